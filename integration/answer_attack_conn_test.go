package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// runnerHead is the head of a raw request of m's MCP session with key (""
// for none), and extra header lines.
func runnerHead(c *attackConn, m *rawMCP, method, key, extra string) string {
	h := method + " /v1/mcp/svc HTTP/1.1\r\nHost: " + c.host + "\r\n"
	if key != "" {
		h += "Authorization: Bearer " + key + "\r\n"
	}
	h += "X-Toolgate-Session: " + m.headers["X-Toolgate-Session"] + "\r\nMcp-Session-Id: " + m.sessionID +
		"\r\nMcp-Protocol-Version: 2025-11-25\r\nAccept: application/json, text/event-stream\r\n"
	if method == http.MethodPost {
		h += "Content-Type: application/json\r\n"
	}
	return h + extra
}

func echoCall(id int, text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":%q}}}`, id, text)
}

// padded is an echo call padded to about n bytes.
func paddedEcho(id, n int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},"_meta":{"pad":%q}}}`,
		id, strings.Repeat("p", n))
}

// chunked encodes body in chunks of at most 1000 bytes, with a trailer.
func chunked(body, trailer string) string {
	var b strings.Builder
	for len(body) > 0 {
		n := min(1000, len(body))
		fmt.Fprintf(&b, "%x\r\n%s\r\n", n, body[:n])
		body = body[n:]
	}
	b.WriteString("0\r\n" + trailer + "\r\n")
	return b.String()
}

type wantAnswer struct {
	status int
	has    string
}

// expectAnswers reads len(want) answers in order, each within 10 s. It
// returns whether the last one said Connection: close.
func expectAnswers(t *testing.T, c *attackConn, want ...wantAnswer) (closing bool) {
	t.Helper()
	for i, w := range want {
		resp, body, err := c.read(10 * time.Second)
		if err != nil {
			t.Fatalf("answer %d: %v, want %d with %q", i+1, err, w.status, w.has)
		}
		if resp.StatusCode != w.status || !strings.Contains(body, w.has) {
			t.Fatalf("answer %d: %d %q, want %d with %q", i+1, resp.StatusCode, truncate(body, 300), w.status, w.has)
		}
		closing = resp.Close
	}
	return closing
}

// mustClose fails t unless the gateway closes c (after an answer that
// said Connection: close) without answering anything more.
func mustClose(t *testing.T, c *attackConn, after string) {
	t.Helper()
	if got := c.next(5 * time.Second); got != "closed" {
		t.Fatalf("after %s, which said Connection: close: %s", after, got)
	}
}

// Attack (held): HTTP/1.1 pipelining through refusals. Refused requests
// whose bodies were sent whole (a wrong key with a Content-Length body,
// another caller with a chunked body and a trailer) are interleaved with
// alice's calls in one write: each gets its own answer, in order, and the
// drained bodies are never read as requests; alice's calls are answered as
// hers (their echo), the refusals as the refused callers'. (A refusal that
// says Connection: close and ends the connection, leaving the pipelined
// calls to be sent again, is as good: nothing more may then be answered.)
func TestAnswerAttackPipelinedRefusalsKeepFraming(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 1MiB"})
	c := dialAttack(t, g)
	// The refused bodies hide requests: read as requests they would be
	// answered (and alice would get answers that are not hers).
	hidden := smuggledRequest(c.host)
	refusedCL := paddedEcho(1, 200<<10) + hidden
	refusedChunked := paddedEcho(3, 50<<10) + hidden
	second, fourth := echoCall(2, "second-call"), echoCall(4, "fourth-call")
	req := runnerHead(c, m, http.MethodPost, "not-a-key", fmt.Sprintf("Content-Length: %d\r\n\r\n", len(refusedCL))) + refusedCL +
		runnerHead(c, m, http.MethodPost, aliceKey, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(second))) + second +
		runnerHead(c, m, http.MethodPost, bobKey, "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n") + chunked(refusedChunked, "X-T: 1\r\n") +
		runnerHead(c, m, http.MethodPost, aliceKey, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(fourth))) + fourth
	done := make(chan error, 1)
	go func() { done <- c.write(req) }() // the gateway answers while it reads
	if expectAnswers(t, c, wantAnswer{http.StatusUnauthorized, "invalid bearer token"}) {
		mustClose(t, c, "the refusal")
		return
	}
	expectAnswers(t, c,
		wantAnswer{http.StatusOK, "second-call"},
		wantAnswer{http.StatusForbidden, "another caller"},
		wantAnswer{http.StatusOK, "fourth-call"})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := c.next(time.Second); got != "timeout" {
		t.Fatalf("after the four answers: %s, want nothing more on the open connection", got)
	}
}

// Attack (held): a refused body longer than max_request_size is drained
// for max_request_size bytes only, and the connection is then closed:
// what follows (here a request placed exactly where the drain stops, for
// the 401 refusal before the body, and where the 413's read and the drain
// stop, followed by 300 KiB more of the body) is never parsed as a
// request. (With the hijack in EarlyAnswer.Finish removed, the hidden
// request was not served either: the connection stayed open, silent.)
func TestAnswerAttackOverlongRefusedBodyIsNotParsed(t *testing.T) {
	const max = 64 << 10
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 64KiB"})
	for _, c := range []struct {
		name   string
		key    string
		at     int // where the hidden request starts
		status int
	}{
		{"401 before the body", "not-a-key", max, http.StatusUnauthorized},
		{"413 after max+1 bytes", aliceKey, 2*max + 1, http.StatusRequestEntityTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := dialAttack(t, g)
			hidden := smuggledRequest(conn.host)
			body := paddedEcho(1, c.at)[:c.at] + hidden + strings.Repeat("q", 300<<10)
			head := runnerHead(conn, m, http.MethodPost, c.key, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)))
			go func() { _ = conn.write(head + body) }()
			resp, b, err := conn.read(10 * time.Second)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if resp.StatusCode != c.status {
				t.Fatalf("%d %q, want %d", resp.StatusCode, truncate(b, 200), c.status)
			}
			if got := conn.next(5 * time.Second); strings.HasPrefix(got, "answered") {
				t.Fatalf("after the refusal of an overlong body: %s, a request hidden in the body was served", got)
			}
		})
	}
}

// Attack (held): Expect: 100-continue. A refused runner that waits for
// 100 Continue gets the refusal at once, no 100 Continue before or after
// it; once it sends its body anyway (as Go's client does when the server
// does not close), the connection serves its next call as its own (or the
// refusal says Connection: close and the connection ends). An accepted
// call gets its 100 Continue and its answer.
func TestAnswerAttackExpectContinue(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 1MiB"})
	c := dialAttack(t, g)
	body := paddedEcho(1, 10<<10)
	start := time.Now()
	if err := c.write(runnerHead(c, m, http.MethodPost, "not-a-key",
		fmt.Sprintf("Expect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body)))); err != nil {
		t.Fatal(err)
	}
	closing := expectAnswers(t, c, wantAnswer{http.StatusUnauthorized, "invalid bearer token"})
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the refusal of a runner waiting for 100 Continue took %v", d)
	}
	if closing {
		mustClose(t, c, "the refusal")
		c = dialAttack(t, g)
	} else {
		next := echoCall(2, "after-expect")
		if err := c.write(body + runnerHead(c, m, http.MethodPost, aliceKey, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(next))) + next); err != nil {
			t.Fatal(err)
		}
		// http.ReadResponse would skip nothing: a stray 100 Continue
		// here would be read as the next answer and fail the status
		// check.
		expectAnswers(t, c, wantAnswer{http.StatusOK, "after-expect"})
	}

	// An accepted call: 100 Continue, then the answer.
	call := echoCall(3, "expected")
	if err := c.write(runnerHead(c, m, http.MethodPost, aliceKey,
		fmt.Sprintf("Expect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(call)))); err != nil {
		t.Fatal(err)
	}
	expectAnswers(t, c, wantAnswer{http.StatusContinue, ""})
	if err := c.write(call); err != nil {
		t.Fatal(err)
	}
	expectAnswers(t, c, wantAnswer{http.StatusOK, "expected"})
}

// Attack (held): calls that are not refused are untouched by
// EarlyAnswer.Finish: on one kept-alive connection, a call with a
// Content-Length body, one with a chunked body and a trailer, and a
// DELETE with a body (answered, then its body read and dropped) are each
// answered and none is drained as a refusal is (which would end with the
// connection hijacked): the connection stays open for the next (no
// hijack, no Connection: close).
func TestAnswerAttackAcceptedCallsAreNotStalled(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 1MiB"})
	c := dialAttack(t, g)
	steps := []struct {
		name     string
		req      func(c *attackConn) string
		want     wantAnswer
		mayClose bool
	}{
		{"Content-Length", func(c *attackConn) string {
			return runnerHead(c, m, http.MethodPost, aliceKey, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(echoCall(1, "cl-call")))) +
				echoCall(1, "cl-call")
		}, wantAnswer{http.StatusOK, "cl-call"}, false},
		{"chunked with a trailer", func(c *attackConn) string {
			return runnerHead(c, m, http.MethodPost, aliceKey, "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n") +
				chunked(echoCall(2, "chunked-call"), "X-T: 1\r\n")
		}, wantAnswer{http.StatusOK, "chunked-call"}, false},
		{"DELETE with a body", func(c *attackConn) string {
			return runnerHead(c, m, http.MethodDelete, aliceKey, "Content-Length: 5\r\n\r\n") + "hello"
		}, wantAnswer{http.StatusNoContent, ""}, false},
		{"after the DELETE", func(c *attackConn) string {
			return runnerHead(c, m, http.MethodPost, aliceKey, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(echoCall(3, "gone")))) +
				echoCall(3, "gone")
		}, wantAnswer{http.StatusNotFound, "initialize"}, false},
	}
	for _, s := range steps {
		if err := c.write(s.req(c)); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		// (A call drained as a refusal would be hijacked and closed:
		// the connection's checks below see it.)
		closing := expectAnswers(t, c, s.want)
		if closing && !s.mayClose {
			t.Fatalf("%s: the answer says Connection: close", s.name)
		}
		if closing {
			mustClose(t, c, s.name)
			c = dialAttack(t, g)
		}
	}
	if got := c.next(500 * time.Millisecond); got != "timeout" {
		t.Fatalf("after the calls: %s, want the connection open and quiet", got)
	}
}
