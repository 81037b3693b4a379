package integration

// Checks a start or a reload makes before it goes on: the cipher opens the
// storage's records, and the policy files load.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// A local cipher key file lost (or replaced by another) while the storage
// keeps records sealed with the old one: toolgate used to make a new key
// silently, and every stored credential and approval then failed to
// decrypt, call after call, "retryable". It now refuses to start (or
// reload), saying to restore the key; with the key back it starts, and
// with the canary reset it goes on with the new key.
func TestCipherKeyThatDoesNotOpenTheStorageIsRefused(t *testing.T) {
	up := startUpstream(t)
	data := gatewayDataDir(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, DataDir: data}
	startGatewayOnPort(t, port, cfg)
	keyFile := filepath.Join(data, "cipher.key")
	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatalf("premise: the gateway's key file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "toolgate", "cipher-canary")); err != nil {
		t.Fatalf("premise: the canary was not sealed at start: %v", err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Fatalf("premise: a reload with the same key is refused: %v", err)
	}

	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	err = tryLoadGateway(t, port, cfg)
	if err == nil || !strings.Contains(err.Error(), "does not open the records in storage") {
		t.Fatalf("a reload whose key file was lost (and made anew): %v; want it refused", err)
	}
	if !strings.Contains(err.Error(), "was made new when this gateway started") {
		t.Errorf("the refusal does not say the key file now there was just made: %v", err)
	}

	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Errorf("with the key file restored, the reload is refused: %v", err)
	}

	// Going on with a new key, as the refusal says: the canary reset.
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "toolgate", "cipher-canary"), []byte("reset"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Errorf("with a new key and the canary reset, the reload is refused: %v", err)
	}
}

// A configuration reload while the policy files do not load is refused,
// naming the error, as toolgate validate and a restart refuse them (the
// running engine keeps its last good policy either way: told nothing, the
// operator learned it at the next restart, which failed). With the files
// mended, the reload goes through.
func TestReloadWithPolicyFilesThatDoNotLoadIsRefused(t *testing.T) {
	up := startUpstream(t)
	policies := copyPolicies(t, "testdata/policy")
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: policies}
	startGatewayOnPort(t, port, cfg)
	broken := filepath.Join(policies, "broken.rego")
	if err := os.WriteFile(broken, []byte("package toolgate.request\n\nthis is not rego\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := tryLoadGateway(t, port, cfg)
	if err == nil || !strings.Contains(err.Error(), "do not load") || !strings.Contains(err.Error(), "broken.rego") {
		t.Fatalf("a reload with a policy file that does not parse: %v; want it refused, naming the file", err)
	}
	if err := os.Remove(broken); err != nil {
		t.Fatal(err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Errorf("a reload with the policy files mended: %v", err)
	}
}

// A file_system storage toolgate cannot write (its path a file) refuses
// the start, saying why: every request that stored something answered
// "try again in a moment".
func TestStorageThatCannotBeWrittenIsRefusedAtStart(t *testing.T) {
	up := startUpstream(t)
	notADir := filepath.Join(t.TempDir(), "storage")
	if err := os.WriteFile(notADir, []byte("a file"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := gatewayConfig{Upstream: up.URL, DataDir: notADir, Cipher: "local " + filepath.Join(t.TempDir(), "cipher.key")}
	t.Cleanup(func() { // should the start not be refused
		caddyMu.Lock()
		defer caddyMu.Unlock()
		_ = caddy.Stop()
	})
	err := tryLoadGateway(t, freePort(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "storage file_system "+notADir) || !strings.Contains(err.Error(), "give a directory toolgate may write") {
		t.Errorf("a storage path that is a file: %v; want the start refused, saying why", err)
	}
}
