package integration

// Replica attacks on calls held for an approval (approval_wait) on one
// replica while the approval is decided through another.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// rpaHoldReplicas starts two replicas of the toolgate binary on a fresh
// PostgreSQL database, with the approval tests' policies and approval_wait
// wait on toolgate_policy; it returns them, the upstream, the DSN and a
// function starting one more.
func rpaHoldReplicas(t *testing.T, wait string) (up *upstream, a, b *replica, dsn string, start func() *replica) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up = startUpstream(t)
	dsn = pgtest.Shared(t).CreateDatabase(t)
	data := t.TempDir()
	block := soBlock("storage postgres "+dsn, data, up.URL, "echo gated_tool", "", "")
	policies := testdataPath(t, "approvals")
	start = func() *replica {
		port := freePort(t)
		return startReplicaAt(t, bin, port, fmt.Sprintf("http://127.0.0.1:%d", port), block, data, policies, "approval_wait "+wait)
	}
	a = start() // the first creates the cipher key
	b = start()
	return up, a, b, dsn, start
}

// Attack (held): alice's call is held (approval_wait 20s) on replica b;
// both replicas' listening connections are then ended with
// pg_terminate_backend, and alice approves the call through replica a at
// that moment: the announcement of the decision is lost with b's
// connection. b reconnects, treats everything as changed (a Reset wakes
// every held call), reads the approval and runs the call once: the held
// stream ends with the result, not with the pending answer of a wait run
// out (which is what a held call that only polled every 30 s would get),
// and a retry through either replica is not let through again (once).
func TestReplicaAttackHeldCallSeesDecisionMadeWhileListenerCut(t *testing.T) {
	up, a, b, dsn, _ := rpaHoldReplicas(t, "20s")
	admin, db := rpaAdmin(t, dsn)
	sess := a.createSession(t, aliceKey, "svc")
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.initialize()
	stream := mb.sseCall(1, "gated_tool", `{"text":"held across replicas"}`)
	id := pendingApprovalID(t, a.gateway, aliceKey, "held across replicas")
	time.Sleep(300 * time.Millisecond) // the call is waiting on b
	if n := rpaKillListeners(t, admin, db); n < 2 {
		t.Fatalf("ended %d listening connections, want both replicas'", n)
	}
	if r := a.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving on a: %d %s", r.StatusCode, r.Body)
	}
	var msgs []json.RawMessage
	deadline := time.After(40 * time.Second)
collect:
	for {
		select {
		case msg, ok := <-stream:
			if !ok {
				break collect
			}
			msgs = append(msgs, msg)
		case <-deadline:
			t.Fatalf("the held call on b did not end within 40s: %s", msgs)
		}
	}
	if len(msgs) == 0 {
		t.Fatal("the held call on b answered nothing")
	}
	last := string(msgs[len(msgs)-1])
	if !strings.Contains(last, `held across replicas`) || strings.Contains(last, `"isError":true`) || strings.Contains(last, "-32012") {
		t.Errorf("the held call on b, approved on a while b's listener was cut: %s, want its result", last)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Errorf("the upstream ran gated_tool %d times, want 1", n)
	}
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.sessionID = mb.sessionID
	mustPend(t, ma.call(2, "gated_tool", `{"text":"held across replicas"}`))
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Errorf("a once approval ran %d times across replicas", n)
	}
}

// Attack (held): alice's call is held on replica b (approval_wait 20s);
// b dies (SIGKILL) with the call held, alice approves it through replica a
// while b is down, and a replacement replica starts. The runner's stream
// ended with b, without a result; its identical retry, through the new
// replica, runs the call once (the approval was not used up by the call
// that died), and a second retry, through a, is not let through again.
func TestReplicaAttackApprovedWhileHoldingReplicaRestarts(t *testing.T) {
	up, a, b, _, start := rpaHoldReplicas(t, "20s")
	sess := a.createSession(t, aliceKey, "svc")
	mb := b.raw(t, aliceKey, sess, "svc")
	mb.initialize()
	stream := mb.sseCall(1, "gated_tool", `{"text":"held on a dying replica"}`)
	id := pendingApprovalID(t, a.gateway, aliceKey, "held on a dying replica")
	time.Sleep(300 * time.Millisecond)
	b.kill(t)
	var msgs []json.RawMessage
	for msg := range stream {
		msgs = append(msgs, msg)
	}
	for _, msg := range msgs {
		if strings.Contains(string(msg), `"result"`) && strings.Contains(string(msg), "held on a dying replica") {
			t.Fatalf("the held call's stream carried a result though its replica died before any decision: %s", msg)
		}
	}
	if r := a.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving on a while b is down: %d %s", r.StatusCode, r.Body)
	}
	c := start()
	mc := c.raw(t, aliceKey, sess, "svc")
	mc.sessionID = mb.sessionID
	if got := mustSucceed(t, mc.call(2, "gated_tool", `{"text":"held on a dying replica"}`)); !strings.Contains(got, "held on a dying replica") {
		t.Fatalf("the retry through the new replica: %s", got)
	}
	ma := a.raw(t, aliceKey, sess, "svc")
	ma.sessionID = mb.sessionID
	mustPend(t, ma.call(3, "gated_tool", `{"text":"held on a dying replica"}`))
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Errorf("the upstream ran gated_tool %d times, want 1", n)
	}
	if s := soApprovalState(t, c.gateway, aliceKey, id); s != "consumed" {
		t.Errorf("the approval after its retry, read through the new replica: %s, want consumed", s)
	}
}
