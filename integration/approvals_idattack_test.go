package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// heldAcrossConfigReload makes a call of gated_tool that is held for its
// approval (approval_wait), then reloads the gateway's configuration with
// after (same port, same storage) while the call waits, and returns the
// held call's stream, the approval's id and the reloaded gateway.
func heldAcrossConfigReload(t *testing.T, runnerKey string, before, after gatewayConfig) (*upstream, *gateway, <-chan json.RawMessage, string, *rawMCP) {
	t.Helper()
	up := startUpstream(t)
	port := freePort(t)
	before.Upstream, after.Upstream = up.URL, up.URL
	before.RequestPolicy, after.RequestPolicy = testdataPath(t, "approvals"), testdataPath(t, "approvals")
	before.PolicyOptions, after.PolicyOptions = "approval_wait 20s", "approval_wait 20s"
	g := startGatewayOnPort(t, port, before)
	m := g.raw(t, runnerKey, g.createSession(t, runnerKey, "svc"), "svc")
	m.initialize()
	stream := m.sseCall(1, "gated_tool", `{"text":"held across a config reload"}`)
	id := pendingApprovalID(t, g, aliceKey, "held across a config reload")

	after.DataDir = g.DataDir
	g2 := startGatewayOnPort(t, port, after)
	m.transport = g2.transport()
	return up, g2, stream, id, m
}

func idattackDrain(t *testing.T, stream <-chan json.RawMessage) []json.RawMessage {
	t.Helper()
	var msgs []json.RawMessage
	timeout := time.After(25 * time.Second)
	for {
		select {
		case msg, ok := <-stream:
			if !ok {
				return msgs
			}
			msgs = append(msgs, msg)
		case <-timeout:
			t.Fatal("the held call never ended")
		}
	}
}

// Attack: alice's gated call is held for its approval (approval_wait).
// Meanwhile the administrator reloads the configuration and takes alice
// off the service (allowed_users): from then on every call of hers to
// svc is 404. She approves her own pending approval (the policy lets the
// requester decide; nothing about deciding checks the service), and the
// held call — authorized by the configuration that was replaced — goes
// upstream with her credential.
//
// What should happen: a held call is checked again against the registry in
// force when its approval comes (allowed_users, the tool allowlist), as its
// retry would be, and refused when it no longer passes.
func TestIDAttackHeldCallRunsAfterReloadRemovedCallerFromService(t *testing.T) {
	before := gatewayConfig{ServiceExtra: "allowed_users " + alice + " " + bob}
	after := gatewayConfig{ServiceExtra: "allowed_users " + bob}
	up, g2, stream, id, m := heldAcrossConfigReload(t, aliceKey, before, after)

	// The control: the reload took effect, alice may no longer use svc.
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`); status != http.StatusNotFound {
		t.Fatalf("control: alice's call after the reload: %d %s; want 404", status, msgs)
	}
	approveHeldExpectNoRun(t, up, g2, id, stream, "for alice after a reload took her off the service")
}

// Attack: as above, but the reload revokes the API key the runner used
// (alice keeps another key, which she decides with). Every new request
// with the revoked key is 401; the held call, made with it, still runs
// once approved.
func TestIDAttackHeldCallRunsAfterReloadRevokedItsAPIKey(t *testing.T) {
	const revocable = "test-key-alice-idattack"
	before := gatewayConfig{AuthExtra: "api_key " + hashKey(revocable) + " " + alice}
	after := gatewayConfig{}
	up, g2, stream, id, m := heldAcrossConfigReload(t, revocable, before, after)

	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`); status != http.StatusUnauthorized {
		t.Fatalf("control: the revoked key after the reload: %d %s; want 401", status, msgs)
	}
	approveHeldExpectNoRun(t, up, g2, id, stream, "for a runner whose API key a reload revoked")
}

// approveHeldExpectNoRun has alice approve the held call's approval id
// once, drains the held call's stream, and fails the test when the
// upstream ran gated_tool: why says for whom or after what.
func approveHeldExpectNoRun(t *testing.T, up *upstream, g *gateway, id string, stream <-chan json.RawMessage, why string) {
	t.Helper()
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Logf("alice approving the held call after the reload: %d %s", r.StatusCode, r.Body)
	}
	msgs := idattackDrain(t, stream)
	if n := up.upstreamCalls("gated_tool"); n != 0 {
		t.Errorf("the upstream ran gated_tool %d time(s) %s; last answer: %s", n, why, idattackLast(msgs))
	}
}

func idattackLast(msgs []json.RawMessage) string {
	if len(msgs) == 0 {
		return "(none)"
	}
	s := string(msgs[len(msgs)-1])
	if len(s) > 300 {
		s = s[:300]
	}
	return strings.TrimSpace(s)
}

// Attack: as above, but the reload takes gated_tool off the service's
// allowlist (every call of it is now "Unknown tool"); the held call of it,
// once approved, still runs upstream.
func TestIDAttackHeldCallRunsAfterReloadRemovedToolFromAllowlist(t *testing.T) {
	after := gatewayConfig{Tools: "echo"}
	up, g2, stream, id, m := heldAcrossConfigReload(t, aliceKey, gatewayConfig{}, after)

	if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"gated_tool","arguments":{"text":"after"}}}`); len(msgs) == 0 || !strings.Contains(string(msgs[0]), "Unknown tool") {
		t.Fatalf("control: gated_tool after the reload: %s; want Unknown tool", msgs)
	}
	approveHeldExpectNoRun(t, up, g2, id, stream, "after a reload took it off the allowlist")
}

// Attack: the same gap on a runner's open GET stream. alice subscribes to
// a resource of svc and keeps her MCP session's standalone stream open; a
// reload takes her off svc (allowed_users), and every request of hers to
// svc is 404 from then on — yet the stream lives on and goes on carrying
// what the upstream sends her session (here bob's touch of the resource
// arrives as notifications/resources/updated). A reload that moves or
// removes a service ends its MCP sessions at once; one that takes a person
// off it ends nothing of theirs.
func TestIDAttackStreamOutlivesReloadRemovingCallerFromService(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, ServiceExtra: "allowed_users " + alice + " " + bob}
	g := startGatewayOnPort(t, port, cfg)
	updated := make(chan string, 8)
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		},
	})
	ctx := context.Background()
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "touch_resource", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	select { // the control: her stream carries the update
	case <-updated:
	case <-time.After(5 * time.Second):
		t.Fatal("control: notifications/resources/updated never reached alice")
	}

	cfg.ServiceExtra, cfg.DataDir = "allowed_users "+bob, g.DataDir
	g2 := startGatewayOnPort(t, port, cfg)
	m := g2.raw(t, aliceKey, "", "svc")
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`); status != http.StatusNotFound {
		t.Fatalf("control: alice at svc after the reload: %d, want 404", status)
	}
	time.Sleep(3 * time.Second) // past the gateway's periodic session check (2s)
	bobs := g2.connect(t, bobKey, g2.createSession(t, bobKey, "svc"), "svc", nil)
	if _, err := bobs.CallTool(ctx, &mcp.CallToolParams{Name: "touch_resource", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	select {
	case uri := <-updated:
		t.Errorf("alice, whom a reload took off svc, still receives svc's notifications on her open stream (%s)", uri)
	case <-time.After(3 * time.Second):
	}
}
