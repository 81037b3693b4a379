package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Second look at gateway.AnswerBeforeBody / EarlyAnswer: requests whose
// body the route never reads although they are not refused (a GET, which
// opens the runner's standalone SSE stream).

// openRawStream sends a GET of m's session with extra (header lines, the
// blank line and any body) on a new raw connection and reads the head of
// its answer: the open stream (200, its body unread), or a refusal (its
// body read) when refused is set; anything else fails t.
func openRawStream(t *testing.T, g *gateway, m *rawMCP, extra string, refused bool) (*attackConn, *http.Response) {
	t.Helper()
	c := dialAttack(t, g)
	if err := c.write(runnerHead(c, m, http.MethodGet, aliceKey, extra)); err != nil {
		t.Fatal(err)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return c, resp
	}
	b, _ := io.ReadAll(resp.Body)
	if refused && resp.StatusCode >= 400 && resp.StatusCode < 500 {
		t.Logf("the GET with a body is refused: %d %q", resp.StatusCode, truncate(string(b), 200))
		return c, resp
	}
	t.Fatalf("GET: %d %v %q, want the open stream", resp.StatusCode, resp.Header, truncate(string(b), 300))
	return nil, nil
}

// Attack (fixed): a runner's GET that carries a body (here two bytes, sent whole
// with the head) opens its standalone stream as any GET does; the runner
// then goes away. Without a body, the gateway notices at once (net/http's
// background read of the connection cancels the request's context) and
// closes the upstream's stream. With the body, it does not: net/http
// starts that background read only once the body was read to its end,
// and nothing reads a GET's body now that AnswerBeforeBody turned full
// duplex on (before, net/http read the unread body as the answer's head
// was written, which both started the background read and noticed a
// closed connection). The stream, its goroutines and its upstream
// connection stay until a write to the dead connection fails: the next
// keep-alive comment, 15 to 30 s later by default (sse_keepalive), never
// with sse_keepalive off. Any caller can so hold upstream streams and
// gateway goroutines (and max_streams_per_caller room, his own) after
// leaving, cheaply: one request per connection, closed at once; and a
// runner whose client sends a GET with an empty chunked body (0-length
// chunked, as some clients and proxies do) loses nothing but leaves every
// stream it drops open upstream for that long. Measured with the default
// sse_keepalive (15 s): the upstream stream was closed 30 s after the
// runner left; before AnswerBeforeBody, at once for each case below.
// Fixed: a GET or DELETE carrying a body is refused (gateway.Bodyless);
// an empty chunked body is read to its end before the stream opens.
func TestAnswerAttack2GetWithBodyHoldsStreamAfterRunnerLeft(t *testing.T) {
	for _, c := range []struct {
		name, extra string
		refused     bool
	}{
		{"no body (control)", "\r\n", false},
		{"a body sent whole", "Content-Length: 2\r\n\r\n{}", true},
		{"a chunked body sent whole", "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", true},
		// What some clients and proxies send for a GET without content:
		// its stream opens.
		{"an empty chunked body", "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, g, m := aliceSession(t, gatewayConfig{})
			held := holdStreams(t, up)
			conn, resp := openRawStream(t, g, m, c.extra, c.refused)
			if resp.StatusCode != http.StatusOK {
				return // refused (openRawStream allowed it): no stream to hold
			}
			if c.refused {
				t.Fatalf("a GET with a body was not refused: %d", resp.StatusCode)
			}
			waitFor(t, "the stream upstream", func() bool { return held.count() == 1 })
			conn.conn.Close() // the runner goes away
			deadline := time.Now().Add(1500 * time.Millisecond)
			for held.count() != 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := held.count(); n != 0 {
				t.Fatalf("1.5 s after the runner closed its connection, %d stream(s) still open upstream: "+
					"a GET with a body is not noticed going away", n)
			}
		})
	}
}

// Attack (fixed): a GET announcing a body it never sends (Content-Length: 100,
// nothing after the head) gets its stream at once (full duplex). When the
// stream ends (here: the runner's MCP session is ended), EarlyAnswer.Finish
// waits 2 s for the body, then hijacks the connection and closes it: the
// stream's chunked answer never gets its last chunk, and the runner reads
// a broken answer ("unexpected EOF") 2.5 s late, where a GET without a
// body reads the stream's clean end at once. An answer already written
// (and flushed by Finish) without a Content-Length is cut by the hijack
// whenever the body is not finished: the terminating chunk is written by
// net/http only after the handler returns.
// Fixed: such a GET is refused at once (gateway.Bodyless).
func TestAnswerAttack2GetWithUnsentBodyCutsTheStreamEnd(t *testing.T) {
	for _, c := range []struct{ name, extra string }{
		{"no body (control)", "\r\n"},
		{"a body announced and never sent", "Content-Length: 100\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, g, m := aliceSession(t, gatewayConfig{})
			conn, resp := openRawStream(t, g, m, c.extra, c.extra != "\r\n")
			if resp.StatusCode != http.StatusOK {
				return // refused at once (a GET carries no body)
			}
			time.Sleep(200 * time.Millisecond)
			start := time.Now()
			if status := m.delete(); status != http.StatusNoContent {
				t.Fatalf("DELETE: %d", status)
			}
			_ = conn.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(resp.Body)
			d := time.Since(start)
			t.Logf("stream ended after %v: %v, %q", d, err, truncate(string(b), 200))
			if err != nil {
				t.Fatalf("the stream's answer did not end cleanly when the session ended: %v (after %v)", err, d)
			}
		})
	}
}

