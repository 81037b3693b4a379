package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Attack (fixed): a call held for its approval (approval_wait) is decided again
// when its approval comes under a newer revision of the policy (a policy
// file changed while it waited, picked up by reload_interval): the
// approval given for the call as the old revision would have sent it
// lets the call through if it "covers" the new ask — the decider, the
// scope and the ttl — whatever arguments the new revision now sends
// upstream. A revision that rewrites the arguments (the policy's
// "arguments") sends, on an approval of {"text":"r18-original"}, a call
// of {"text":"r18-rewritten"} that nobody approved; a fresh call under
// the same revision asks about the rewritten arguments (an approval of
// "the arguments as they would go upstream").
//
// Expected: README, Approvals: an approval records "the arguments as they
// would go upstream" and lets through the **identical** call; "An
// approval never authorizes other arguments, another session or another
// caller" (internal/approval); DESIGN: "changed arguments need a new
// approval".
//
// Reproduced: the upstream got gated_tool {"text":"r18-rewritten"} on
// the approval of {"text":"r18-original"}.
//
// Fixed: the approval stands only if it is about the call as the revision
// in force sends it (Approval.About); else the call asks anew.
//
// Severity: medium (an approver's decision applied to arguments they
// never saw; it takes a policy revision during the hold).
func TestR18HeldCallRunsRewrittenArgumentsOnAnotherCallsApproval(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"mask.rego", "result.rego", "request.rego"} {
		data, err := os.ReadFile(filepath.Join(testdataPath(t, "approvals"), name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, PolicyOptions: "approval_wait 30s"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	stream := m.sseCall(1, "gated_tool", `{"text":"r18-original"}`)
	id := pendingApprovalID(t, g, aliceKey, "r18-original")

	// The next revision asks about gated_tool's calls with their text
	// rewritten, and denies echo (so that the test sees it in force).
	if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte(`package toolgate.request

default decision := {"action": "allow"}

decision := {"action": "ask", "reason": "gated_tool needs an approval", "arguments": {"text": "r18-rewritten"}} if {
	input.method == "tools/call"
	input.tool.name == "gated_tool"
}

decision := {"action": "deny", "reason": "r18 revision two"} if input.tool.name == "echo"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	inForce := false
	for deadline := time.Now().Add(20 * time.Second); !inForce && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"probe"}}}`)
		inForce = len(msgs) > 0 && strings.Contains(string(msgs[len(msgs)-1]), "r18 revision two")
	}
	if !inForce {
		t.Fatal("premise: the policy's second revision was not in force within 20 s")
	}
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving the held call: %d %s", r.StatusCode, r.Body)
	}
	msgs := idattackDrain(t, stream)
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"name":"gated_tool"`) && strings.Contains(r.Body, "r18-rewritten") {
			t.Errorf("the upstream got gated_tool with arguments nobody approved (the approval was of r18-original): %s; the held call's answer: %s",
				r.Body, idattackLast(msgs))
		}
	}
}
