package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// refusalCase is a call the gateway refuses before it reads the body.
type refusalCase struct {
	name   string
	change func(req *http.Request)
	status int
	want   string // in the answer's body
	header string // on the answer
	over   bool   // the body is over max_request_size
}

func refusalCases(g *h2Gateway) []refusalCase {
	return []refusalCase{
		{"wrong key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer not-a-key") }, http.StatusUnauthorized, "", "WWW-Authenticate", false},
		{"another caller's session", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+bobKey) }, http.StatusForbidden, "another caller", "", false},
		{"an ended MCP session", func(r *http.Request) { r.Header.Set("Mcp-Session-Id", "ended-session") }, http.StatusNotFound, "initialize", "", false},
		{"unknown service", func(r *http.Request) { r.URL.Path = "/v1/mcp/nope" }, http.StatusNotFound, "unknown service", "", false},
		{"body not JSON", func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, http.StatusUnsupportedMediaType, "Content-Type", "", false},
		{"body over max_request_size", func(*http.Request) {}, http.StatusRequestEntityTooLarge, "max_request_size", "", true},
	}
}

// attackRefusalsWhileUploading sends each refusal case on rt twice, once
// with a body sent at once (over max_request_size: 4 MiB) and once with
// a body that stalls after its first bytes, and asserts the answer (not
// a reset) in a bounded time; then that rt still serves alice's call.
func attackRefusalsWhileUploading(t *testing.T, g *h2Gateway, m *rawMCP, rt http.RoundTripper) {
	const max = 64 << 10
	for _, c := range refusalCases(g) {
		for _, stalled := range []bool{false, true} {
			name := c.name + map[bool]string{false: " at once", true: " stalled"}[stalled]
			size := 40 << 10
			if c.over {
				size = 4 << 20
			}
			payload := echoCall(7, strings.Repeat("p", size))
			var body io.Reader = strings.NewReader(payload)
			length := int64(len(payload))
			if stalled {
				head := payload[:20<<10]
				if c.over {
					head = payload[:max+(8<<10)]
				}
				body, length = stalledBody(t, head), -1
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			req := m.mcpRequest(ctx, http.MethodPost, body, length)
			c.change(req)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				cancel()
				t.Errorf("%s: the runner got %v, want the %d", name, err, c.status)
				continue
			}
			b, err := readAllWithin(resp.Body, 15*time.Second)
			resp.Body.Close()
			cancel()
			if err != nil {
				t.Errorf("%s: %d, reading the answer: %v (read %q)", name, resp.StatusCode, err, b)
				continue
			}
			if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) || c.header != "" && resp.Header.Get(c.header) == "" {
				t.Errorf("%s: %d %v %.200s, want %d with %q", name, resp.StatusCode, resp.Header, b, c.status, c.want)
			}
		}
	}
	// The connection still serves alice's calls.
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		req := m.mcpRequest(ctx, http.MethodPost, strings.NewReader(echoCall(50+i, "after")), -1)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("a call after the refusals: %v", err)
		}
		b, err := readAllWithin(resp.Body, 15*time.Second)
		resp.Body.Close()
		cancel()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "after") {
			t.Fatalf("a call after the refusals: %d %v %.300s", resp.StatusCode, err, b)
		}
	}
}

// h2AliceSession is a gateway over protocols, and alice's initialized MCP
// session through it.
func h2AliceSession(t *testing.T, protocols string, extra string) (*upstream, *h2Gateway, *rawMCP) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Extra: extra}, protocols)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	return up, g, m
}

// Attack (held): every refusal before the body is read (401, 403, the
// ended session's 404, the unknown service's 404, 415, 413), sent on one
// HTTP/2 connection over TLS while the runner is still uploading (a body
// at once, a body that stalls after its first bytes): each runner gets
// its answer (not a stream reset) within the bounded drain, and the same
// connection then serves alice's calls.
func TestH2AttackRefusalsWhileUploadingOverTLS(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 64KiB")
	c := g.dialH2(t)
	attackRefusalsWhileUploading(t, g, m, c)
}

// Attack (held): the same refusals over cleartext HTTP/2 (h2c, prior
// knowledge), on one connection.
func TestH2AttackRefusalsWhileUploadingOverH2C(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2c", "max_request_size 64KiB")
	c := g.dialH2(t)
	attackRefusalsWhileUploading(t, g, m, c)
}

// Attack (held): the same refusals over HTTP/3, on one QUIC connection.
func TestH2AttackRefusalsWhileUploadingOverH3(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 64KiB")
	attackRefusalsWhileUploading(t, g, m, g.h3Transport(t))
}
