package sse

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Attack (fixed): a legacy server answers a call on its stream at once,
// then answers the POST that carried it with 202 and a body it keeps open
// (a byte, then nothing: a broken framework's chunked answer, or a server
// that wants calls to hang). The MCP Go SDK's client closed the POST's
// body unread once its status arrived; toolgate read up to 4 KiB of it to
// reuse the connection, with no bound in time, so the call waited for the
// body — the whole of the caller's time — though its answer was there.
// Expected: the answer reaches the runner at once. Reproduced: the call
// came back only when its context ended (3 s here; the service's whole
// timeout in toolgate, see TestR16LegacyPostBodyKeptOpenHoldsTheAnswer).
// Severity: low (availability; a server can stall its own calls, but here
// even a server that answered them).
func TestR16PostBodyKeptOpenHoldsTheAnswer(t *testing.T) {
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		s.send(r16Answer(m))
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, "A")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	})
	rt := reviewRuntime(t, l.port)
	sid := r16Open(t, rt, "alice")
	start := time.Now()
	msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, 3*time.Second)
	took := time.Since(start)
	if err != nil || len(msgs) != 1 || !strings.Contains(msgs[0], `"text":"answered"`) {
		t.Errorf("the call got %q, %v; want its answer", msgs, err)
	}
	if took > time.Second {
		t.Errorf("the call took %v: it waited for the POST's body, not for its answer", took)
	}
}

// Attack (fixed): a runner's initialize is in progress (the legacy server
// takes its time to answer it) when a config reload changes the service:
// Caddy stops the old config without waiting for its requests during a
// reload, and cleans it up, so the service's runtime is destructed
// (bridge.Close ends the sessions it holds) while Open still waits. The
// initialize then succeeded on the destructed runtime: its session was
// held by a bridge nobody reaches any more (its idle sweep stopped, the
// runner's next request goes to the new config's runtime), so its GET
// stream, goroutine and read buffer stayed until the server hung up — a
// leak per reload and initialize in flight, and a session the server
// keeps for a client that is gone. Expected: the initialize fails
// retryably and its stream is closed, as Destruct promises ("ends every
// session's stream"). Reproduced: initialize answered with a session id,
// the GET stayed open. Severity: low (resource leak needing reloads).
func TestR16DestructDuringOpenLeavesItsStream(t *testing.T) {
	got, release := make(chan struct{}, 1), make(chan struct{})
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "initialize" {
			return false
		}
		got <- struct{}{}
		<-release
		s.send(r16Answer(m))
		w.WriteHeader(http.StatusAccepted)
		return true
	})
	rt := reviewRuntime(t, l.port)
	done := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(gateway.WithUpstreamUser(context.Background(), "alice"), 3*time.Second)
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://toolgate/mcp/legacy",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := rt.bridge.RoundTrip(req)
		if err != nil {
			done <- err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		done <- fmt.Sprintf("HTTP %d session %q: %s", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), body)
	}()
	select {
	case <-got:
	case <-time.After(3 * time.Second):
		t.Fatal("the initialize never reached the server")
	}
	_ = rt.Destruct()
	close(release)
	answer := <-done
	if !strings.Contains(answer, `session ""`) || !strings.Contains(answer, `"retryable":true`) {
		t.Errorf("an initialize in progress while the runtime was destructed got %s; want a retryable error and no session", answer)
	}
	if !waitFor(2*time.Second, func() bool { return l.openGET.Load() == 0 }) {
		t.Errorf("2 s after the runtime was destructed, %d GET streams to the server are still open", l.openGET.Load())
	}
}

// Attack (fixed): a legacy server sends malformed messages without end
// on a stream a runner keeps open (one that holds its standalone GET
// stream is never swept as idle). stream.mayLog bounds what the stream
// puts in the log at maxLogged entries, but counted every message it was
// asked about in an int32: after 2^31 of them (7-byte "data:\n\n"
// events, some 15 GB, within the hour on a fast link) the count wrapped
// negative and every message was logged again, 2^31 more times. Expected:
// past the bound, nothing more is ever logged. Reproduced with the
// counter where 2^31 messages leave it (one short of wrapping): the next
// messages were logged, the "logged no more" notice again later.
// Severity: low (log flooding, after a long flood).
func TestR16LogBudgetWrapsAround(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	st := &stream{service: "legacy", logger: func() *zap.Logger { return zap.New(core) }}
	first := 0
	for range maxLogged + 2 {
		if st.mayLog() {
			first++
		}
	}
	if first != maxLogged || logs.Len() != 1 {
		t.Fatalf("of the first %d messages, %d may be logged, and %d notices; want %d and 1", maxLogged+2, first, logs.Len(), maxLogged)
	}
	logs.TakeAll()
	st.logged.Store(math.MaxInt32) // where 2^31 - 1 messages leave it
	allowed := 0
	for range 3 {
		if st.mayLog() {
			allowed++
		}
	}
	if allowed > 0 || logs.Len() > 0 {
		t.Errorf("past the bound, %d more messages may be logged and %d entries were: the count wrapped around", allowed, logs.Len())
	}
}

