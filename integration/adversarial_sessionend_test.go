// Tests whose comment starts with "Attack" reproduce a flaw (they fail until it is fixed); those whose comment starts with "Holds" check an attack that toolgate withstands.
package integration

// Adversarial suite for the end of a toolgate session (DELETE
// /v1/sessions/{id}, or its expiry): what a runner holds open in the
// session — streams, calls in progress, calls held between rounds or for
// an approval — must not go on receiving upstream data or keep an
// upstream exchange running once the session is over (README, "HTTP API":
// "the streams its runners hold open … end within 2 s on every replica";
// "Approvals": "An approved call runs only if its toolgate session is
// still live").

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ---- helpers ---------------------------------------------------------------

// seUpstream is a go-sdk upstream (earlier revisions, resumable streams)
// whose "drip" tool reports progress ("DRIP") every 200 ms until it is
// cancelled, and whose "ask" tool asks its client (elicitation/create) and
// waits for the answer. stopped is closed when such a call's context ends
// (the go-sdk server cancels it on notifications/cancelled); closing quit
// ends every call on its own (a test's cleanup), as does a minute passing.
type seUpstream struct {
	*upstream
	stopped chan struct{}
	quit    chan struct{}
	once    sync.Once
}

func seStartUpstream(t *testing.T) *seUpstream {
	t.Helper()
	s := &seUpstream{stopped: make(chan struct{}), quit: make(chan struct{})}
	s.upstream = startUpstreamServer(t, nil, func(*upstream) *mcp.Server {
		srv := mcp.NewServer(&mcp.Implementation{Name: "drip", Version: "1"}, nil)
		readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
		mcp.AddTool(srv, &mcp.Tool{Name: "drip", Description: "Reports progress until cancelled.", Annotations: readOnly},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				token := req.Params.GetProgressToken()
				tick := time.NewTicker(200 * time.Millisecond)
				defer tick.Stop()
				limit := time.NewTimer(time.Minute)
				defer limit.Stop()
				for i := 1; ; i++ {
					select {
					case <-ctx.Done():
						s.once.Do(func() { close(s.stopped) })
						return nil, nil, ctx.Err()
					case <-s.quit:
						return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "dripped"}}}, nil, nil
					case <-limit.C:
						return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "dripped"}}}, nil, nil
					case <-tick.C:
						if token != nil {
							_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: float64(i), Message: "DRIP"})
						}
					}
				}
			})
		mcp.AddTool(srv, &mcp.Tool{Name: "ask", Description: "Asks its client, then answers.", Annotations: readOnly},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				ectx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				go func() {
					select {
					case <-s.quit:
						cancel()
					case <-ectx.Done():
					}
				}()
				_, err := req.Session.Elicit(ectx, &mcp.ElicitParams{Message: "proceed?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}})
				if ctx.Err() != nil {
					s.once.Do(func() { close(s.stopped) })
				}
				text := "answered"
				if err != nil {
					text = "not answered: " + err.Error()
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
			})
		return srv
	})
	return s
}

// toldToStop waits up to within for the upstream to be told to stop the
// calls of the test: a call's context ended (notifications/cancelled), or
// toolgate sent notifications/cancelled or ended the upstream session
// (DELETE; the go-sdk server lets a call in progress run on then, but
// toolgate gave it up).
func (s *seUpstream) toldToStop(within time.Duration) bool {
	bound := time.After(within)
	for {
		for _, r := range s.requestLog() {
			if r.Method == http.MethodDelete || strings.Contains(r.Body, "notifications/cancelled") {
				return true
			}
		}
		select {
		case <-s.stopped:
			return true
		case <-bound:
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// seEvent is one SSE event a runner read.
type seEvent struct{ id, data string }

// seEvents reads the SSE events of body as they come, on a channel closed
// when the stream ends.
func seEvents(body io.Reader) <-chan seEvent {
	out := make(chan seEvent, 1024)
	go func() {
		defer close(out)
		br := bufio.NewReader(body)
		var ev seEvent
		for {
			line, err := br.ReadString('\n')
			line = strings.TrimRight(line, "\r\n")
			switch {
			case strings.HasPrefix(line, "id:"):
				ev.id = strings.TrimSpace(line[len("id:"):])
			case strings.HasPrefix(line, "data:"):
				ev.data = strings.TrimSpace(line[len("data:"):])
			case line == "" && err == nil:
				if ev.data != "" {
					out <- ev
				}
				ev = seEvent{}
			}
			if err != nil {
				return
			}
		}
	}()
	return out
}

// seWaitFor reads events until one containing want (returned), failing t
// when the stream ends or within passes first.
func seWaitFor(t *testing.T, events <-chan seEvent, want string, within time.Duration) seEvent {
	t.Helper()
	bound := time.After(within)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the stream ended before carrying %q", want)
			}
			if strings.Contains(ev.data, want) {
				return ev
			}
		case <-bound:
			t.Fatalf("no event with %q within %s", want, within)
		}
	}
}

