package integration

// Review of the federated endpoint (/v1/mcp) against the per-service route
// (/v1/mcp/{service}) and of the per-user OAuth connection seen through
// it: the same request policy, the same hostile or ordinary upstream, both
// routes; and what a disconnect or a new connect leaves of a federated
// session.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

// frvPolicy denies ping and logging/setLevel to everyone, on every route.
const frvPolicy = `package toolgate.request

default decision := {"action": "allow"}

decision := {"action": "deny", "reason": "ping is not allowed on this gateway"} if {
	input.method == "ping"
}

decision := {"action": "deny", "reason": "runners may not change the log level"} if {
	input.method == "logging/setLevel"
}
`

// frvGateway is faConfig's gateway (svc and beta, federated) with
// frvPolicy as the request policy.
func frvGateway(t *testing.T) *gateway {
	t.Helper()
	svc := faUpstream(t, "svc", func(s *mcp.Server) { faTool(s, "lookup", &mcp.TextContent{Text: "svc"}) })
	beta := faUpstream(t, "beta", func(s *mcp.Server) { faTool(s, "lookup", &mcp.TextContent{Text: "beta"}) })
	cfg := faConfig(t, svc, beta, gatewayConfig{})
	dir := t.TempDir()
	for name, text := range map[string]string{"request.rego": frvPolicy, "result.rego": allowResults} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg.RequestPolicy = dir
	return startGateway(t, cfg)
}

// frvServiceRunner is a raw runner initialized at /v1/mcp/{service} with
// key and an implied session.
func frvServiceRunner(t *testing.T, g *gateway, key, service string) *rawMCP {
	t.Helper()
	m := g.raw(t, key, "", service)
	delete(m.headers, "X-Toolgate-Session")
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
	if status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize at %s: %d %s", m.url, status, msgs)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	if status, _, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", status)
	}
	return m
}

