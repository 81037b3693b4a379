package integration

// Replica attacks on per-caller limits: a runner that spreads its
// requests over two replicas sharing one PostgreSQL storage.

import (
	"net/http"
	"strings"
	"testing"
)

// rpaStatelessCall sends alice's stateless (2026-07-28) echo through g in
// the toolgate session sess, declaring the client capabilities caps; it
// returns the status and the answer.
func rpaStatelessCall(t *testing.T, g *gateway, sess, caps string) (int, string) {
	t.Helper()
	status, msg := statelessPost(t, g, aliceKey, sess,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},`+aaStatelessMeta(caps)+`}}`, nil)
	return status, aaJSON(msg)
}

// Attack (fixed): max_mcp_sessions_per_caller is documented as "open MCP sessions
// of one caller, counted on every replica sharing the storage" (README,
// the toolgate option table; "Sizing": "counts a caller's sessions on all
// of them"), and the MCP sessions implied for 2026-07-28 requests "count
// against max_mcp_sessions_per_caller". With max_mcp_sessions_per_caller
// 2, alice's stateless runner opens two implied MCP sessions on replica a
// (two capability sets: each is its own implied session, with its own
// upstream session), and a third is refused there, as expected. The same
// runner sending its next requests to replica b is given two more implied
// sessions there: four open MCP sessions (four upstream sessions) for a
// caller limited to two, and with N replicas, 2N. Expected: b refuses, as
// a does. What happens: b accepts both (a stateless session is counted in
// the replica's own localUser only: internal/mcpsession/sessions.go:495,
// initializing.go:69). Fixed: each replica keeps a record of how many such
// sessions it holds for the caller (renewed while they live), which the
// others count.
func TestReplicaAttackStatelessSessionsEscapePerCallerLimit(t *testing.T) {
	up := startUpstream(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo", "", "max_mcp_sessions_per_caller 2")
	})
	sess := a.createSession(t, aliceKey, "svc")
	caps := []string{`{}`, `{"roots":{}}`, `{"sampling":{}}`, `{"elicitation":{}}`, `{"roots":{"listChanged":true}}`}

	// On a: two implied sessions, the third refused.
	for i, c := range caps[:2] {
		if status, ans := rpaStatelessCall(t, a.gateway, sess, c); status != http.StatusOK || !strings.Contains(ans, `"result"`) {
			t.Fatalf("stateless call %d on a: %d %s", i, status, ans)
		}
	}
	if _, ans := rpaStatelessCall(t, a.gateway, sess, caps[2]); !strings.Contains(ans, "max_mcp_sessions_per_caller") {
		t.Fatalf("a third implied session on a (max_mcp_sessions_per_caller 2): %s, want refused", ans)
	}

	// On b: the same caller, the same limit.
	opened := 2
	for _, c := range caps[2:4] {
		status, ans := rpaStatelessCall(t, b.gateway, sess, c)
		if status == http.StatusOK && strings.Contains(ans, `"result"`) {
			opened++
			t.Logf("b opened another implied MCP session for alice (capabilities %s): %s", c, ans)
		}
	}
	m := b.raw(t, aliceKey, sess, "svc")
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status == http.StatusOK && len(msgs) == 1 && !strings.Contains(string(msgs[0]), `"error"`) {
		opened++
		t.Logf("b initialized a stored MCP session for alice too")
	}
	if opened > 2 {
		t.Errorf("alice holds %d open MCP sessions over two replicas with max_mcp_sessions_per_caller 2 (a refused her third; b counted none of a's)", opened)
	}
}