// seEnds waits up to within for the stream to end and reports whether it
// did, and how many events containing count it carried meanwhile.
func seEnds(events <-chan seEvent, count string, within time.Duration) (ended bool, carried int) {
	bound := time.After(within)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return true, carried
			}
			if strings.Contains(ev.data, count) {
				carried++
			}
		case <-bound:
			return false, carried
		}
	}
}

// seOpenStream opens r's standalone stream, trying again while the
// upstream still holds the stream's previous connection (HTTP 409: a
// go-sdk server lets it go as soon as it notices it closed).
func seOpenStream(t *testing.T, r *rawMCP, ctx context.Context) (*http.Response, string) {
	t.Helper()
	for range 50 {
		get, body := r.openStream(t, ctx)
		if get.StatusCode != http.StatusConflict && !strings.Contains(body, "HTTP 409") {
			return get, body
		}
		time.Sleep(100 * time.Millisecond)
	}
	return r.openStream(t, ctx)
}

// seEndSession ends the toolgate session through the API.
// seStart starts the dripping upstream and a gateway in front of it
// (service timeout 120 s, so nothing ends by timing out within a test),
// with alice's toolgate session of it.
func seStart(t *testing.T) (*seUpstream, *gateway, string) {
	up := seStartUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "drip ask", Timeout: "120s", RequestPolicy: aaPolicies(t, "", "")})
	t.Cleanup(func() { close(up.quit) }) // first: the upstream's handlers return before the gateway stops
	return up, g, g.createSession(t, aliceKey, "svc")
}

// seEndWhileDripping ends alice's toolgate session while the upstream drips
// notifications on events (stream names it in the failure), and expects
// the stream to end and the upstream to be told to stop, within 15 s each.
func seEndWhileDripping(t *testing.T, up *seUpstream, g *gateway, session string, events <-chan seEvent, stream, notStopped string) {
	t.Helper()
	seWaitFor(t, events, "DRIP", 15*time.Second)
	seEndSession(t, g, aliceKey, session)
	if ended, carried := seEnds(events, "DRIP", 15*time.Second); !ended {
		t.Fatalf("15 s after its toolgate session was ended, %s is still open and carried %d more upstream notifications", stream, carried)
	}
	if !up.toldToStop(15 * time.Second) {
		t.Fatal(notStopped)
	}
}

func seEndSession(t *testing.T, g *gateway, key, session string) {
	t.Helper()
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+session, key, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending the session: %d %s", r.StatusCode, r.Body)
	}
}

