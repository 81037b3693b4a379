// Package bridgetest drives an upstream transport (an http.RoundTripper
// such as mcpbridge.Bridge) the way toolgate_proxy does, for the tests of
// mcpbridge and of the upstream transport modules.
package bridgetest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/sseref"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Capabilities runners declare.
const (
	NoCapabilities = `{}`
	Sampling       = `{"sampling":{}}`
)

// Runner is one runner's MCP session through a transport.
type Runner struct {
	T       testing.TB
	RT      http.RoundTripper
	User    string
	Header  http.Header // sent with every request (the caller's credential)
	Session string      // the Mcp-Session-Id, once initialized
}

// Initialize starts the session, declaring capabilities (JSON), and
// returns the initialize response.
func (r *Runner) Initialize(capabilities string) string {
	r.T.Helper()
	r.Session = ""
	resp := r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":`+
		capabilities+`,"clientInfo":{"name":"runner","version":"1"}}}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || gjson.GetBytes(body, "id").String() != "init" {
		r.T.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	if r.Session = resp.Header.Get("Mcp-Session-Id"); r.Session == "" {
		return string(body) // refused: the body says why
	}
	if resp := r.Send(http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		r.T.Fatalf("notifications/initialized: %d", resp.StatusCode)
	}
	return string(body)
}

// Send sends one request of the session; the response is the caller's to
// close.
func (r *Runner) Send(method, body string) *http.Response {
	r.T.Helper()
	return r.SendCtx(context.Background(), method, body)
}

// SendCtx is Send within ctx.
func (r *Runner) SendCtx(ctx context.Context, method, body string) *http.Response {
	r.T.Helper()
	req, err := http.NewRequestWithContext(gateway.WithUpstreamUser(ctx, r.User), method, "", strings.NewReader(body))
	if err != nil {
		r.T.Fatal(err)
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.Session != "" {
		req.Header.Set("Mcp-Session-Id", r.Session)
	}
	resp, err := r.RT.RoundTrip(req)
	if err != nil {
		r.T.Fatalf("RoundTrip: %v", err)
	}
	return resp
}

// Call sends a request and returns every message of its answer.
func (r *Runner) Call(body string) []string {
	r.T.Helper()
	resp := r.Send(http.MethodPost, body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		r.T.Fatalf("reading the answer to %s: %v", body, err)
	}
	return Messages(resp, data)
}

// Messages are the JSON-RPC messages of an answer: the JSON body, or each
// SSE event's data, read as a standard SSE client reads them.
func Messages(resp *http.Response, data []byte) []string {
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		if len(bytes.TrimSpace(data)) == 0 {
			return nil
		}
		return []string{string(data)}
	}
	var out []string
	for _, ev := range sseref.Parse(string(data)).Events {
		out = append(out, ev.Data)
	}
	return out
}

// Events reads an SSE answer as it comes; the channel closes when it ends.
func Events(body io.Reader) <-chan string {
	ch := make(chan string, 1024)
	go func() {
		defer close(ch)
		var buf bytes.Buffer
		seen := 0
		chunk := make([]byte, 4096)
		for {
			n, err := body.Read(chunk)
			buf.Write(chunk[:n])
			evs := sseref.Parse(buf.String()).Events
			for ; seen < len(evs); seen++ {
				ch <- evs[seen].Data
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// Next returns the next message of ch, failing after 20s.
func Next(t testing.TB, ch <-chan string) string {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("the stream ended")
		}
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no message within 20s")
	}
	return ""
}

// ToolText is the first text of a tools/call result.
func ToolText(msg string) string { return gjson.Get(msg, "result.content.0.text").String() }
