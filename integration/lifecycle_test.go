package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// The MCP session lifecycle through toolgate against go-sdk upstreams, some
// of them made to misbehave: ending sessions here and upstream, deadlines
// while re-initializing, limits, the tool catalog, shared connections.

// waitFor polls cond every 10 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, 10*time.Second, what, cond)
}

// waitWithin waits until cond holds, checking every 10 ms, and fails t
// when it still does not after limit.
func waitWithin(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// holdInitializes makes the upstream hold every initialize until the test
// ends; held counts them.
func holdInitializes(t *testing.T, up *upstream) (held *atomic.Int32, release func()) {
	held = new(atomic.Int32)
	hold := make(chan struct{})
	var once atomic.Bool
	release = func() {
		if once.CompareAndSwap(false, true) {
			close(hold)
		}
	}
	t.Cleanup(release)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if strings.Contains(string(body), `"method":"initialize"`) {
			held.Add(1)
			select {
			case <-hold:
			case <-r.Context().Done():
				return true
			}
		}
		return false
	})
	return held, release
}

// rpcError is the error of a JSON-RPC answer, zero when it has none.
func rpcError(t *testing.T, msg json.RawMessage) (code int, message string) {
	t.Helper()
	var m struct {
		Error struct {
			Code    int
			Message string
		}
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		t.Fatalf("answer %s: %v", msg, err)
	}
	return m.Error.Code, m.Error.Message
}

func lastMessage(t *testing.T, msgs []json.RawMessage) json.RawMessage {
	t.Helper()
	if len(msgs) == 0 {
		t.Fatal("no answer")
	}
	return msgs[len(msgs)-1]
}

