package integration

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An upstream that drops a call's SSE stream (SEP-1699) is resumed by
// toolgate with GET and Last-Event-ID; the runner sees one unbroken stream
// with what came before and after the drop, in order.
func TestUpstreamStreamIsResumed(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	_, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"reconnect","arguments":{},"_meta":{"progressToken":"r-1"}}}`)
	if !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") || len(msgs) != 3 {
		t.Fatalf("answer (%s): %s, want two progress notifications and the result", hdr.Get("Content-Type"), msgs)
	}
	for i, want := range []string{`"progress":1`, `"progress":2`, `answered after the stream was resumed`} {
		if !strings.Contains(string(msgs[i]), want) {
			t.Errorf("message %d = %s, want %s", i, msgs[i], want)
		}
	}
	var resumed bool
	for _, h := range up.headers() {
		if h.Get("Last-Event-Id") != "" {
			resumed = true
		}
	}
	if !resumed {
		t.Error("toolgate never sent Last-Event-ID to the upstream")
	}
}

// Runners speaking the older protocol versions work, and toolgate sends the
// negotiated version upstream on every request after initialize.
func TestOlderProtocolVersions(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	sess := g.createSession(t, aliceKey, "svc")
	for _, version := range []string{"2025-03-26", "2025-06-18"} {
		m := g.raw(t, aliceKey, sess, "svc")
		status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":{},"clientInfo":{"name":"old","version":"1"}}}`)
		if status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"protocolVersion":"`+version+`"`) {
			t.Fatalf("%s: initialize: %d %s", version, status, msgs)
		}
		m.sessionID = hdr.Get("Mcp-Session-Id")
		m.headers["Mcp-Protocol-Version"] = version
		if status, _, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
			t.Fatalf("%s: initialized: %d", version, status)
		}
		before := len(up.headers())
		_, _, msgs = m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"v"}}}`)
		if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), `{\"text\":\"v\"}`) {
			t.Fatalf("%s: tools/call: %s", version, msgs)
		}
		for _, h := range up.headers()[before:] {
			if got := h.Get("Mcp-Protocol-Version"); got != version {
				t.Errorf("%s: the upstream received MCP-Protocol-Version %q", version, got)
			}
		}
	}
}

// A runner asking for a version toolgate does not speak is offered the
// latest one toolgate speaks, whatever the upstream would have accepted.
func TestUnknownProtocolVersionIsNegotiatedDown(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2099-01-01","capabilities":{},"clientInfo":{"name":"new","version":"1"}}}`)
	if len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"protocolVersion":"2025-11-25"`) {
		t.Fatalf("initialize with an unknown version: %s", msgs)
	}
}

// Resource subscriptions: the runner's GET stream carries the upstream's
// notifications/resources/updated; the policy sees resources/read too.
func TestResourcesThroughTheGateway(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	updated := make(chan string, 4)
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			updated <- req.Params.URI
		},
	})
	ctx := context.Background()
	list, err := cs.ListResources(ctx, nil)
	if err != nil || len(list.Resources) != 2 {
		t.Fatalf("resources/list: %v %+v", err, list)
	}
	read, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://watched"})
	if err != nil || len(read.Contents) != 1 || read.Contents[0].Text != "watch me" {
		t.Fatalf("resources/read: %v %+v", err, read)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://secret"}); err == nil ||
		!strings.Contains(err.Error(), "test://secret is off limits") {
		t.Fatalf("reading a resource the policy denies: err = %v", err)
	}
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "touch_resource", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	select {
	case uri := <-updated:
		if uri != "test://watched" {
			t.Errorf("updated %q", uri)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("notifications/resources/updated never reached the runner")
	}
}
