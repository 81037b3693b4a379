//go:build open_findings

package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// Attack: since r17 an approved approval holds its place under
// max_pending_per_user, and its sealed arguments, "until it is used up or
// expires" — an approval for session (or tool) never is used up. Its
// toolgate session ends (its runner ends it, or it expires): nothing can
// use the approval any more (it lets through calls of that session only),
// yet it keeps its place and its contents for the rest of its ttl (up to
// 24 hours, as the policy sets). Approvers who chose session (four eyes:
// the requester cannot undo it) lock the requester out of every new ask in
// every new session until those approvals expire.
//
// Expected: README, Approvals: "each keeps the call's arguments (and a
// withheld result), encrypted, until it is denied, used up or expires" —
// the lifecycle r17 set: an approval keeps what it is about, and its
// place, "only while it may still be used"; an approval of an ended
// session may not.
//
// Reproduced: max_pending_per_user 2, two asks approved for session, the
// session ended through the API: the first ask in a new session is refused
// -32011 (max_pending_per_user), and the ended session's approvals keep
// their sealed arguments.
//
// Severity: low (a lockout of one person's asks up to the approvals' ttl,
// set by their own approvals; storage bounded by max_pending_per_user).
//
// Fix (not obvious): an approval names its session by ref only, and
// implied sessions (stateless runners) are stored nowhere, so "ended" is
// not a lookup away. Index session- and tool-scope approvals by their
// session's ref, and drop their contents and places when a stored session
// is deleted or swept (SessionStore.Delete/DeleteRef/sweep calling into
// the approvals, or an approvals sweep reading sessionIndexKey(user, ref)
// for stored sessions); implied sessions end only at their expiry, which
// an approval could take as its own ExpiresAt bound.
func TestR18AttackApprovalsOfEndedSessionHoldTheirPlace(t *testing.T) {
	_, g := approvalsGateway(t, "approvals {\n\t\tmax_pending_per_user 2\n\t}")
	session := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	args := func(i int) string { return fmt.Sprintf(`{"text":"r18-session-%d"}`, i) }
	for i := range 2 {
		p := mustPend(t, m.call(100+i, "gated_tool", args(i)))
		if r := g.api(t, http.MethodPost, "/v1/approvals/"+p.ApprovalID+"/approve", aliceKey, []byte(`{"scope":"session"}`)); r.StatusCode != http.StatusOK {
			t.Fatalf("approve %d for the session: %d %s", i, r.StatusCode, r.Body)
		}
		mustSucceed(t, m.call(200+i, "gated_tool", args(i))) // used, not used up
	}
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+session, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending the session: %d %s", r.StatusCode, r.Body)
	}
	if size := approvalContentsBytes(g); size > 0 {
		t.Errorf("approvals of an ended session keep %d bytes of sealed contents", size)
	}
	m2 := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m2.initialize()
	answer := m2.call(300, "gated_tool", args(2))
	if strings.Contains(string(answer), "max_pending_per_user") {
		t.Errorf("the first ask in a new session, beside two approvals of an ended session: %.300s", answer)
	} else {
		mustPend(t, answer)
	}
}
