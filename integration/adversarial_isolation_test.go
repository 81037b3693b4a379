package integration

// Attacks on isolation through caches and shared state: what toolgate
// keeps in memory or storage keyed by something (a caller, a session, a
// service, an upstream session), served to — or poisoned by — someone or
// something it was not kept for.
//
// Attack: a service re-registered with another upstream URL (a reload)
// keeps the MCP sessions of the old one, with the old upstream's tool
// catalog: the request policy decides the new upstream's tool by what the
// old upstream said of its namesake (readOnlyHint), so a call that needs
// approval on the new upstream runs without one.
// Attack: the same re-registration sends the old upstream's Mcp-Session-Id
// to the new upstream, another host: one server's session handle is
// handed to another.
//
// Attack: the same user's credential replaced by another account's
// (disconnect, connect): a stateless runner's server/discover still
// answers what the upstream told the old account, from the discovery and
// implied MCP session toolgate keeps per (service, user).
// Attack: whether a service's upstream speaks only 2026-07-28 is learned
// once per service from the first caller's probe; a probe the upstream
// refuses for that caller's credential (401) is recorded as "an upstream
// of an earlier revision", and every other caller's initialize then fails.
// Attack: tool pins are per service while upstreams define tools per
// caller's credential: bob's listing through his own account refuses
// alice's calls of the pinned definition. (The first caller's account
// still decides which definition is pinned: an upstream that defines tools
// per person needs tool_pins off, README "Tool pins".)
//
// Known: a stateful MCP session outlives its caller connecting again (a
// rotated personal token, a new OAuth consent): its upstream session and
// tool catalog are the ones made through the old connection, of the same
// person. Ending it would make every token rotation re-initialize runners.
//
// Holds: discoveries are per caller (bob never gets alice's instructions;
// TestIsolationHoldsStatelessDiscoveryPerCaller). The implied session key
// (user NUL session NUL service NUL caps digest) cannot be collided by a
// JWT subject holding NULs: the session id, service id and digest hold no
// NUL, so equal keys need equal users. Mcp-Session-Ids seal caller,
// session and service; federated sessions and listens are keyed by them.
// Tool catalogs are shared between callers only by content hash, and the
// memoized policy view of a tool is keyed by the service. Verified JWTs
// are cached by SHA-256 of resource and token; connections by service
// (restricted to [A-Za-z0-9_-]) and SHA-256 of the user, so case variants,
// separators and slashes in users or services do not collide. A
// stateless runner's listens, subscriptions and answers are keyed by the
// sealed MCP session id (and generation). Results relayed to stateless
// runners are made cacheScope "private".

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// isoDestructiveUpstream is an upstream whose echo says nothing of what it
// does: the test policy asks a person before it runs.
func isoDestructiveUpstream(t *testing.T) *upstream {
	t.Helper()
	return startUpstreamServer(t, nil, func(u *upstream) *mcp.Server {
		s := mcp.NewServer(&mcp.Implementation{Name: "other-upstream", Version: "1.0.0"}, nil)
		mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Deletes what it is given."},
			func(_ context.Context, _ *mcp.CallToolRequest, in echoArgs) (*mcp.CallToolResult, any, error) {
				args, _ := json.Marshal(in)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "DELETED " + string(args)}}}, nil, nil
			})
		return s
	})
}

// isoReRegister starts alice's MCP session with svc on upstream a (her
// runner lists the tools), then reloads the gateway with svc's url
// pointing at b, and returns alice's same MCP session on the reloaded
// gateway, and the upstream session id a gave her session.
func isoReRegister(t *testing.T, a, b *upstream) (*rawMCP, string) {
	t.Helper()
	port := freePort(t)
	cfg := gatewayConfig{Upstream: a.URL, Tools: "echo", DataDir: t.TempDir()}
	g := startGatewayOnPort(t, port, cfg)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if ans := m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); dig(ans, "result", "tools", "0", "name") != "echo" {
		t.Fatalf("tools/list on the first upstream: %v", ans)
	}
	var upSession string
	for _, r := range a.requestLog() {
		if r.SessionID != "" {
			upSession = r.SessionID
		}
	}
	if upSession == "" {
		t.Fatal("the first upstream gave no session id")
	}
	cfg.Upstream = b.URL
	g2 := startGatewayOnPort(t, port, cfg)
	m2 := g2.raw(t, aliceKey, m.headers["X-Toolgate-Session"], "svc")
	m2.sessionID = m.sessionID
	return m2, upSession
}

