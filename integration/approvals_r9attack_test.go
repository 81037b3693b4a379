package integration

import (
	"os"
	"path/filepath"
	"testing"
)

// Attack (fixed; the cipher reset 6a23c34 builds on, end to end with the local
// cipher): the gateway's approvals keep an HMAC key of their own,
// toolgate/approvals-key, sealed by the cipher. The local key file is
// lost; the operator follows the refusal's advice: stores "reset" as the
// canary, and starts with the key file the gateway makes anew. The README
// says "every credential and approval sealed with the old key then stays
// unreadable, and people connect again".
//
// What happened: after the reset no approval can be made at all, ever:
// a call of a tool the policy gates answers -32011 "this call needs an
// approval and approvals cannot be read or stored right now; retry later"
// (retryable: true) instead of "approval required": the approvals' key,
// sealed with the lost key, never opens and is never replaced. A
// retryable error that never clears, on every call, until an administrator finds
// and deletes toolgate/approvals-key by hand, which nothing tells them.
// Severity: high where approvals are used (every gated tool unusable after
// the documented recovery from a lost or replaced key).
// Suggested fix (done; the code says how): seal a new approvals' key when the canary is sealed after
// a reset (approvals signed with the old one are then not found, as
// documented), or replace an approvals' key that does not open while the
// canary vouches for the cipher's key and is older than an after-reset
// canary.
func TestR9ApprovalsAfterACipherReset(t *testing.T) {
	up := startUpstream(t)
	cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals")}
	g1 := startGateway(t, cfg)
	m := g1.raw(t, aliceKey, g1.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	mustPend(t, m.call(1, "gated_tool", `{"text":"before the reset","project":"apollo"}`))

	// The key file is lost; the operator resets the canary and starts
	// again: the local cipher makes a new key file.
	keyFile := filepath.Join(g1.DataDir, "cipher.key")
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g1.DataDir, "toolgate", "cipher-canary"), []byte("reset\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = g1.DataDir
	g2 := startGateway(t, cfg)
	if _, err := os.Stat(keyFile); err != nil {
		t.Fatalf("setup: no new key file: %v", err)
	}
	m2 := g2.raw(t, aliceKey, g2.createSession(t, aliceKey, "svc"), "svc")
	m2.initialize()
	for i := range 3 { // it never clears
		answer := m2.call(10+i, "gated_tool", `{"text":"after the reset","project":"apollo"}`)
		if i == 2 {
			mustPend(t, answer)
		}
	}
}
