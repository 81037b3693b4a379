package integration

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Attack (a regression of the fix): the federated endpoint (/v1/mcp)
// serves each service through a sub-request (federation.subCall) whose
// headers are only Accept: the runner's Authorization is dropped. A call
// held for its approval through /v1/mcp reaches policy.hold with that
// sub-request, and StillAuthorized re-authenticates it
// (AuthenticateEndpoint(sub)): after ANY reload — here one that changes
// nothing — it finds no credential and refuses the approved call ("your
// credential no longer authenticates you"), though the caller's key, the
// service and the tool are all unchanged. Before the fix the call ran.
// Now a reload ends the hold with the pending answer (the runner's retry
// is the new configuration's to decide), and the retry runs the call once
// it is approved.
func TestFixAttackFederatedHeldCallRefusedAfterUnrelatedReload(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Federation: " ", RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 20s"}
	g := startGatewayOnPort(t, port, cfg)
	m := &rawMCP{t: t, url: g.URL + "/v1/mcp", transport: g.transport(), headers: map[string]string{"Authorization": "Bearer " + aliceKey}}
	m.initialize()
	stream := m.sseCall(1, "svc__gated_tool", `{"text":"federated, held across a reload"}`)
	id := pendingApprovalID(t, g, aliceKey, "federated, held across a reload")

	cfg.DataDir = g.DataDir
	g2 := startGatewayOnPort(t, port, cfg) // the same configuration
	endedPendingAtReload(t, idattackDrain(t, stream), id)
	if r := g2.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != 200 {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	m.transport = g2.transport()
	retry := m.call(2, "svc__gated_tool", `{"text":"federated, held across a reload"}`)
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Errorf("the approved retry of a federated call held across a reload that changed nothing ran upstream %d times, want 1; answer: %s", n, retry)
	}
}

// Attack (same cause): a federated stream (GET /v1/mcp) is one sub-request
// GET per service, served by mcpproxy.stream with WhileAuthorized(sub):
// the first reload after it opened — here one that changes nothing —
// re-authenticates a request without the runner's Authorization and cuts
// the stream. Every reload drops every federated runner's notifications.
func TestFixAttackFederatedStreamCutByUnrelatedReload(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Federation: " "}
	g := startGatewayOnPort(t, port, cfg)
	updated := make(chan string, 8)
	cs := g.connectWithToken(t, aliceKey, "/v1/mcp", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		},
	})
	if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "svc__test://watched"}); err != nil {
		t.Fatal(err)
	}
	fixattackTouch(t, g)
	select { // the control: the federated stream carries the update
	case <-updated:
	case <-time.After(5 * time.Second):
		t.Fatal("control: notifications/resources/updated never reached the federated stream")
	}

	cfg.DataDir = g.DataDir
	g2 := startGatewayOnPort(t, port, cfg) // the same configuration
	fixattackTouch(t, g2)
	select {
	case <-updated:
	case <-time.After(5 * time.Second):
		t.Error("after a reload that changed nothing, the federated stream no longer carries the service's notifications (StillAuthorized found no credential on the sub-request)")
	}
}
