package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Attack: a call held for its approval (approval_wait) is decided again
// when "the policy that asked is no longer the one in force" — but hold
// compares revisions of the engine of the handler that held it
// (h.engine.Revision() == revision). A configuration reload that points
// toolgate_policy at another policy (a new source: another pooled
// engine) leaves the old handler's engine, and its revision, as they
// were: the held call, once approved, runs under the replaced policy,
// though the policy in force now denies the tool outright (its retry, or
// any new call, is denied). StillAuthorized checks key, service,
// allowed_users and tool, never the policy in force.
func TestFixAttackHeldCallSkipsPolicyReplacedByConfigReload(t *testing.T) {
	denies := t.TempDir()
	if err := os.WriteFile(filepath.Join(denies, "request.rego"), []byte(`package toolgate.request

default decision := {"action": "allow"}

decision := {"action": "deny", "reason": "gated_tool is retired"} if input.tool.name == "gated_tool"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t)
	port := freePort(t)
	approvals := testdataPath(t, "approvals")
	cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: approvals, ResultPolicy: approvals, PolicyOptions: "approval_wait 20s"}
	g := startGatewayOnPort(t, port, cfg)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	stream := m.sseCall(1, "gated_tool", `{"text":"held across a policy swap"}`)
	id := pendingApprovalID(t, g, aliceKey, "held across a policy swap")

	cfg.RequestPolicy, cfg.DataDir = denies, g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	m.transport = g2.transport()
	if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"gated_tool","arguments":{"text":"after"}}}`); len(msgs) == 0 || !strings.Contains(string(msgs[0]), "retired") {
		t.Fatalf("control: gated_tool after the reload: %s; want denied (retired)", msgs)
	}
	if r := g2.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != 200 {
		t.Logf("approving after the reload: %d %s", r.StatusCode, r.Body)
	}
	msgs := idattackDrain(t, stream)
	if n := up.upstreamCalls("gated_tool"); n != 0 {
		t.Errorf("the upstream ran gated_tool %d time(s) after a reload replaced the policy with one that denies it; last answer: %s", n, idattackLast(msgs))
	}
}

// Holds: a held call answers to the configuration in force however many
// reloads came since it was held (InForce reads the App started last): a
// first reload that changes nothing, then a second that revokes the key
// the call was made with, and the approved call is refused, never sent;
// while a held call across two reloads that change nothing runs.
func TestFixAttackHoldsHeldCallAcrossTwoReloads(t *testing.T) {
	const revocable = "test-key-alice-fixattack-held2"
	for _, revoke := range []bool{false, true} {
		up := startUpstream(t)
		port := freePort(t)
		approvals := testdataPath(t, "approvals")
		cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: approvals, PolicyOptions: "approval_wait 20s",
			AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
		g := startGatewayOnPort(t, port, cfg)
		m := g.raw(t, revocable, g.createSession(t, revocable, "svc"), "svc")
		m.initialize()
		stream := m.sseCall(1, "gated_tool", `{"text":"held across two reloads"}`)
		id := pendingApprovalID(t, g, aliceKey, "held across two reloads")
		cfg.DataDir = g.DataDir
		startGatewayOnPort(t, port, cfg)
		if revoke {
			cfg.AuthExtra = ""
		}
		g2 := startGatewayOnPort(t, port, cfg)
		endedPendingAtReload(t, idattackDrain(t, stream), id)
		if r := g2.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != 200 {
			t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
		}
		m.transport = g2.transport()
		status, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"gated_tool","arguments":{"text":"held across two reloads"}}}`)
		want := 1
		if revoke {
			want = 0
		}
		if n := up.upstreamCalls("gated_tool"); n != want {
			t.Errorf("revoked by the second reload %v: the retry ran gated_tool %d time(s), want %d; answer: %d %s", revoke, n, want, status, idattackLast(msgs))
		}
	}
}
