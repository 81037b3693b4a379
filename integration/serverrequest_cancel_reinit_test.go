package integration

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed): the runner's notifications/cancelled of a request on its
// way while toolgate re-initializes the upstream session overtook the
// request. The request recorded that it went to S1; S1 answered 404 and
// post re-initialized (a slow initialize). The runner cancelled meanwhile:
// the record named S1, still current, so the cancellation took the
// ordinary path, got 404 from S1 too and waited on the same
// re-initialization; once S2 existed it was sent at once, while the
// request's own re-initialization first listed S2's tools. S2 got the
// cancellation of a request it never heard of (ignored), then the call,
// which ran unstopped though the runner had cancelled it.
// Fixed: a cancellation about to reach the session that replaced the one
// its request went to, before the request is sent there, marks it
// cancelled (mcpsession CancelUnsent), and the request is not sent
// (SendingIn): it never runs, and the runner's call is answered so.
func TestRunnersCancellationDuringItsRequestsReinitializeIsNotOvertaken(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "12s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	var mu sync.Mutex
	gen1, forgotten := "", false
	initializing := make(chan struct{}, 4)
	type seen struct{ what, sess string }
	var order []seen
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		method := gjson.GetBytes(b, "method").String()
		mu.Lock()
		if method == "ping" && gen1 == "" {
			gen1 = sess
		}
		gone := forgotten && sess != "" && sess == gen1
		switch {
		case method == "tools/call" && gjson.GetBytes(b, "id").Raw == "7" && !gone:
			order = append(order, seen{"call", sess})
		case method == "notifications/cancelled" && strings.Contains(string(b), "cr-stop-7") && !gone:
			order = append(order, seen{"cancel", sess})
		}
		mu.Unlock()
		if gone {
			http.Error(w, "unknown session", http.StatusNotFound)
			return true
		}
		if method == "initialize" {
			select {
			case initializing <- struct{}{}:
			default:
			}
			time.Sleep(1500 * time.Millisecond) // a slow re-initialization
		}
		return false
	})
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
	mu.Lock()
	forgotten = true // the upstream forgets S1
	mu.Unlock()
	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		status, msgs, err := faPost(m, raWaitCall(7, ""))
		var b strings.Builder
		for _, msg := range msgs {
			b.Write(msg)
		}
		if err != nil {
			b.WriteString(err.Error())
		}
		done <- answer{status, b.String()}
	}()
	select {
	case <-initializing:
	case <-time.After(5 * time.Second):
		t.Fatal("premise: no re-initialization")
	}
	time.Sleep(200 * time.Millisecond)
	status, _, err := faPost(m, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"cr-stop-7"}}`)
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("the runner's cancellation: HTTP %d %v", status, err)
	}
	var call answer
	select {
	case call = <-done:
	case <-time.After(14 * time.Second):
		t.Fatal("the call did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("S1 %s; upstream saw (outside S1): %v; the call's answer: HTTP %d %s", gen1, order, call.status, call.body)
	callAt, cancelAt := -1, -1
	for i, s := range order {
		if s.what == "call" && callAt < 0 {
			callAt = i
		}
		if s.what == "cancel" && cancelAt < 0 {
			cancelAt = i
		}
	}
	switch {
	case callAt < 0 && cancelAt >= 0:
		t.Errorf("the runner's cancellation of call 7 reached the new upstream session, the call did not: %v", order)
	case callAt < 0:
		// Cancelled before it was sent again: it never ran, and the runner
		// is told so.
		if gjson.Get(call.body, "id").Raw != "7" || !strings.Contains(gjson.Get(call.body, "error.message").String(), "did not run") {
			t.Errorf("a call cancelled before it was sent again: HTTP %d %s (want call 7's error: it did not run)", call.status, call.body)
		}
	case cancelAt < 0:
		t.Errorf("call 7 reached the new upstream session and its cancellation did not; the call's answer: HTTP %d %s", call.status, call.body)
	case cancelAt < callAt:
		t.Errorf("the runner's cancellation of call 7 reached the new upstream session before the call itself (ignored there): %v", order)
	}
}
