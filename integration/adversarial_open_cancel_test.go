//go:build open_findings

package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
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
	var mu sync.Mutex
	callSess, expiredSess := "", ""
	var cancels []string
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo()
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		switch gjson.GetBytes(b, "method").String() {
		case "notifications/cancelled":
			if strings.Contains(string(b), "f3-replica-cancel") {
				mu.Lock()
				cancels = append(cancels, sess)
				mu.Unlock()
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		case "ping":
			mu.Lock()
			defer mu.Unlock()
			if expiredSess == "" && callSess != "" {
				expiredSess = sess
				w.WriteHeader(http.StatusNotFound)
				return true
			}
			return false
		case "tools/call":
			mu.Lock()
			callSess = sess
			mu.Unlock()
			sseStart(w)
			fmt.Fprint(w, ": started\n\n")
			flush(w)
			select {
			case <-release:
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
			flush(w)
			return true
		}
		return false
	})
	m, onB := srOnTwoReplicas(t, bin, up, "")
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	ga2Until(func() bool { mu.Lock(); defer mu.Unlock(); return callSess != "" }, 5*time.Second)
	if status, _, err := faPost(onB, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping on B: HTTP %d %v", status, err)
	}
	status, _, err := faPost(onB, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"f3-replica-cancel"}}`)
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("the runner's cancellation on B: HTTP %d %v", status, err)
	}
	ga2Until(func() bool { mu.Lock(); defer mu.Unlock(); return len(cancels) > 0 }, 3*time.Second)
	letGo()
	for range c {
	}
	mu.Lock()
	defer mu.Unlock()
	if expiredSess == "" || expiredSess != callSess {
		t.Fatal("premise: S1 was not re-initialized on B")
	}
	t.Logf("call in %s; the runner's cancellation (on B) reached %v", callSess, cancels)
	if len(cancels) == 0 {
		t.Fatal("the runner's cancellation reached no upstream session")
	}
	for _, s := range cancels {
		if s != callSess {
			t.Errorf("the runner's cancellation of call 5, running in upstream session %s (relayed by replica A), sent on replica B, reached upstream session %s", callSess, s)
		}
	}
}

// Attack: the runner's notifications/cancelled of a request that is on its
// way while post re-initializes the upstream session overtakes the request
// and is lost. request records SentIn(7, S1) before sending; S1 answers
// 404 and post re-initializes (the initialize takes a while). The runner
// cancels 7 meanwhile: the record names S1, still the current session, so
// forward takes the ordinary path (post), whose POST to S1 also gets 404
// and waits on the same re-initialization; once S2 exists the
// cancellation's reinitialize returns at once (it did not run it), while
// the request's own reinitialize first lists S2's tools (fetchCatalog)
// before the request is sent again. So S2 gets notifications/cancelled for
// 7 before tools/call 7: a cancellation of no request it knows (ignored, as
// the spec allows), and then the call, which runs unstopped until its end
// or the service timeout. The runner did everything right (it cancelled
// after sending). Severity: low (a call the runner cancelled runs on; a
// tool with side effects completes). Fix: while a request is being
// re-sent after a re-initialization, hold the runner's cancellation of it
// for that request: record "cancelled" on the SentIn entry, and have post
// check it before sending into the new session (answer the runner, send
// nothing); or send the cancellation only after MovedTo (wait on the
// entry).
func TestServerRequestFix4AttackCancellationDuringReinitializeOvertakesRequest(t *testing.T) {
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
		case method == "notifications/cancelled" && strings.Contains(string(b), "f4-stop-7") && !gone:
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
	done := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		_, _, _ = faPost(m, raWaitCall(7, ""))
		done <- time.Since(start)
	}()
	select {
	case <-initializing:
	case <-time.After(5 * time.Second):
		t.Fatal("premise: no re-initialization")
	}
	time.Sleep(200 * time.Millisecond)
	status, _, err := faPost(m, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"f4-stop-7"}}`)
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("the runner's cancellation: HTTP %d %v", status, err)
	}
	var took time.Duration
	select {
	case took = <-done:
	case <-time.After(14 * time.Second):
		t.Fatal("the call did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("S1 %s; upstream saw (outside S1): %v; the call's answer after %v", gen1, order, took)
	callAt, cancelAt := -1, -1
	for i, s := range order {
		if s.what == "call" && callAt < 0 {
			callAt = i
		}
		if s.what == "cancel" && cancelAt < 0 {
			cancelAt = i
		}
	}
	if callAt < 0 {
		t.Fatal("premise: the call never reached the new upstream session")
	}
	if cancelAt < 0 {
		t.Errorf("the runner's cancellation of call 7 (sent during the re-initialization) reached no live upstream session; the call ran %v", took)
	} else if cancelAt < callAt {
		t.Errorf("the runner's cancellation of call 7 reached the new upstream session before the call itself (ignored there); the call ran on for %v", took)
	}
}
