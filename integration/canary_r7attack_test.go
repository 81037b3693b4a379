package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Found and fixed (change B, 1a79dc9), end to end: the way to go on with
// a new cipher key — "delete toolgate/cipher-canary from the storage" —
// no longer worked once an API key user had a stored connection: the
// gateway (alice, an API key user, stored a token for the personal
// service) lost its local key file; the operator deleted the canary as
// the refusal said; the reload was refused anyway, by alice's connection,
// with the same advice to delete the (now absent) canary.
// Severity: medium — the documented recovery from a lost key was a dead
// end.
// Fixed: the refusal says to store the word "reset" as the canary, which
// the next start honours before looking at any older record; alice's old
// connection stays unreadable (never deleted), and she connects again.
func TestR7CanaryDeletedAsToldReloadStillRefused(t *testing.T) {
	up := startUpstream(t)
	data := gatewayDataDir(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, DataDir: data, Services: caPersonalServices(up.URL)}
	g := startGatewayOnPort(t, port, cfg)
	caPutToken(t, g, aliceKey, "personal", "alice-token")
	canary := filepath.Join(data, "toolgate", "cipher-canary")
	if _, err := os.Stat(canary); err != nil {
		t.Fatalf("premise: no canary sealed at start: %v", err)
	}

	// The key file is lost (the gateway makes a new one): refused, also
	// with the canary deleted (alice's connection speaks for the old key).
	if err := os.Remove(filepath.Join(data, "cipher.key")); err != nil {
		t.Fatal(err)
	}
	err := tryLoadGateway(t, port, cfg)
	if err == nil || !strings.Contains(err.Error(), `store the word "reset" as toolgate/cipher-canary`) {
		t.Fatalf("a reload with a new key: %v; want it refused, saying how to go on", err)
	}
	if err := os.Remove(canary); err != nil {
		t.Fatal(err)
	}
	if err := tryLoadGateway(t, port, cfg); err == nil {
		t.Fatal("a reload with a new key and the canary deleted went on, though alice's connection does not open with it")
	}
	// As the refusal says.
	if err := os.WriteFile(canary, []byte("reset\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tryLoadGateway(t, port, cfg); err != nil {
		t.Fatalf("with the canary reset, the reload is refused: %v", strings.TrimSpace(err.Error()))
	}
	if b, err := os.ReadFile(canary); err != nil || strings.TrimSpace(string(b)) == "reset" {
		t.Fatalf("no new canary sealed after the reset: %q, %v", b, err)
	}
	if s := g.catalogService(t, aliceKey, "personal"); s.Status == "connected" {
		t.Fatalf("alice's connection, sealed with the lost key, reads as connected: %+v", s)
	}
	caPutToken(t, g, aliceKey, "personal", "alice-token-again")
	if s := g.catalogService(t, aliceKey, "personal"); s.Status != "connected" {
		t.Fatalf("alice connected again, yet her connection is %+v", s)
	}
}
