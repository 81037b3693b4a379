package mcpbridge

import (
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// Attack (fixed): a link's tag (Link.relayedID) is unique only within one Bridge:
// b.links counts from 1 in every Bridge, so the first program of every
// replica, and of every runtime a reload makes anew (the stdio and sse
// runtimes are pooled by their configuration's key: a changed key is a
// new Bridge), relays its request 1 as "1:n1". The gateway's exemption
// (mcpproxy.askedIn, registry.relayAnswer: an answer to a request of an
// older upstream generation is relayed when the service is bridged and
// the current upstream session has the same Ref) rests on the bridge
// naming each process's requests apart, and a bridged session's id is
// the same on every replica (NewSession: gateway.UpstreamSession). So a
// runner whose session moves to replica B (B re-initializes under the
// same session id: same Ref) and answers the request program A (replica
// A) asked as "1:n1" has its answer posted into B's session, where
// serverRequests["1:n1"] is B's program's own request 1: that program
// takes it as the answer to a question the user never saw (an
// elicitation's "accept", a sampling result). The attack fix3 fixed for
// HTTP upstreams, back for bridged programs. Severity: medium (integrity
// of server→client answers, across replicas or a reload that remakes the
// runtime; within one user's session). Fix: make the tag unique beyond
// one Bridge: a random prefix per Bridge (gateway.NewID()[:8]) with the
// counter, or record in the pending server request the Bridge/replica
// instance that asked and refuse the exemption across instances.
// Fixed: Bridge.nonce.
func TestFix4AttackLinkTagsRepeatAcrossBridges(t *testing.T) {
	cfg := Config{Service: "svc", MaxMessage: 1 << 20, Limits: mcpmsg.Limits{MaxDepth: 64}}
	onA, onB := New(cfg, nil), New(cfg, nil) // two replicas (or a runtime before and after a reload)
	t.Cleanup(onA.Close)
	t.Cleanup(onB.Close)
	a, b := onA.NewLink(LinkConfig{}), onB.NewLink(LinkConfig{})
	ra, rb := a.relayedID([]byte(`1`)), b.relayedID([]byte(`1`))
	t.Logf("program A's request 1 is relayed as %s, program B's as %s", ra, rb)
	if mcpmsg.IDKey(ra) == mcpmsg.IDKey(rb) {
		t.Errorf("request 1 of two programs (two bridges: replicas, or a runtime remade by a reload) is relayed under the same id %s: an answer to one, relayed under the same-Ref exemption, reaches the other", ra)
	}
}
