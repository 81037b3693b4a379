package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (held): request trailers on HTTP/2 and HTTP/3. A call whose
// headers carry a wrong key and whose trailers carry alice's is refused
// (401, or the stream reset: Authorization is no trailer field):
// trailers never authenticate. A call of alice's whose trailers
// name another MCP session and toolgate session is served as hers.
func TestH2AttackTrailers(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "")
	// (Go's HTTP/2 client does not reuse a connection after a stream's
	// PROTOCOL_ERROR: each send on h2 dials its own.)
	h3 := g.h3Transport(t)
	for _, c := range []struct {
		name string
		rt   func() http.RoundTripper
	}{{"h2", func() http.RoundTripper { return g.dialH2(t) }}, {"h3", func() http.RoundTripper { return h3 }}} {
		send := func(header, trailer http.Header, text string) (int, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			pr, pw := io.Pipe()
			go func() {
				_, _ = pw.Write([]byte(echoCall(20, text)))
				pw.Close()
			}()
			req := m.mcpRequest(ctx, http.MethodPost, pr, -1)
			for k, v := range header {
				req.Header[k] = v
			}
			req.Trailer = trailer
			resp, err := c.rt().RoundTrip(req)
			if err != nil {
				return 0, err.Error() // refused by the server (a reset)
			}
			b, err := readAllWithin(resp.Body, 15*time.Second)
			resp.Body.Close()
			if err != nil { // the stream reset after the answer's head (the bogus trailer)
				return resp.StatusCode, err.Error()
			}
			return resp.StatusCode, string(b)
		}
		status, b := send(http.Header{"Authorization": {"Bearer not-a-key"}}, http.Header{"Authorization": {"Bearer " + aliceKey}}, "trailer-auth")
		if status != http.StatusUnauthorized && status != 0 {
			t.Errorf("%s: a wrong key with alice's key in a trailer: %d %.200s, want 401", c.name, status, b)
		}
		status, b = send(nil, http.Header{"Mcp-Session-Id": {"other"}, "X-Toolgate-Session": {"other"}}, "trailer-session")
		if status != http.StatusOK || !strings.Contains(b, "trailer-session") {
			t.Errorf("%s: alice's call with other sessions in trailers: %d %.200s, want her answer", c.name, status, b)
		}
	}
}

// Attack (held): header-size abuse on one HTTP/2 connection and over
// HTTP/3: a call whose headers hold 2 MiB (one value, and many
// HPACK-cheap repeats) is refused by the server (431 or a reset), and
// the same connection then serves alice's call.
func TestH2AttackOversizedHeaders(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "")
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{{"h2", g.dialH2(t)}, {"h3", g.h3Transport(t)}} {
		for _, shape := range []string{"one value", "repeats"} {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			req := m.mcpRequest(ctx, http.MethodPost, strings.NewReader(echoCall(21, "big-headers")), -1)
			if shape == "one value" {
				req.Header.Set("X-Pad", strings.Repeat("a", 2<<20))
			} else {
				for range 2048 {
					req.Header.Add("X-Pad", strings.Repeat("b", 1024))
				}
			}
			resp, err := c.rt.RoundTrip(req)
			if err == nil {
				b, _ := readAllWithin(resp.Body, 15*time.Second)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Errorf("%s, %s: 2 MiB of headers served: %.200s", c.name, shape, b)
				}
			}
			cancel()
			callEcho(t, m, c.rt, 22, "after-"+c.name+"-"+strings.ReplaceAll(shape, " ", "-"))
		}
	}
}