// TestIsolationAttackReRegisteredServiceKeepsOldToolAnnotations: the
// operator points service svc at another upstream (a reload); alice's MCP
// session, begun on the old upstream, lives on. The old upstream marked
// echo readOnlyHint: true; the new upstream's echo says nothing (so the
// test policy, like the shipped one, asks a person first). What happens:
// alice's next echo is decided with the old upstream's definition kept in
// her session's catalog and runs on the new upstream without approval
// (the proxy even re-initializes with the new upstream when it answers
// 404, after the policy allowed the call). What should happen: a service
// whose upstream changed is another upstream — MCP sessions (and their
// catalogs) made with the old one end at the reload, or the catalog is
// dropped and listed again from the new upstream before any policy uses
// it.
func TestIsolationAttackReRegisteredServiceKeepsOldToolAnnotations(t *testing.T) {
	a := startUpstream(t)
	b := isoDestructiveUpstream(t)
	m, _ := isoReRegister(t, a, b)

	ans := m.call(2, "echo", `{"text":"all tickets"}`)
	if strings.Contains(string(ans), "DELETED") {
		t.Errorf("the new upstream's unannotated echo ran without approval, decided by the old upstream's readOnlyHint: %s", ans)
	}

	// Control: a session begun on the new upstream is asked about.
	g := startGateway(t, gatewayConfig{Upstream: b.URL, Tools: "echo"})
	fresh := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	fresh.initialize()
	fresh.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	mustPend(t, fresh.call(2, "echo", `{"text":"all tickets"}`))
}

// TestIsolationAttackReRegisteredServiceGetsOldUpstreamSessionID: the same
// re-registration as above. What happens: alice's first request after the
// reload goes to the new upstream with the Mcp-Session-Id the old upstream
// issued — a handle of one server's session given to another host (which
// may use it against the old one, or log it). What should happen: an
// upstream session id is sent only to the upstream (URL) that issued it;
// toolgate should record which upstream a session belongs to and
// initialize afresh (or end the MCP session) when the registry's URL for
// the service changed.
func TestIsolationAttackReRegisteredServiceGetsOldUpstreamSessionID(t *testing.T) {
	a := startUpstream(t)
	b := startUpstream(t)
	m, upSession := isoReRegister(t, a, b)

	m.call(2, "echo", `{"text":"after the reload"}`)
	for _, r := range b.requestLog() {
		if r.Header.Get("Mcp-Session-Id") == upSession {
			t.Errorf("the new upstream received the old upstream's session id %q (%s %s)", upSession, r.Method, r.Body)
			break
		}
	}
}

// isoPerAccountUpstream is an upstream that describes its tool for the
// account of the token it gets, as many do (a workspace's name, the
// account's plan): each caller sees their own definition of echo.
func isoPerAccountUpstream(t *testing.T) string {
	t.Helper()
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		// The account a token belongs to (not the token: toolgate redacts
		// a credential an upstream writes back).
		account := strings.ToUpper(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer token-"))
		s := mcp.NewServer(&mcp.Implementation{Name: "per-account", Version: "1"}, nil)
		mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo, in the workspace of " + account + ".",
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
			func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok for " + account}}}, nil, nil
			})
		return s
	}, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// TestIsolationAttackToolPinPoisonedByAnotherAccount: tool pins are kept
