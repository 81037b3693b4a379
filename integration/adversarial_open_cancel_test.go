//go:build open_findings

package integration

import (
	"strings"
	"testing"
)

// Attack (replicas): the record of where a runner's request went
// (Session.SentIn) is in one process's memory. A call runs on replica A
// in upstream session S1; a ping on replica B finds S1 expired and B
// re-initializes it (S2); the runner's cancellation of the call lands on
// B (a load balancer spreads a session's requests), which has no record
// of the call: forward → post sends it into S2, and S1, running the call,
// is never told. Severity: low (as the single-replica case 33b8aa9 fixed:
// a call cannot be stopped across a re-initialization, on replicas).
// Fix: keep the upstream generation a request went to where every replica
// reads it (beside the pending requests in the shared storage), or route
// a cancellation naming no local request to the replica that relays it.
func TestServerRequestFix3AttackCancellationOnOtherReplicaGoesToNewSession(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	cu := srCancelUpstream(t, up, func(b []byte) bool { return strings.Contains(string(b), "f3-replica-cancel") }, "sse")
	m, onB := srOnTwoReplicas(t, bin, up, "")
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	cu.waitCall()
	srPing(t, onB, 2, "ping on B")
	srCancel(t, onB, 5, "f3-replica-cancel", "the runner's cancellation on B")
	cu.waitCancel()
	cu.letGo()
	for range c {
	}
	st := cu.state()
	if st.expiredSess == "" || st.expiredSess != st.callSess {
		t.Fatal("premise: S1 was not re-initialized on B")
	}
	st.onlyInTheCallsSession(t, "the runner's cancellation of call 5, running in upstream session %s (relayed by replica A), sent on replica B, reached upstream session %s")
}
