package integration

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// cancelAttackOutcome is what an upstream session other than the forgotten
// S1 saw of call 7 and its cancellation, in order, and the call's answer.
type cancelAttackOutcome struct {
	order  []string // "call" / "cancel", as the upstream received them outside S1
	status int
	body   string
}

// cancelAttackRun starts an upstream (configured by configure), a gateway
// and a runner; pings (S1 is the upstream session), makes the upstream
// forget S1, sends call 7 (the wait tool) and, once slowMethod reaches the
// session that replaces S1 (the upstream is held there for hold), sends the
// runner's cancellation of 7. It returns what the upstream saw and the
// call's answer.
func cancelAttackRun(t *testing.T, upstreamKind int, slowMethod string, hold time.Duration, marker string) cancelAttackOutcome {
	t.Helper()
	up := startUpstreamWith(t, upstreamKinds[upstreamKind].configure)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "12s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	var mu sync.Mutex
	gen1, forgotten := "", false
	reached := make(chan struct{}, 1)
	var order []string
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
		slow := forgotten && !gone && method == slowMethod
		switch {
		case method == "tools/call" && gjson.GetBytes(b, "id").Raw == "7" && !gone:
			order = append(order, "call")
		case method == "notifications/cancelled" && strings.Contains(string(b), marker) && !gone:
			order = append(order, "cancel")
		}
		mu.Unlock()
		if gone {
			http.Error(w, "unknown session", http.StatusNotFound)
			return true
		}
		if slow {
			select {
			case reached <- struct{}{}:
			default:
			}
			time.Sleep(hold)
		}
		return false
	})
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
	mu.Lock()
	forgotten = true // the upstream forgets S1
	mu.Unlock()
	done := make(chan cancelAttackOutcome, 1)
	go func() {
		status, msgs, err := faPost(m, raWaitCall(7, ""))
		var b strings.Builder
		for _, msg := range msgs {
			b.Write(msg)
		}
		if err != nil {
			b.WriteString(err.Error())
		}
		done <- cancelAttackOutcome{status: status, body: b.String()}
	}()
	select {
	case <-reached:
	case <-time.After(8 * time.Second):
		t.Fatalf("premise: %s never reached the new upstream session", slowMethod)
	}
	time.Sleep(200 * time.Millisecond)
	status, _, err := faPost(m, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"`+marker+`"}}`)
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("the runner's cancellation: HTTP %d %v", status, err)
	}
	var out cancelAttackOutcome
	select {
	case out = <-done:
	case <-time.After(16 * time.Second):
		t.Fatal("the call did not end")
	}
	mu.Lock()
	out.order = append([]string(nil), order...)
	mu.Unlock()
	t.Logf("S1 %s; upstream saw (outside S1): %v; the call's answer: HTTP %d %.300s", gen1, out.order, out.status, out.body)
	return out
}

// cancelAttackJudge fails the test when the runner's cancellation of call
// 7 was lost: the call reached a live upstream session and no cancellation
// of it followed it there.
func cancelAttackJudge(t *testing.T, out cancelAttackOutcome) {
	t.Helper()
	callAt, cancelAt := -1, -1
	for i, s := range out.order {
		if s == "call" && callAt < 0 {
			callAt = i
		}
		if s == "cancel" && callAt >= 0 && cancelAt < 0 {
			cancelAt = i
		}
	}
	switch {
	case callAt < 0:
		if gjson.Get(out.body, "id").Raw != "7" || !strings.Contains(gjson.Get(out.body, "error.message").String(), "did not run") {
			t.Errorf("a call cancelled before it was sent again: HTTP %d %.300s (want call 7's error: it did not run)", out.status, out.body)
		}
	case cancelAt < 0:
		t.Errorf("call 7 reached the new upstream session and the runner's cancellation never followed it there (order %v); the call's answer: HTTP %d %.300s",
			out.order, out.status, out.body)
	}
}

// Attack (fixed): the fix closed the window only while the re-initialization's
// initialize runs. The request that re-initializes the upstream session
// (post → reinitialize) then lists the new session's tools (fetchCatalog,
// up to 50 pages of tools/list round trips) before it sends the request
// again (send → SendingIn). Reinitialize has already made S2 the MCP
// session's current upstream, while the request's SentIn record still
// names S1. A runner's notifications/cancelled of the request arriving
// during that listing took forward's cancelsInReplaced path (since replaced
// by cancelInProgress; the record's
// generation differs from the current one), is sent to S1, which forgot
// the session and answers 404 (the error is ignored, the runner gets
// 202), and never reached CancelUnsent (since replaced by CancelGone). The request is then sent to S2 and
// runs to its end: the runner cancelled it and was told nothing; it is
// the very overtaking the commit set out to close, shifted by one round
// trip (or 50, with a paginated catalog, or a slow upstream tools/list).
// Both the SSE- and the JSON-answering upstream lose it.
// Severity: medium (a cancelled call — a tool with side effects — runs;
// the window is as long as the upstream's tools/list, which the upstream
// controls, and every re-initialization opens it).
// Fix: mark the request's record "on its way" from the moment its send
// got 404 until SendingIn records the new session (e.g. a Resending(id)
// before reinitialize), and have forward route a cancellation of such a
// request to CancelUnsent (mark it cancelled, send nothing) instead of to
// the replaced session; or list the tools after the request was sent
// again (fetchCatalog after send, or in the background).
// Fixed: the cancellation of a request in progress goes to the session its
// record names; when that answers 404, the request is kept from the session
// replacing it, or the cancellation follows it there (mcpproxy
// cancelInProgress, mcpsession CancelGone).
func TestCancelAttackCancellationDuringReinitializeToolListingIsLost(t *testing.T) {
	for i, kind := range upstreamKinds {
		t.Run(kind.name, func(t *testing.T) {
			out := cancelAttackRun(t, i, "tools/list", 1500*time.Millisecond, "ca-list-"+kind.name)
			cancelAttackJudge(t, out)
		})
	}
}

// Attack (fixed): the same lost cancellation without the re-initializing request's
// tools listing, so moving fetchCatalog alone would not fix it. Call 7 goes
// to S1, which forgot the session but is slow to say so (a restarting
// upstream, a busy proxy in front of it: its 404 comes after 2s). A ping
// meanwhile gets 404 from S1 at once and re-initializes: S2 is current.
// The runner now cancels 7: the record names S1, not current, so
// cancelsInReplaced sends the cancellation to S1, which answers 404 (it
// runs nothing; the error is dropped, the runner gets 202). Then call 7's
// own 404 arrives, its reinitialize finds S2 made already, and SendingIn
// sends it there (nothing marked it cancelled): it runs to its end.
// Severity: medium (as above: a call the runner cancelled runs; the window
// is as long as the upstream takes to refuse the request).
// Fix: in forward, when the cancellation's exchange with the replaced
// session answers 404 (that session runs nothing, so the request never ran
// there and is on its way elsewhere), call CancelUnsent(id, current): the
// request is kept from the new session; if SendingIn already moved it
// there (CancelUnsent false), send the cancellation to the current session.
// Fixed so (CancelGone).
func TestCancelAttackCancellationWhileRequestAwaitsSlow404IsLost(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "15s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	var mu sync.Mutex
	gen1, forgotten := "", false
	refusing := make(chan struct{}, 1)
	var order []string
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		method := gjson.GetBytes(b, "method").String()
		call7 := method == "tools/call" && gjson.GetBytes(b, "id").Raw == "7"
		mu.Lock()
		if method == "ping" && gen1 == "" {
			gen1 = sess
		}
		gone := forgotten && sess != "" && sess == gen1
		switch {
		case call7 && !gone:
			order = append(order, "call")
		case method == "notifications/cancelled" && strings.Contains(string(b), "ca-slow404") && !gone:
			order = append(order, "cancel")
		}
		mu.Unlock()
		if gone {
			if call7 {
				select {
				case refusing <- struct{}{}:
				default:
				}
				time.Sleep(2 * time.Second) // slow to say it forgot the session
			}
			http.Error(w, "unknown session", http.StatusNotFound)
			return true
		}
		return false
	})
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
	mu.Lock()
	forgotten = true // the upstream forgets S1
	mu.Unlock()
	done := make(chan cancelAttackOutcome, 1)
	go func() {
		status, msgs, err := faPost(m, raWaitCall(7, ""))
		var b strings.Builder
		for _, msg := range msgs {
			b.Write(msg)
		}
		if err != nil {
			b.WriteString(err.Error())
		}
		done <- cancelAttackOutcome{status: status, body: b.String()}
	}()
	select {
	case <-refusing:
	case <-time.After(8 * time.Second):
		t.Fatal("premise: call 7 never reached S1")
	}
	// Another request re-initializes meanwhile: S2 is current.
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("premise: the ping that re-initializes: HTTP %d %v", status, err)
	}
	status, _, err := faPost(m, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"ca-slow404"}}`)
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("the runner's cancellation: HTTP %d %v", status, err)
	}
	var out cancelAttackOutcome
	select {
	case out = <-done:
	case <-time.After(18 * time.Second):
		t.Fatal("the call did not end")
	}
	mu.Lock()
	out.order = append([]string(nil), order...)
	mu.Unlock()
	t.Logf("S1 %s; upstream saw (outside S1): %v; the call's answer: HTTP %d %.300s", gen1, out.order, out.status, out.body)
	cancelAttackJudge(t, out)
}