// Attack (fixed): a legacy server floods its stream with answers to
// requests nobody sent (ids toolgate never used). Each was logged at
// debug level ("dropped a response to no pending request"), outside the
// stream's log budget (stream.mayLog) that bounds every other entry the
// server's text causes, so a gateway logging at debug (as one does to
// look into a misbehaving upstream) wrote one entry per event the server
// sent, without end. Expected: at most the budget. Reproduced: 2000
// stray answers, 2000 entries. Severity: low (log flooding at debug
// level only).
func TestR16StrayAnswersFloodTheDebugLog(t *testing.T) {
	const stray = 2000
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		for i := range stray {
			s.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{}}`, 100000+i))
		}
		s.send(r16Answer(m))
		w.WriteHeader(http.StatusAccepted)
		return true
	})
	core, logs := observer.New(zapcore.DebugLevel)
	rt := reviewRuntime(t, l.port)
	rt.bridge.SetLogger(zap.New(core))
	sid := r16Open(t, rt, "alice")
	if msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, 5*time.Second); err != nil || len(msgs) != 1 {
		t.Fatalf("the call got %q, %v", msgs, err)
	}
	if n := logs.Len(); n > maxLogged+1 {
		t.Errorf("%d stray answers put %d entries in the log, past the stream's budget of %d", stray, n, maxLogged)
	}
}

// Attack (fixed): a broken legacy server handles a call within its POST
// (the tool runs, its answer goes out on the stream) and then fails the
// POST itself (HTTP 500: its handler crashed after answering; or 401, a
// token that expired while the tool ran). toolgate dropped the answer it
// had received and told the runner the call "may not have reached the
// server", with a retryable error — so a runner that retries what it is
// told is retryable ran a tool with side effects twice (a payment, a
// deploy), though the server's own answer said it had run. Expected: the
// runner gets the answer that arrived. Reproduced: a retryable error
// saying the call may not have reached the server. Severity: low-medium
// (a duplicate side effect on a broken server; the same with the SDK's
// client before).
func TestR16AnsweredCallWhosePostFailedIsCalledUnsent(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusUnauthorized} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
				if m.Method != "tools/call" {
					return false
				}
				s.send(r16Answer(m))
				// The answer is on its way before the POST fails.
				time.Sleep(50 * time.Millisecond)
				w.WriteHeader(status)
				return true
			})
			rt := reviewRuntime(t, l.port)
			sid := r16Open(t, rt, "alice")
			msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"pay","arguments":{}}}`, 3*time.Second)
			if err != nil || len(msgs) != 1 || !strings.Contains(msgs[0], `"text":"answered"`) {
				t.Errorf("a call the server answered before failing its POST got %q, %v; want the answer", msgs, err)
			}
		})
	}
}

// Attack (fixed): a broken legacy server pads its endpoint event's data
// with blanks ("data:  /message?sid=1 ", two spaces after the colon, one
// after the URL). The MCP Go SDK's client trimmed the data, so such a
// server worked; toolgate's reader keeps what the standard keeps (all but
// one leading space), and the blanks became part of the URL: every
// message was POSTed to "/%20/message" or with a space in its query, and
// every initialize failed. Expected: blanks around the URL (which no URL
// holds) are dropped, and the session opens, still only on the service's
// origin. Reproduced: initialize failed (HTTP 404 from the server).
// Severity: low (availability; behaviour lost with the SDK's client).
func TestR16EndpointDataPaddedWithBlanks(t *testing.T) {
	for _, first := range []string{
		"event: endpoint\ndata:  /message?sid=0\n\n",
		"event: endpoint\ndata: /message?sid=0 \n\n",
		"event: endpoint\ndata: /message?sid=0\t\n\n",
	} {
		t.Run(strings.TrimSpace(strings.ReplaceAll(first, "\n", "|")), func(t *testing.T) {
			rt := reviewRuntime(t, startR16ServerBeginning(t, first, nil).port)
			if s, err := reviewOpen(t, rt); err != nil || s == nil {
				t.Errorf("initialize with the endpoint event %q: %v", first, err)
			}
		})
	}
}

// Holds: trimming the endpoint's blanks moves nothing past the guard: a
// padded endpoint on another origin still gets nothing.
func TestR16PaddedForeignEndpointGetsNothing(t *testing.T) {
	evil := &reviewRecorder{}
	evilSrv := httptest.NewServer(evil)
	t.Cleanup(evilSrv.Close)
	_, evilPort, _ := net.SplitHostPort(evilSrv.Listener.Addr().String())
	for _, ep := range []string{" http://127.0.0.1:%e/message", "//127.0.0.1:%e/message ", " \thttp://localhost:%e/message"} {
		rt := reviewRuntime(t, reviewLegacy(t, ep, evilPort, ""))
		if s, err := reviewOpen(t, rt); err == nil && s != nil {
			t.Errorf("endpoint %q: a session was opened", ep)
		}
	}
	if seen := evil.requests(); len(seen) > 0 {
		t.Errorf("the other origin got %q", seen)
	}
}

