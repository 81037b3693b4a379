package integration

// A fourth look at isolation through the caller's connection: what an
// upstream said through one connection of a caller (their personal token,
// their OAuth consent) is not served through another.
//
// Attack: a stateful MCP session outlived its caller connecting again: the
// upstream session initialized with the old connection's credential went
// on receiving the new connection's credential (another account at the
// provider, as far as the upstream knows)
// (TestIsolation4AttackStatefulSessionOutlivesReconnect), and the
// session's tool catalog, listed through the old account, went on deciding
// calls made through the new one
// (TestIsolation4AttackOldAccountsCatalogDecidesNewAccountsCall). Now the
// registry sees the connection change (Upstream.Grant against the
// caller's connection) and has toolgate_proxy open a new upstream session
// through the new connection and list the tools through it before
// anything is decided; the runner's session goes on.
//
// Holds: refreshing an OAuth grant keeps its connection (ConnectedAt), so
// a refresh opens no new upstream session (see Connection.Grant; the
// OAuth tests refresh under running sessions); disconnecting is answered
// needs_sign_in on the same session (TestOAuthRejectedRefreshNeedsSignIn).

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestIsolation4AttackStatefulSessionOutlivesReconnect: alice initializes
// a stateful MCP session on an auth bearer service with the token of one
// account and calls echo (the upstream session is that account's); then
// she stores the token of another account. What happened: her next call
// on the same MCP session went upstream with the old upstream session id
// and the new token. What should happen: the new token never travels with
// the old session's id (nor in a DELETE of it); the MCP session of the old
// connection is over (404), and her runner's new one is the new account's.
func TestIsolation4AttackStatefulSessionOutlivesReconnect(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: "bearer"})
	session := g.createSession(t, aliceKey, "svc")
	lsPutToken(t, g, aliceKey, "account-one-token")
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	if ans := m.call(1, "echo", `{"text":"one"}`); !strings.Contains(string(ans), "one") {
		t.Fatalf("control: the first call: %s", ans)
	}
	open := up.openSessions()
	if len(open) != 1 {
		t.Fatalf("%d upstream sessions after the first call, want 1", len(open))
	}
	old := open[0]

	lsPutToken(t, g, aliceKey, "account-two-token")
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"two"}}}`)
	if status != http.StatusNotFound || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "connected to the service again") {
		t.Errorf("a call on the MCP session after alice connected another account: %d %s, want 404 telling her to initialize a new one", status, msgs)
	}
	fresh := g.raw(t, aliceKey, session, "svc")
	fresh.initialize()
	if ans := fresh.call(3, "echo", `{"text":"three"}`); !strings.Contains(string(ans), `\"three\"`) {
		t.Errorf("the new session's call: %s", ans)
	}
	if status := m.delete(); status != http.StatusNotFound {
		t.Errorf("DELETE of the old MCP session: %d, want 404 (it is over)", status)
	}
	opened := false
	for _, r := range up.requestLog() {
		switch {
		case r.Header.Get("Mcp-Session-Id") == old && r.Header.Get("Authorization") == "Bearer account-two-token":
			t.Errorf("the new token was sent with the old connection's upstream session (%s %s)", r.Method, r.Body)
		case r.SessionID != "" && r.SessionID != old:
			opened = true
			if got := r.Header.Get("Authorization"); got != "Bearer account-two-token" {
				t.Errorf("the new upstream session was opened with %q", got)
			}
		}
	}
	if !opened {
		t.Errorf("no upstream session was opened for the new connection")
	}
}

// TestIsolation4AttackOldAccountsCatalogDecidesNewAccountsCall: the
// upstream defines echo per account: read-only for account one, not for
// account two (tool pins off, as such an upstream needs). Alice's session
// lists and calls echo through account one; then she stores account two's
// token. What happened: her next call was decided with account one's
// definition (read-only: allowed) though it ran as account two, whose echo
// the default policy sends for approval. What should happen: that session
// is over; a new one lists the tools through the new connection.
func TestIsolation4AttackOldAccountsCatalogDecidesNewAccountsCall(t *testing.T) {
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		account := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer token-")
		s := mcp.NewServer(&mcp.Implementation{Name: "per-account", Version: "1"}, nil)
		tool := &mcp.Tool{Name: "echo", Description: "Echo."}
		if account == "one" {
			tool.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
		}
		mcp.AddTool(s, tool, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran as " + account}}}, nil, nil
		})
		return s
	}, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	g := startGateway(t, gatewayConfig{Upstream: srv.URL + "/mcp", Tools: "echo", Auth: "bearer", Extra: "tool_pins off"})
	lsPutToken(t, g, aliceKey, "token-one")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if ans := m.call(2, "echo", `{}`); !strings.Contains(string(ans), "ran as one") {
		t.Fatalf("control: the read-only echo of account one: %s", ans)
	}
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := m.call(3, "echo", `{}`); strings.Contains(string(ans), "ran as two") || !strings.Contains(string(ans), "initialize a new one") {
		t.Errorf("alice's call of account two's echo on the session listed through account one: %s, want it refused (initialize a new one)", ans)
	}
	fresh := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	fresh.initialize()
	fresh.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if ans := fresh.call(4, "echo", `{}`); strings.Contains(string(ans), "ran as two") || !strings.Contains(string(ans), "approval") {
		t.Errorf("alice's call of account two's echo (not read-only) in a new session: %s, want it sent for approval", ans)
	}
}
