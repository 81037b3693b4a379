package integration

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fixattackTouch has bob touch test://watched through a new MCP session of
// his on g (the upstream tells every session subscribed to it).
func fixattackTouch(t *testing.T, g *gateway) {
	t.Helper()
	bobs := g.connect(t, bobKey, g.createSession(t, bobKey, "svc"), "svc", nil)
	if _, err := bobs.CallTool(context.Background(), &mcp.CallToolParams{Name: "touch_resource", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
}

// fixattackRevoked checks that the revocable key is refused by g (the
// control: the reload took effect).
func fixattackRevoked(t *testing.T, g *gateway, key string) {
	t.Helper()
	if status, _, _ := g.raw(t, key, "", "svc").post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`); status != http.StatusUnauthorized {
		t.Fatalf("control: the revoked key after the reload: %d, want 401", status)
	}
}

// Attack: two reloads in a row. WhileAuthorized watches only the stop of
// the App the stream was opened under (its stopCtx): the first reload
// (which changes nothing the stream depends on) fires that watch once, the
// check passes, and nothing watches the stream any more. A second reload
// that revokes the stream's API key then says nothing to it: the stream
// keeps carrying the service's notifications to whoever holds the revoked
// key. (TestStreamEndsWhenAReloadRevokesItsAPIKey passes only because the
// key is revoked by the very first reload.)
func TestFixAttackStreamSurvivesKeyRevokedBySecondReload(t *testing.T) {
	const revocable = "test-key-alice-fixattack-2reloads"
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
	g := startGatewayOnPort(t, port, cfg)
	updated := watchedUpdates(t, g, revocable)

	// Reload 1: the same configuration (an unrelated edit elsewhere).
	cfg.DataDir = g.DataDir
	g1 := startGatewayOnPort(t, port, cfg)
	fixattackTouch(t, g1)
	select { // still authorized: the stream goes on
	case <-updated:
	case <-time.After(5 * time.Second):
		t.Fatal("control: after a reload that changed nothing, the stream no longer carries updates")
	}

	// Reload 2: the key is revoked.
	cfg.AuthExtra = ""
	g2 := startGatewayOnPort(t, port, cfg)
	fixattackRevoked(t, g2, revocable)
	fixattackTouch(t, g2)
	select {
	case uri := <-updated:
		t.Errorf("after a second reload revoked its API key, the stream still carries the service's notifications (%s): only the first reload after it opened is watched", uri)
	case <-time.After(3 * time.Second):
	}
}

// Attack: a stateless runner's subscriptions/listen with an upstream of an
// earlier revision (listenLegacy) is a stream too, but it is served by
// serveStateless/listenLegacy, which never call WhileAuthorized: a reload
// revoking the API key it was opened with leaves it open, and it goes on
// relaying the service's notifications to the holder of the revoked key.
func TestFixAttackLegacyListenSurvivesKeyRevokedByReload(t *testing.T) {
	const revocable = "test-key-alice-fixattack-listen"
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
	g := startGatewayOnPort(t, port, cfg)
	updated := listenUpdates(t, g, revocable)

	cfg.AuthExtra, cfg.DataDir = "", g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	fixattackRevoked(t, g2, revocable)
	fixattackTouch(t, g2)
	select {
	case line, ok := <-updated:
		if ok {
			t.Errorf("a subscriptions/listen opened with an API key a reload revoked still carries the service's notifications: %.200s", line)
		}
	case <-time.After(3 * time.Second):
	}
}

// Holds: as TestFixAttackLegacyListenSurvivesKeyRevokedByReload, but the
// reload takes alice off the service (allowed_users): EndBarred ends her
// implied MCP session of svc, and with it her stateless
// subscriptions/listen relays nothing more of the service.
func TestFixAttackHoldsLegacyListenEndsOnRemovalFromService(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, ServiceExtra: "allowed_users " + alice + " " + bob}
	g := startGatewayOnPort(t, port, cfg)
	updated := listenUpdates(t, g, aliceKey)

	cfg.ServiceExtra, cfg.DataDir = "allowed_users "+bob, g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	if status, _, _ := g2.raw(t, aliceKey, "", "svc").post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`); status != http.StatusNotFound {
		t.Fatalf("control: alice at svc after the reload: %d, want 404", status)
	}
	time.Sleep(3 * time.Second) // past the gateway's periodic session check (2s)
	fixattackTouch(t, g2)
	select {
	case line, ok := <-updated:
		if ok {
			t.Errorf("alice, whom a reload took off svc, still receives svc's notifications on her subscriptions/listen: %.200s", line)
		}
	case <-time.After(3 * time.Second):
	}
}

// listenUpdates opens a stateless runner's subscriptions/listen of
// test://watched at svc as the caller of key, checks that an update reaches
// it, and returns the lines of the updates that follow; the channel closes
// when the listen ends.
func listenUpdates(t *testing.T, g *gateway, key string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	resp := aaStatelessSend(t, ctx, g, key, g.createSession(t, key, "svc"), "subscriptions/listen",
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["test://watched"]},`+aaStatelessMeta(`{}`)+`}}`)
	br := bufio.NewReader(resp.Body)
	if resp.StatusCode != http.StatusOK || trReadUntil(br, "notifications/subscriptions/acknowledged") == "" {
		t.Fatalf("control: the listen did not open: HTTP %d", resp.StatusCode)
	}
	updated := make(chan string, 8)
	go func() {
		defer close(updated)
		for {
			line := trReadUntil(br, "notifications/resources/updated")
			if line == "" {
				return
			}
			updated <- line
		}
	}()
	fixattackTouch(t, g)
	select {
	case line, ok := <-updated:
		if !ok || !strings.Contains(line, "test://watched") {
			t.Fatalf("control: the listen ended or carried %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("control: notifications/resources/updated never reached the listen")
	}
	return updated
}