// Attack (held): a runner whom the request policy denies `ping` sends it to
// the federated endpoint instead of /v1/mcp/svc. /v1/mcp/svc relays a ping
// to the upstream, so the policy decides it there; the federated endpoint
// answers ping itself, as it answers initialize (README "The federated
// endpoint"): it reaches no service, and no policy is asked. The runner
// learns that toolgate is alive and nothing else; a service's data and
// its upstream stay out of it.
func TestFederationReviewHeldPingIsToolgatesOwn(t *testing.T) {
	g := frvGateway(t)

	direct := frvServiceRunner(t, g, aliceKey, "svc")
	_, _, msgs := direct.post(`{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	if len(msgs) == 0 || !gjson.GetBytes(msgs[len(msgs)-1], "error").Exists() {
		t.Fatalf("the per-service route did not apply the policy to ping: %s", msgs)
	}

	fed := faRunner(t, g, aliceKey, `{}`)
	_ = faRPC(t, fed, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`) // every service's session started
	answer := faRPC(t, fed, `{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	if got := gjson.GetBytes(answer, "result").Raw; got != "{}" {
		t.Errorf("the federated endpoint's own answer to ping: %s; want an empty result", answer)
	}
}

// Attack (fixed): a runner whom the request policy denies `logging/setLevel` sends
// it to the federated endpoint, where it is broadcast to every started
// service. Expected: as at /v1/mcp/svc, the runner is told the policy
// refused it (every service refused it: nothing was set anywhere). Happens:
// each service's sub-call is denied by the policy (403), the refusal is
// only logged (modules/federation/route.go:342-345, broadcast), and the runner is
// answered success `{}` regardless (route.go:32-34, request): it believes a level it
// may not set was applied.
// Fixed: a logging/setLevel every started service refuses is answered with
// the refusal (exchange.broadcast).
func TestFederationReviewAttackDeniedSetLevelReportedAsDone(t *testing.T) {
	g := frvGateway(t)
	body := `{"jsonrpc":"2.0","id":9,"method":"logging/setLevel","params":{"level":"debug"}}`

	direct := frvServiceRunner(t, g, aliceKey, "svc")
	_, _, msgs := direct.post(body)
	if len(msgs) == 0 || !gjson.GetBytes(msgs[len(msgs)-1], "error").Exists() {
		t.Fatalf("the per-service route did not apply the policy to logging/setLevel: %s", msgs)
	}

	fed := faRunner(t, g, aliceKey, `{}`)
	list := faRPC(t, fed, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if names := faNames(list, "result.tools.#.name"); !slices.Contains(names, "svc__lookup") || !slices.Contains(names, "beta__lookup") {
		t.Fatalf("both services should be started: %s", list)
	}
	answer := faRPC(t, fed, body)
	if !gjson.GetBytes(answer, "error").Exists() {
		t.Errorf("every service's policy refused logging/setLevel, yet the federated endpoint answered success: %s", answer)
	}
}

// ---- the per-user OAuth connection, through the federated endpoint --------

// frvOAuth is a federated gateway whose service svc uses the provider p
// (alice connected), with its upstream.
func frvOAuth(t *testing.T) (*oauthProvider, *protectedUpstream, *gateway) {
	t.Helper()
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Federation: " ", Tools: "echo"})
	g.connectOAuth(t, aliceKey)
	return p, up, g
}

func frvEcho(t *testing.T, m *rawMCP, id int, text string) json.RawMessage {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": "svc__echo", "arguments": map[string]any{"text": text}}})
	return faRPC(t, m, string(b))
}

// Attack (held): alice disconnects svc while her federated session holds
// an open MCP session with it (its upstream session was made with her
// token); her runner goes on calling svc__echo through it. Expected: no
// request carrying the forgotten token reaches the upstream after the
// disconnect (the token is still valid at the provider: there is no
// revocation_url), and the call says needs_sign_in. Holds: the child
// session's calls pass toolgate_credentials (modules/federation/subcall.go
// sub-calls through the route), which finds no connection.
func TestFederationReviewHoldsDisconnectStopsTheChildSessionsToken(t *testing.T) {
	_, up, g := frvOAuth(t)
	m := faRunner(t, g, aliceKey, `{}`)
	if a := frvEcho(t, m, 1, "before"); refused(a) || !strings.Contains(string(a), "before") {
		t.Fatalf("a federated call before the disconnect: %s", a)
	}
	accepted, _ := up.seen()
	if resp := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE /v1/connections/svc: %d %s", resp.StatusCode, resp.Body)
	}
	a := frvEcho(t, m, 2, "after")
	if !gjson.GetBytes(a, "error.data.needs_sign_in").Bool() {
		t.Errorf("a federated call after the disconnect: %s, want needs_sign_in", a)
	}
	_ = faRPC(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	_, _, _ = faPost(m, `{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`)
	if after, _ := up.seen(); len(after) != len(accepted) {
		t.Errorf("the upstream accepted %d requests with alice's forgotten token after she disconnected", len(after)-len(accepted))
	}
}

// Attack (fixed): alice connects svc again (a new grant; maybe another account at
// the provider) while her federated session holds an MCP session with svc
// made with the old one, then lists tools. Expected: svc's tools are
// listed through a new MCP session, as a call is (route() initializes
// again once) and as the per-service route promises ("the next request
// opens a new one"); a connected, healthy service is not reported
// unavailable. Happens: the registry ends the outdated child session and
// answers 404; listOne (modules/federation/lists.go:174-177) forgets it
// and reports svc in _meta["toolgate/unavailable"] ("its MCP session
// ended") without initializing a new one, so the runner's first list
// after every reconnect (or upstream change) drops all of svc's tools.
// Fixed: a list whose service MCP session the pipeline no longer knows
// initializes a new one, once, as a routed call does (exchange.listOne).
func TestFederationReviewAttackReconnectDropsTheServiceFromTheList(t *testing.T) {
	_, _, g := frvOAuth(t)
	m := faRunner(t, g, aliceKey, `{}`)
	list := faRPC(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if !slices.Contains(faNames(list, "result.tools.#.name"), "svc__echo") {
		t.Fatalf("the first list: %s", list)
	}
	time.Sleep(10 * time.Millisecond) // a grant is named by when it was made
	g.connectOAuth(t, aliceKey)
	list = faRPC(t, m, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if !slices.Contains(faNames(list, "result.tools.#.name"), "svc__echo") {
		t.Errorf("after connecting svc again, the federated list leaves svc out: %s", list)
	}
	if a := frvEcho(t, m, 3, "still"); refused(a) {
		t.Errorf("a call after connecting again: %s", a)
	}
}

// Attack (held): alice connected only svc; another service, other, uses
// the same provider (its upstream accepts any token that provider issued).
// Her runner calls other__echo, lists, and pings every service through the
// federated endpoint. Expected: other's upstream never gets svc's token
// (no request of alice's is accepted there) and the call says
// needs_sign_in for other. Holds: each sub-call's credential is looked up
// for the service the name routes to (ConnectionKey(service, user),
// modules/gateway/connections.go), with a cipher context naming it.
func TestFederationReviewHoldsOneServicesTokenNeverReachesAnother(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	otherUp := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Federation: " ", Tools: "echo", Services: `service other {
			url ` + otherUp.URL + `
			allow_http
			tools echo
			auth ` + oauthBlock(p, "") + `
		}`})
	g.connectOAuth(t, aliceKey)
	m := faRunner(t, g, aliceKey, `{}`)
	if a := frvEcho(t, m, 1, "svc"); refused(a) {
		t.Fatalf("svc__echo: %s", a)
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call",
		"params": map[string]any{"name": "other__echo", "arguments": map[string]any{"text": "other"}}})
	a := faRPC(t, m, string(b))
	if !gjson.GetBytes(a, "error.data.needs_sign_in").Bool() || gjson.GetBytes(a, "error.data.service").String() != "other" {
		t.Errorf("other__echo without a connection to other: %s, want needs_sign_in for other", a)
	}
	list := faRPC(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if gjson.GetBytes(list, `result._meta.toolgate/unavailable.#(service=="other").data.needs_sign_in`).Bool() != true {
		t.Errorf("the merged list does not say other needs a sign-in: %s", list)
	}
	_, _, _ = faPost(m, `{"jsonrpc":"2.0","id":4,"method":"logging/setLevel","params":{"level":"info"}}`)
	if users, _ := otherUp.seen(); len(users) != 0 {
		t.Errorf("other's upstream accepted %d requests made with a token toolgate holds for svc", len(users))
	}
}

// Attack (fixed): alice starts connecting svc (she may use it: the console starts
// the connect and the provider sends her back); before she follows the
// provider's redirect, the administrator takes her off svc's
// allowed_users (a reload). She then opens the callback. Expected: as
// every other route (the API's authorize, the console's connect page, the
// MCP route: account.Service, modules/registry/registry.go:86), the
// callback acts only for a caller who may use the service: nothing is
// exchanged at the provider and no grant is stored for her. Happens: the
// callback looks the service up without asking whether the user of the
// state may use it (modules/api/oauth.go:35, callback;
// modules/gateway/oauth.go:403-453, CompleteAuthorization), exchanges the
// code and stores a grant for a user the registry refuses.
// Fixed: the callback of a user the service no longer allows connects
// nothing (App.CompleteAuthorization).
func TestFederationReviewAttackCallbackConnectsAUserNoLongerAllowed(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: oauthBlock(p, ""), DataDir: t.TempDir(),
		Extra: "state_secret " + testStateSecret}
	g := startGatewayOnPort(t, port, cfg)
	p.allowRedirect(g.URL + "/v1/connections/svc/callback")
	browser := g.signedIn(t, aliceKey)
	cb := providerRedirect(t, browser.startConnect("svc"))

	cfg.ServiceExtra = "allowed_users " + bob
	g2 := startGatewayOnPort(t, port, cfg)
	if resp := g2.api(t, http.MethodPost, "/v1/connections/svc/authorize", aliceKey, nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("after the reload alice may still start connecting svc: %d %s", resp.StatusCode, resp.Body)
	}
	status, page := browser.get(cb.String())
	if n := len(g2.connectionFiles(t, "svc")); n != 0 || strings.Contains(page, "is connected") {
		t.Errorf("alice, no longer allowed svc, completed a connect: %d connection(s) stored, page %d %q", n, status, frvTitle(page))
	}
	if n := len(p.calls()); n != 0 {
		t.Errorf("the provider saw %d code exchange(s) for a user the registry refuses", n)
	}
}