// Attack (fixed): as TestAnswerAttack2GetWithBodyHoldsStreamAfterRunnerLeft, on
// the federated endpoint (/v1/mcp): its GET, carrying a body sent whole,
// opens a stream of every service of the session, and none is closed when
// the runner goes away (the federated stream ends on the runner's
// request context, which is never cancelled). Before AnswerBeforeBody
// it was closed at once.
// Fixed: as there (gateway.Bodyless).
func TestAnswerAttack2FederatedGetWithBodyHoldsStreams(t *testing.T) {
	for _, c := range []struct{ name, extra string }{
		{"no body (control)", "\r\n"},
		{"a body sent whole", "Content-Length: 2\r\n\r\n{}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, g, _ := aliceSession(t, gatewayConfig{Federation: " "})
			held := holdStreams(t, up)
			m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "")
			m.url = strings.TrimSuffix(m.url, "/")
			m.initialize()
			conn := dialAttack(t, g)
			head := strings.Replace(runnerHead(conn, m, http.MethodGet, aliceKey, c.extra), " /v1/mcp/svc ", " /v1/mcp ", 1)
			if err := conn.write(head); err != nil {
				t.Fatal(err)
			}
			_ = conn.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(conn.br, nil)
			if err != nil {
				t.Fatalf("federated GET: %v", err)
			}
			if resp.StatusCode != http.StatusOK {
				if c.extra == "\r\n" {
					t.Fatalf("federated GET: %d", resp.StatusCode)
				}
				return // refused: no stream to hold
			}
			waitFor(t, "the stream upstream", func() bool { return held.count() == 1 })
			conn.conn.Close() // the runner goes away
			deadline := time.Now().Add(1500 * time.Millisecond)
			for held.count() != 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := held.count(); n != 0 {
				t.Fatalf("1.5 s after the runner closed its connection, %d stream(s) still open upstream", n)
			}
		})
	}
}

// Attack (held): a GET whose body (sent whole with its head) hides a
// request. The route never reads a GET's body; once its stream ends (the
// MCP session is ended), EarlyAnswer.Finish reads the body to its end and
// the connection goes on: the hidden request is never answered, and the
// stream's answer ends cleanly. (A GET refused for its body: the hidden
// request is never answered either.)
func TestAnswerAttack2GetBodyHidingARequestIsNotServed(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{})
	hidden := smuggledRequest(strings.TrimPrefix(g.URL, "http://"))
	c, resp := openRawStream(t, g, m, fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(hidden), hidden), true)
	if resp.StatusCode != http.StatusOK {
		if got := c.next(3 * time.Second); strings.HasPrefix(got, "answered") {
			t.Fatalf("after the refusal: %s, the request hidden in the GET's body was served", got)
		}
		return
	}
	time.Sleep(100 * time.Millisecond)
	if status := m.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the stream did not end cleanly: %v %q", err, truncate(string(b), 200))
	}
	if got := c.next(time.Second); strings.HasPrefix(got, "answered") {
		t.Fatalf("after the stream: %s, the request hidden in the GET's body was served", got)
	}
}

// Attack (fixed): a GET announcing a chunked body and sending no chunk
// (nothing after its head) must still be answered at once: refused for
// its body, or its stream. gateway.Bodyless reads one byte of a body of
// unknown length to see whether it is empty: the read waited for the
// first chunk, up to read_body_idle (1 m by default), with no answer.
// Fixed: it waits for the body's end at most bodylessWait (1 s).
func TestAnswerAttack2ChunkedGetWithoutChunksIsAnswered(t *testing.T) {
	up, g, m := aliceSession(t, gatewayConfig{})
	holdStreams(t, up)
	c := dialAttack(t, g)
	if err := c.write(runnerHead(c, m, http.MethodGet, aliceKey, "Transfer-Encoding: chunked\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("a GET whose chunked body has not begun got no answer within 3 s: %v", err)
	}
	t.Logf("answer: %d %v", resp.StatusCode, resp.Header)
}

// Attack (held): the POST counterpart of
// TestAnswerAttack2GetWithBodyHoldsStreamAfterRunnerLeft. A call whose
// answer is a long SSE stream (the upstream holds it open), sent with a
// Content-Length or a chunked body: its body is read to its end, so
// net/http watches the connection, and the runner going away ends the
// upstream's request at once; the stream's head carries no
// Connection: close.
func TestAnswerAttack2PostStreamNoticesTheRunnerLeaving(t *testing.T) {
	up, g, m := aliceSession(t, gatewayConfig{})
	var mu sync.Mutex
	open := 0
	count := func() int { mu.Lock(); defer mu.Unlock(); return open }
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Method != http.MethodPost || !strings.Contains(string(body), "hold-me") {
			return false
		}
		sseStart(w)
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"working\"}}\n\n")
		flush(w)
		mu.Lock()
		open++
		mu.Unlock()
		defer func() { mu.Lock(); open--; mu.Unlock() }()
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
		return true
	})
	call := echoCall(7, "hold-me")
	for _, c := range []struct{ name, extra string }{
		{"Content-Length", fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(call), call)},
		{"chunked", "Transfer-Encoding: chunked\r\n\r\n" + chunked(call, "")},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := dialAttack(t, g)
			if err := conn.write(runnerHead(conn, m, http.MethodPost, aliceKey, c.extra)); err != nil {
				t.Fatal(err)
			}
			_ = conn.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(conn.br, nil)
			if err != nil {
				t.Fatalf("no answer head: %v", err)
			}
			if resp.StatusCode != http.StatusOK || resp.Close {
				t.Fatalf("the call's answer: %d, Connection: close %v", resp.StatusCode, resp.Close)
			}
			waitFor(t, "the call upstream", func() bool { return count() == 1 })
			conn.conn.Close()
			deadline := time.Now().Add(1500 * time.Millisecond)
			for count() != 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := count(); n != 0 {
				t.Fatalf("1.5 s after the runner left, its call is still open upstream")
			}
		})
	}
}
