package integration

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (held): HTTP/1.0 keep-alive. A refused HTTP/1.0 request
// ("Connection: keep-alive", a Content-Length body hiding a request)
// pipelined with alice's call: the refusal, then alice's answer (or the
// refusal ends the connection); the hidden request is never answered.
func TestAnswerAttack2HTTP10KeepAliveRefusal(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 1MiB"})
	c := dialAttack(t, g)
	http10 := func(s string) string {
		return strings.Replace(s, " HTTP/1.1\r\n", " HTTP/1.0\r\nConnection: keep-alive\r\n", 1)
	}
	refused := paddedEcho(1, 10<<10) + smuggledRequest(c.host)
	call := echoCall(2, "http10-call")
	req := http10(runnerHead(c, m, http.MethodPost, "not-a-key", fmt.Sprintf("Content-Length: %d\r\n\r\n", len(refused)))) + refused +
		http10(runnerHead(c, m, http.MethodPost, aliceKey, fmt.Sprintf("Content-Length: %d\r\n\r\n", len(call)))) + call
	if err := c.write(req); err != nil {
		t.Fatal(err)
	}
	if expectAnswers(t, c, wantAnswer{http.StatusUnauthorized, "invalid bearer token"}) {
		mustClose(t, c, "the refusal")
		return
	}
	expectAnswers(t, c, wantAnswer{http.StatusOK, "http10-call"})
	if got := c.next(time.Second); got != "timeout" && got != "closed" {
		t.Fatalf("after the two answers: %s", got)
	}
}

// Attack (held): a runner that half-closes its connection mid-body after
// the refusal reaches it (its body will never end) reads the whole
// refusal, and the gateway then closes the connection (its read sees the
// runner's end; no test here times it).
func TestAnswerAttack2HalfCloseMidBody(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 1MiB"})
	c := dialAttack(t, g)
	if err := c.write(runnerHead(c, m, http.MethodPost, "not-a-key", fmt.Sprintf("Content-Length: %d\r\n\r\n", 500<<10)) +
		paddedEcho(1, 20<<10)); err != nil {
		t.Fatal(err)
	}
	expectAnswers(t, c, wantAnswer{http.StatusUnauthorized, "invalid bearer token"})
	if err := c.conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got := c.next(5 * time.Second); got != "closed" {
		t.Fatalf("after the half-close: %s", got)
	}
}

// Attack (held): chunk sizes that lie. A refused chunked body whose chunk
// announces 64 GiB but carries a hidden request and then stalls, and one
// whose chunk size overflows 64 bits followed by a hidden request: the
// refusal, then the connection ends; the hidden request is never
// answered.
func TestAnswerAttack2LyingChunkSizes(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{Extra: "max_request_size 64KiB"})
	for _, c := range []struct{ name, size string }{
		{"64 GiB chunk, few bytes", "1000000000"},
		{"overflowing chunk size", "1ffffffffffffffff"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := dialAttack(t, g)
			req := runnerHead(conn, m, http.MethodPost, "not-a-key", "Transfer-Encoding: chunked\r\n\r\n") +
				c.size + "\r\n" + smuggledRequest(conn.host)
			if err := conn.write(req); err != nil {
				t.Fatal(err)
			}
			resp, body, err := conn.read(5 * time.Second)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			t.Logf("answer: %d %v", resp.StatusCode, truncate(body, 100))
			if got := conn.next(5 * time.Second); got != "closed" { // not read_body_idle's minute
				t.Fatalf("after the refusal of a lying chunk: %s", got)
			}
		})
	}
}
