package integration

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// watchedUpdates opens an MCP session of key's on g's svc, subscribes it
// to test://watched and returns the updates its stream carries, once the
// stream is seen carrying one (the control).
func watchedUpdates(t *testing.T, g *gateway, key string) <-chan string {
	t.Helper()
	updated := make(chan string, 8)
	cs := g.connect(t, key, g.createSession(t, key, "svc"), "svc", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		},
	})
	if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "test://watched"}); err != nil {
		t.Fatal(err)
	}
	fixattackTouch(t, g)
	select {
	case <-updated:
	case <-time.After(5 * time.Second):
		t.Fatal("control: notifications/resources/updated never reached the stream")
	}
	return updated
}

// A runner's open stream ends when a reload revokes the API key it was
// opened with: from then on every request with that key is 401, and what
// the upstream sends the session must not keep reaching whoever holds it.
// (A reload that takes the caller off the service ends their MCP sessions:
// TestIDAttackStreamOutlivesReloadRemovingCallerFromService; a second
// reload: TestFixAttackStreamSurvivesKeyRevokedBySecondReload.)
func TestStreamEndsWhenAReloadRevokesItsAPIKey(t *testing.T) {
	const revocable = "test-key-alice-stream-revoked"
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
	g := startGatewayOnPort(t, port, cfg)
	updated := watchedUpdates(t, g, revocable)

	cfg.AuthExtra, cfg.DataDir = "", g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	fixattackRevoked(t, g2, revocable)
	fixattackTouch(t, g2)
	select {
	case uri := <-updated:
		t.Errorf("the stream opened with an API key a reload revoked still carries the service's notifications (%s)", uri)
	case <-time.After(3 * time.Second):
	}
}
