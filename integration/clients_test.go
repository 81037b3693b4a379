package integration

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connectWithToken opens an MCP session the way a client that knows only
// the endpoint's URL and a bearer token does: the official SDK client,
// no toolgate session, no other header.
func (g *gateway) connectWithToken(t testing.TB, key, path string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "url-and-token", Version: "1.0.0"}, opts)
	transport := &mcp.StreamableClientTransport{
		Endpoint: g.URL + path,
		HTTPClient: &http.Client{Transport: headerTransport{base: http.DefaultTransport,
			headers: map[string]string{"Authorization": "Bearer " + key}}},
		MaxRetries: -1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connecting to %s with only a token: %v", path, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// A client given only the URL and a token lists and calls tools: toolgate
// implies its session.
func TestURLAndTokenAreEnough(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	cs := g.connectWithToken(t, aliceKey, "/v1/mcp/svc", nil)
	ctx := context.Background()
	if tools := toolNames(t, cs); !slices.Contains(tools, "echo") || slices.Contains(tools, "not_allowlisted") {
		t.Fatalf("tools/list through an implied session: %v", tools)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "implied"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, res); got != `{"text":"implied"}` {
		t.Fatalf("echo = %q", got)
	}
	// The same checks as with a session: the allowlist, and the policy.
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "forbidden_tool", Arguments: map[string]any{}}); err != nil || !res.IsError {
		t.Fatalf("forbidden_tool through an implied session: %+v %v, want the policy's deny", res, err)
	}
}

// Two clients of the same person have two implied sessions: what is
// approved for one client's session does not cover the other's calls.
// An MCP session of an implied session cannot be used with an explicit
// one, nor by another caller, nor the other way round.
func TestImpliedSessionsAreSeparate(t *testing.T) {
	up, g := approvalsGateway(t, "")
	first := g.raw(t, aliceKey, "", "svc")
	delete(first.headers, "X-Toolgate-Session")
	first.initialize()
	p := mustPend(t, first.call(1, "gated_tool", `{"text":"implied"}`))
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "session", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving for the session: %d %s", r.StatusCode, r.Body)
	}
	mustSucceed(t, first.call(2, "gated_tool", `{"text":"implied"}`))
	mustSucceed(t, first.call(3, "gated_tool", `{"text":"implied"}`))

	second := g.raw(t, aliceKey, "", "svc")
	delete(second.headers, "X-Toolgate-Session")
	second.initialize()
	if p2 := mustPend(t, second.call(1, "gated_tool", `{"text":"implied"}`)); p2.ApprovalID == p.ApprovalID {
		t.Fatal("the second client's call waits on the first client's approval")
	}
	if n := up.upstreamCalls("gated_tool"); n != 2 {
		t.Fatalf("the upstream ran gated_tool %d times, want 2", n)
	}

	// The first client's MCP session with an explicit toolgate session.
	explicit := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	explicit.sessionID = first.sessionID
	if status, _, _ := explicit.post(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); status != http.StatusForbidden {
		t.Errorf("an implied session's MCP session with a session header: %d, want 403", status)
	}
	// Bob with alice's MCP session.
	bobM := g.raw(t, bobKey, "", "svc")
	delete(bobM.headers, "X-Toolgate-Session")
	bobM.sessionID = first.sessionID
	if status, _, _ := bobM.post(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); status != http.StatusForbidden {
		t.Errorf("bob with alice's MCP session: %d, want 403", status)
	}
	// An MCP session started in an explicit session needs its header.
	explicit.sessionID = ""
	explicit.initialize()
	delete(explicit.headers, "X-Toolgate-Session")
	status, _, msgs := explicit.post(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
	if status != http.StatusForbidden || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "send that session's id") {
		t.Errorf("an explicit session's MCP session without its header: %d %s, want 403 saying so", status, msgs)
	}
}

// require_session turns implied sessions off: a runner must create its
// session and send it, as before.
func TestRequireSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "require_session"})
	m := g.raw(t, aliceKey, "", "svc")
	delete(m.headers, "X-Toolgate-Session")
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusForbidden || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "require_session") {
		t.Fatalf("initialize without a session under require_session: %d %s, want 403 naming the option", status, msgs)
	}
	// With a session it works as ever.
	g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc").initialize()
}

// An initialize whose upstream cannot be reached is a retryable error, not
// a 404 that would tell the runner its (not yet existing) session ended.
func TestInitializeWithTheUpstreamDown(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:" + strconv.Itoa(freePort(t)) + "/mcp"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"code":-32011`) || !strings.Contains(string(msgs[0]), `"retryable":true`) {
		t.Fatalf("initialize with the upstream down: %d %s, want a retryable error", status, msgs)
	}
}
