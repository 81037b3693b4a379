// Tests whose comment starts with "Attack" describe what an attack would get through without the defence the test checks (each failed before its fix); those starting with "Holds" show attacks the design resists.

package integration

// The rewritten resumption of runner streams (modules/mcpproxy/resume.go),
// attacked at its new joints: a kept stream forgotten (its deadline, a
// ninth kept stream, its session's end) while a relay or a resume is on
// it, a resume whose upstream fails, streams still being read that count
// among the eight a session keeps, an answer that is toolgate's own error,
// the standalone stream (its eviction, toolgate's own notifications once it
// is resumed), the upstream's event ids a stream remembers, progress on a
// resumed stream, a resume superseded by another, a cancellation after the
// upstream session was re-initialized. Each test runs as a caller of its
// own (acctUser) and compares the gauges (and the process's goroutines)
// with their value at its start.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ---- helpers ---------------------------------------------------------------

// rrCancelledFor counts the notifications/cancelled the upstream got for
// the request id (its JSON text).
func rrCancelledFor(up *upstream, id string) int {
	n := 0
	for _, c := range raCancelled(up) {
		if c == id {
			n++
		}
	}
	return n
}

// rrAwaitCancel polls, for at most within, until the upstream was told to
// cancel the request id.
func rrAwaitCancel(up *upstream, id string, within time.Duration) bool {
	for end := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		if rrCancelledFor(up, id) > 0 {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// rrQuiet closes the connections kept for reuse (the gateway's to the
// upstream, the tests' to the gateway), whose goroutines would otherwise
// be counted.
func rrQuiet(g *gateway, up *upstream) {
	up.server.CloseClientConnections()
	if g.pool != nil {
		g.pool.CloseIdleConnections()
	}
	http.DefaultClient.CloseIdleConnections()
}

// rrGoroutines is the process's goroutine count with no connection kept
// for reuse.
func rrGoroutines(g *gateway, up *upstream) int {
	rrQuiet(g, up)
	time.Sleep(100 * time.Millisecond)
	return runtime.NumGoroutine()
}

// rrGoroutinesBack polls (at most 5s) until the process runs no more than
// two goroutines more than base.
func rrGoroutinesBack(g *gateway, up *upstream, base int) (int, bool) {
	n := 0
	for range 50 {
		if n = rrGoroutines(g, up); n <= base+2 {
			return n, true
		}
	}
	return n, false
}

// rrSSE starts an SSE answer of an intercepting upstream.
func rrSSE(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

// rrEvent writes one SSE event (id "" for none) and flushes it.
func rrEvent(w http.ResponseWriter, id, data string) {
	if id != "" {
		fmt.Fprintf(w, "id: %s\n", id)
	}
	fmt.Fprintf(w, "data: %s\n\n", data)
	w.(http.Flusher).Flush()
}

// rrNote is a notifications/message carrying text.
func rrNote(text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":%q}}`, text)
}

// rrProgressNote is a notifications/progress on token (JSON text).
func rrProgressNote(token string, n int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":%s,"progress":%d,"total":10}}`, token, n)
}

// rrID is the JSON text of the id of the JSON-RPC message body.
func rrID(body []byte) string {
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal(body, &msg)
	return string(msg.ID)
}

// rrResults counts the responses with a result in an SSE text.
func rrResults(text string) int {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"result":`) {
			n++
		}
	}
	return n
}

// ---- attacks ---------------------------------------------------------------

// Attack: a call whose resume waits on a stalled upstream until the call's
// deadline runs on upstream for good: nothing ever tells the upstream to
// cancel it. The runner dropped its stream (kept, its deadline timer
// armed) and resumed it; resumeForRunner (modules/mcpproxy/resume.go)
// takes the stream over and sends the upstream its GET with Last-Event-ID
// under a context that ends at the call's deadline. The upstream sends no
// headers; at the deadline the exchange fails, and the error path calls
// st.release(), which finds the stream no longer resumable (its deadline
// passed) and forgets it with forget("") — "its relay told the upstream
// what it had to", but no relay ran. The deadline timer (expire) fires a
// millisecond later, finds the resume still in its relay slot (or the
// stream forgotten), and does nothing. Without the resume, expire would
// have cancelled the call at its deadline (TestResumeAttackDroppedStreamIsNeverCancelledUpstream).
// Here wait (which works until cancelled) is never told, 3s past its 3s
// timeout. Fix: on resumeForRunner's error path, a stream that the failed
// resume leaves unresumable, unanswered and not superseded is forgotten
// with a reason (st.forget(err.Error()) or release taking a why), so that
// its call is cancelled upstream.
func TestResume2AttackResumeTimingOutUpstreamLeavesTheCallRunning(t *testing.T) {
	key, _, auth := acctUser("resume2-hang")
	up := startUpstream(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet || r.Header.Get("Last-Event-Id") == "" {
			return false
		}
		<-r.Context().Done() // the upstream never answers a resumption
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "3s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	lastID, sent := acctOpenUntil(t, m, raWaitCall(1, ""), "") // to its priming event, then dropped
	if lastID == "" {
		t.Fatal("the call's stream carried no event id")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	status, body, err := raGet(ctx, m, lastID)
	t.Logf("the resume: %d %v %.300s", status, err, body)
	wait := time.Until(sent.Add(3*time.Second)) + 3*time.Second
	if !rrAwaitCancel(up, "1", wait) {
		t.Errorf("the call of wait is %v past its 3s timeout, its resume failed at the deadline, and the upstream was never told to cancel it (cancelled: %v)",
			time.Since(sent.Add(3*time.Second)).Round(100*time.Millisecond), raCancelled(up))
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: a stream a resume is connecting upstream is not among its
// session's dropped streams, so eight newer streams dropped meanwhile do
// not push it out. When the upstream then fails the resumption (500), the
// stream is dropped again and kept — the runner may resume it once more —
// and the oldest of the nine dropped streams is pushed out instead, its
// call cancelled upstream at once. (Before, a stream counted among the
// eight while it was written: the one being resumed was pushed out, and
// its failed resume forgot it without cancelling its call.)
func TestResume2HoldsStreamBeingResumedIsNotPushedOut(t *testing.T) {
	key, _, auth := acctUser("resume2-evicted")
	up := startUpstream(t)
	release := make(chan struct{})
	var asked atomic.Int32
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent) // at once (the go-sdk waits for the session's calls)
			return true
		}
		if r.Method != http.MethodGet || r.Header.Get("Last-Event-Id") == "" {
			return false
		}
		asked.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return true
		}
		http.Error(w, "the event store lost the stream", http.StatusInternalServerError)
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "30s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	lastID, _ := acctOpenUntil(t, m, raWaitCall(901, ""), "")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	type result struct {
		status int
		body   string
		err    error
	}
	resumed := make(chan result, 1)
	go func() {
		status, body, err := raGet(ctx, m, lastID)
		resumed <- result{status, body, err}
	}()
	for i := 0; asked.Load() == 0; i++ {
		if i == 100 {
			t.Fatal("the resume never reached the upstream")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Eight newer streams, dropped: the session keeps eight, and pushes
	// the call's stream out while the resume waits for the upstream.
	for i := 1; i <= 8; i++ {
		acctOpenUntil(t, m, raProgressCall(910+i, 100, ""), `"progress":1`)
	}
	close(release)
	select {
	case res := <-resumed:
		t.Logf("the resume: %d %v %.300s", res.status, res.err, res.body)
	case <-time.After(15 * time.Second):
		t.Fatal("the resume got no answer")
	}
	// The oldest dropped: the gateway sees a dropped connection when it
	// next writes to it, so two streams dropped within one progress
	// period may be seen in either order.
	oldest := func() bool {
		for _, id := range []string{"911", "912"} {
			if rrCancelledFor(up, id) > 0 {
				return true
			}
		}
		return false
	}
	for end := time.Now().Add(3 * time.Second); !oldest() && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
	if !oldest() {
		t.Errorf("nine dropped streams in the session, and the upstream was not told to cancel the oldest's call, 911 or 912 (cancelled: %v)", raCancelled(up))
	}
	if rrCancelledFor(up, "901") > 0 {
		t.Errorf("the call whose resume failed was cancelled, though its stream may still be resumed (cancelled: %v)", raCancelled(up))
	}
	endMCPSession(t, m)
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Attack: streams a runner is still reading count among the eight its
// session keeps for resumption, so a runner with nine calls in progress
// that loses the connection of one — the oldest — cannot resume it, and
// the call is cancelled upstream, although it is the only stream the
// runner dropped. README: "a session keeps up to eight dropped streams for
// resumption". A runner stream is kept (runnerStream.keep →
// MCPSession.KeepStream, bounded by MaxResumableStreams) at its first
// event id — the priming event every 2025-11-25 stream starts with — not
// when it is dropped, and evict marks a stream still being written as
// pushed out; when its runner then goes away, relay finds it unresumable,
// answers an error into the dead connection and sends
// notifications/cancelled, and the resume is refused with 400. Parallel
// tool calls are what agents do. Fix: bound only the streams kept after
// their relay ended (count and evict in release), and keep those being
// written where a resume finds them without counting them.
func TestResume2AttackLiveStreamsPushOutTheOnlyDroppedOne(t *testing.T) {
	key, _, auth := acctUser("resume2-live")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "30s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	open := func(id int) (*http.Response, context.CancelFunc, string) {
		cctx, ccancel := context.WithCancel(ctx)
		resp, err := m.send(cctx, http.MethodPost, "application/json, text/event-stream", raProgressCall(id, 150, ""), "")
		if err != nil || resp.StatusCode != http.StatusOK {
			ccancel()
			t.Fatalf("call %d: %v %v", id, err, resp)
		}
		text := raRead(t, resp.Body, "the first progress", func(s string) bool { return strings.Contains(s, `"progress":1,`) && raHasID(s) })
		return resp, ccancel, raLastID(text)
	}
	// The oldest call, read to its first progress.
	r1, drop1, lastID := open(1)
	// Eight more, all read by the runner to their answers.
	var wg sync.WaitGroup
	var answered atomic.Int32
	for id := 2; id <= 9; id++ {
		resp, done, _ := open(id)
		wg.Go(func() {
			defer done()
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if strings.Contains(string(b), `"text":"done"`) {
				answered.Add(1)
			}
		})
	}
	// The connection of the oldest call drops; the runner resumes it.
	drop1()
	r1.Body.Close()
	status, body, err := raGet(ctx, m, lastID)
	if err != nil || status != http.StatusOK || !strings.Contains(body, `"text":"done"`) {
		t.Errorf("resuming the one stream the runner dropped, with eight more in progress: %d %v %.300s; want the rest and the answer", status, err, body)
	}
	if n := rrCancelledFor(up, "1"); n != 0 {
		t.Errorf("the upstream was told %d times to cancel the call whose stream the runner dropped (and wanted to resume)", n)
	}
	wg.Wait()
	if n := answered.Load(); n != 8 {
		t.Errorf("%d of the eight streams read to their end got their answer", n)
	}
	endMCPSession(t, m)
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Attack: an MCP client (the official Go SDK) that makes eight tool calls
// at once loses its whole session the next time its standalone stream
// drops. The standalone stream is kept for resumption at its first event
// id, before the calls, and the eight calls' streams — kept at their
// priming events — push it out of the session's eight (evict marks it;
// its relay goes on). When the stream then ends (here the upstream's
// stream breaks and toolgate's own resumption of it fails), the client
// resumes it with Last-Event-ID, as the transport says, and toolgate
// answers 400 ("names no stream this MCP session can resume"): the SDK
// takes a failed reconnection of its standalone stream as the end of the
// connection, and every later call fails. Without the eight calls, the
// same resumption succeeds and the session goes on. Fix: do not count
// streams still being written among the kept ones (see
// TestResume2AttackLiveStreamsPushOutTheOnlyDroppedOne); a standalone
// stream, of which a session has one, need not compete with request
// streams at all.
func TestResume2AttackParallelCallsBreakTheClientsStandaloneStream(t *testing.T) {
	key, _, auth := acctUser("resume2-sdk")
	up := startUpstream(t)
	end := make(chan struct{})
	var resumes atomic.Int32 // resumptions of the standalone stream the upstream got
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet {
			return false
		}
		switch id := r.Header.Get("Last-Event-Id"); {
		case id == "":
			rrSSE(w)
			rrEvent(w, "sa-1", rrNote("standalone"))
			select {
			case <-end: // the upstream's stream breaks
			case <-r.Context().Done():
			}
			return true
		case strings.HasPrefix(id, "sa-"):
			if resumes.Add(1) == 1 {
				// toolgate's own resumption of the broken stream fails:
				// the runner's stream ends.
				http.Error(w, "try again later", http.StatusServiceUnavailable)
				return true
			}
			rrSSE(w)
			<-r.Context().Done()
			return true
		}
		return false
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: auth})
	seen := make(chan struct{}, 1)
	cs := g.connectWith(t, key, g.createSession(t, key, "svc"), "svc", 2, &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			if fmt.Sprint(req.Params.Data) == "standalone" {
				select {
				case seen <- struct{}{}:
				default:
				}
			}
		},
	})
	select {
	case <-seen: // the standalone stream has its event id
	case <-time.After(10 * time.Second):
		t.Fatal("the standalone stream's first event never reached the client")
	}
	// (A first call pins the tool: calls of a tool seen for the first time
	// wait for one another.)
	if text, isErr := toolError(t, cs, "progress", map[string]any{"steps": 1}); isErr {
		t.Fatalf("the first call: %s", text)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 25}})
			if err != nil || res.IsError {
				t.Errorf("parallel call %d: %v %v", i, err, res)
			}
		})
	}
	wg.Wait()
	close(end)
	// The client reconnects its standalone stream (after its retry delay).
	var lastErr string
	for i := 0; i < 40 && resumes.Load() < 2; i++ {
		time.Sleep(250 * time.Millisecond)
		if text, isErr := toolError(t, cs, "echo", map[string]any{"text": "still there"}); isErr {
			lastErr = text
			break
		}
	}
	if text, isErr := toolError(t, cs, "echo", map[string]any{"text": "still there"}); isErr || !strings.Contains(text, "still there") {
		t.Errorf("after eight parallel calls and a drop of its standalone stream, the client's session is broken: %q (first failure: %q; resumptions of the standalone stream that reached the upstream: %d, want 2)",
			text, lastErr, resumes.Load())
	}
}

// Attack: a request answered with toolgate's own error stays resumable,
// keeps its body's room until its deadline, and is cancelled upstream
// twice. When an upstream's stream ends without the answer and
// toolgate's resumption of it fails, relay (modules/mcpproxy/mcpproxy.go)
// writes the runner a final error ("the upstream failed …; the request may
// or may not have run") and sends notifications/cancelled — but only a
// written result marks the stream settled (st.finished()), so release
// finds it resumable: it keeps it in the session, hands its request's body
// room over to it and arms the deadline timer. A runner that got its
// error then resumes the stream and gets a second answer to the same
// request id (here the upstream's late result, for a call toolgate
// cancelled); the 100 KiB body of an answered request stays counted
// against its caller until the call's timeout; and at the deadline,
// expire sends the upstream a second notifications/cancelled ("the client
// did not resume its stream before the call's deadline"). Fix: in relay's
// error path, a final error written to the runner settles the stream
// (st.finished() when writeFinal succeeds), as a result does.
func TestResume2AttackErrorAnswerLeavesTheStreamResumable(t *testing.T) {
	key, _, auth := acctUser("resume2-error")
	up := startUpstream(t)
	var mu sync.Mutex
	gets := map[string]int{}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		switch last := r.Header.Get("Last-Event-Id"); {
		case r.Method == http.MethodPost && strings.Contains(string(body), "resume2-broken"):
			id := rrID(body)
			rrSSE(w)
			rrEvent(w, "brk-"+id+"-1", rrNote("working"))
			return true // the stream ends without the answer
		case r.Method == http.MethodGet && strings.HasPrefix(last, "brk-"):
			mu.Lock()
			gets[last]++
			n := gets[last]
			mu.Unlock()
			if n == 1 {
				// toolgate's own resumption, at once: refused.
				http.Error(w, "not yet", http.StatusInternalServerError)
				return true
			}
			id := strings.TrimSuffix(strings.TrimPrefix(last, "brk-"), "-1")
			rrSSE(w)
			rrEvent(w, "brk-"+id+"-2", fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"late answer"}]}}`, id))
			return true
		}
		return false
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "4s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	call := func(id int, pad string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume2-broken"},"_meta":{"pad":%q}}}`, id, pad)
	}
	// A call with a 100 KiB body, answered with toolgate's error.
	sent := time.Now()
	status, body := acctStatus(t, m, call(2, strings.Repeat("p", 100<<10)))
	if status != http.StatusOK || !strings.Contains(body, `"error"`) || !raHasID(body) {
		t.Fatalf("the call whose upstream stream broke: %d %.500s; want an event id and an error", status, body)
	}
	if now, back := settleBoundGauges(t, g, before, time.Second); !back {
		t.Errorf("the request has its answer (an error), and its body's room stays held: %v (before: %v)", now, before)
	}
	// Another, resumed after its error.
	status, body = acctStatus(t, m, call(1, ""))
	if status != http.StatusOK || !strings.Contains(body, `"error"`) {
		t.Fatalf("the second call: %d %.500s", status, body)
	}
	rstatus, rbody, err := raGet(context.Background(), m, raLastID(body))
	if err != nil || rstatus != http.StatusBadRequest || strings.Contains(rbody, "late answer") {
		t.Errorf("resuming a stream after its error answer: %d %v %.300s; want 400 and no second answer to request 1", rstatus, err, rbody)
	}
	// The first call's deadline passes.
	time.Sleep(time.Until(sent.Add(4*time.Second)) + 2*time.Second)
	if n := rrCancelledFor(up, "2"); n != 1 {
		t.Errorf("the upstream was told %d times to cancel request 2, want once (when toolgate gave up on it): %v", n, raCancelled(up))
	}
	gaugesBackWithin(t, g, before, 3*time.Second)
}

// Attack: a runner whose standalone stream drops and is resumed — as the
// official SDK does, with Last-Event-ID — never gets toolgate's own
// notifications again: an approval decided for it
// (notifications/elicitation/complete) waits on the board for a stream
// that never comes. stream (modules/mcpproxy/stream.go) attaches the
// standalone stream it opens to the notice board; resumeForRunner, which
// continues a standalone stream as any other, relays the upstream's
// events only. The notification waits five minutes for a fresh GET the
// client has no reason to make, and is dropped. Fix: a resumed standalone
// stream (st.call not a request) attaches to h.notices as stream does.
func TestResume2AttackResumedStandaloneStreamGetsNoNotices(t *testing.T) {
	up := startUpstream(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet {
			return false
		}
		rrSSE(w)
		if r.Header.Get("Last-Event-Id") == "" {
			rrEvent(w, "sn-1", rrNote("standalone"))
		}
		<-r.Context().Done()
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals")})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initializeWith(`{"elicitation":{"url":{}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The standalone stream, to its first event; then it drops.
	sctx, scancel := context.WithCancel(ctx)
	resp, err := m.send(sctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the standalone stream: %v %v", err, resp)
	}
	lastID := raLastID(raRead(t, resp.Body, "its first event", func(s string) bool { return strings.Contains(s, "standalone") && raHasID(s) }))
	scancel()
	resp.Body.Close()
	// The client resumes it.
	rresp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", lastID)
	if err != nil || rresp.StatusCode != http.StatusOK {
		t.Fatalf("resuming the standalone stream: %v %v", err, rresp)
	}
	defer rresp.Body.Close()
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		var sb strings.Builder
		for {
			n, err := rresp.Body.Read(b)
			sb.Write(b[:n])
			if strings.Contains(sb.String(), "notifications/elicitation/complete") || err != nil {
				got <- sb.String()
				return
			}
		}
	}()
	// A call that needs an approval; the approval is decided.
	answer := m.call(1, "gated_tool", `{"text":"notice me"}`)
	var a struct {
		Error *struct {
			Code int
			Data struct {
				Elicitations []struct {
					ElicitationID string `json:"elicitationId"`
				}
			}
		}
	}
	if json.Unmarshal(answer, &a) != nil || a.Error == nil || a.Error.Code != -32042 || len(a.Error.Data.Elicitations) != 1 {
		t.Fatalf("want -32042 with the approval's URL, got %s", answer)
	}
	if r := g.decide(t, aliceKey, a.Error.Data.Elicitations[0].ElicitationID, true, "once", ""); r.StatusCode/100 != 2 {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	select {
	case text := <-got:
		if !strings.Contains(text, "notifications/elicitation/complete") {
			t.Errorf("the resumed standalone stream ended without the approval's notification: %.300q", text)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the approval was decided 5s ago and the runner's (resumed) standalone stream never got notifications/elicitation/complete")
	}
}

// Attack: an upstream makes toolgate hold 64 of its events' worth of
// memory per stream, uncounted, for as long as the stream lives or is kept
// (its call's deadline): runnerStream.id (modules/mcpproxy/resume.go)
// records the upstream's event id of every event it relays, in a window of
// the last 64 (resumeWindow), and an event id is bounded only by
// max_response_size, like the whole event. Here one call's events carry
// 1 MiB ids and a small notification each (the runner reads toolgate's
// short ids, nothing large): 64 MiB stay in memory while the stream is
// open, and after the runner drops it, until its deadline, while the
// bounds' gauges show nothing of it. With the default 16 MiB
// max_response_size, one stream holds 1 GiB, and a session keeps eight.
// Fix: bound what an upstream event id may hold (refuse or do not record
// ids longer than a few hundred bytes: such an event gets no id, and the
// stream cannot be resumed past it), or bound the window's bytes.
func TestResume2AttackUpstreamEventIDsHeldUncounted(t *testing.T) {
	key, _, auth := acctUser("resume2-ids")
	up := startUpstream(t)
	id := strings.Repeat("i", 1<<20)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Method != http.MethodPost || !strings.Contains(string(body), "resume2-ids") {
			return false
		}
		rrSSE(w)
		for i := 1; i <= 64; i++ {
			rrEvent(w, fmt.Sprintf("%d-%s", i, id), rrNote(fmt.Sprintf("note %d.", i)))
		}
		<-r.Context().Done()
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "30s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	g1, h1 := readBoundGauges(t, g), acctHeap()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	rctx, rcancel := context.WithCancel(ctx)
	resp, err := m.send(rctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume2-ids"}}}`, "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the call: %v %v", err, resp)
	}
	text := raRead(t, resp.Body, "the 64th event", func(s string) bool { return strings.Contains(s, "note 64.") })
	if len(text) > 64<<10 {
		t.Fatalf("the runner read %d bytes: the upstream's ids reached it", len(text))
	}
	g2, h2 := readBoundGauges(t, g), acctHeap()
	rcancel()
	resp.Body.Close()
	time.Sleep(300 * time.Millisecond) // the stream is kept for its runner to resume
	g3, h3 := readBoundGauges(t, g), acctHeap()
	for _, at := range []struct {
		when  string
		g     boundGauges
		grown int64
	}{{"while the stream is open", g2, int64(h2) - int64(h1)}, {"once the runner dropped it", g3, int64(h3) - int64(h1)}} {
		counted := int64(at.g.bytes - g1.bytes)
		if at.grown-counted > 24<<20 {
			t.Errorf("%s, %d MiB more are in use for one call whose events the runner got as a few KiB, and the gauge counts %d bytes more (%v, was %v): the upstream's event ids are kept",
				at.when, at.grown>>20, counted, at.g, g1)
		}
	}
	endMCPSession(t, m)
}

// ---- holds -----------------------------------------------------------------

// Holds: an honest runner whose stream drops twice — once on its POST,
// once on the resume — and that resumes it again gets everything after
// its last event, the answer exactly once, and its call is never
// cancelled upstream; three such calls leave no stream place, no body
// room and no goroutine behind (the kept streams' deadline timers and
// session watches go with them).
func TestResume2HoldsResumedStreamAnsweredOnceNothingLeaks(t *testing.T) {
	key, _, auth := acctUser("resume2-honest")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	base := rrGoroutines(g, up)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	pad := strings.Repeat("p", 16<<10)
	for round := 1; round <= 3; round++ {
		id := 100 + round
		lastID, _ := acctOpenUntil(t, m, raProgressCall(id, 30, pad), `"progress":2,`)
		rctx, rcancel := context.WithCancel(ctx)
		resp, err := m.send(rctx, http.MethodGet, "text/event-stream", "", lastID)
		if err != nil || resp.StatusCode != http.StatusOK {
			rcancel()
			t.Fatalf("round %d, the first resume: %v %v", round, err, resp)
		}
		text := raRead(t, resp.Body, "progress 5", func(s string) bool { return strings.Contains(s, `"progress":5,`) })
		if rrResults(text) != 0 || !strings.Contains(text, `"progress":3,`) {
			t.Errorf("round %d, the first resume: %.500q; want progress 3 to 5 and no answer yet", round, text)
		}
		lastID = raLastID(text)
		rcancel()
		resp.Body.Close()
		status, body, err := raGet(ctx, m, lastID)
		if err != nil || status != http.StatusOK {
			t.Fatalf("round %d, the second resume: %d %v %.300s", round, status, err, body)
		}
		if n := rrResults(body); n != 1 || !strings.Contains(body, `"text":"done"`) || !strings.Contains(body, `"progress":30,`) || strings.Contains(body, `"progress":4,`) {
			t.Errorf("round %d, the second resume: %d answers in %.800q; want progress 5 (or 6) to 30 and the answer once", round, n, body)
		}
		if status, body, _ := raGet(ctx, m, lastID); status != http.StatusBadRequest {
			t.Errorf("round %d, resuming after the answer: %d %.300s, want 400", round, status, body)
		}
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
	if n, back := rrGoroutinesBack(g, up, base); !back {
		t.Errorf("%d goroutines run after three resumed calls ended, %d before", n, base)
	}
}

// Holds: a resumed stream carries the progress of its own call (whose
// request ended when the stream dropped), and no other: an upstream that
// writes, on the resumed stream, progress about another caller's request
// in progress, and about a request of the same runner that is over, gets
// neither to the runner.
func TestResume2HoldsResumedStreamCarriesOnlyItsOwnProgress(t *testing.T) {
	aliceK, _, aliceAuth := acctUser("resume2-own")
	bobK, _, bobAuth := acctUser("resume2-other")
	up := startUpstream(t)
	var callID atomic.Value
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		switch {
		case r.Method == http.MethodPost && strings.Contains(string(body), "resume2-own"):
			callID.Store(rrID(body))
			rrSSE(w)
			rrEvent(w, "own-1", rrProgressNote(`"own-tok"`, 1))
			<-r.Context().Done()
			return true
		case r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") == "own-1":
			id, _ := callID.Load().(string)
			rrSSE(w)
			rrEvent(w, "own-2", rrProgressNote(`"bob-live"`, 1))
			rrEvent(w, "own-3", rrProgressNote(`"ended-tok"`, 1))
			rrEvent(w, "own-4", rrProgressNote(`"own-tok"`, 2))
			rrEvent(w, "own-5", fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"own answer"}]}}`, id))
			return true
		}
		return false
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: aliceAuth + "\n" + bobAuth})
	alice := acctRunner(t, g, aliceK)
	bob := acctRunner(t, g, bobK)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Alice's earlier call, over.
	if status, body := acctStatus(t, alice, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"progress","arguments":{"steps":2},"_meta":{"progressToken":"ended-tok"}}}`); status != http.StatusOK || !strings.Contains(body, "done") {
		t.Fatalf("alice's earlier call: %d %.300s", status, body)
	}
	// Bob's call, in progress.
	bresp, err := bob.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"progress","arguments":{"steps":150},"_meta":{"progressToken":"bob-live"}}}`, "")
	if err != nil || bresp.StatusCode != http.StatusOK {
		t.Fatalf("bob's call: %v %v", err, bresp)
	}
	defer bresp.Body.Close()
	raRead(t, bresp.Body, "bob's first progress", func(s string) bool { return strings.Contains(s, `"progress":1,`) })
	// Alice's call, dropped at its first progress, then resumed.
	lastID, _ := acctOpenUntil(t, alice, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume2-own"},"_meta":{"progressToken":"own-tok"}}}`, `"progress":1`)
	status, body, err := raGet(ctx, alice, lastID)
	if err != nil || status != http.StatusOK || !strings.Contains(body, "own answer") {
		t.Fatalf("resuming alice's call: %d %v %.500s", status, err, body)
	}
	if !strings.Contains(body, `"progressToken":"own-tok","progress":2`) {
		t.Errorf("the resumed stream lacks its own call's progress: %.800q", body)
	}
	for _, foreign := range []string{"bob-live", "ended-tok"} {
		if strings.Contains(body, foreign) {
			t.Errorf("the resumed stream carries progress on %q, of no request of its runner in progress: %.800q", foreign, body)
		}
	}
}