// A call meeting a forgotten upstream session waits for a
// re-initialization in progress no longer than its own timeout, and the
// runner's GET, which has no deadline of its own, re-initializes within
// the service timeout.
func TestReinitializeHonoursEachCallersDeadline(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{Timeout: "1s"})
	up.reset() // the upstream forgets the session: 404 from now on
	held, _ := holdInitializes(t, up)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	getDone := make(chan int, 1)
	go func() {
		resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
		if err != nil {
			getDone <- 0
			return
		}
		resp.Body.Close()
		getDone <- resp.StatusCode
	}()
	waitFor(t, "the GET's re-initialize to reach the upstream", func() bool { return held.Load() >= 1 })

	postDone := make(chan []json.RawMessage, 1)
	go func() {
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
		postDone <- msgs
	}()
	select {
	case msgs := <-postDone:
		if code, _ := rpcError(t, lastMessage(t, msgs)); code != -32011 {
			t.Errorf("the call's answer = %s, want a retryable -32011", lastMessage(t, msgs))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call waited behind the stream's re-initialize far beyond its 1s timeout")
	}
	select {
	case status := <-getDone:
		if status != http.StatusServiceUnavailable {
			t.Errorf("the GET's status = %d, want 503 (the upstream did not re-initialize in time)", status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the GET's re-initialize was not bounded by the service timeout")
	}
}

// An idle MCP session ends upstream too.
func TestIdleMCPSessionEndsUpstream(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{Extra: "mcp_session_idle_timeout 200ms\nmcp_session_sweep_interval 50ms"})
	if open := up.openSessions(); len(open) != 1 {
		t.Fatalf("upstream sessions after initialize: %v", open)
	}
	waitFor(t, "the idle session's DELETE upstream", func() bool { return len(up.openSessions()) == 0 })
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusNotFound {
		t.Errorf("a request on the expired session: %d, want 404", status)
	}
}

// An open stream is use: the session does not expire under it.
func TestOpenStreamKeepsTheSession(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{Extra: "mcp_session_idle_timeout 300ms\nmcp_session_sweep_interval 50ms"})
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %v %v", err, resp)
	}
	time.Sleep(time.Second) // more than three idle timeouts, with the stream open
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"still here"}}}`)
	if !strings.Contains(string(lastMessage(t, msgs)), `still here`) {
		t.Errorf("a call while the stream was open: %s", msgs)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the session to expire once its stream closed", func() bool { return len(up.openSessions()) == 0 })
}

// A DELETE racing a call's re-initialization leaves no upstream
// session behind, and the closed session never initializes again.
func TestDeleteRacingReinitializeLeavesNoUpstreamSession(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	up.reset()
	held, release := holdInitializes(t, up)
	callDone := make(chan int, 1)
	go func() {
		status, _, _ := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
		callDone <- status
	}()
	waitFor(t, "the call's re-initialize to reach the upstream", func() bool { return held.Load() == 1 })
	if status := m.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	release()
	if status := <-callDone; status != http.StatusNotFound {
		t.Errorf("the call on the ended session: %d, want 404", status)
	}
	waitFor(t, "every upstream session to be ended", func() bool { return len(up.openSessions()) == 0 })
	if held.Load() != 1 {
		t.Errorf("the upstream saw %d initializes after the restart, want 1", held.Load())
	}
}

// A tools/call racing the first tool listing waits for it and
// is decided with the tool's definition (read-only: allowed).
func TestCallWaitsForTheToolCatalog(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	listing := make(chan struct{})
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	var once atomic.Bool
	up.setIntercept(func(_ http.ResponseWriter, r *http.Request, body []byte) bool {
		if strings.Contains(string(body), `"method":"tools/list"`) && strings.Contains(string(body), `"toolgate-`) && once.CompareAndSwap(false, true) {
			close(listing)
			select {
			case <-hold:
			case <-time.After(300 * time.Millisecond):
			case <-r.Context().Done():
			}
		}
		return false
	})
	status, hdr, _ := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusOK {
		t.Fatalf("initialize: %d", status)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	go m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	<-listing // the listing is under way; the call races it
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"decided with the definition"}}}`)
	if !strings.Contains(string(lastMessage(t, msgs)), "decided with the definition") {
		t.Fatalf("answer = %s, want the read-only tool to run", lastMessage(t, msgs))
	}
}

// Notifications/tools/list_changed refreshes the catalog, so a
// tool added later is decided with its definition.
func TestListChangedRefreshesTheCatalog(t *testing.T) {
	_, _, m := aliceSession(t, gatewayConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %v %v", err, resp)
	}
	defer resp.Body.Close()
	if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_tool","arguments":{}}}`); !strings.Contains(string(lastMessage(t, msgs)), "added") {
		t.Fatalf("add_tool: %s", msgs)
	}
	// The runner sees list_changed once toolgate relayed it (and started
	// listing the tools again).
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() && !strings.Contains(lines.Text(), "notifications/tools/list_changed") {
	}
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"late_tool","arguments":{"text":"known"}}}`)
	if !strings.Contains(string(lastMessage(t, msgs)), `known`) {
		t.Fatalf("late_tool answer = %s, want it run (its definition says read-only)", lastMessage(t, msgs))
	}
}

// Reloads share the upstream connection pool instead of
// stranding one per configuration.
func TestReloadsShareUpstreamConnections(t *testing.T) {
	up := startUpstream(t)
	for i := range 10 {
		g := startGateway(t, gatewayConfig{Upstream: up.URL})
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
		m.initialize()
		if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`); len(msgs) == 0 {
			t.Fatalf("reload %d: no answer", i)
		}
	}
	if n := up.openConns(); n > 2 {
		t.Errorf("%d connections to the upstream are open after 10 reloads, want the one pool's (at most 2)", n)
	}
}

// A handler-order mistake fails `caddy validate`.
func TestPipelineOrderIsValidated(t *testing.T) {
	for name, route := range map[string]string{
		"result policy after the proxy": "toolgate_session\ntoolgate_registry\ntoolgate_proxy\ntoolgate_result_policy testdata/policy",
		"no registry":                   "toolgate_session\ntoolgate_proxy",
		"policy before the registry":    "toolgate_session\ntoolgate_policy testdata/policy\ntoolgate_registry\ntoolgate_proxy",
		"no session":                    "toolgate_registry\ntoolgate_proxy",
		"no policies":                   "toolgate_session\ntoolgate_registry\ntoolgate_proxy",
		"no result policy":              "toolgate_session\ntoolgate_registry\ntoolgate_policy testdata/policy\ntoolgate_credentials\ntoolgate_proxy",
	} {
		err := validateCaddyfile(t, `{
	admin off
	toolgate {
		service svc {
			url http://127.0.0.1:1/mcp
			allow_http
			tools echo
		}
	}
}
http://127.0.0.1:1 {
	route /v1/mcp/* {
		`+route+`
	}
}`)
		if err == nil || !regexp.MustCompile(`toolgate_\w+ (must come after|comes after)`).MatchString(err.Error()) {
			t.Errorf("%s: validate = %v, want the order mistake named", name, err)
		}
	}
}

