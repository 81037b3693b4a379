package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// startModernOnlyUpstream starts a go-sdk server of the stateless revision
// only (SupportedProtocolVersions 2026-07-28, stateless HTTP), recording
// what reaches it: "echo", "confirm" (an input_required round with a
// requestState), "progress" (a notification during the call) and
// "add_tool" (a tools/list_changed for subscriptions/listen).
func startModernOnlyUpstream(t testing.TB) *statelessUpstream {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "modern-upstream", Version: "2.0.0"},
		&mcp.ServerOptions{SupportedProtocolVersions: []string{"2026-07-28"}, Instructions: "modern only"})
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo.", Annotations: readOnly},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo " + in.Text}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "confirm", Description: "Asks first.", Annotations: readOnly},
		func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			answer, ok := req.Params.InputResponses["confirm"].(*mcp.ElicitResult)
			if !ok {
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "deploy?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}}},
					RequestState: confirmState}, nil, nil
			}
			text := "confirmed: " + answer.Action
			if req.Params.RequestState != confirmState {
				text = fmt.Sprintf("requestState changed on the way: %q", req.Params.RequestState)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "progress", Description: "Reports progress.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			if token := req.Params.GetProgressToken(); token != nil {
				if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Total: 1}); err != nil {
					return nil, nil, err
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "add_tool", Description: "Adds late_tool.", Annotations: readOnly},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			mcp.AddTool(s, &mcp.Tool{Name: "late_tool", Description: "Late.", Annotations: readOnly},
				func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "late"}}}, nil, nil
				})
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "added"}}}, nil, nil
		})
	return serveStateless(t, s)
}

// A runner that initializes (the go-sdk client at 2025-11-25) in front of
// an upstream of the stateless revision only: toolgate learns the
// upstream's era with server/discover, answers the initialize itself, sends
// every request with the revision's _meta and headers, turns the
// upstream's input_required into an elicitation/create on the runner's
// stream and retries with the answer and the requestState byte for byte,
// relays a progress notification, and serves the GET stream with
// subscriptions/listen.
func TestMixLegacyRunnerModernUpstream(t *testing.T) {
	up := startModernOnlyUpstream(t)
	// The default test policy denies answers to elicitation/create; this
	// one allows them.
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm progress add_tool late_tool", RequestPolicy: testdataPath(t, "approvals")})
	changed := make(chan struct{}, 4)
	var mu sync.Mutex
	var asked []string
	progress := 0
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, req.Params.Message)
			mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		},
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress++
			mu.Unlock()
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	})
	if v := cs.InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Fatalf("the runner settled on %s", v)
	}
	if info := cs.InitializeResult().ServerInfo; info == nil || info.Name != "modern-upstream" || cs.InitializeResult().Instructions != "modern only" {
		t.Fatalf("initialize result: %+v", cs.InitializeResult())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) < 4 {
		t.Fatalf("tools/list: %v %+v", err, tools)
	}
	if got := callTool(t, cs, "echo", map[string]any{"text": "hi"}); got != "echo hi" {
		t.Fatalf("echo: %q", got)
	}
	if got := callTool(t, cs, "confirm", map[string]any{}); got != "confirmed: accept" {
		t.Fatalf("confirm: %q", got)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": "p"}})
	if err != nil || res.IsError {
		t.Fatalf("progress: %v %+v", err, res)
	}
	// The client may run its notification handler after the call returned.
	for i := 0; ; i++ {
		mu.Lock()
		q, p := strings.Join(asked, "|"), progress
		mu.Unlock()
		if q != "deploy?" || p > 1 || (p == 0 && i > 200) {
			t.Fatalf("the runner was asked %q and got %d progress notifications", q, p)
		}
		if p == 1 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	// The runner's GET stream is a subscriptions/listen upstream; wait
	// until the upstream has it, then change the tools.
	for i := 0; len(up.seen(`"subscriptions/listen"`)) == 0; i++ {
		if i > 200 {
			t.Fatal("the runner's GET stream did not open subscriptions/listen upstream")
		}
		time.Sleep(25 * time.Millisecond)
	}
	callTool(t, cs, "add_tool", map[string]any{})
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("notifications/tools/list_changed did not reach the runner's GET stream")
	}
	up.mu.Lock()
	seen := append([]upstreamRequest(nil), up.requests...)
	up.mu.Unlock()
	for _, r := range seen {
		if r.Header.Get("Mcp-Method") == "subscriptions/listen" {
			continue // still open: the runner's GET stream
		}
		if r.Method != http.MethodPost {
			t.Errorf("the upstream got %s", r.Method)
		}
		if strings.Contains(r.Body, `"initialize"`) || r.Header.Get("Mcp-Session-Id") != "" {
			t.Errorf("the upstream of the stateless revision was sent an initialize or a session: %v %s", r.Header, r.Body)
		}
		if !strings.Contains(r.Body, `"io.modelcontextprotocol/protocolVersion":"2026-07-28"`) || r.Header.Get("Mcp-Method") == "" {
			t.Errorf("an upstream request without the revision's _meta or Mcp-Method: %v %s", r.Header, r.Body)
		}
		if strings.Contains(r.Body, `"tools/call"`) && !strings.Contains(r.Body, `"elicitation":`) && !strings.Contains(r.Body, `"name":"add_tool"`) {
			t.Errorf("a tools/call without the runner's declared capabilities: %s", r.Body)
		}
	}
	retries := up.seen(`"requestState"`)
	if len(retries) != 1 || !strings.Contains(retries[0].Body, `"inputResponses":{"confirm":{`) {
		t.Fatalf("the retry upstream: %v", retries)
	}
}

