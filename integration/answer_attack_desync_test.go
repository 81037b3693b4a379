package integration

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attacks on gateway.AnswerBeforeBody / EarlyAnswer: request smuggling and
// desync on the kept-alive connection of a runner request whose body was
// not read to its end.

// attackConn is a raw HTTP/1.1 connection to the gateway, every read of it
// bounded.
type attackConn struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
	host string
}

func dialAttack(t *testing.T, g *gateway) *attackConn {
	t.Helper()
	host := strings.TrimPrefix(g.URL, "http://")
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &attackConn{t: t, conn: conn, br: bufio.NewReader(conn), host: host}
}

func (c *attackConn) write(s string) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := io.WriteString(c.conn, s)
	return err
}

// read reads the next response on the connection, within d; its body is
// read whole (every answer these tests get has an end).
func (c *attackConn) read(d time.Duration) (*http.Response, string, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

// closedOrTimeout describes what reading after the last expected answer
// gave: "closed" (EOF or reset), "timeout" (the gateway kept the
// connection and answered nothing) or the answer it sent.
func (c *attackConn) next(d time.Duration) string {
	resp, body, err := c.read(d)
	var ne net.Error
	switch {
	case err == nil:
		return fmt.Sprintf("answered %d %q", resp.StatusCode, truncate(body, 200))
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return "closed"
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// smuggledRequest is a complete request hidden in another request's body:
// an unauthenticated GET whose 401 carries a WWW-Authenticate header.
func smuggledRequest(host string) string {
	return "GET /v1/mcp/svc HTTP/1.1\r\nHost: " + host + "\r\nAuthorization: Bearer smuggled-key\r\n" +
		"Accept: text/event-stream\r\nX-Smuggled: 1\r\n\r\n"
}

// Attack (fixed): a runner request whose body fails as it is read (here: a
// malformed chunk size) is answered 400, and the connection is then kept
// alive: the bytes that followed the malformed chunk line (still part of
// the request as the runner and any proxy in front framed it) are parsed
// as the next request and answered. net/http itself guards against
// exactly this ("whatever remains on the wire must not be parsed as
// another HTTP request": the closeAfterReply of response.WriteHeader),
// but only when full duplex is off; AnswerBeforeBody now turns full
// duplex on for every runner request, and EarlyAnswer.Finish returns at
// once for a body that "ended" with an error (a.ended), without closing
// the connection. The same bytes sent to the HTTP API (no
// AnswerBeforeBody) end with the connection closed, as they did on the
// MCP route before AnswerBeforeBody.
// Fixed: a body read to an error other than its end makes the answer say
// "Connection: close" (EarlyAnswer.CloseAfterAnswer).
func TestAnswerAttackMalformedChunkedBodySmuggles(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	for _, c := range []struct{ name, path, ct string }{
		{"HTTP API (control, no AnswerBeforeBody)", "/v1/sessions", "application/json"},
		{"MCP route", "/v1/mcp/svc", "application/json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := dialAttack(t, g)
			req := "POST " + c.path + " HTTP/1.1\r\nHost: " + conn.host + "\r\nAuthorization: Bearer " + aliceKey +
				"\r\nContent-Type: " + c.ct + "\r\nAccept: application/json, text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"5\r\n{\"a\":\r\n" + "zz\r\n" + // a chunk size that is not hex: the body fails here
				smuggledRequest(conn.host)
			if err := conn.write(req); err != nil {
				t.Fatal(err)
			}
			resp, body, err := conn.read(10 * time.Second)
			if err != nil {
				t.Fatalf("no answer to the request with the malformed body: %v", err)
			}
			t.Logf("first answer: %d %q", resp.StatusCode, truncate(body, 200))
			if got := conn.next(3 * time.Second); got != "closed" {
				t.Fatalf("after a body that failed to parse, the bytes that followed it were not dropped with the connection: %s "+
					"(a request smuggled inside the body was served)", got)
			}
		})
	}
}

// Attack (fixed): the pause-based desync. With read_body_idle set (README,
// "Server timeouts", recommends 10 s; Caddy's default is 1 m), a runner
// sends part of its body and pauses: the read fails, the gateway answers
// 400 — and keeps the connection. What the runner sends afterwards, the
// rest of the body its Content-Length announced, is parsed as the next
// request and answered. A proxy in front that pools connections to the
// gateway counts those bytes as the first request's body, so the answer
// to the smuggled request is queued for the next client on that pooled
// connection. Cause as above: full duplex skips net/http's
// closeAfterReply for a body read that failed, and EarlyAnswer.Finish
// returns for a body that ended with an error (a.ended) without closing.
// Fixed: as above (EarlyAnswer.CloseAfterAnswer).
func TestAnswerAttackPausedBodySmuggles(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Global: `servers {
		timeouts {
			read_body_idle 500ms
		}
	}`})
	conn := dialAttack(t, g)
	part := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`
	rest := smuggledRequest(conn.host)
	head := "POST /v1/mcp/svc HTTP/1.1\r\nHost: " + conn.host + "\r\nAuthorization: Bearer " + aliceKey +
		"\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: " +
		fmt.Sprint(len(part)+len(rest)) + "\r\n\r\n"
	if err := conn.write(head + part); err != nil {
		t.Fatal(err)
	}
	// The pause: read_body_idle ends the read of the body.
	resp, body, err := conn.read(10 * time.Second)
	if err != nil {
		t.Fatalf("no answer to the paused body: %v", err)
	}
	t.Logf("answer to the paused body: %d %v %q", resp.StatusCode, resp.Header.Get("Connection"), truncate(body, 200))
	// The rest of the body, as its Content-Length said.
	if err := conn.write(rest); err != nil {
		t.Logf("the gateway closed the connection: %v", err)
		return
	}
	if got := conn.next(3 * time.Second); got != "closed" {
		t.Fatalf("the rest of a paused body was parsed as a request of its own: %s", got)
	}
}
