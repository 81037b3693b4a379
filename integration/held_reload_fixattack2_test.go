package integration

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// Holds: a held call (approval_wait) whose approval is decided at the
// moment of a reload (the decision and the reload sent together) runs
// once in all: either the hold saw the decision before the reload and ran
// the call (its retry then finds the approval used and runs nothing), or
// it ended with the pending answer and the runner's retry, under the
// configuration in force, runs it. Never both, never neither once retried.
func TestFixAttack2HoldsHeldCallDecidedAtReloadRunsOnce(t *testing.T) {
	for round := range 3 {
		up := startUpstream(t)
		port := freePort(t)
		cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 20s"}
		g := startGatewayOnPort(t, port, cfg)
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
		m.initialize()
		text := "decided at a reload " + string(rune('a'+round))
		args := `{"text":"` + text + `"}`
		stream := m.sseCall(1, "gated_tool", args)
		id := pendingApprovalID(t, g, aliceKey, text)
		decided := make(chan int, 1)
		go func() { decided <- approveOnce(g, aliceKey, id) }()
		cfg.DataDir = g.DataDir
		g2 := startGatewayOnPort(t, port, cfg) // the same configuration
		switch status := <-decided; status {
		case http.StatusOK:
		case 0:
			// Sent on a connection the reload closed (see startGatewayOnPort):
			// decided, or not, before it closed. Approve through the new one.
			if status := approveOnce(g2, aliceKey, id); status != http.StatusOK && status != http.StatusConflict {
				t.Fatalf("approving again after the reload: %d", status)
			}
		default:
			t.Fatalf("approving: %d", status)
		}
		m.transport = g2.transport()
		msgs := idattackDrain(t, stream)
		last := idattackLast(msgs)
		ranHeld := up.upstreamCalls("gated_tool")
		if ranHeld > 1 {
			t.Fatalf("the held call ran %d times", ranHeld)
		}
		if ranHeld == 0 && !strings.Contains(last, `"code":-32012`) {
			t.Fatalf("the held call neither ran nor ended with the pending answer: %s", last)
		}
		retry := m.call(2, "gated_tool", args)
		if n := up.upstreamCalls("gated_tool"); n != 1 {
			t.Errorf("round %d: held call ran %d, after the retry %d in all, want 1; held answer %s; retry %s", round, ranHeld, n, last, retry)
		}
	}
}

// approveOnce approves the approval id once, as the person key names,
// and returns the HTTP status: 0 when no answer came (it may be called
// from a goroutine other than the test's).
func approveOnce(g *gateway, key, id string) int {
	req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/approvals/"+id+"/approve", bytes.NewReader([]byte(`{"scope":"once"}`)))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: g.transport()}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
