package integration

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// Attack (fixed; change 2, a01e4a6), end to end with a real Vault: the gateway
// runs on a storage whose connections predate its canary (here: the
// canary was deleted and the next start sealed a new one after a stored
// connection opened, as on every storage upgraded to canaries; the
// records are an hour old). Then Vault loses the transit key for a while
// — deleted by mistake and restored from its backup (transit/backup,
// transit/restore), or Vault restored from an older snapshot, or a DR
// failover to a cluster without it. Every decrypt answers HTTP 400
// ("encryption key not found"), which vaulttransit maps to
// ErrCipherMismatch; the canary no longer opens either.
//
// What happened: the canary vouched for the key once, at start, so every
// connection older than it that "does not open" became
// ErrSealedWithOtherKey: bob's call answered needs_sign_in ("an
// administrator replaced the key: connect it again") and the catalog said
// needs_sign_in, for a record the restored key opens again a moment later.
// People who follow the advice PUT their token again while the key is
// gone; Vault (encrypt upserts, when the token may create keys) seals it
// with a new key of the same name, which the restore then replaces: the record the right key opened is
// overwritten with one nothing opens.
// Severity: medium (a transient Vault fault turns into a mass sign-in
// request that destroys good credentials; against "a wrong key must never
// make people overwrite records the right key opens").
// Fixed: only a canary sealed after the operator's reset makes the
// records stored before it the old key's, and only while the cipher opens
// the canary (modules/gateway sealedwith.go; the unit tests there try a
// backend losing the key after a reset too).
func TestR8VaultKeyLostForAWhileKeepsTheRetryableError(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	vault := v.Client()
	if _, err := vault.Logical().Write("transit/keys/"+key+"/config", map[string]any{
		"deletion_allowed": true, "exportable": true, "allow_plaintext_backup": true}); err != nil {
		t.Fatal(err)
	}
	backup, err := vault.Logical().Read("transit/backup/" + key)
	if err != nil || backup == nil {
		t.Fatalf("backing up the transit key: %v", err)
	}

	up := startUpstream(t)
	cfg := gatewayConfig{Upstream: up.URL, Services: caPersonalServices(up.URL), Extra: "cache_ttl 50ms", Cipher: vaultCipher(v, key)}
	g := startGateway(t, cfg)
	caPutToken(t, g, aliceKey, "personal", "alice-token")
	caPutToken(t, g, bobKey, "personal", "bob-token")
	hourAgo := time.Now().Add(-time.Hour)
	for _, u := range []string{alice, bob} {
		if err := os.Chtimes(caRecordPath(g, "personal", u), hourAgo, hourAgo); err != nil {
			t.Fatal(err)
		}
	}
	// The canary is sealed anew after the records (a storage upgraded to
	// canaries; here: deleted, and sealed again once alice's record opened).
	if err := os.Remove(filepath.Join(g.DataDir, "toolgate", "cipher-canary")); err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = g.DataDir
	g = startGateway(t, cfg)
	if _, err := os.Stat(filepath.Join(g.DataDir, "toolgate", "cipher-canary")); err != nil {
		t.Fatalf("setup: no canary sealed at the restart: %v", err)
	}
	m := g.raw(t, bobKey, g.createSession(t, bobKey, "personal"), "personal")
	m.initialize()
	m.mustEcho(t, "before")

	if _, err := vault.Logical().Delete("transit/keys/" + key); err != nil {
		t.Fatalf("deleting the transit key: %v", err)
	}
	var a rpcAnswer
	for range 100 { // until the 50 ms cache lets go of bob's decrypted record
		if a, err = m.callEcho("key gone"); err != nil {
			t.Fatal(err)
		}
		if a.Error != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	status := g.catalogService(t, bobKey, "personal").Status

	if _, err := vault.Logical().Write("transit/restore/"+key, map[string]any{"backup": backup.Data["backup"]}); err != nil {
		t.Fatalf("restoring the transit key: %v", err)
	}
	m.mustEcho(t, "key restored") // bob's record, untouched, opens again

	if a.Error == nil {
		t.Fatal("setup: calls went on while Vault had lost the key")
	}
	if a.Error.Data.NeedsSignIn || status == "needs_sign_in" {
		t.Fatalf("while Vault had lost the key for a while: call %+v, catalog %q; want a retryable error and not needs_sign_in, "+
			"for a record the restored key opens", a.Error, status)
	}
}