// per service, but an upstream reached with each caller's own credential
// may define its tools per account. Alice lists and uses echo, so her
// account's definition is pinned; bob, with a personal token of an account
// of his own, lists the service's tools. What happened: bob's listing
// recorded his definition as a change of the pin, after which alice's
// calls of echo — exactly the pinned definition, as her own account shows
// it — were refused (until a listing of the pinned definition withdrew
// the change, and bob's next listing recorded it again): any user could
// switch a tool off for everyone else at will. What should happen: one
// caller's view never refuses another caller's calls of what their own
// account shows (a session listed before the change lists again: it may
// be a rug pull for everyone, TestIsolation2AttackRugPullCalledThroughStaleCatalog). Bob's definition,
// which differs from the pin, stays hidden from bob and waits for an
// administrator (pins are per service: an upstream that defines tools
// per person needs tool_pins off, README "Tool pins"), and alice listing
// hers does not withdraw it.
func TestIsolationAttackToolPinPoisonedByAnotherAccount(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: isoPerAccountUpstream(t), Tools: "echo", Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "token-alice")
	lsPutToken(t, g, bobKey, "token-bobs-own")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if ans := m.call(2, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
		t.Fatalf("control: alice's echo before bob listed: %s", ans)
	}

	b := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	b.initialize()
	if ans := b.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); dig(ans, "result", "tools", "0", "name") != nil {
		t.Errorf("bob's tools/list shows his account's echo, which differs from the pinned one: %v", ans)
	}
	// Alice's session listed its tools before the change was seen: it may
	// be a rug pull her catalog does not show yet, so she lists again, and
	// her account shows the pinned definition: she calls it.
	if ans := m.call(3, "echo", `{}`); !strings.Contains(string(ans), "list them again") {
		t.Fatalf("alice's call on a catalog listed before the change: %s, want to be told to list the tools again", ans)
	}
	for i := range 2 {
		m.rpc(`{"jsonrpc":"2.0","id":10,"method":"tools/list"}`)
		if ans := m.call(4+i, "echo", `{}`); !strings.Contains(string(ans), "ok for ALICE") {
			t.Fatalf("after bob listed the tools through his own account, alice's echo (the pinned definition, as her listing shows it) is refused: %s", ans)
		}
	}
	if ans := b.call(2, "echo", `{}`); strings.Contains(string(ans), "ok for BOB") {
		t.Errorf("bob's call of his account's echo, which differs from the pin, ran: %s", ans)
	}
	r := g.api(t, http.MethodGet, "/v1/tool-pins?changed=true", carolKey, nil)
	if r.StatusCode != http.StatusOK || !strings.Contains(string(r.Body), "workspace of BOB") {
		t.Errorf("bob's definition is not waiting for an administrator after alice listed hers: %d %s", r.StatusCode, r.Body)
	}
}

// TestIsolationAttackDiscoveryOutlivesReconnectedAccount: a stateless
// runner (2026-07-28) of alice's asks server/discover of a service whose
// upstream tells each account its own instructions (here, the account's
// workspace). Alice then disconnects that account and connects another
// one (DELETE then PUT /v1/connections/svc) and asks again in the same
// toolgate session. What happens: toolgate answers from what it learned
// when it opened her implied MCP session — the instructions the upstream
// gave the account she disconnected (mcp2026 Runtime.discover, keyed by
// service and user; openImplied returns early once the implied session has
// an upstream, so the upstream session initialized with the old token
// stays in use too). What should
// happen: what the upstream said to a connection (the discovery, the
// implied MCP session and its upstream session) is not served through
// another: the implied MCP session is keyed by the caller's connection
// (gateway.Connection.Grant), so the next request after a new connect
// opens a new one, which asks the upstream again.
func TestIsolationAttackDiscoveryOutlivesReconnectedAccount(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: aaPersonalUpstream(t), Tools: "echo", Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "alice-token")
	session := g.createSession(t, aliceKey, "svc")
	discover := func() string {
		t.Helper()
		status, msg := statelessPost(t, g, aliceKey, session,
			`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{`+aaStatelessMeta(`{}`)+`}}`, nil)
		if status != http.StatusOK || aaResult(msg) == nil {
			t.Fatalf("server/discover: %d %s", status, aaJSON(msg))
		}
		s, _ := aaResult(msg)["instructions"].(string)
		return s
	}
	if got := discover(); !strings.Contains(got, "Project Falcon") {
		t.Fatalf("control: the first account's discovery: %q", got)
	}
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("disconnecting: %d %s", r.StatusCode, r.Body)
	}
	lsPutToken(t, g, aliceKey, "bob-token") // another account, at the upstream
	if got := discover(); !strings.Contains(got, "bake sale") {
		t.Errorf("after alice connected another account, server/discover still answers what the upstream told the disconnected one: %q", got)
	}
}