// Held: the runner ends its MCP session (DELETE) while toolgate
// re-initializes the upstream session for its call: the upstream session
// the re-initialization made is ended too (DELETE), not left open with no
// MCP session naming it, and the call is answered.
func TestCancelAttackSessionEndedDuringReinitializeLeavesNoUpstreamSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "12s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	var mu sync.Mutex
	gen1, forgotten := "", false
	initializing := make(chan struct{}, 1)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		sess := r.Header.Get("Mcp-Session-Id")
		method := gjson.GetBytes(b, "method").String()
		mu.Lock()
		if r.Method == http.MethodPost && method == "ping" && gen1 == "" {
			gen1 = sess
		}
		gone := forgotten && sess != "" && sess == gen1
		slow := forgotten && r.Method == http.MethodPost && method == "initialize"
		mu.Unlock()
		if gone {
			http.Error(w, "unknown session", http.StatusNotFound)
			return true
		}
		if slow {
			select {
			case initializing <- struct{}{}:
			default:
			}
			time.Sleep(1500 * time.Millisecond)
		}
		return false
	})
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
	mu.Lock()
	forgotten = true
	mu.Unlock()
	done := make(chan int, 1)
	go func() {
		status, _, _ := faPost(m, raWaitCall(7, ""))
		done <- status
	}()
	select {
	case <-initializing:
	case <-time.After(8 * time.Second):
		t.Fatal("premise: no re-initialization")
	}
	time.Sleep(200 * time.Millisecond)
	resp, err := m.send(context.Background(), http.MethodDelete, "", "", "")
	if err != nil {
		t.Fatalf("DELETE: %v", err)
	}
	resp.Body.Close()
	select {
	case <-done:
	case <-time.After(14 * time.Second):
		t.Fatal("the call did not end")
	}
	made := false
	for _, r := range up.requestLog() {
		if r.SessionID != "" && r.SessionID != gen1 {
			made = true
		}
	}
	if !made {
		t.Fatal("premise: the re-initialization made no new upstream session")
	}
	var open []string
	for range 50 {
		open = open[:0]
		for _, id := range up.openSessions() {
			if id != gen1 {
				open = append(open, id)
			}
		}
		if len(open) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(open) != 0 {
		t.Errorf("upstream sessions left open after the MCP session ended during their re-initialization: %v", open)
	}
}

