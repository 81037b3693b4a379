package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// attackGetAndDeleteBodies sends, on rt: a GET carrying a body (at once,
// and stalled), a GET whose body of unknown length is empty (let
// through: its stream opens), and a DELETE carrying a stalled body
// (answered 204, the session ended); the connection then still serves a
// new session's calls.
func attackGetAndDeleteBodies(t *testing.T, g *h2Gateway, m *rawMCP, rt http.RoundTripper) {
	do := func(name string, req *http.Request) (int, string) {
		t.Helper()
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := readAllWithin(resp.Body, 15*time.Second)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %d, reading: %v", name, resp.StatusCode, err)
		}
		return resp.StatusCode, string(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A GET with a body sent at once, with and without a length.
	for _, length := range []int64{14, -1} {
		req := m.mcpRequest(ctx, http.MethodGet, strings.NewReader(`{"jsonrpc":1}`+"\n"), length)
		req.Header.Set("Accept", "text/event-stream")
		if status, b := do("GET with a body", req); status != http.StatusBadRequest || !strings.Contains(b, "carries no body") {
			t.Errorf("GET with a body (length %d): %d %.200s, want 400", length, status, b)
		}
	}
	// A GET whose body stalls after a byte.
	req := m.mcpRequest(ctx, http.MethodGet, stalledBody(t, "{"), -1)
	req.Header.Set("Accept", "text/event-stream")
	if status, b := do("GET with a stalled body", req); status != http.StatusBadRequest {
		t.Errorf("GET with a stalled body: %d %.200s, want 400", status, b)
	}
	// A GET whose body of unknown length is empty: its stream opens.
	pr, pw := io.Pipe()
	go func() { time.Sleep(50 * time.Millisecond); pw.Close() }()
	sctx, scancel := context.WithCancel(ctx)
	req = m.mcpRequest(sctx, http.MethodGet, pr, -1)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET with an empty body: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		t.Errorf("GET with an empty body of unknown length: %d %s, want its stream", resp.StatusCode, b)
	}
	scancel()
	resp.Body.Close()
	// A DELETE whose body stalls: answered, the session ended.
	req = m.mcpRequest(ctx, http.MethodDelete, stalledBody(t, `{"pad":"`+strings.Repeat("p", 4096)), -1)
	if status, b := do("DELETE with a stalled body", req); status != http.StatusNoContent {
		t.Errorf("DELETE with a stalled body: %d %.200s, want 204", status, b)
	}
	if status, b := do("a call of the ended session", m.mcpRequest(ctx, http.MethodPost, strings.NewReader(echoCall(70, "ended")), -1)); status != http.StatusNotFound {
		t.Errorf("a call of the session the DELETE ended: %d %.200s, want 404", status, b)
	}
	// The connection serves a new session.
	m2 := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m2.initialize()
	callEcho(t, m2, rt, 71, "new-session")
}

// Attack (held): GET and DELETE carrying bodies on one HTTP/2 connection.
func TestH2AttackGetAndDeleteBodies(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "")
	attackGetAndDeleteBodies(t, g, m, g.dialH2(t))
}

// Attack (held): GET and DELETE carrying bodies over HTTP/3.
func TestH2AttackGetAndDeleteBodiesH3(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "")
	attackGetAndDeleteBodies(t, g, m, g.h3Transport(t))
}

// bytesInFlight reads the gateway's toolgate_request_bytes_in_flight
// over rt.
func bytesInFlight(t *testing.T, m *rawMCP, rt http.RoundTripper) string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req := m.mcpRequest(ctx, http.MethodGet, nil, 0)
	req.URL.Path = "/metrics"
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	b, _ := readAllWithin(resp.Body, 15*time.Second)
	resp.Body.Close()
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "toolgate_request_bytes_in_flight ") {
			return strings.TrimPrefix(l, "toolgate_request_bytes_in_flight ")
		}
	}
	t.Fatalf("no toolgate_request_bytes_in_flight in the metrics")
	return ""
}