// frvTitle is the <h1> of a toolgate page.
func frvTitle(page string) string {
	_, rest, _ := strings.Cut(page, "<h1>")
	title, _, _ := strings.Cut(rest, "</h1>")
	return title
}

// Attack (fixed): alice connected svc at provider A. The administrator moves svc to
// another provider and upstream (a reload: new url, authorization_url,
// token_url; a migration, or a configuration mistake). Alice calls svc.
// Expected: a grant belongs to the provider and client that issued it: the
// new upstream never gets A's access token, the new token endpoint never
// gets A's refresh token (RFC 6749 section 10.4/6: a refresh token is sent
// only to the authorization server that issued it), and alice is asked to
// connect again. Happens: the stored Connection records nothing of the
// provider or client that issued it (modules/gateway/connections.go:22-40)
// and the registry checks only the upstream endpoint and the grant's name
// of an MCP session (modules/registry/registry.go:432-446): CredentialFor
// (modules/gateway/grants.go:294-299) sends A's access token to the new
// upstream, which refuses it, and CredentialRefused
// (grants.go:340-361) refreshes A's refresh token at the token_url the
// service names now (grants.go:225, refresh).
// Fixed: a grant records the token endpoint, client and resource it was
// issued under (Connection.Issuer); one of another is neither sent,
// refreshed nor revoked, and the person connects again.
func TestFederationReviewAttackGrantFollowsTheServiceToAnotherProvider(t *testing.T) {
	mv := frvMoveProvider(t)
	issued := mv.pA.calls()
	if len(issued) != 1 || issued[0].IssuedRefresh == "" {
		t.Fatalf("provider A's code exchange: %+v", issued)
	}
	refreshA := issued[0].IssuedRefresh
	pB, upB, g2 := mv.pB, mv.upB, mv.g2
	m := g2.raw(t, aliceKey, g2.createSession(t, aliceKey, "svc"), "svc")
	_, _, _ = m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)

	if _, refused := upB.seen(); refused != 0 {
		t.Errorf("the new upstream was sent %d request(s) carrying the token provider A issued", refused)
	}
	for _, c := range pB.calls() {
		if c.Form.Get("refresh_token") == refreshA {
			t.Errorf("provider B's token endpoint was sent provider A's refresh token (grant_type %s, answered %d)", c.Form.Get("grant_type"), c.Status)
		}
	}
}

