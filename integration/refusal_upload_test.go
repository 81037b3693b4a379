package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A call refused before its body is read (no or a wrong credential,
// another caller's session, an MCP session that ended) reaches a runner
// that sent its large body at once as the refusal it is: the 401 with its
// WWW-Authenticate, the 403, the 404 that tells an MCP client to
// initialize again, the 404, 413 and 415 of the registry's step. A server that answers and closes with the body
// unread resets the connection, and the runner then gets "connection
// reset by peer" instead: it neither signs in again nor re-initializes.
// Fixed: every case was answered with a reset, the first call or the
// second; the first step of the route readies the request to be answered
// before its body is read (gateway.AnswerBeforeBody).
func TestRefusalBeforeTheBodyReachesAnUploadingRunner(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_request_size 1MiB"})
	alice := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	alice.transport = &http.Transport{DisableKeepAlives: true}
	alice.initialize()
	call := func(id, size int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"_meta":{"pad":%q}}}`, id, strings.Repeat("p", size))
	}
	with := func(change func(m *rawMCP)) *rawMCP {
		m := *alice
		m.headers = map[string]string{}
		for k, v := range alice.headers {
			m.headers[k] = v
		}
		change(&m)
		return &m
	}
	for _, c := range []struct {
		name   string
		m      *rawMCP
		status int
		want   string // in the body
		header string // present on the answer
	}{
		{"wrong key", with(func(m *rawMCP) { m.headers["Authorization"] = "Bearer not-a-key" }), http.StatusUnauthorized, "", "WWW-Authenticate"},
		{"no key", with(func(m *rawMCP) { delete(m.headers, "Authorization") }), http.StatusUnauthorized, "", "WWW-Authenticate"},
		{"another caller's session", with(func(m *rawMCP) { m.headers["Authorization"] = "Bearer " + bobKey }), http.StatusForbidden, "another caller", ""},
		{"an MCP session that ended", with(func(m *rawMCP) { m.sessionID = "ended-" + m.sessionID }), http.StatusNotFound, "initialize", ""},
		{"a service not in the registry", with(func(m *rawMCP) { m.url = strings.TrimSuffix(m.url, "/svc") + "/nope" }), http.StatusNotFound, "unknown service", ""},
		{"a body not JSON", with(func(m *rawMCP) { m.headers["Content-Type"] = "text/plain" }), http.StatusUnsupportedMediaType, "Content-Type", ""},
		{"a body over max_request_size", alice, http.StatusRequestEntityTooLarge, "max_request_size", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i := range 16 { // sent at once: a reset comes of one in a few
				size := 900 << 10
				if c.status == http.StatusRequestEntityTooLarge {
					size = 1536 << 10
				}
				resp, err := c.m.send(context.Background(), http.MethodPost, "application/json, text/event-stream", call(100+i, size), "")
				if err != nil {
					t.Fatalf("call %d: the runner got %v, want the %d", i, err, c.status)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) || c.header != "" && resp.Header.Get(c.header) == "" {
					t.Fatalf("call %d: %d %v %.300s, want %d with %q", i, resp.StatusCode, resp.Header, b, c.status, c.want)
				}
			}
		})
	}
	// The gateway still serves the session's own calls.
	if status, _, msgs := alice.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`); status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "after") {
		t.Fatalf("after the refusals: %d %s", status, msgs)
	}
}

// A runner that stops sending its body halfway gets the refusal at once,
// and the gateway stops waiting for the rest: it closes the connection
// after its bounded wait (2 s), not when its read timeouts allow.
// Fixed: the read of the rest was bounded, but the connection was then
// kept for the runner's next request (Caddy wraps the body, and net/http
// no longer sees it unread), the rest of the body to be read as one.
func TestRefusalOfAStalledUploadEnds(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_request_size 1MiB"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/mcp/svc HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer not-a-key\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n", strings.TrimPrefix(g.URL, "http://"), 900<<10)
	if _, err := conn.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + strings.Repeat("p", 10<<10))); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for the test, far above the gateway's
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the refusal did not come while the body was unsent: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("%d %v %.300s, want 401 with WWW-Authenticate", resp.StatusCode, resp.Header, b)
	}
	// The gateway closes the connection: a read ends (EOF or a reset),
	// without a timeout.
	_, err = br.ReadByte()
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("after the refusal of a stalled upload the connection stayed open: %v", err)
	}
}
