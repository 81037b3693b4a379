package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A runner's open stream ends when a reload revokes the API key it was
// opened with: from then on every request with that key is 401, and what
// the upstream sends the session must not keep reaching whoever holds it.
// (A reload that takes the caller off the service ends their MCP sessions:
// TestIDAttackStreamOutlivesReloadRemovingCallerFromService.)
func TestStreamEndsWhenAReloadRevokesItsAPIKey(t *testing.T) {
	const revocable = "test-key-alice-stream-revoked"
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
	g := startGatewayOnPort(t, port, cfg)
	updated := make(chan string, 8)
	cs := g.connect(t, revocable, g.createSession(t, revocable, "svc"), "svc", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		},
	})
	ctx := context.Background()
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched"}); err != nil {
		t.Fatal(err)
	}
	bobs := g.connect(t, bobKey, g.createSession(t, bobKey, "svc"), "svc", nil)
	if _, err := bobs.CallTool(ctx, &mcp.CallToolParams{Name: "touch_resource", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	select { // the control: the stream carries the update
	case <-updated:
	case <-time.After(5 * time.Second):
		t.Fatal("control: notifications/resources/updated never reached the stream")
	}

	cfg.AuthExtra, cfg.DataDir = "", g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	if status, _, _ := g2.raw(t, revocable, "", "svc").post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`); status != http.StatusUnauthorized {
		t.Fatalf("control: the revoked key after the reload: %d, want 401", status)
	}
	bobs = g2.connect(t, bobKey, g2.createSession(t, bobKey, "svc"), "svc", nil)
	if _, err := bobs.CallTool(ctx, &mcp.CallToolParams{Name: "touch_resource", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	select {
	case uri := <-updated:
		t.Errorf("the stream opened with an API key a reload revoked still carries the service's notifications (%s)", uri)
	case <-time.After(3 * time.Second):
	}
}