// MCP sessions are bounded per caller and in all.
func TestMCPSessionLimits(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "max_mcp_sessions 3\nmax_mcp_sessions_per_caller 2"})
	aliceSess, bobSess := g.createSession(t, aliceKey, "svc"), g.createSession(t, bobKey, "svc")
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	var alices []*rawMCP
	for range 2 {
		m := g.raw(t, aliceKey, aliceSess, "svc")
		m.initialize()
		alices = append(alices, m)
	}
	_, _, msgs := g.raw(t, aliceKey, aliceSess, "svc").post(init)
	if _, msg := rpcError(t, lastMessage(t, msgs)); !strings.Contains(msg, "max_mcp_sessions_per_caller") {
		t.Errorf("alice's third session: %s, want the per-caller limit named", msgs)
	}
	g.raw(t, bobKey, bobSess, "svc").initialize() // the third session in all
	_, _, msgs = g.raw(t, bobKey, bobSess, "svc").post(init)
	if _, msg := rpcError(t, lastMessage(t, msgs)); !strings.Contains(msg, "max_mcp_sessions ") {
		t.Errorf("a fourth session in all: %s, want the global limit named", msgs)
	}
	if status := alices[0].delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d", status)
	}
	g.raw(t, aliceKey, aliceSess, "svc").initialize() // room again
}

// An MCP session keeps only what it needs of the runner's
// initialize, so a hundred large ones do not grow the heap by their size.
func TestLargeInitializesKeepTheHeapBounded(t *testing.T) {
	up := startUpstream(t)
	padding := strings.Repeat("x", 512<<10)
	// The go-sdk upstream keeps each session's initialize whole; what is
	// measured is toolgate, so the upstream gets the message without the
	// padding.
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), padding) {
			return false
		}
		r.Body = io.NopCloser(strings.NewReader(strings.Replace(string(body), padding, "", 1)))
		r.ContentLength = -1
		up.mcpHandler().ServeHTTP(w, r)
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL}) // 100 is the per-caller limit
	sess := g.createSession(t, aliceKey, "svc")
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},` +
		`"clientInfo":{"name":"big","version":"1"},"x_padding":"` + padding + `"}}`
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	before := heap()
	for i := range 100 {
		if status, hdr, _ := g.raw(t, aliceKey, sess, "svc").post(init); status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" {
			t.Fatalf("initialize %d: %d", i, status)
		}
	}
	grown := heap() - before
	t.Logf("the heap grew by %d KiB", grown>>10)
	if grown > 24<<20 {
		t.Errorf("100 open sessions initialized with 512 KiB each grew the heap by %d MiB, want under 24", grown>>20)
	}
}

// validateCaddyfile adapts a Caddyfile and validates it as `caddy
// validate` does.
func validateCaddyfile(t *testing.T, caddyfile string) error {
	t.Helper()
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return err
	}
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	caddyMu.Lock()
	defer caddyMu.Unlock()
	return caddy.Validate(&cfg)
}

// Calls one after another reuse one connection to the upstream, for an
// upstream answering over SSE and one answering with JSON: toolgate reads
// each upstream response to its end, so the connection goes back to the
// pool instead of being closed and dialled anew for the next call.
func TestSequentialCallsReuseTheUpstreamConnection(t *testing.T) {
	for _, kind := range upstreamKinds {
		t.Run(kind.name, func(t *testing.T) {
			up := startUpstreamWith(t, kind.configure)
			g := startGateway(t, gatewayConfig{Upstream: up.URL})
			m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
			m.initialize()
			call := func(i int) {
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x%d"}}}`, i, i)
				if status, _, msgs := m.post(body); status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), fmt.Sprintf(`x%d`, i)) {
					t.Fatalf("call %d: %d %s", i, status, msgs)
				}
			}
			call(1)
			before := up.acceptedConns()
			for i := 2; i <= 30; i++ {
				call(i)
			}
			if n := up.acceptedConns() - before; n != 0 {
				t.Errorf("29 calls one after another opened %d new connections to the upstream, want 0", n)
			}
		})
	}
}
