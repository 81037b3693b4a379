package integration

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// attackRunnerLeavesMidCall has a runner start a call of the upstream's
// wait tool on rt, read its answer's head, and leave (the request's
// context ends: RST_STREAM(CANCEL) on HTTP/2, STOP_SENDING and
// RESET_STREAM on HTTP/3). The upstream must see the call cancelled, the
// gateway must hold no goroutine for it, and rt must still serve calls.
func attackRunnerLeavesMidCall(t *testing.T, up *upstream, m *rawMCP, rt http.RoundTripper, accept string) {
	callEcho(t, m, rt, 29, "warm") // the connection is open before the count
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	before := goroutineKinds()
	ctx, cancel := context.WithCancel(context.Background())
	req := m.mcpRequest(ctx, http.MethodPost,
		strings.NewReader(`{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"wait","arguments":{}}}`), -1)
	req.Header.Set("Accept", accept)
	type result struct {
		resp *http.Response
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := rt.RoundTrip(req)
		got <- result{resp, err}
	}()
	// The upstream has the call once its request log shows it.
	for i := 0; ; i++ {
		seen := false
		for _, r := range up.requestLog() {
			if strings.Contains(r.Body, `"name":"wait"`) {
				seen = true
			}
		}
		if seen {
			break
		}
		if i == 200 {
			t.Fatal("the wait call never reached the upstream")
		}
		time.Sleep(25 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	cancel() // the runner leaves
	if r := <-got; r.err == nil {
		r.resp.Body.Close()
	}
	select {
	case name := <-up.cancelled:
		if name != "wait" {
			t.Errorf("cancelled %q", name)
		}
	case <-time.After(20 * time.Second):
		t.Error("the runner left mid-call, and the upstream's call was never cancelled")
	}
	callEcho(t, m, rt, 31, "next") // the connection serves the next call
	if n := settleGoroutines(base + 10); n > base+10 {
		t.Errorf("%d goroutines after the runner left, %d before its call; more of: %s", n, base, newGoroutines(before))
	}
}

// callEcho has alice's echo tool echo text over rt, failing t unless it
// does.
func callEcho(t testing.TB, m *rawMCP, rt http.RoundTripper, id int, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := rt.RoundTrip(m.mcpRequest(ctx, http.MethodPost, strings.NewReader(echoCall(id, text)), -1))
	if err != nil {
		t.Fatalf("echo %q: %v", text, err)
	}
	b, err := readAllWithin(resp.Body, 15*time.Second)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), text) {
		t.Fatalf("echo %q: %d %v %.300s", text, resp.StatusCode, err, b)
	}
}

// goroutineKinds counts the running goroutines by where they were
// created and where they wait.
func goroutineKinds() map[string]int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	kinds := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(strings.TrimSpace(g), "\n")
		if len(lines) < 2 {
			continue
		}
		top := strings.SplitN(lines[1], "(", 2)[0]
		created := ""
		for i, l := range lines {
			if strings.HasPrefix(l, "created by ") {
				created = strings.SplitN(strings.TrimPrefix(l, "created by "), " in goroutine", 2)[0]
				if i+1 < len(lines) {
					created += " " + strings.TrimSpace(strings.SplitN(lines[i+1], " +", 2)[0])
				}
			}
		}
		kinds[top+" <- "+created]++
	}
	return kinds
}

// newGoroutines says which kinds of goroutines are more than in before.
func newGoroutines(before map[string]int) string {
	var out []string
	for k, n := range goroutineKinds() {
		if n > before[k] {
			out = append(out, fmt.Sprintf("\n  %d× %s", n-before[k], k))
		}
	}
	return strings.Join(out, "")
}

// Attack (held): a runner on HTTP/2 (TLS) leaves a call relayed upstream
// (RST_STREAM CANCEL on its stream), its answer JSON: the upstream's call
// is cancelled, no goroutine is held, and the connection goes on.
func TestH2AttackResetMidCallJSON(t *testing.T) {
	up, g, m := h2AliceSession(t, "h1 h2 h3", "")
	attackRunnerLeavesMidCall(t, up, m, g.dialH2(t), "application/json")
}

// Attack (held): the same with the answer on SSE (resumable: the call is
// given up at the service's timeout, 3 s here, and cancelled upstream).
func TestH2AttackResetMidCallSSE(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Timeout: "3s"}, "h1 h2 h3")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	attackRunnerLeavesMidCall(t, up, m, g.dialH2(t), "application/json, text/event-stream")
}

// Attack (held): a runner on HTTP/3 leaves a call relayed upstream, JSON.
func TestH2AttackResetMidCallH3JSON(t *testing.T) {
	up, g, m := h2AliceSession(t, "h1 h2 h3", "")
	attackRunnerLeavesMidCall(t, up, m, g.h3Transport(t), "application/json")
}

// Attack (held): a runner on HTTP/3 leaves a call whose answer is SSE.
func TestH2AttackResetMidCallH3SSE(t *testing.T) {
	up := startUpstream(t)
	g := startH2Gateway(t, gatewayConfig{Upstream: up.URL, Timeout: "3s"}, "h1 h2 h3")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	attackRunnerLeavesMidCall(t, up, m, g.h3Transport(t), "application/json, text/event-stream")
}