// seDripCall is the body of a tools/call of drip with a progress token.
const seDripCall = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"drip","arguments":{},"_meta":{"progressToken":"p1"}}}`

// ---- attacks ---------------------------------------------------------------

// Attack: a runner's call in progress is a stream it holds open as much as
// its GET stream is: the upstream's tool here reports progress every
// 200 ms for as long as it runs, and the service's timeout is 120 s. The
// runner's person ends its toolgate session (DELETE /v1/sessions/{id}).
// Only GET streams and stateless listens ended with their session
// (a watch in mcpproxy.ServeHTTP), so the call's SSE answer stays open and goes on
// carrying the upstream's notifications, and the upstream call goes on,
// until the service timeout. It should end within a few session checks
// (15 s allowed here), and the upstream be told to stop the call.
func TestSessionEndAttackCallStreamOutlivesSession(t *testing.T) {
	up, g, session := seStart(t)
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", seDripCall, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("the call: HTTP %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := seEvents(resp.Body)
	seEndWhileDripping(t, up, g, session, events, "the call's stream", "the call's stream ended, but the upstream call of the ended session was not told to stop")
}

// Attack: a runner drops its call's stream and resumes it with GET and
// Last-Event-ID (the resumed GET ended with the session).
// Once the person ended the toolgate session, nobody can resume the call
// again (every request of the session gets 403), yet toolgate keeps the
// call's stream for resumption and the upstream call running until the
// service timeout (120 s here): "a call whose stream is forgotten
// unanswered is cancelled upstream: nobody can have its answer any more"
// is applied to the MCP session's end, not the toolgate session's. The
// upstream should be told (notifications/cancelled, or a DELETE of its
// session) to stop the call within a few session checks (15 s allowed).
func TestSessionEndAttackResumedCallKeepsRunningUpstream(t *testing.T) {
	up, g, session := seStart(t)
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	postCtx, dropPost := context.WithTimeout(context.Background(), 90*time.Second)
	defer dropPost()
	resp, err := m.send(postCtx, http.MethodPost, "application/json, text/event-stream", seDripCall, "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the call: HTTP %d", resp.StatusCode)
	}
	events := seEvents(resp.Body)
	var last seEvent
	for last.id == "" {
		last = seWaitFor(t, events, "DRIP", 15*time.Second)
	}
	dropPost() // the runner loses the stream
	resp.Body.Close()
	for range events {
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var get *http.Response
	for range 50 { // the relay that wrote the dropped stream lets it go
		if get, err = m.send(ctx, http.MethodGet, "text/event-stream", "", last.id); err != nil {
			t.Fatal(err)
		}
		if get.StatusCode == http.StatusOK {
			break
		}
		get.Body.Close()
		time.Sleep(100 * time.Millisecond)
	}
	if get.StatusCode != http.StatusOK {
		t.Fatalf("resuming the call's stream: HTTP %d", get.StatusCode)
	}
	defer get.Body.Close()
	resumed := seEvents(get.Body)
	seEndWhileDripping(t, up, g, session, resumed, "the resumed stream", "the resumed stream ended with its toolgate session, but 15 s later the upstream was not told to stop the call: toolgate keeps it for a resumption that the ended session can no longer make")
}

// Attack: a stateless runner (2026-07-28) calls a tool that asks its
// client something; toolgate holds the upstream call between rounds
// (input_required, a sealed requestState), keeping the upstream request
// open and one of the caller's stream places, "until it is continued or
// given up", at most the service timeout (120 s here). The person ends the
// toolgate session: the retry can never come (403), yet the held call
// stays, its upstream request open and waiting, and toolgate_streams_open
// does not come back. It should be given up (the upstream told to stop)
// within a few session checks (15 s allowed).
func TestSessionEndAttackHeldStatelessCallOutlivesSession(t *testing.T) {
	up, g, session := seStart(t)
	before := readBoundGauges(t, g)
	status, msg := saSend(t, g, "/v1/mcp/svc", aliceKey, session, "tools/call", "ask", saCall(1, "ask", `{}`, `{"elicitation":{}}`, ""), nil)
	if res := aaResult(msg); status != http.StatusOK || res["resultType"] != "input_required" {
		t.Fatalf("the stateless call: %d %s, want input_required", status, aaJSON(msg))
	}
	if held := readBoundGauges(t, g); held.streams <= before.streams {
		t.Fatalf("the held call keeps no stream place (%s, before %s)", held, before)
	}
	seEndSession(t, g, aliceKey, session)
	if !up.toldToStop(15 * time.Second) {
		t.Fatalf("15 s after its toolgate session was ended, the call held between rounds still keeps its upstream request open (%s, before %s)",
			readBoundGauges(t, g), before)
	}
	if now, ok := settleBoundGauges(t, g, before, 15*time.Second); !ok {
		t.Fatalf("the held call of the ended session still keeps its stream place: %s, before %s", now, before)
	}
}

// Attack: an anonymous caller (auth anonymous, loopback only) has a
// session that is not stored: its streams are rightly left open
// (Session.Stored). But a call it holds for an approval (approval_wait)
// checks its session as a stored one when the approval comes
// (policy.sessionEnded reads Sessions().Get("anonymous")), finds none, and
// refuses the approved call with "the toolgate session ended while the
// call waited" — the approved call never runs. Here alice (the anonymous
// user) approves her own held call with her API key; the call should run.
func TestSessionEndAttackAnonymousApprovedCallRefused(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 20s",
		AuthExtra: "anonymous " + alice})
	m := g.raw(t, "", "", "svc")
	delete(m.headers, "Authorization")
	delete(m.headers, "X-Toolgate-Session")
	m.initialize()
	stream := m.sseCall(1, "gated_tool", `{"text":"anonymous approved hold"}`)
	id := aaPendingOf(t, g, aliceKey, "anonymous approved hold")
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("alice approving her anonymous call: %d %s", r.StatusCode, r.Body)
	}
	var last json.RawMessage
	for msg := range stream {
		last = msg
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 || !strings.Contains(string(last), "anonymous approved hold") {
		t.Fatalf("an anonymous caller's held call, approved, did not run (the upstream saw %d calls); its answer: %s", n, last)
	}
}

// ---- attacks that hold -----------------------------------------------------

// Holds: a session that expires (session_ttl 6s) ends the streams its
// runners hold open like one its person ended: the standalone GET stream
// of a runner that initialized, and a stateless listen. Both end within a
// few session checks after the expiry (25 s allowed from the start).
func TestSessionEndHoldsExpiryEndsStreams(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "session_ttl 6s"})
	session := g.createSession(t, aliceKey, "svc")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	ended := openSessionStreams(t, ctx, g, session)
	for range 2 {
		select {
		case name := <-ended:
			t.Logf("%s ended", name)
		case <-ctx.Done():
			t.Fatal("a stream of the expired session stays open")
		}
	}
}

// Holds: a runner of an earlier revision in front of an upstream of the
// stateless revision only gets its GET stream translated
// (subscriptions/listen upstream); that stream ends with the toolgate
// session too, and afterwards the MCP session cannot be used in any way:
// with the ended session's header, without a session header (an implied
// session does not adopt it), nor by resuming a stream (all 403).
func TestSessionEndHoldsTranslatedStreamAndMCPSession(t *testing.T) {
	up := startModernOnlyUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm progress add_tool late_tool"})
	session := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	get, body := m.openStream(t, ctx)
	if get.StatusCode != http.StatusOK {
		t.Fatalf("the translated stream: HTTP %d %s", get.StatusCode, body)
	}
	ended := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, get.Body)
		close(ended)
	}()
	seEndSession(t, g, aliceKey, session)
	select {
	case <-ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the translated stream of the ended session stays open")
	}
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after the end"}}}`
	if status, _, msgs := m.post(call); status != http.StatusForbidden {
		t.Errorf("a call with the ended session's header: %d %s, want 403", status, msgs)
	}
	bare := g.raw(t, aliceKey, "", "svc")
	delete(bare.headers, "X-Toolgate-Session")
	bare.sessionID = m.sessionID
	// The MCP session ended with its toolgate session (404: initialize
	// anew), or is refused to a runner without the session (403).
	if status, _, msgs := bare.post(call); status != http.StatusForbidden && status != http.StatusNotFound {
		t.Errorf("a call in the MCP session without a session header: %d %s, want 403 or 404", status, msgs)
	}
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "x.1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("resuming a stream of the ended session: %d, want 403", resp.StatusCode)
	}
	if n := len(up.seen("after the end")); n != 0 {
		t.Errorf("the upstream saw %d calls made after the session ended", n)
	}
}

