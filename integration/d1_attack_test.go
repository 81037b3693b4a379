package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

// d1Routes is a site of three prefixes of the MCP endpoint, each a route
// of its own as in TestProxyRelaysNothingThePoliciesDidNotJudge: /judged
// (both policies' matchers cover svc), /unseen (toolgate_result_policy's
// matcher misses svc) and /unjudged (toolgate_policy's matcher misses
// svc). policies is a directory for both policies.
func d1Routes(port int, policies string) string {
	route := func(request, result string) string {
		return `
	route /v1/mcp/* {
		toolgate_session
		toolgate_registry
		toolgate_policy ` + request + ` {
			source ` + policies + `
		}
		toolgate_credentials
		toolgate_result_policy ` + result + ` {
			source ` + policies + `
		}
		toolgate_proxy
	}`
	}
	return `http://127.0.0.1:` + aaItoa(port) + ` {
	handle_path /judged/* {` + route("/v1/mcp/svc", "/v1/mcp/svc") + `
	}
	handle_path /unseen/* {` + route("/v1/mcp/svc", "/v1/mcp/elsewhere") + `
	}
	handle_path /unjudged/* {` + route("/v1/mcp/elsewhere", "/v1/mcp/svc") + `
	}
}
`
}

// d1Result is a result policy that withholds every tools/call result and
// every tool listing: whatever of them reaches the runner was not judged.
const d1Result = `decision := {"action": "deny", "reason": "d1: withheld by the result policy"} if input.method in {"tools/call", "tools/list"}`

// Attack (fixed): the proxy's request-time check "no toolgate_result_policy will
// see its answer" is `!call.HasResultHooks()`, but result hooks are not
// the result policy's alone: toolgate_policy registers one on every
// tools/call it allows (markDecision) and on tools/list (hideTools), and
// toolgate_registry two on tools/list (allowlistTools, FilterList). So a
// tools/call or tools/list whose route's toolgate_result_policy matcher
// lets it by passes the check, and its result reaches the runner unjudged
// — exactly the methods the result policy exists for (secret redaction,
// prompt-injection withholding, tool-result approvals). The existing test
// only sends an initialize through such a route, which has no hook.
// Here the runner initializes its MCP session through a route both
// policies cover (/judged), then sends its calls, with the same
// Mcp-Session-Id, through a route of the same site whose result policy's
// matcher misses the service (/unseen): the MCP session is the app's, not
// the route's, so it is accepted there. Any route shape where the result
// policy's matcher covers the initialize but not a later message (a
// header or expression matcher, a stateless 2026-07-28 runner that sends
// no initialize at all — see the next test) does the same.
// Severity: medium-high (the result policy, the only
// thing that redacts or withholds results, is bypassed while the commit
// and policies/README promise the proxy refuses such a message); it needs
// a route whose result policy matcher misses some requests, which is the
// very configuration the check exists to catch.
// Fix: record the result policy's own participation — e.g. a
// call.ResultJudged flag (or a distinct hook list) set only by
// toolgate_result_policy's ServeHTTP — and have the proxy require it for
// every request (and its message hooks for every stream), rather than
// counting any result hook.
// Fixed: toolgate_policy and toolgate_result_policy mark the call as they
// see it (gateway.Call RequestJudged, ResultJudged), and toolgate_proxy
// relays no request, message or stream, without both marks.
func TestD1AttackResultPolicyMatcherBypassedByRequestPolicyHooks(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, "", d1Result)
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, policies)})
	session := g.createSession(t, aliceKey, "svc")
	at := func(prefix string) *rawMCP {
		g2 := *g
		g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + prefix
		return g2.raw(t, aliceKey, session, "svc")
	}
	judged := at("judged")
	judged.initialize()
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d1-secret-result"}}}`
	// Control: through /judged the result policy withholds the result.
	if _, _, msgs := judged.post(call); len(msgs) != 1 || strings.Contains(string(msgs[0]), "d1-secret-result") {
		t.Fatalf("premise: the result policy did not withhold the call's result through /judged: %s", msgs)
	}
	unseen := at("unseen")
	unseen.sessionID = judged.sessionID
	_, _, msgs := unseen.post(call)
	if len(msgs) != 1 || strings.Contains(string(msgs[0]), "d1-secret-result") ||
		!strings.Contains(gjson.GetBytes(msgs[0], "error.message").String(), "without a policy's judgement") {
		t.Errorf("tools/call through a route whose toolgate_result_policy matcher misses it: %s (want refused: no result policy saw it)", msgs)
	}
	_, _, msgs = unseen.post(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`)
	if len(msgs) != 1 || gjson.GetBytes(msgs[0], "result.tools.#").Int() > 0 {
		t.Errorf("tools/list through a route whose toolgate_result_policy matcher misses it: %s (want refused)", msgs)
	}
}

// Attack (fixed): the same bypass without any second route: a stateless runner of
// 2026-07-28 sends no initialize, so the one message the existing test
// shows refused never comes. Its tools/call through a route whose
// toolgate_result_policy matcher misses the service has toolgate_policy's
// markDecision hook, passes `HasResultHooks()`, and gets the upstream's
// result unjudged. (gatewayConfig.ResultPolicyElsewhere is the harness's
// own such route.)
// Severity: high (as above; stateless runners are the protocol's newest
// revision, which toolgate serves on the same endpoint).
// Fix: as above.
func TestD1AttackStatelessCallThroughRouteWithoutResultPolicy(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", ResultPolicyElsewhere: true})
	_, msg := statelessPost(t, g, aliceKey, g.createSession(t, aliceKey, "svc"),
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d1-stateless-result"},`+aaStatelessMeta(`{}`)+`}}`, nil)
	text := aaJSON(msg)
	if strings.Contains(text, "d1-stateless-result") || !strings.Contains(text, "without a policy's judgement") {
		t.Errorf("a stateless tools/call through a route whose toolgate_result_policy matcher misses the service: %s (want refused: no result policy saw it)", text)
	}
}

