package integration

import (
	"fmt"
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

// Attack (fixed): since r17 an approved approval holds its place under
// max_pending_per_user, and its sealed arguments, until it is used up or
// expires, and an approval for session (or tool) is never used up. Its
// toolgate session ends (its person ends it): nothing can use the approval
// any more (it lets through calls of that session only), yet it kept its
// place and its contents for the rest of its ttl (up to 24 hours, as the
// policy sets): approvers who chose session locked the requester out of
// every new ask in every new session until those approvals expired.
//
// Expected: README, Approvals: an approval keeps what it is about, and its
// place, only while it may still be used.
//
// Reproduced: max_pending_per_user 2, two asks approved for session, the
// session ended through the API: the first ask in a new session was
// refused -32011 (max_pending_per_user).
//
// Fixed: an approval records whether its session is a stored one; counted
// under max_pending_per_user after that session ended, it gives its place
// and its contents back (an implied session's ends only at its expiry).
//
// Severity: low.
func TestR18ApprovalsOfEndedSessionHoldTheirPlace(t *testing.T) {
	_, g := approvalsGateway(t, "approvals {\n\t\tmax_pending_per_user 2\n\t}")
	session := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	args := func(i int) string { return fmt.Sprintf(`{"text":"r18-session-%d"}`, i) }
	var ids []string
	for i := range 2 {
		p := mustPend(t, m.call(100+i, "gated_tool", args(i)))
		ids = append(ids, p.ApprovalID)
		if r := g.api(t, http.MethodPost, "/v1/approvals/"+p.ApprovalID+"/approve", aliceKey, []byte(`{"scope":"session"}`)); r.StatusCode != http.StatusOK {
			t.Fatalf("approve %d for the session: %d %s", i, r.StatusCode, r.Body)
		}
		mustSucceed(t, m.call(200+i, "gated_tool", args(i))) // used, not used up
	}
	// While the session lives, its approvals hold their places.
	if answer := m.call(102, "gated_tool", args(2)); !strings.Contains(string(answer), "max_pending_per_user") {
		t.Fatalf("a third ask beside two approvals for the live session (max_pending_per_user 2): %.300s", answer)
	}
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+session, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending the session: %d %s", r.StatusCode, r.Body)
	}
	m2 := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m2.initialize()
	mustPend(t, m2.call(300, "gated_tool", args(2)))
	for i, id := range ids {
		r := g.api(t, http.MethodGet, "/v1/approvals/"+id, aliceKey, nil)
		if r.StatusCode != http.StatusOK || strings.Contains(string(r.Body), fmt.Sprintf("r18-session-%d", i)) {
			t.Errorf("approval %d of the ended session: %d %.300s; want it without its arguments", i, r.StatusCode, r.Body)
		}
	}
}