// attackResetUploadsGiveRoomBack has alice start uploads of unknown
// length that stall (each holds max_request_size of request-body room)
// and reset them (the runner cancels its streams), several rounds over:
// the room must come back each time (toolgate_request_bytes_in_flight
// back to 0), and her next call must be served.
func attackResetUploadsGiveRoomBack(t *testing.T, m *rawMCP, rt http.RoundTripper) {
	for round := range 4 {
		var wg sync.WaitGroup
		var cancels []context.CancelFunc
		for range 4 {
			ctx, cancel := context.WithCancel(context.Background())
			cancels = append(cancels, cancel)
			body, stop := stalledBodyStop(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + strings.Repeat("s", 1024))
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer stop()
				resp, err := rt.RoundTrip(m.mcpRequest(ctx, http.MethodPost, body, -1))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		got := ""
		for range 100 { // the uploads hold room (the test's own check)
			if got = bytesInFlight(t, m, rt); got != "0" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got == "0" {
			t.Fatalf("round %d: the stalled uploads never held room", round)
		}
		for _, c := range cancels {
			c()
		}
		wg.Wait()
		for range 200 { // at most 10 s
			if got = bytesInFlight(t, m, rt); got == "0" {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got != "0" {
			t.Fatalf("round %d: %s request-body bytes still held after the uploads were reset", round, got)
		}
		callEcho(t, m, rt, 80+round, "room")
	}
}

// Attack (held): uploads reset mid-body on HTTP/2 give their room back.
func TestH2AttackResetUploadsGiveRoomBack(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 64KiB\n\t\tmax_request_bytes_in_flight_per_caller 256KiB")
	attackResetUploadsGiveRoomBack(t, m, g.dialH2(t))
}

// Attack (held): uploads reset mid-body on HTTP/3 give their room back.
func TestH2AttackResetUploadsGiveRoomBackH3(t *testing.T) {
	_, g, m := h2AliceSession(t, "h1 h2 h3", "max_request_size 64KiB\n\t\tmax_request_bytes_in_flight_per_caller 256KiB")
	attackResetUploadsGiveRoomBack(t, m, g.h3Transport(t))
}

// attackStalledAuthenticatedUpload has alice start a call whose body
// stalls halfway (under max_request_size), with read_body_idle 2s: she
// gets 400 within the bound, nothing reaches the upstream, her room comes
// back, and the connection serves her next call.
func attackStalledAuthenticatedUpload(t *testing.T, up *upstream, m *rawMCP, rt http.RoundTripper) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := m.mcpRequest(ctx, http.MethodPost, stalledBody(t, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"stalled-upload`), -1)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("a stalled upload: the runner got %v, want 400", err)
	}
	b, err := readAllWithin(resp.Body, 20*time.Second)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a stalled upload: %d %v %.300s, want 400", resp.StatusCode, err, b)
	}
	if n := upstreamCalls(up, "stalled-upload"); n != 0 {
		t.Errorf("a stalled upload reached the upstream %d times", n)
	}
	got := ""
	for range 100 {
		if got = bytesInFlight(t, m, rt); got == "0" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != "0" {
		t.Errorf("%s request-body bytes still held after the stalled upload was answered", got)
	}
	callEcho(t, m, rt, 6, "after-the-stall")
}

const readBodyIdle2s = "servers {\n\t\ttimeouts {\n\t\t\tread_body_idle 2s\n\t\t}\n\t}"

// Attack (held): an authenticated upload that stalls on HTTP/2 ends at
// read_body_idle with 400, nothing upstream, its room back.
func TestH2AttackStalledAuthenticatedUpload(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Global: readBodyIdle2s}, "h1 h2 h3")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	attackStalledAuthenticatedUpload(t, up, m, g.dialH2(t))
}

// Attack (held): the same over HTTP/3.
func TestH2AttackStalledAuthenticatedUploadH3(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Global: readBodyIdle2s}, "h1 h2 h3")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	attackStalledAuthenticatedUpload(t, up, m, g.h3Transport(t))
}
