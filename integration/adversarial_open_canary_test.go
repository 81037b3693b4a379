//go:build open_findings

package integration

import (
	"os"
	"path/filepath"
	"testing"
)

// Attack (3ae5760, the cipher canary): a storage that holds sealed
// credentials but no canary — every deployment upgrading to this version,
// a storage restored from a backup taken before it, or one whose canary
// was deleted — with the key file lost and made anew (the very case the
// commit names). checkCipherKey finds no canary and seals one with the
// new key without looking whether the records already in storage open
// with it: the gateway starts (here, reloads) and every stored credential
// is unreadable, as before the change — and from now on the canary
// vouches for the wrong key, so restoring the right key file is refused.
// Severity: low–medium (the protection is absent exactly where records
// already exist; afterwards it guards the wrong key).
// Suggested fix: before sealing a first canary, try to open one existing
// sealed record (a connection, an approval) and refuse when none opens;
// or seal the canary only on a storage with no sealed records.
// Partly fixed: the approvals' key, when stored, is opened first
// (App.AddSealedWitness); a storage holding only connections (whose
// context names a user the storage keeps only as a hash) is not.
func TestS3CanaryFirstSealIgnoresRecordsAlreadyStored(t *testing.T) {
	up := startUpstream(t)
	data := gatewayDataDir(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, DataDir: data, Services: caPersonalServices(up.URL)}
	g := startGatewayOnPort(t, port, cfg)
	caPutToken(t, g, aliceKey, "personal", "s3-token-0123456789abcdef")
	if s := g.catalogService(t, aliceKey, "personal"); s.Status != "connected" {
		t.Fatalf("premise: alice's token is not stored: %+v", s)
	}
	canary := filepath.Join(data, "toolgate", "cipher-canary")
	if _, err := os.Stat(canary); err != nil {
		t.Fatalf("premise: no canary: %v", err)
	}
	// The storage as a version before the canary left it, and the key
	// file lost.
	if err := os.Remove(canary); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(data, "cipher.key")); err != nil {
		t.Fatal(err)
	}
	err := tryLoadGateway(t, port, cfg)
	if err == nil {
		s := g.catalogService(t, aliceKey, "personal")
		if s.Status == "connected" {
			t.Fatalf("premise: the record opens with the new key: %+v", s)
		}
		t.Errorf("a start whose new key opens none of the stored credentials was accepted (alice's connection is now %q), and the canary now vouches for the new key", s.Status)
	}
}