// Held: a runner of the stateless revision (2026-07-28) cancels by closing
// its request's stream. Its call of a legacy upstream, whose upstream
// session toolgate re-initializes, is not sent into the new session when
// the runner closes the stream while the re-initialization still lists the
// new session's tools (the window that loses a legacy runner's
// notifications/cancelled, above): the exchange's context ends with it.
func TestCancelAttackStatelessRunnerClosingDuringReinitializeHeld(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "12s"})
	session := g.createSession(t, aliceKey, "svc")
	var mu sync.Mutex
	gen1, forgotten := "", false
	listing := make(chan struct{}, 1)
	var calls []string
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		method := gjson.GetBytes(b, "method").String()
		mu.Lock()
		if method == "tools/call" && gjson.GetBytes(b, "params.name").String() == "echo" && gen1 == "" {
			gen1 = sess
		}
		gone := forgotten && sess != "" && sess == gen1
		if method == "tools/call" && gjson.GetBytes(b, "params.name").String() == "wait" && !gone {
			calls = append(calls, sess)
		}
		slow := forgotten && !gone && method == "tools/list"
		mu.Unlock()
		if gone {
			http.Error(w, "unknown session", http.StatusNotFound)
			return true
		}
		if slow {
			select {
			case listing <- struct{}{}:
			default:
			}
			time.Sleep(1500 * time.Millisecond)
		}
		return false
	})
	if status, out := statelessPost(t, g, aliceKey, session,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"ca"},`+statelessMeta+`}}`, nil); status != http.StatusOK || out["result"] == nil {
		t.Fatalf("premise: the stateless echo: HTTP %d %v", status, out)
	}
	mu.Lock()
	if gen1 == "" {
		mu.Unlock()
		t.Fatal("premise: the echo reached no upstream session")
	}
	forgotten = true
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/mcp/svc", strings.NewReader(
			`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"wait","arguments":{},`+statelessMeta+`}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		req.Header.Set("X-Toolgate-Session", session)
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "wait")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-listing:
	case <-time.After(8 * time.Second):
		t.Fatal("premise: no re-initialization listed the new session's tools")
	}
	time.Sleep(200 * time.Millisecond)
	cancel() // the runner closes its request's stream: its cancellation
	<-done
	time.Sleep(2500 * time.Millisecond) // the listing ends; a call sent then would show
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 0 {
		t.Errorf("the stateless runner's call reached the new upstream session after it closed its stream: %v", calls)
	}
}