// Holds: events that try to pass an answer past the message-type check —
// the type in other cases, with a NUL or a blank after it, a type set on
// a line a bare CR ends, "event: message" inside a data line, a second
// endpoint event — are read as the standard reads them: none is a message
// event, so none is relayed; each names the call, which fails at once with
// toolgate's retryable error saying why (not its timeout), and the
// server's real answer after it finds the call ended.
func TestR16TypeCheckVariantsAreNeverRelayed(t *testing.T) {
	const forged = `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"forged"}]}}`
	variants := []string{
		"event: Message\ndata: %s\n\n",
		"event: MESSAGE\ndata: %s\n\n",
		"event: message\x00\ndata: %s\n\n",
		"event: message \ndata: %s\n\n",
		"event: response\ndata: %s\n\n",
		"event: ping\rdata: %s\r\r",
		"event: ping\r\ndata: %s\r\n\r\n",
		"event: ping\ndata: %s\ndata: event: message\n\n",
		"event: endpoint\ndata: %s\n\n",
	}
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		for i, v := range variants {
			if strings.Contains(m.Raw, fmt.Sprintf(`"variant":%d}`, i)) {
				s.out <- fmt.Sprintf(v, fmt.Sprintf(forged, m.ID))
			}
		}
		s.send(r16Answer(m))
		w.WriteHeader(http.StatusAccepted)
		return true
	})
	rt := reviewRuntime(t, l.port)
	sid := r16Open(t, rt, "alice")
	for i, v := range variants {
		msgs, err := r16Call(t, rt, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"variant":%d}}}`, 10+i, i), 3*time.Second)
		if err != nil || len(msgs) != 1 || strings.Contains(msgs[0], "forged") || !strings.Contains(msgs[0], "another type than message") {
			t.Errorf("%q: the call got %q, %v; want toolgate's error saying the answer came under another event type, never the forged answer", v, msgs, err)
		}
	}
}

// Attack (fixed): a broken legacy server labels its answers with an event
// type padded with a blank ("event: message "), or another type of its
// own ("event: response"). The MCP Go SDK's client trimmed event names
// and relayed every event's data, so such a server worked; toolgate
// relays only events typed exactly "message" (or untyped), as the
// standard reads them, and skips the rest after one log entry — so the
// answer, which names its call's id, is dropped and the call waits out
// the service's whole timeout (up to 300 s, holding the runner and a slot
// of the caller's), the very outcome the switch to toolgate's reader was
// to end for answers it cannot relay. Expected: the call ends at once —
// with its answer, or with a retryable error saying the server answered
// under another event type (link.Fail, as for a malformed answer).
// Reproduced: the call returned only when its context ended. Severity:
// low (availability with a nonconforming server; behaviour lost with the
// SDK's client). Fixed: such an event is still not relayed (a standard
// reader, the TypeScript SDK's, skips it too), but one naming a call in
// progress fails it at once, saying why.
func TestR16AnswerUnderAnotherEventTypeFailsItsCallAtOnce(t *testing.T) {
	for _, typ := range []string{"message ", "response"} {
		t.Run(typ, func(t *testing.T) {
			l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
				if m.Method != "tools/call" {
					return false
				}
				s.out <- fmt.Sprintf("event: %s\ndata: %s\n\n", typ, r16Answer(m))
				w.WriteHeader(http.StatusAccepted)
				return true
			})
			rt := reviewRuntime(t, l.port)
			sid := r16Open(t, rt, "alice")
			msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, 3*time.Second)
			if err != nil || len(msgs) != 1 || !strings.Contains(msgs[0], "another type than message") || !strings.Contains(msgs[0], `"retryable":true`) {
				t.Errorf("the call answered under event type %q got %q, %v; want at once a retryable error saying so (not its timeout)", typ, msgs, err)
			}
		})
	}
}

// Holds: a request of the server's under another event type whose id
// happens to be that of a call in progress (the server's ids are its own)
// fails nothing: only an answer names a call; the call gets its answer.
func TestR16ServerRequestUnderAnotherTypeFailsNoCall(t *testing.T) {
	l := startR16Server(t, func(s *r16Stream, m r16Msg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		s.out <- fmt.Sprintf("event: ping\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"ping\"}\n\n", m.ID)
		s.send(r16Answer(m))
		w.WriteHeader(http.StatusAccepted)
		return true
	})
	rt := reviewRuntime(t, l.port)
	sid := r16Open(t, rt, "alice")
	msgs, err := r16Call(t, rt, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{}}}`, 3*time.Second)
	if err != nil || len(msgs) != 1 || !strings.Contains(msgs[0], `"text":"answered"`) {
		t.Errorf("the call got %q, %v; want the server's answer", msgs, err)
	}
}