// Holds: the session check ends only stored sessions' streams. An
// anonymous caller's GET stream and an implied session's GET stream stay
// open over several session checks (7 s), while a stored session's stream
// beside them is ended with its session; and opening and closing 30
// streams leaves no goroutines behind.
func TestSessionEndHoldsUnstoredStreamsStayAndNothingLeaks(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, AuthExtra: "anonymous " + bob})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Leaks: 30 streams opened and closed.
	session := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	_, goroutinesBefore := inUse()
	for range 30 {
		sctx, scancel := context.WithCancel(ctx)
		get, body := seOpenStream(t, m, sctx)
		if get.StatusCode != http.StatusOK {
			scancel()
			t.Fatalf("a standalone stream: HTTP %d %s", get.StatusCode, body)
		}
		scancel()
		get.Body.Close()
	}
	settled := false
	var goroutinesAfter int
	for range 75 {
		if _, goroutinesAfter = inUse(); goroutinesAfter <= goroutinesBefore+5 {
			settled = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !settled {
		t.Errorf("after 30 streams opened and closed, %d goroutines remain (%d before)", goroutinesAfter, goroutinesBefore)
	}

	// Unstored sessions' streams stay.
	implied := g.raw(t, aliceKey, "", "svc")
	delete(implied.headers, "X-Toolgate-Session")
	implied.initialize()
	anonymous := g.raw(t, "", "", "svc")
	delete(anonymous.headers, "Authorization")
	delete(anonymous.headers, "X-Toolgate-Session")
	anonymous.initialize()
	ended := make(chan string, 3)
	for name, r := range map[string]*rawMCP{"the implied session's stream": implied, "the anonymous caller's stream": anonymous, "the stored session's stream": m} {
		get, body := seOpenStream(t, r, ctx)
		if get.StatusCode != http.StatusOK {
			t.Fatalf("%s: HTTP %d %s", name, get.StatusCode, body)
		}
		go func() {
			_, _ = io.Copy(io.Discard, get.Body)
			ended <- name
		}()
	}
	seEndSession(t, g, aliceKey, session)
	select {
	case name := <-ended:
		if name != "the stored session's stream" {
			t.Fatalf("%s ended with another session", name)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the stored session's stream stays open after its session ended")
	}
	select {
	case name := <-ended:
		t.Fatalf("%s was ended by the session check", name)
	case <-time.After(7 * time.Second):
	}
}
