package integration

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// attackResetThenResume has a runner start a slow call with an SSE
// answer on rt, read its first event's id, reset the stream, and resume
// it on the same connection with GET and Last-Event-ID: the answer must
// come (no lost data), and the upstream must have run the call once.
func attackResetThenResume(t *testing.T, up *upstream, m *rawMCP, rt http.RoundTripper) {
	ctx, cancel := context.WithCancel(context.Background())
	req := m.mcpRequest(ctx, http.MethodPost, strings.NewReader(
		`{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{"name":"slow_echo","arguments":{"text":"resumed-answer","ms":1500}}}`), -1)
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		cancel()
		t.Fatalf("the slow call's answer is %s, want SSE", resp.Header.Get("Content-Type"))
	}
	id := ""
	br := bufio.NewReader(resp.Body)
	for id == "" {
		line, err := br.ReadString('\n')
		if err != nil {
			cancel()
			t.Fatalf("no event id before the answer: %v", err)
		}
		if strings.HasPrefix(line, "id:") {
			id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		}
	}
	cancel() // the runner's stream is reset
	resp.Body.Close()
	time.Sleep(100 * time.Millisecond)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	greq := m.mcpRequest(ctx2, http.MethodGet, nil, 0)
	greq.Header.Set("Accept", "text/event-stream")
	greq.Header.Set("Last-Event-ID", id)
	gresp, err := rt.RoundTrip(greq)
	if err != nil {
		t.Fatalf("resuming from %s: %v", id, err)
	}
	b, err := readAllWithin(gresp.Body, 20*time.Second)
	gresp.Body.Close()
	if gresp.StatusCode != http.StatusOK || !strings.Contains(string(b), "resumed-answer") {
		t.Errorf("resuming from %s after the reset: %d %v %.300s, want the answer", id, gresp.StatusCode, err, b)
	}
	if n := up.slowRuns()["resumed-answer"]; n != 1 {
		t.Errorf("the call ran %d times upstream, want once", n)
	}
}

const h2ResumeTools = "echo slow_echo wait"

// Attack (held): a runner's SSE answer reset mid-call on HTTP/2
// (RST_STREAM) is resumed on the same connection with Last-Event-ID:
// the answer arrives, the call ran once.
func TestH2AttackResetThenResume(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Tools: h2ResumeTools}, "h1 h2 h3")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	attackResetThenResume(t, up, m, g.dialH2(t))
}

// Attack (held): the same over HTTP/3.
func TestH2AttackResetThenResumeH3(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Tools: h2ResumeTools}, "h1 h2 h3")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	attackResetThenResume(t, up, m, g.h3Transport(t))
}

// attackStandaloneStreamsReset has a runner open its standalone SSE
// stream (GET) on rt and reset it, up to 40 times over, the next GET
// right after the reset (as a runner reconnects): every GET must open
// the stream (or, at worst, get a retryable 503), never a refusal.
func attackStandaloneStreamsReset(t *testing.T, m *rawMCP, rt http.RoundTripper) {
	for i := range 40 {
		ctx, cancel := context.WithCancel(context.Background())
		req := m.mcpRequest(ctx, http.MethodGet, nil, 0)
		req.Header.Set("Accept", "text/event-stream")
		var resp *http.Response
		var err error
		for range 100 { // a place comes back once the reset lands
			resp, err = rt.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
				break
			}
			resp.Body.Close()
			time.Sleep(100 * time.Millisecond)
			req = req.Clone(ctx)
		}
		if err != nil {
			cancel()
			t.Fatalf("GET %d: %v", i, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := readAllWithin(resp.Body, 5*time.Second)
			cancel()
			t.Fatalf("GET %d, right after the runner reset its previous standalone stream: %d %.300s, want its stream", i, resp.StatusCode, b)
		}
		cancel() // reset
		resp.Body.Close()
	}
	callEcho(t, m, rt, 45, "after-the-resets")
}

// Attack (fixed): a runner on HTTP/2 resets its standalone SSE stream
// (RST_STREAM CANCEL, as when it reconnects) and opens a new one on the
// same connection at once. Expected: the new GET opens the stream (the
// previous one is gone; at worst a retryable answer). What happened:
// within a few rounds a GET is answered HTTP 409 with JSON-RPC -32600
// "the upstream rejected the request (HTTP 409)" — not retryable, and
// no fault of the runner's: the upstream still held the stream of the
// relay the reset had just ended. (Resuming with Last-Event-ID retries a
// 409 for about a second; opening a new stream did not.) Fixed: both ask
// again while the upstream answers 409 (mcpproxy's getStream).
func TestH2AttackStandaloneStreamsReset(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_streams_per_caller 3")
	attackStandaloneStreamsReset(t, m, g.dialH2(t))
}