// Held: a message no toolgate_policy judged is refused even when the MCP
// session was initialized through a route both policies cover: the
// runner's notification and its tools/call, sent with that session's id
// through a route whose toolgate_policy matcher misses the service, are
// not relayed (Decision is per message, never carried over from the
// initialize).
func TestD1AttackSessionFromJudgedRouteDoesNotCarryDecision(t *testing.T) {
	up := startUpstream(t)
	var mu sync.Mutex
	var reached []string
	up.setIntercept(func(_ http.ResponseWriter, _ *http.Request, b []byte) bool {
		if strings.Contains(string(b), "d1-unjudged") {
			mu.Lock()
			reached = append(reached, gjson.GetBytes(b, "method").String())
			mu.Unlock()
		}
		return false
	})
	policies := aaPolicies(t, "", "")
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, policies)})
	session := g.createSession(t, aliceKey, "svc")
	g2 := *g
	g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/judged"
	judged := g2.raw(t, aliceKey, session, "svc")
	judged.initialize()
	g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/unjudged"
	unjudged := g2.raw(t, aliceKey, session, "svc")
	unjudged.sessionID = judged.sessionID
	_, _, msgs := unjudged.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"d1-unjudged"}}}`)
	if len(msgs) != 1 || !strings.Contains(gjson.GetBytes(msgs[0], "error.message").String(), "without a policy's judgement") {
		t.Errorf("tools/call through a route whose toolgate_policy misses it: %s (want refused)", msgs)
	}
	status, _, _ := unjudged.post(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"d1-unjudged"}}`)
	if status == http.StatusAccepted {
		t.Errorf("a notification through a route whose toolgate_policy misses it was accepted (HTTP %d)", status)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reached) != 0 {
		t.Errorf("the upstream got unjudged messages: %v", reached)
	}
}

// Attack (fixed): the request-time check covered messages only (`Kind != 0`): a
// runner's standalone stream (GET), which carries no message of its own,
// is relayed whatever the policies' matchers let by. What the upstream
// sends on it — notifications, and server→client requests (elicitation,
// sampling) — is what toolgate_result_policy's message hook judges
// (redaction, withholding instructions, other sessions' task statuses);
// through a route whose result policy's matcher misses the stream, it
// reaches the runner unjudged. (Likewise a stream toward an upstream of
// 2026-07-28 is a subscriptions/listen toolgate sends for the runner,
// decided by toolgate_policy's stream hook, which a matcher that misses
// the GET skips: the listen goes upstream undecided.)
// Here the runner's MCP session is initialized through /judged, whose
// result policy withholds any message naming "d1-stream"; the same
// stream opened through /unseen delivers it.
// Severity: medium (upstream→runner messages on the standalone stream
// bypass redaction and injection filtering in a route the commit says
// fails closed).
// Fix: refuse a GET (and serve no stream) unless toolgate_result_policy
// registered its message hook and toolgate_policy its stream hook for it,
// e.g. by a flag each sets for every request it sees, checked in the
// proxy for Kind == 0 too (DELETE aside).
func TestD1AttackStandaloneStreamBypassesResultPolicyMatcher(t *testing.T) {
	up := startUpstream(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"d1-stream-secret\"}}\n\n"))
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
		return true
	})
	policies := aaPolicies(t, "", `decision := {"action": "deny", "reason": "d1: withheld"} if contains(json.marshal(input), "d1-stream")`)
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, policies)})
	session := g.createSession(t, aliceKey, "svc")
	at := func(prefix string) *rawMCP {
		g2 := *g
		g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + prefix
		return g2.raw(t, aliceKey, session, "svc")
	}
	judged := at("judged")
	judged.initialize()
	read := func(m *rawMCP) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body) // until the upstream or the timeout ends it
		return resp.StatusCode, string(b)
	}
	if status, body := read(judged); status != http.StatusOK || strings.Contains(body, "d1-stream-secret") {
		t.Fatalf("premise: the stream through /judged: HTTP %d %q (want 200 without the withheld notification)", status, body)
	}
	unseen := at("unseen")
	unseen.sessionID = judged.sessionID
	if status, body := read(unseen); strings.Contains(body, "d1-stream-secret") {
		t.Errorf("the standalone stream through a route whose toolgate_result_policy matcher misses it: HTTP %d, delivered the notification the result policy withholds: %q", status, body)
	}
}

