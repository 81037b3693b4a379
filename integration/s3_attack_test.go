package integration

// Attacks on the changes 3b9f8c4 … 65c19c4 (third review): see each test.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/toolgate/toolgate/modules/ciphers/vaulttransit/vaulttest"
)

// Attack (65c19c4, a reload refused while the policy files do not load):
// an operator edits request.rego in Emacs, which while the buffer has
// unsaved changes keeps a lock file beside it, `.#request.rego`: a
// dangling symbolic link ("user@host.pid:boot-time"). The policy's file
// listing takes every name ending in .rego, hidden ones too, and reading
// the dangling link fails; checkFiles therefore refuses every config
// reload — a revoked API key, a new service, `toolgate reload` for any
// reason — for as long as someone has a policy file open with unsaved
// edits, although the policy files themselves are fine (the same happens
// to a macOS AppleDouble `._request.rego` copied in with the files).
// Before 65c19c4 the reload went through; now it is refused.
// Severity: low–medium (reloads, including security ones such as
// revoking an API key, blocked by an editor's lock file; a restart fails
// the same way).
// Suggested fix: skip hidden names (leading '.') and entries that are
// not regular files (or whose target does not exist) when listing a
// policy directory, in fileSource.files.
// Fixed: hidden names are skipped (a dangling link of another name still
// fails: that is a policy file gone).
func TestS3ReloadRefusedByEditorLockFileInPolicyDir(t *testing.T) {
	up := startUpstream(t)
	policies := copyPolicies(t, "testdata/policy")
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: policies}
	startGatewayOnPort(t, port, cfg)
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Fatalf("premise: a reload with the policy files unchanged is refused: %v", err)
	}
	// What Emacs makes while request.rego has unsaved changes.
	lock := filepath.Join(policies, ".#request.rego")
	if err := os.Symlink("alice@host.example.12345:1700000000", lock); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(policies, "request.rego")); err != nil {
		t.Fatalf("premise: the policy file itself: %v", err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Errorf("a reload while an editor's lock file sits beside an unchanged policy is refused: %v", err)
	}
	_ = os.Remove(lock)
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Errorf("premise: with the lock file gone, the reload is refused: %v", err)
	}
}

// Held (3b9f8c4): ending a session by its ref does what ending it by its
// id does — its MCP session's calls stop at once — and a ref in upper
// case, with a trailing slash, or the ref's hash again, ends nothing. The
// list's ref is the SHA-256 of the id and nothing else of the id shows.
func TestS3HeldSessionEndedByRefEndsItsMCPSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	sess := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, sess, "svc")
	m.initialize()
	m.mustEcho(t, "before")
	ref := sha256Hex(sess)
	r := g.api(t, http.MethodGet, "/v1/sessions", aliceKey, nil)
	if r.StatusCode != http.StatusOK || !strings.Contains(string(r.Body), `"ref":"`+ref+`"`) || strings.Contains(string(r.Body), sess) {
		t.Fatalf("premise: GET /v1/sessions: %d %s; want the ref %s and not the id", r.StatusCode, r.Body, ref)
	}
	for _, variant := range []string{strings.ToUpper(ref), ref + "/", sha256Hex(ref)} {
		if r := g.api(t, http.MethodDelete, "/v1/sessions/"+variant, aliceKey, nil); r.StatusCode == http.StatusNoContent {
			t.Errorf("DELETE /v1/sessions/%s answered 204", variant)
		}
	}
	m.mustEcho(t, "variants ended nothing")
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+ref, bobKey, nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("bob ending alice's session by its ref: %d %s, want 404", r.StatusCode, r.Body)
	}
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+ref, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending by ref: %d %s", r.StatusCode, r.Body)
	}
	a, err := m.callEcho("after")
	if err == nil && a.Error == nil {
		t.Errorf("a call in the session ended by its ref still ran: %s", a.Result)
	}
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+ref, aliceKey, nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("ending it again: %d, want 404", r.StatusCode)
	}
}