// frvDenyBetaInitialize is a result policy withholding beta's answer to
// initialize (say, its instructions carry a prompt injection).
const frvDenyBetaInitialize = `package toolgate.result

default decision := {"action": "allow"}

decision := {"action": "deny", "reason": "beta's initialize answer is withheld"} if {
	input.method == "initialize"
	input.service.id == "beta"
}
`

// frvWithheldGateway runs svc and beta (federated), beta's initialize
// answers withheld by the result policy, with max_mcp_sessions_per_caller 4.
func frvWithheldGateway(t *testing.T) *gateway {
	t.Helper()
	svc := faUpstream(t, "svc", func(s *mcp.Server) { faTool(s, "lookup", &mcp.TextContent{Text: "svc"}) })
	beta := faUpstream(t, "beta", func(s *mcp.Server) { faTool(s, "lookup", &mcp.TextContent{Text: "beta"}) })
	cfg := faConfig(t, svc, beta, gatewayConfig{Extra: "max_mcp_sessions_per_caller 4"})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "result.rego"), []byte(frvDenyBetaInitialize), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.ResultPolicy = dir
	return startGateway(t, cfg)
}

// frvInitialize initializes at /v1/mcp/{service} with an implied session.
func frvInitialize(t *testing.T, g *gateway, service string) (int, string, []json.RawMessage) {
	t.Helper()
	m := g.raw(t, aliceKey, "", service)
	delete(m.headers, "X-Toolgate-Session")
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
	return status, hdr.Get("Mcp-Session-Id"), msgs
}