// Holds: ending an MCP session (DELETE) while a request's relay and a
// resume's relay write its streams ends both at once — the request's
// runner is told the session ended — with nothing cancelled upstream (the
// upstream session is ended instead), every place, room and goroutine
// given back, and the stream no longer resumable (404: the session is
// gone).
func TestResume2HoldsSessionEndStopsRelayAndResume(t *testing.T) {
	key, _, auth := acctUser("resume2-end")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	base := rrGoroutines(g, up)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pad := strings.Repeat("p", 32<<10)
	// A call read as it goes.
	live, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", raProgressCall(1, 400, pad), "")
	if err != nil || live.StatusCode != http.StatusOK {
		t.Fatalf("the live call: %v %v", err, live)
	}
	defer live.Body.Close()
	raRead(t, live.Body, "its first progress", func(s string) bool { return strings.Contains(s, `"progress":1,`) })
	liveEnd := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(live.Body)
		liveEnd <- string(b)
	}()
	// A call dropped and resumed.
	lastID, _ := acctOpenUntil(t, m, raProgressCall(2, 400, pad), `"progress":1,`)
	resumed, err := m.send(ctx, http.MethodGet, "text/event-stream", "", lastID)
	if err != nil || resumed.StatusCode != http.StatusOK {
		t.Fatalf("the resume: %v %v", err, resumed)
	}
	defer resumed.Body.Close()
	raRead(t, resumed.Body, "a progress of the resumed call", func(s string) bool { return strings.Contains(s, `"progress":3,`) })
	resumedEnd := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(resumed.Body)
		resumedEnd <- string(b)
	}()
	if status := m.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	for name, ch := range map[string]chan string{"the live call's stream": liveEnd, "the resumed stream": resumedEnd} {
		select {
		case rest := <-ch:
			if strings.Contains(rest, `"text":"done"`) {
				t.Errorf("%s went on to its answer after its session ended", name)
			}
			if name == "the live call's stream" && !strings.Contains(rest, "the MCP session was ended") {
				t.Errorf("%s ended without telling the runner: %.300q", name, rest[max(0, len(rest)-300):])
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s did not end with its session", name)
		}
	}
	if status, body, _ := raGet(ctx, m, lastID); status != http.StatusNotFound {
		t.Errorf("resuming a stream of the ended session: %d %.300s, want 404", status, body)
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
	if n, back := rrGoroutinesBack(g, up, base); !back {
		t.Errorf("%d goroutines run after the session ended, %d before", n, base)
	}
}

// Holds: the standalone stream (no deadline, no call to cancel) is kept
// when it drops and resumed as often as the runner likes; pushed out by
// eight newer streams it is refused (400) and nothing is sent upstream for
// it; none of it leaves a goroutine, a place or room behind once the
// session ends.
func TestResume2HoldsStandaloneStreamKeptAndForgotten(t *testing.T) {
	key, _, auth := acctUser("resume2-standalone")
	up := startUpstream(t)
	var n atomic.Int32
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if last := r.Header.Get("Last-Event-Id"); r.Method != http.MethodGet || last != "" && !strings.HasPrefix(last, "sa-") {
			return false
		}
		k := n.Add(1)
		rrSSE(w)
		rrEvent(w, fmt.Sprintf("sa-%d", k), rrNote(fmt.Sprintf("standalone %d", k)))
		<-r.Context().Done()
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	base := rrGoroutines(g, up)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	openUntil := func(lastEventID string) string {
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		resp, err := m.send(sctx, http.MethodGet, "text/event-stream", "", lastEventID)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the standalone stream (Last-Event-ID %q): %v %v", lastEventID, err, resp)
		}
		defer resp.Body.Close()
		return raLastID(raRead(t, resp.Body, "its event", func(s string) bool { return strings.Contains(s, "standalone") && raHasID(s) }))
	}
	id := openUntil("")
	for range 3 {
		id = openUntil(id) // dropped, resumed, dropped again
	}
	for i := 1; i <= 8; i++ {
		acctOpenUntil(t, m, raProgressCall(i, 60, ""), `"progress":1,`)
	}
	// The gateway sees each drop on its own time: the resume waits until
	// no relay writes any of the streams.
	for end := time.Now().Add(5 * time.Second); readBoundGauges(t, g).streams > before.streams && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if status, body, _ := raGet(ctx, m, id); status != http.StatusBadRequest {
		t.Errorf("resuming the standalone stream pushed out by eight newer ones: %d %.300s, want 400", status, body)
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
	endMCPSession(t, m)
	gaugesBackWithin(t, g, before, 5*time.Second)
	if n, back := rrGoroutinesBack(g, up, base); !back {
		t.Errorf("%d goroutines run after the session ended, %d before", n, base)
	}
}

// Holds: a resume superseded while it waits for the upstream's answer to
// its resumption is refused (400, "another request resumed this stream"),
// the later resume gets the rest of the stream and the answer, the call is
// never cancelled, and nothing is left held.
func TestResume2HoldsResumeSupersededWhileConnecting(t *testing.T) {
	key, _, auth := acctUser("resume2-superseded")
	up := startUpstream(t)
	var gets atomic.Int32
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet || r.Header.Get("Last-Event-Id") == "" {
			return false
		}
		if gets.Add(1) == 1 {
			<-r.Context().Done() // the first resumption hangs
			return true
		}
		return false // the upstream's event store replays the rest
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	lastID, _ := acctOpenUntil(t, m, raProgressCall(1, 40, strings.Repeat("p", 16<<10)), `"progress":1,`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		status int
		body   string
	}
	first := make(chan result, 1)
	go func() {
		status, body, _ := raGet(ctx, m, lastID)
		first <- result{status, body}
	}()
	for i := 0; gets.Load() == 0; i++ {
		if i == 100 {
			t.Fatal("the first resume never reached the upstream")
		}
		time.Sleep(50 * time.Millisecond)
	}
	status, body, err := raGet(ctx, m, lastID)
	if err != nil || status != http.StatusOK || rrResults(body) != 1 || !strings.Contains(body, `"text":"done"`) {
		t.Errorf("the later resume: %d %v %.500s; want the rest and the answer once", status, err, body)
	}
	select {
	case res := <-first:
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, "another request resumed this stream") {
			t.Errorf("the superseded resume: %d %.300s; want 400", res.status, res.body)
		}
	case <-time.After(10 * time.Second):
		t.Error("the superseded resume got no answer")
	}
	if c := raCancelled(up); len(c) != 0 {
		t.Errorf("the upstream was told to cancel %v", c)
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: a dropped stream pushed out by a ninth has its call cancelled
// upstream at once — long before its deadline — and gives its body's
// room back; the eight kept are not cancelled, and ending the session
// gives theirs back.
func TestResume2HoldsEvictedDroppedStreamCancelledAtOnce(t *testing.T) {
	key, _, auth := acctUser("resume2-evict")
	up := startUpstream(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodDelete {
			return false
		}
		w.WriteHeader(http.StatusNoContent) // at once (the go-sdk waits for the session's calls)
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "60s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	pad := strings.Repeat("p", 64<<10)
	for i := 1; i <= 9; i++ {
		acctOpenUntil(t, m, raWaitCall(500+i, pad), "")
	}
	if !rrAwaitCancel(up, "501", 3*time.Second) {
		t.Errorf("the oldest dropped stream was pushed out by a ninth, and its call was not cancelled upstream (cancelled: %v)", raCancelled(up))
	}
	if c := raCancelled(up); len(c) > 1 {
		t.Errorf("the upstream was told to cancel %v; want only 501", c)
	}
	mid := readBoundGauges(t, g)
	if mid.bytes > before.bytes+8*(65<<10) || mid.bytes < before.bytes+8*(64<<10) {
		t.Errorf("with eight dropped streams of 64 KiB requests kept and one pushed out: %v (before: %v)", mid, before)
	}
	endMCPSession(t, m)
	gaugesBackWithin(t, g, before, 5*time.Second)
}

// Holds: a kept stream's call, cancelled at its deadline after its MCP
// session was re-initialized upstream (the upstream forgot the session
// the call was sent in), is cancelled in the upstream session it was sent
// in — never in the new one, where the same request id could name another
// call.
func TestResume2HoldsCancelGoesToTheCallsUpstreamSession(t *testing.T) {
	key, _, auth := acctUser("resume2-reinit")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "3s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	_, sent := acctOpenUntil(t, m, raWaitCall(7, ""), "")
	sessionOf := func(match func(upstreamRequest) bool) string {
		for _, r := range up.requestLog() {
			if match(r) {
				return r.Header.Get("Mcp-Session-Id")
			}
		}
		return ""
	}
	first := sessionOf(func(r upstreamRequest) bool { return strings.Contains(r.Body, `"name":"wait"`) })
	up.reset() // the upstream forgets its sessions
	if status, body := acctStatus(t, m, acctPing(8, 0)); status != http.StatusOK {
		t.Fatalf("a ping after the upstream forgot the session: %d %.300s", status, body)
	}
	second := sessionOf(func(r upstreamRequest) bool {
		return strings.Contains(r.Body, `"id":8`) && strings.Contains(r.Body, `"ping"`) && r.Header.Get("Mcp-Session-Id") != first
	})
	if first == "" || second == "" || first == second {
		t.Fatalf("upstream sessions: %q, then %q", first, second)
	}
	if !rrAwaitCancel(up, "7", time.Until(sent.Add(3*time.Second))+3*time.Second) {
		t.Fatalf("the kept stream's call was never cancelled at its deadline")
	}
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"notifications/cancelled"`) && strings.Contains(r.Body, `"requestId":7`) {
			if got := r.Header.Get("Mcp-Session-Id"); got != first {
				t.Errorf("the call sent in upstream session %q was cancelled in %q (the new one: %q)", first, got, second)
			}
		}
	}
	gaugesBackWithin(t, g, before, 5*time.Second)
}