// Attack (3ae5760, the cipher canary): the same Vault Transit key, but a
// token that may not decrypt (a policy missing transit/decrypt/<key>, a
// token whose policy was narrowed): the canary's Decrypt is refused with
// 403, which is not ErrCipherUnavailable, so checkCipherKey reports it as
// "the cipher's key does not open the records in storage, which were
// sealed with another key" and tells the operator to restore a key backup
// or delete toolgate/cipher-canary. The key is the right one; the cause
// (permission denied) is not named. An operator who follows the advice
// deletes the canary: the next start seals a new one (encrypt is allowed)
// and starts, and every stored credential then fails to decrypt — the
// check the canary exists for is defeated by its own message.
// Severity: low–medium (misdiagnosis with harmful advice; a wrong reload
// refusal reason).
// Suggested fix: tell a cipher that refused the operation (permission,
// token, missing key: vault 403/404, KMS AccessDenied) from one whose key
// does not open the record (vault 400 "cipher: message authentication
// failed", an AEAD failure), and refuse the former naming the cipher's
// own error, without advising to delete the canary.
// Fixed: ciphers wrap gateway.ErrCipherMismatch for a record that does
// not open with their key; any other refusal names the cipher's own error
// and no key.
func TestS3CanaryBlamesKeyForVaultPermissionDenied(t *testing.T) {
	v := vaulttest.Start(t)
	key := v.NewKey(t)
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, DataDir: gatewayDataDir(t), Cipher: vaultCipher(v, key)}
	startGatewayOnPort(t, port, cfg)
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "toolgate", "cipher-canary")); err != nil {
		t.Fatalf("premise: the canary was not sealed at start: %v", err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Fatalf("premise: a reload with the same key and token is refused: %v", err)
	}

	root := v.Client()
	policy := fmt.Sprintf("path \"transit/keys/%s\" { capabilities = [\"read\"] }\npath \"transit/encrypt/%s\" { capabilities = [\"update\"] }\n", key, key)
	if err := root.Sys().PutPolicy("s3-no-decrypt", policy); err != nil {
		t.Fatal(err)
	}
	secret, err := root.Auth().Token().Create(&vaultapi.TokenCreateRequest{Policies: []string{"s3-no-decrypt"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	token := secret.Auth.ClientToken
	// Premise: the token encrypts with the very key, and may not decrypt.
	c := v.Client()
	c.SetToken(token)
	enc, err := c.Logical().Write("transit/encrypt/"+key, map[string]any{"plaintext": "aGk=", "context": "Y3R4"})
	if err != nil || enc == nil {
		t.Fatalf("premise: the narrowed token cannot encrypt: %v", err)
	}
	if _, err := c.Logical().Write("transit/decrypt/"+key, map[string]any{"ciphertext": enc.Data["ciphertext"], "context": "Y3R4"}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("premise: the narrowed token decrypts: %v", err)
	}

	narrowed := cfg
	narrowed.Cipher = fmt.Sprintf("vault_transit {\n\t\t\taddress %s\n\t\t\ttoken %s\n\t\t\tkey %s\n\t\t}", v.Addr, token, key)
	err = tryLoadGateway(t, port, narrowed)
	if err != nil && (strings.Contains(err.Error(), "sealed with another key") || strings.Contains(err.Error(), "toolgate/cipher-canary in the storage")) {
		t.Errorf("a reload whose Vault token may not decrypt (same key) is refused as a wrong key, advising to reset the canary: %v", err)
	}
}

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
// Fixed: the approvals' key, when stored, is opened first
// (App.AddSealedWitness), else a stored connection of a user the
// configuration names (an API key's: a connection's context names its
// user, whom the storage keeps only as a hash).
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
	// The storage as a version before the canary left it, with its key:
	// the start goes on, and seals a canary.
	if err := os.Remove(canary); err != nil {
		t.Fatal(err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Fatalf("a start with the key the stored connection was sealed with was refused: %v", err)
	}
	if _, err := os.Stat(canary); err != nil {
		t.Fatalf("no canary sealed after a start with the right key: %v", err)
	}
	// Then again without the canary, and the key file lost.
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
		t.Fatalf("a start whose new key opens none of the stored credentials was accepted (alice's connection is now %q), and the canary now vouches for the new key", s.Status)
	}
	if !strings.Contains(err.Error(), "does not open the records in storage") || strings.Contains(err.Error(), "s3-token") {
		t.Fatalf("refused with %v; want the key named as not opening the records, and no token", err)
	}
	if _, err := os.Stat(canary); !os.IsNotExist(err) {
		t.Fatalf("the refused key sealed a canary anyway (%v)", err)
	}
}
