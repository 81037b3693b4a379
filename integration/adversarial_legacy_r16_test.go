package integration

import (
	"context"
	"io"
	"net/http"
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