// A runner that did not declare elicitation is not sent the upstream's
// input request: its call gets an error naming what is missing.
func TestMixLegacyRunnerModernUpstreamUndeclared(t *testing.T) {
	up := startModernOnlyUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm progress add_tool late_tool"})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "confirm", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "did not declare") {
		t.Fatalf("confirm without elicitation: %v", err)
	}
	if retries := up.seen(`"requestState"`); len(retries) != 0 {
		t.Fatalf("the upstream was retried: %v", retries)
	}
	// A second caller's initialize is answered from what the upstream told
	// that caller: the service's era is known already, its discovery for
	// Bob is not.
	bcs := g.connect(t, bobKey, g.createSession(t, bobKey, "svc"), "svc", nil)
	if info := bcs.InitializeResult().ServerInfo; info == nil || info.Name != "modern-upstream" || bcs.InitializeResult().Instructions != "modern only" {
		t.Fatalf("a second caller's initialize result: %+v", bcs.InitializeResult())
	}
	if bcs.InitializeResult().Capabilities.Tools == nil {
		t.Fatalf("a second caller's initialize result lists no tools capability: %+v", bcs.InitializeResult().Capabilities)
	}
}

// A runner that initialized on one replica in front of an upstream of the
// stateless revision only opens its GET stream on another: that replica
// has not learned the upstream's discovery for the caller, and asks it, so
// the listen it opens upstream asks for the list changes the upstream
// offers (a listen with an empty filter would carry nothing).
func TestMixModernUpstreamStreamOnAnotherReplica(t *testing.T) {
	up := startModernOnlyUpstream(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo add_tool late_tool", "", "")
	})
	session := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, session, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, session, "svc")
	mb.sessionID = ma.sessionID
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, body := mb.openStream(t, ctx)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the stream on the other replica: HTTP %d %s", resp.StatusCode, body)
	}
	defer resp.Body.Close()
	listens := up.seen(`"subscriptions/listen"`)
	if len(listens) != 1 || !strings.Contains(listens[0].Body, `"toolsListChanged":true`) {
		t.Fatalf("the listen the other replica opened upstream: %v", listens)
	}
	endMCPSession(t, ma)
}