// Attack (fixed): beta's upstream answers initialize with something the result
// policy withholds (policies/README.md: a rule on initialize's
// instructions); alice's runner lists tools through the federated endpoint
// now and then, as clients do. Expected: a refused initialize leaves no MCP
// session open (none was handed to anyone), so alice keeps her room under
// max_mcp_sessions_per_caller. Happens: each federated list initializes a
// new beta session through the pipeline; the proxy keeps the MCP session
// (and the upstream session) although the answer it delivers is an error
// (modules/mcpproxy/handshake.go:94-96), and childSession drops the
// session id the pipeline handed over without ending it
// (modules/federation/session.go:155-159: a.response's gap returns before
// anything is ended). Six lists fill alice's quota of 4: she can no longer
// open any MCP session, on any route, until they expire idle.
// Fixed: an initialize whose result the policy withheld ends its MCP
// session and the upstream's, and gives the runner no id (mcpproxy
// answerInitialize).
func TestFederationReviewAttackWithheldInitializeLeaksChildSessions(t *testing.T) {
	g := frvWithheldGateway(t)
	m := faRunner(t, g, aliceKey, `{}`)
	for i := range 6 {
		list := faRPC(t, m, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, i+1))
		if !slices.Contains(faNames(list, "result.tools.#.name"), "svc__lookup") {
			t.Fatalf("list %d: %s", i+1, list)
		}
	}
	if status, sid, msgs := frvInitialize(t, g, "svc"); status != http.StatusOK || sid == "" {
		t.Errorf("after six federated lists whose beta initialize was withheld, alice cannot open a session at /v1/mcp/svc: %d %s", status, msgs)
	}
}

// Attack (fixed): the same withheld initialize at /v1/mcp/beta, five times.
// Expected: the runner gets the error and no session (no Mcp-Session-Id,
// nothing counted). Happens: each error answer carries an Mcp-Session-Id
// and holds a place under max_mcp_sessions_per_caller
// (modules/mcpproxy/handshake.go:94-96: the session is stored and its id
// set before h.deliver runs the result policy, which turns the answer into
// an error), so four refused initializes lock alice out of every service.
// Fixed: as above (mcpproxy answerInitialize).
func TestFederationReviewAttackWithheldInitializeKeepsTheSession(t *testing.T) {
	g := frvWithheldGateway(t)
	for i := range 5 {
		status, sid, msgs := frvInitialize(t, g, "beta")
		if len(msgs) == 0 || !gjson.GetBytes(msgs[0], "error").Exists() {
			t.Fatalf("beta's initialize %d was not withheld: %d %s", i, status, msgs)
		}
		if sid != "" && i == 0 {
			t.Errorf("a withheld initialize answer carries an MCP session id: %q", sid)
		}
	}
	if status, sid, msgs := frvInitialize(t, g, "svc"); status != http.StatusOK || sid == "" {
		t.Errorf("after five withheld initializes at /v1/mcp/beta, alice cannot open a session at /v1/mcp/svc: %d %s", status, msgs)
	}
}

// frvMove is a service moved by a reload: alice connected svc at provider
// A (its upstream upA), then the configuration names provider B and its
// upstream upB; g2 is the gateway after the reload.
type frvMove struct {
	pA, pB *oauthProvider
	upB    *protectedUpstream
	g2     *gateway
}

func frvMoveProvider(t *testing.T) frvMove {
	t.Helper()
	pA := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	upA := startProtectedUpstream(t, pA)
	pB := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	upB := startProtectedUpstream(t, pB)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: upA.URL, Tools: "echo", Auth: oauthBlock(pA, ""), DataDir: t.TempDir(),
		Extra: "state_secret " + testStateSecret}
	g := startGatewayOnPort(t, port, cfg)
	pA.allowRedirect(g.URL + "/v1/connections/svc/callback")
	g.connectOAuth(t, aliceKey)

	cfg.Upstream, cfg.Auth = upB.URL, oauthBlock(pB, "")
	g2 := startGatewayOnPort(t, port, cfg)
	pB.allowRedirect(g2.URL + "/v1/connections/svc/callback")
	return frvMove{pA: pA, pB: pB, upB: upB, g2: g2}
}