// TestIsolationAttackEraPoisonedByAnotherCallersCredential: toolgate
// learns once per service (mcp2026 eras, keyed by the service id alone)
// whether its upstream speaks only the stateless revision, from a
// server/discover probe sent with the credential of whoever initializes
// first. Bob, on an auth bearer service, connects a token the upstream
// refuses (401) and initializes first. What happens: the refusal is taken
// for "an upstream of an earlier revision" and recorded for the service,
// so alice — whose token the upstream accepts — can no longer initialize:
// toolgate sends her initialize to an upstream that speaks only
// 2026-07-28, for as long as the configuration lives. What should happen:
// an answer that says nothing of the upstream's revision (401/403, any
// HTTP error, a credential refused) is not recorded for everyone; the era
// is learned only from a discovery (or an initialize) the upstream
// actually answered, or kept per caller like the discovery itself.
func TestIsolationAttackEraPoisonedByAnotherCallersCredential(t *testing.T) {
	modern := startModernOnlyUpstream(t)
	target, _ := url.Parse(modern.URL)
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good-token" {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, "invalid token", http.StatusUnauthorized)
			return
		}
		// A server of 2026-07-28 alone has no initialize (go-sdk servers
		// answer an unknown method so).
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"method":"initialize"`) {
			http.Error(w, "unknown method initialize", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	upURL := front.URL + target.Path

	initialize := func(g *gateway, key string) (int, []json.RawMessage) {
		t.Helper()
		m := g.raw(t, key, g.createSession(t, key, "svc"), "svc")
		status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		return status, msgs
	}
	ok := func(status int, msgs []json.RawMessage) bool {
		return status == http.StatusOK && len(msgs) == 1 && strings.Contains(string(msgs[0]), `"modern-upstream"`)
	}

	// Control: alice initializing first works.
	g := startGateway(t, gatewayConfig{Upstream: upURL, Tools: "echo", Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "good-token")
	if status, msgs := initialize(g, aliceKey); !ok(status, msgs) {
		t.Fatalf("control: alice's initialize: %d %s", status, msgs)
	}

	g = startGateway(t, gatewayConfig{Upstream: upURL, Tools: "echo", Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "good-token")
	lsPutToken(t, g, bobKey, "refused-token")
	initialize(g, bobKey) // refused, as bob's token is
	if status, msgs := initialize(g, aliceKey); !ok(status, msgs) {
		t.Errorf("after bob's refused credential was probed first, alice cannot initialize: %d %s", status, msgs)
	}
}

// TestIsolationHoldsStatelessDiscoveryPerCaller: the discoveries toolgate
// keeps (mcp2026 Runtime.discover) are per service and caller. Alice's
// and bob's stateless runners ask server/discover of an upstream that
// tells each account its own workspace, alice first: bob gets his own
// instructions, never alice's, and alice's stay hers after bob's.
func TestIsolationHoldsStatelessDiscoveryPerCaller(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: aaPersonalUpstream(t), Tools: "echo", Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "alice-token")
	lsPutToken(t, g, bobKey, "bob-token")
	discover := func(key string) string {
		t.Helper()
		status, msg := statelessPost(t, g, key, g.createSession(t, key, "svc"),
			`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{`+aaStatelessMeta(`{}`)+`}}`, nil)
		if status != http.StatusOK || aaResult(msg) == nil {
			t.Fatalf("server/discover: %d %s", status, aaJSON(msg))
		}
		s, _ := aaResult(msg)["instructions"].(string)
		return s
	}
	if got := discover(aliceKey); !strings.Contains(got, "Project Falcon") {
		t.Fatalf("alice's discovery: %q", got)
	}
	if got := discover(bobKey); !strings.Contains(got, "bake sale") || strings.Contains(got, "Falcon") {
		t.Errorf("bob's discovery: %q", got)
	}
	if got := discover(aliceKey); !strings.Contains(got, "Project Falcon") {
		t.Errorf("alice's discovery after bob's: %q", got)
	}
}

// TestReloadRespellingTheUpstreamURLKeepsMCPSessions: a reload whose
// service url names the same upstream in other letters (its scheme in
// capitals here) is no move: alice's MCP session goes on with the upstream
// session it had, where a reload to another upstream ends it
// (TestIsolationAttackReRegisteredServiceGetsOldUpstreamSessionID).
func TestReloadRespellingTheUpstreamURLKeepsMCPSessions(t *testing.T) {
	a := startUpstream(t)
	respelled := &upstream{URL: "HTTP://" + strings.TrimPrefix(a.URL, "http://")}
	if respelled.URL == a.URL {
		t.Fatalf("upstream url %s is not http://", a.URL)
	}
	m, upSession := isoReRegister(t, a, respelled)

	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after the reload"}}}`)
	if status != http.StatusOK || len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "after the reload") {
		t.Fatalf("a call in alice's MCP session after a reload that only respelled the service's url: status %d, %s; want the echo (the session goes on)", status, msgs)
	}
	initializes, last := 0, ""
	for _, r := range a.requestLog() {
		if strings.Contains(r.Body, `"method":"initialize"`) {
			initializes++
		}
		if strings.Contains(r.Body, "after the reload") {
			last = r.Header.Get("Mcp-Session-Id")
		}
	}
	if initializes != 1 || last != upSession {
		t.Errorf("after the respelling reload the upstream saw %d initializes (want 1) and the call came with session %q (want %q, the session's own)", initializes, last, upSession)
	}
}
