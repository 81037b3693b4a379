package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Attack (fixed): a runner's initialize of a legacy service is in
// progress (the server takes its time to answer it) when the operator
// reloads a config that changes the service but not its url (here its
// dial_timeout): the MCP session goes on, but the service gets a new
// transport runtime. Caddy stops the old config without waiting for its
// requests during a reload and cleans it up at once, so the old runtime
// was destructed while its Open still waited; the initialize then
// succeeded on the destructed runtime, whose session nobody reaches (the
// runner's next request goes to the new runtime, which answers 404, and
// the runner initializes again), and its GET stream to the server stayed
// open until the server hung up: a stream, goroutine and read buffer
// leaked per initialize a reload catches, and the server kept a session
// for a client that is gone. (A reload changing the url ends the session
// in toolgate_proxy, which closed the stream.) Expected: the initialize
// fails with a retryable error and its stream closes. Reproduced (before
// the fix): the initialize succeeded, the stream stayed open. Severity:
// low (a leak that needs reloads).
func TestR16LegacyReloadDuringInitializeLeavesItsStream(t *testing.T) {
	got, release := make(chan struct{}, 1), make(chan struct{})
	l1 := startLegacy(t, legacyHooks{post: func(s *legacyStream, m legacyMsg, w http.ResponseWriter) bool {
		if m.Method != "initialize" {
			return false
		}
		got <- struct{}{}
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		s.send(legacyAnswer(m))
		w.WriteHeader(http.StatusAccepted)
		return true
	}})
	port := freePort(t)
	cfg := gatewayConfig{Upstream: "http://127.0.0.1:9/unused", DataDir: t.TempDir(), Services: legacyService("legacy", l1.srv.URL+"/sse", "")}
	g := startGatewayOnPort(t, port, cfg)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
	done := make(chan string, 1)
	go func() {
		resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream",
			`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, "")
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		done <- resp.Status + " " + resp.Header.Get("Mcp-Session-Id") + " " + string(body)
	}()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the initialize never reached the server")
	}
	cfg.Services = legacyService("legacy", l1.srv.URL+"/sse", "dial_timeout 2s")
	_ = startGatewayOnPort(t, port, cfg)
	time.Sleep(200 * time.Millisecond) // the old config's cleanup
	close(release)
	t.Logf("the initialize caught by the reload got %s", <-done)
	waitWithin(t, 3*time.Second, "the old server's stream to close", func() bool { return l1.openGET.Load() == 0 })
}

// Attack (fixed): alice disconnects a legacy service she had connected with a
// personal token (auth bearer; or her OAuth grant is refused). Her MCP
// session's stream, opened with that token, stays open until the
// session's idle timeout, and toolgate goes on using the token she took
// back: each ping the server sends is answered with a POST carrying it.
// toolgate lets go of a disconnected caller's credential at once where
// something of its own holds it (a per_user program is stopped:
// App.OnConnectionGone); the legacy transport's guard holds it for the
// session's whole life. Expected: after the disconnect, nothing toolgate
// sends carries the token, and her stream closes. Reproduced: the pings'
// answers carried it, the stream stayed open. Severity: low-medium (a
// credential used after its owner withdrew it; it goes to the server it
// was given for).
func TestR16LegacyDisconnectedTokenStillUsed(t *testing.T) {
	const token = "alice-legacy-token-r16-0123456789"
	l := startLegacy(t, legacyHooks{})
	g := legacyGateway(t, l, gatewayConfig{}, "auth bearer")
	if r := g.api(t, http.MethodPut, "/v1/connections/legacy", aliceKey, []byte(`{"token":"`+token+`"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /v1/connections/legacy: %d %s", r.StatusCode, r.Body)
	}
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
	m.initialize()
	if r := g.api(t, http.MethodDelete, "/v1/connections/legacy", aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE /v1/connections/legacy: %d %s", r.StatusCode, r.Body)
	}
	time.Sleep(300 * time.Millisecond) // the disconnect reaches what holds the token
	if s := l.stream(-1); s != nil {
		for i := range 3 {
			s.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":"r16-ping-%d","method":"ping"}`, i))
		}
	}
	time.Sleep(500 * time.Millisecond)
	l.mu.Lock()
	var used []string
	for _, p := range l.posts {
		if strings.Contains(p.Header.Get("Authorization"), token) && strings.Contains(string(p.Raw), "r16-ping") {
			used = append(used, string(p.Raw))
		}
	}
	l.mu.Unlock()
	if len(used) > 0 {
		t.Errorf("after alice disconnected, toolgate sent her token with %d messages: %q", len(used), used)
	}
	if n := l.openGET.Load(); n != 0 {
		t.Errorf("after alice disconnected, %d streams opened with her token are still open", n)
	}
}

// Attack (fixed): a legacy server answers a call on its stream at once,
// then answers the POST that carried it with 202 and a body it never
// ends. toolgate read that body (to reuse the connection) with no bound
// in time, so the call was held for the service's whole timeout though
// its answer had arrived at once; the MCP Go SDK's client closed the body
// unread. Expected: the answer, at once. Reproduced (before the fix): the
// answer came only when the service's timeout (5 s) ended the POST.
// Severity: low (availability: every call on such a server takes the
// whole timeout, holding its runner and a slot of its caller's).
func TestR16LegacyPostBodyKeptOpenHoldsTheAnswer(t *testing.T) {
	var l *legacyServer
	l = startLegacy(t, legacyHooks{post: func(s *legacyStream, m legacyMsg, w http.ResponseWriter) bool {
		if m.Method != "tools/call" {
			return false
		}
		s.send(legacyAnswer(m))
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "A")
		w.(http.Flusher).Flush()
		select {
		case <-l.quit:
		case <-time.After(8 * time.Second):
		}
		return true
	}})
	g := legacyGateway(t, l, gatewayConfig{}, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
	m.initialize()
	start := time.Now()
	_, _, msgs := m.post(fmt.Sprintf(legacyEcho, 1, "hi"))
	if took := time.Since(start); took > 2*time.Second || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"hi"`) {
		t.Errorf("the call took %v and got %s; want its answer at once", took, msgs)
	}
}

// Attack (fixed): a broken legacy server runs a call within its POST,
// sends the answer on its stream, then fails the POST (HTTP 500). The
// runner was told the call "may not have reached the server", retryable,
// though the server's answer had arrived: a runner retrying it ran the
// tool twice. Expected: the runner gets the answer. Reproduced (before
// the fix, and with the SDK's client): the retryable error. Severity:
// low-medium (a duplicate side effect).
func TestR16LegacyAnsweredThenFailedPostGivesTheAnswer(t *testing.T) {
	l := startLegacy(t, legacyHooks{post: func(s *legacyStream, m legacyMsg, w http.ResponseWriter) bool {
		if m.Method != "tools/call" {
			return false
		}
		s.send(legacyAnswer(m))
		time.Sleep(50 * time.Millisecond)
		w.WriteHeader(http.StatusInternalServerError)
		return true
	}})
	g := legacyGateway(t, l, gatewayConfig{}, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
	m.initialize()
	if _, _, msgs := m.post(fmt.Sprintf(legacyEcho, 1, "paid once")); len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"paid once"`) || retryableError(msgs) {
		t.Errorf("a call the server answered, then failed its POST: %s; want the answer", msgs)
	}
}