// Held (false positives): legitimate configurations still validate under
// the new order rule: the pipeline in a named route invoked by the site,
// one shared pipeline whose proxy sits in two nested routes, a route
// per service with its own policies, and the federated endpoint's route
// beside the services' route.
func TestD1AttackLegitimateRoutesStillValidate(t *testing.T) {
	const policy = "testdata/policy"
	full := func(extra string) string {
		return "toolgate_session\n" + extra + "toolgate_registry\ntoolgate_policy " + policy + "\ntoolgate_credentials\ntoolgate_result_policy " + policy + "\n"
	}
	head := `{
	admin off
	toolgate {
		service svc {
			url http://127.0.0.1:1/mcp
			allow_http
			tools echo
		}
	}
}
`
	for name, site := range map[string]string{
		"named route": `&(mcp) {
	route {
		` + full("") + `toolgate_proxy
	}
}
http://127.0.0.1:1 {
	route /v1/mcp/* {
		invoke mcp
	}
}`,
		"proxy in two branches": `http://127.0.0.1:1 {
	route /v1/mcp/* {
		` + full("") + `route /v1/mcp/svc {
			toolgate_proxy
		}
		route {
			toolgate_proxy
		}
	}
}`,
		"a route per service": `http://127.0.0.1:1 {
	route /v1/mcp/svc {
		` + full("") + `toolgate_proxy
	}
	route /v1/mcp/other {
		` + full("") + `toolgate_proxy
	}
}`,
		"federated and per-service routes": `http://127.0.0.1:1 {
	route /v1/mcp {
		` + full("toolgate_federation\n") + `toolgate_proxy
	}
	route /v1/mcp/* {
		` + full("") + `toolgate_proxy
	}
}`,
	} {
		if err := validateCaddyfile(t, head+site); err != nil {
			t.Errorf("%s: validate = %v, want a legitimate configuration accepted", name, err)
		}
	}
}

// Attack (fixed): the stream-side twin of the result-policy bypass, on the request
// side. Toward an upstream of 2026-07-28 a runner's GET stream is served
// by a subscriptions/listen toolgate sends in its name, which
// toolgate_policy decides through the stream hook it registers on the GET
// (decideStream). The proxy's request-time check skips every GET
// (`Kind != 0`), so through a route whose toolgate_policy matcher misses
// the GET, the listen goes upstream undecided, though the policy denies
// subscriptions/listen. The runner initializes through /judged (both
// policies cover it; there the listen is refused) and opens its stream,
// with the same MCP session, through /unjudged.
// Severity: medium (a request the policy denies reaches the upstream,
// and its notifications flow to the runner, in a route the commit says
// fails closed).
// Fix: have the proxy refuse a GET whose call no toolgate_policy saw (a
// flag the policy sets for every request, message or not), as it refuses
// an undecided message.
func TestD1AttackTranslatedListenBypassesPolicyMatcher(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "modern", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2026-07-28"}})
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
	up := serveStateless(t, s)
	listens := func() int {
		up.mu.Lock()
		defer up.mu.Unlock()
		n := 0
		for _, r := range up.requests {
			if gjson.Get(r.Body, "method").String() == "subscriptions/listen" {
				n++
			}
		}
		return n
	}
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "d1: no listening"} if input.method == "subscriptions/listen"`, "")
	port := freePort(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: d1Routes(port, policies)})
	session := g.createSession(t, aliceKey, "svc")
	at := func(prefix string) *rawMCP {
		g2 := *g
		g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + prefix
		return g2.raw(t, aliceKey, session, "svc")
	}
	judged := at("judged")
	judged.initialize()
	stream := func(m *rawMCP) int {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	status := stream(judged)
	if n := listens(); n != 0 {
		t.Fatalf("premise: the stream through /judged (HTTP %d) sent %d subscriptions/listen the policy denies", status, n)
	}
	unjudged := at("unjudged")
	unjudged.sessionID = judged.sessionID
	status = stream(unjudged)
	if n := listens(); n != 0 {
		t.Errorf("the stream through a route whose toolgate_policy matcher misses it (HTTP %d) sent %d subscriptions/listen upstream, which the policy denies", status, n)
	}
}
