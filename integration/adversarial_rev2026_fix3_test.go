package integration

// A review of two fixes of the stateless revision (2026-07-28): the
// initialize toolgate sends to open a stateless runner's implied MCP
// session is decided by the request policy (gateway.Route, da7108f), and
// the requestState of an upstream of 2026-07-28 reaches a
// stateless runner sealed in one of toolgate's so that its answers are
// decided as answers (mcp2026.Relay, c94a68b). Tests whose comment starts
// with "Attack (fixed):" reproduced a defect (each failed before its fix);
// "Attack (held):" ones show an attack the gateway resists.

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

// fx3Call is a stateless tools/call of echo declaring caps and the client
// identity name.
func fx3Call(id int, caps, name string) string {
	return `{"jsonrpc":"2.0","id":` + aaItoa(id) + `,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":` + caps +
		`,"io.modelcontextprotocol/clientInfo":{"name":` + aaJSON(name) + `,"version":"1"}}}}`
}

// Attack (fixed): a request rule on initialize's clientInfo holds for a stateless
// runner only when its request happens to open the implied MCP session.
// The implied session is keyed by caller, toolgate session, service and
// the hash of the declared capabilities only (internal/mcp2026/runtime.go
// Session: key = user \x00 session \x00 service \x00 sha256(capabilities)),
// and the opening decision (modules/policy/opening.go decideOpening, run
// from mcpproxy/stateless.go initializeFor) is taken once, with the
// clientInfo of whichever request opened it. The site's policy refuses the
// client "evil-runner" (input.params.clientInfo.name); a runner of
// 2025-11-25 declaring it is refused at initialize, and so is a stateless
// runner whose request opens the session (control). But a stateless runner
// that first sends one request as "good-runner", then declares
// "evil-runner" with the same capabilities, shares the opened session: no
// initialize is decided for it and its tools/call is served. Expected: the
// request declaring "evil-runner" is refused as its initialize would be.
// Fix: put the declared clientInfo in the implied session's key (or decide
// "initialize" again, without sending it, for every request whose declared
// clientInfo differs from the one the session was opened with).
// Fixed: the implied session is keyed by the declared clientInfo too
// (mcp2026.Runtime.Session): another identity opens, and is decided as, an
// initialize of its own.
func TestRev2026Fix3AttackClientInfoRuleSkippedOnceOpened(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "evil-runner may not connect"} if {
	input.method == "initialize"
	input.params.clientInfo.name == "evil-runner"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
	// Control: the evil runner opening its own implied session is refused.
	control := g.createSession(t, aliceKey, "svc")
	status, msg := statelessPost(t, g, aliceKey, control, fx3Call(1, `{}`, "evil-runner"), nil)
	if got := aaJSON(msg); gjson.Get(got, "error.code").Int() != -32013 {
		t.Fatalf("control: evil-runner opening the session: %d %s, want the policy's denial (-32013)", status, got)
	}
	session := g.createSession(t, aliceKey, "svc")
	if status, msg := statelessPost(t, g, aliceKey, session, fx3Call(2, `{}`, "good-runner"), nil); status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("good-runner: %d %s, want served", status, aaJSON(msg))
	}
	status, msg = statelessPost(t, g, aliceKey, session, fx3Call(3, `{}`, "evil-runner"), nil)
	if aaResult(msg) != nil {
		t.Fatalf("a stateless runner declaring clientInfo evil-runner, which the policy refuses at initialize, was served "+
			"through the implied session another clientInfo opened: %d %s", status, aaJSON(msg))
	}
}

// Attack (fixed): an initialize the policy denies leaves an MCP session behind,
// counted against max_mcp_sessions_per_caller. toolgate_registry creates
// the implied MCP session (CreateLocal, counted like an initialize) in
// readStateless (modules/registry/stateless.go:31, rt.Session) before the
// opening is decided (openStateless / initializeFor); a denied opening
// refuses the request but leaves the session open and counted until it
// idles out. A runner of an earlier revision whose initialize is denied
// gets no MCP session at all. Here max_mcp_sessions_per_caller is 2 and
// the policy denies initialize declaring sampling: three requests
// declaring sampling (with different sub-members, so three implied
// sessions), each refused with nothing sent upstream, and the caller's
// next request, which the policy allows, is refused with 429 (the limit).
// Expected: the allowed request is served. Fix: end (discard) the implied
// session when its opening is refused, or create it only once the opening
// is allowed.
// Fixed: a refused opening retires the implied session unless another
// request uses it (Sessions.RetireUnopened): it holds no place among the
// caller's MCP sessions.
func TestRev2026Fix3AttackDeniedOpeningCountsAgainstSessionLimit(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "clients that offer sampling may not connect"} if {
	input.method == "initialize"
	input.params.capabilities.sampling
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies, Extra: "max_mcp_sessions_per_caller 2"})
	session := g.createSession(t, aliceKey, "svc")
	for i, caps := range []string{`{"sampling":{}}`, `{"sampling":{"a":{}}}`, `{"sampling":{"b":{}}}`} {
		status, msg := statelessPost(t, g, aliceKey, session, fx3Call(1+i, caps, "r"), nil)
		if aaResult(msg) != nil {
			t.Fatalf("a runner declaring sampling was served: %d %s", status, aaJSON(msg))
		}
	}
	status, msg := statelessPost(t, g, aliceKey, session, fx3Call(9, `{}`, "r"), nil)
	if status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("after three denied openings, the caller's allowed request: %d %s; want it served (denied initializes "+
			"must not hold MCP sessions counted against max_mcp_sessions_per_caller)", status, aaJSON(msg))
	}
}

// Attack (fixed): an upstream of 2026-07-28 hands its requestState to the runner
// in a result that is not input_required. finishStateless
// (modules/mcpproxy/stateless.go) seals the upstream's requestState
// (mcp2026.Relay) only when resultType is input_required; a complete
// result carrying requestState reaches the runner with it as the upstream
// wrote it, though the fix says toolgate never hands the upstream's state
// to the runner (internal/mcp2026/relay.go). The runner can then echo the
// upstream's own state (its answers go as unattributed ones, decided under
// each input method, so no rule is skipped; but whatever the upstream
// binds to its state is now the runner's to replay, outside toolgate's
// caller/session/tool binding). Expected: no requestState of the
// upstream's in the runner's answer. Fix: drop requestState (any case) from
// every stateless result that is not input_required, as inputRequests is
// refused there (mcp2026.InputRequestsProblem).
// Fixed: a complete result reaches a stateless runner without requestState
// (mcp2026.Complete).
func TestRev2026Fix3AttackUpstreamStateInCompleteResult(t *testing.T) {
	const secret = "upstream-secret-state-42"
	up := saStartModern(t, `["2026-07-28"]`, `[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]`,
		func(gjson.Result) (int, string) {
			return http.StatusOK, `"result":{"resultType":"complete","content":[{"type":"text","text":"done"}],"requestState":"` + secret + `"}`
		})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo"})
	session := g.createSession(t, aliceKey, "svc")
	status, msg := statelessPost(t, g, aliceKey, session, fx3Call(1, `{}`, "r"), nil)
	if got := aaJSON(msg); status != http.StatusOK || !strings.Contains(got, "done") {
		t.Fatalf("echo: %d %s", status, got)
	} else if strings.Contains(got, secret) {
		t.Fatalf("the upstream's requestState reached the runner unsealed in a complete result: %s", got)
	}
}

// Attack (held): the answer's key spelled with an escape. The upstream's
// confirm asks under "confirm"; the runner answers under "con\u0066irm"
// (the same key once decoded, as the upstream's decoder reads it) with the
// relayed requestState. decideInputResponses decodes keys (gjson) and
// WithoutAnswers removes by the decoded key (mcpmsg.RemoveMember): the
// answer is decided as the answer to elicitation/create and withheld.
func TestRev2026Fix3HeldEscapedAnswerKeyIsDecided(t *testing.T) {
	up := startStatelessUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "answers to elicitation/create are denied"} if {
	input.method == "elicitation/create"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"elicitation":{"form":{}}}`
	_, msg := statelessPost(t, g, aliceKey, session, saCall(1, "confirm", `{}`, caps, ""), nil)
	state, _ := aaResult(msg)["requestState"].(string)
	if state == "" {
		t.Fatalf("confirm: %s, want input_required", aaJSON(msg))
	}
	s, _ := json.Marshal(state)
	for i, key := range []string{`con\u0066irm`, `confirm`, `Confirm`, `con\/firm`} {
		extra := `,"inputResponses":{"` + key + `":{"action":"accept","content":{"ok":true}}},"requestState":` + string(s)
		status, msg := statelessPost(t, g, aliceKey, session, saCall(2+i, "confirm", `{}`, caps, extra), nil)
		if got := aaJSON(msg); strings.Contains(got, "confirmed: accept") || len(up.seen(`"accept"`)) > 0 {
			t.Fatalf("an answer under %q reached the upstream past the rule: %d %s", key, status, got)
		}
	}
}

// Attack (held): a relayed requestState replayed against other arguments,
// another tool, or another toolgate session of the same caller is refused
// (mcp2026.State.Matches), and an answer under toolgate's own key
// io.toolgate/approval (skipped by decideInputResponses for a state
// toolgate sealed) never reaches the upstream.
func TestRev2026Fix3HeldRelayedStateBoundToCall(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm"})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"elicitation":{"form":{}}}`
	_, msg := statelessPost(t, g, aliceKey, session, saCall(1, "confirm", `{}`, caps, ""), nil)
	state, _ := aaResult(msg)["requestState"].(string)
	if state == "" {
		t.Fatalf("confirm: %s, want input_required", aaJSON(msg))
	}
	accept := map[string]any{"confirm": map[string]any{"action": "accept", "content": map[string]any{"ok": true}}}
	other := g.createSession(t, aliceKey, "svc")
	for name, c := range map[string]struct{ session, body string }{
		"other arguments": {session, saCall(2, "confirm", `{"x":1}`, caps, retryWith(state, accept))},
		"other tool":      {session, saCall(3, "echo", `{}`, caps, retryWith(state, accept))},
		"other session":   {other, saCall(4, "confirm", `{}`, caps, retryWith(state, accept))},
	} {
		status, msg := statelessPost(t, g, aliceKey, c.session, c.body, nil)
		if status != http.StatusBadRequest || len(up.seen(`"accept"`)) > 0 {
			t.Errorf("%s: %d %s, want 400 and nothing upstream", name, status, aaJSON(msg))
		}
	}
	own := map[string]any{"io.toolgate/approval": map[string]any{"action": "accept", "content": map[string]any{"smuggled": true}}}
	statelessPost(t, g, aliceKey, session, saCall(5, "confirm", `{}`, caps, retryWith(state, own)), nil)
	if got := up.seen(`smuggled`); len(got) > 0 {
		t.Errorf("an answer under io.toolgate/approval reached the upstream: %s", got[0].Body)
	}
}

// Attack (fixed): a route with two toolgate_policy handlers (each for its own
// paths) decides every stateless runner's opening with the last one's
// policy. toolgate_policy sets gateway.Route.OpeningGate on the route
// being provisioned (modules/policy/request.go Provision:
// h.app.ProvisioningRoute().OpeningGate = h.decideOpening): a route's
// second toolgate_policy overwrites the first's, and toolgate_registry
// hands that one gate to every request of the route
// (modules/registry/stateless.go readStateless, st.Gate =
// h.route.OpeningGate), whichever toolgate_policy the request's matcher
// picks. Here /v1/mcp/svc has a strict policy that denies an initialize
// declaring sampling, and a later toolgate_policy for another path allows
// everything: a runner of 2026-07-28 declaring sampling on svc gets its
// initialize decided by the lax policy, sent upstream, and its tools/call
// served (the strict policy decides only the tools/call, which it allows).
// Expected: refused (-32013) as by the strict policy. Fix: let the
// toolgate_policy that decides the request decide its opening (e.g. have
// toolgate_policy set call.Stateless.Gate, or the opening decided lazily
// by the policy step in the request's own chain), not a per-route slot
// the last provisioned handler wins.
// Fixed: the opening is decided under every toolgate_policy of the route
// (gateway.Route.DecideOpening), the first refusal holding.
func TestRev2026Fix3AttackSecondPolicyOfRouteDecidesOpening(t *testing.T) {
	up := startUpstream(t)
	strict := aaPolicies(t, `decision := {"action": "deny", "reason": "clients that offer sampling may not connect"} if {
	input.method == "initialize"
	input.params.capabilities.sampling
}
`, "")
	lax := aaPolicies(t, "", "")
	port2 := freePort(t)
	sites := `http://127.0.0.1:` + aaItoa(port2) + ` {
	route /v1/mcp/* {
		toolgate_session
		toolgate_registry
		toolgate_policy /v1/mcp/svc {
			source ` + strict + `
			timeout 5s
		}
		toolgate_policy /v1/mcp/elsewhere {
			source ` + lax + `
			timeout 5s
		}
		toolgate_credentials
		toolgate_result_policy {
			source ` + lax + `
		}
		toolgate_proxy
	}
}
`
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: strict, Sites: sites})
	session := g.createSession(t, aliceKey, "svc")
	// Control: the gateway's own route (one toolgate_policy) refuses it.
	status, msg := statelessPost(t, g, aliceKey, session, fx3Call(1, `{"sampling":{}}`, "r"), nil)
	if got := aaJSON(msg); gjson.Get(got, "error.code").Int() != -32013 {
		t.Fatalf("control: %d %s, want the policy's denial (-32013)", status, got)
	}
	g2 := *g
	g2.URL = "http://127.0.0.1:" + aaItoa(port2)
	// Control: on that route, svc's requests are decided by the strict
	// policy: a runner that initializes declaring sampling is refused.
	m := g2.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"r","version":"1"}}}`); len(msgs) != 1 || !gjson.GetBytes(msgs[0], "error").Exists() {
		t.Fatalf("control: on the second route, an initialize declaring sampling was not refused: %s", msgs)
	}
	other := g.createSession(t, aliceKey, "svc")
	before := len(paUpstreamBodies(up, `"sampling"`))
	status, msg = statelessPost(t, &g2, aliceKey, other, fx3Call(2, `{"sampling":{}}`, "r"), nil)
	if aaResult(msg) != nil || len(paUpstreamBodies(up, `"sampling"`)) > before {
		t.Fatalf("on a route whose later toolgate_policy is for other paths, a stateless runner declaring sampling was served "+
			"past svc's policy denying such an initialize (runner got %d %s; upstream initialized with sampling: %v)",
			status, aaJSON(msg), len(paUpstreamBodies(up, `"sampling"`)) > before)
	}
}

// Attack (held): an ask on initialize. Opening an implied session cannot
// wait for an approval: the runner's request is refused (-32013, with the
// decision), nothing is sent upstream.
func TestRev2026Fix3HeldAskOnInitializeRefuses(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "ask", "reason": "a person must let sampling clients in"} if {
	input.method == "initialize"
	input.params.capabilities.sampling
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	before := len(paUpstreamBodies(up, `"sampling"`))
	status, msg := statelessPost(t, g, aliceKey, session, fx3Call(1, `{"sampling":{}}`, "r"), nil)
	if got := aaJSON(msg); gjson.Get(got, "error.code").Int() != -32013 || !strings.Contains(got, "approval required") ||
		len(paUpstreamBodies(up, `"sampling"`)) > before {
		t.Fatalf("an ask on the opening: %d %s; want refused with nothing sent", status, got)
	}
}

// Attack (fixed): one request of a stateless runner makes the request policy
// decide, and the audit log record, three decisions per input response it
// carries, without bound. decideInputResponses (modules/policy/inputs.go)
// decides an answer under a key toolgate relayed no request for as the
// answer to each of elicitation/create, sampling/createMessage and
// roots/list (mcp2026.InputMethods), each with its own policy evaluation
// and audit entry (h.newDecision), for every member of inputResponses; the
// only bound is max_request_values (100,000 by default): some 50,000
// answers, 150,000 evaluations and audit lines, from one request of a
// few hundred kilobytes, for a call whose upstream asked nothing (an
// upstream of an earlier revision's held exchange takes only answers to
// what it asked; a runner of an earlier revision sends one answer per
// message). Here 1,000 answers to an echo that asked nothing: the request
// yields 3,000 audit entries. Expected: the number of answers decided per
// request is bounded (say by the input requests relayed, or a small
// constant, the rest refused), so that a request costs O(1) decisions and
// audit entries. Fix: refuse a retry with more input responses than a
// small bound (or, when the relayed state names the input requests, with
// answers under keys it does not name).
// Fixed: a retry carries at most mcp2026.MaxInputResponses (64) answers;
// more are refused before any policy runs.
func TestRev2026Fix3AttackUnattributedAnswersAmplifyDecisions(t *testing.T) {
	logCfg, audit := auditLog(t)
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm", Log: logCfg})
	session := g.createSession(t, aliceKey, "svc")
	const n = 1000
	var b strings.Builder
	b.WriteString(`,"inputResponses":{`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + aaItoa(i) + `":{}`)
	}
	b.WriteString(`}`)
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, `{}`, b.String()), nil)
	answers := 0
	for _, e := range auditOf(audit(), "policy decision") {
		switch e["method"] {
		case "elicitation/create", "sampling/createMessage", "roots/list":
			answers++
		}
	}
	if answers > 3*16 {
		t.Fatalf("one request with %d input responses (answered %d %.200s) made %d answer decisions and audit entries; "+
			"want a bound independent of the request", n, status, aaJSON(msg), answers)
	}
}

// Attack (held): an upstream of 2026-07-28 answering input_required with
// its requestState given twice, in another case, escaped, or not a string.
// The first two are refused as the upstream's answer (duplicate keys and
// case variants of requestState are refused by the parser); the escaped
// and the non-string ones are sealed, and come back to the upstream byte
// for byte. The runner never sees the upstream's state.
func TestRev2026Fix3HeldUpstreamStateSpellings(t *testing.T) {
	const secret = "upstream-secret-7"
	ask := `"inputRequests":{"confirm":{"method":"elicitation/create","params":{"mode":"form","message":"ok?","requestedSchema":{"type":"object","properties":{}}}}}`
	for name, rs := range map[string]string{
		"twice":      `"requestState":"` + secret + `","requestState":"` + secret + `-2"`,
		"case":       `"RequestState":"` + secret + `"`,
		"escaped":    `"request\u0053tate":"` + secret + `"`,
		"non-string": `"requestState":{"s":"` + secret + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			up := saStartModern(t, `["2026-07-28"]`, `[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]`,
				func(params gjson.Result) (int, string) {
					mu.Lock()
					got = append(got, params.Raw)
					mu.Unlock()
					if params.Get("inputResponses").Exists() {
						return http.StatusOK, `"result":{"resultType":"complete","content":[{"type":"text","text":"done"}]}`
					}
					return http.StatusOK, `"result":{"resultType":"input_required",` + ask + `,` + rs + `}`
				})
			g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo"})
			session := g.createSession(t, aliceKey, "svc")
			caps := `{"elicitation":{"form":{}}}`
			_, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, caps, ""), nil)
			if strings.Contains(aaJSON(msg), secret) {
				t.Fatalf("the upstream's requestState reached the runner: %s", aaJSON(msg))
			}
			state, _ := aaResult(msg)["requestState"].(string)
			if refused := name == "twice" || name == "case"; refused != (state == "") {
				t.Fatalf("the runner got %s; want the upstream's answer refused: %v", aaJSON(msg), refused)
			} else if refused {
				return
			}
			accept := map[string]any{"confirm": map[string]any{"action": "accept", "content": map[string]any{}}}
			statelessPost(t, g, aliceKey, session, saCall(2, "echo", `{}`, caps, retryWith(state, accept)), nil)
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 || !strings.Contains(got[1], secret) || strings.Contains(got[1], "toolgate.") {
				t.Errorf("the retry upstream: %q, want the upstream's own state back", got)
			}
		})
	}
}

// Attack (fixed): an answer is decided as the method toolgate attributes to its key,
// while the upstream reads it as the method its shape says. A relayed
// requestState is not used up (mcp2026.Runtime.Redeem returns early for a
// Relayed state) and maps each key to the method the upstream asked under
// it in that round (mcp2026.Relay, State.Inputs). decideInputResponses
// (modules/policy/inputs.go) decides the answer under a key only as that
// method. The go-sdk (v1.8.0, mcp/protocol.go unmarshalInputResponse)
// decodes each input response by its shape: "roots" → ListRootsResult,
// "action" → ElicitResult, "role" → CreateMessageResult, whatever was
// asked under its key. Here a stateless go-sdk tool asks "q" as roots/list
// in round 1 (state S1), then "q" as elicitation/create ("deploy?") in
// round 2 (S2), and deploys on an accepted ElicitResult under "q". The
// policy denies accepting an elicitation. The accept given with S2 is
// withheld (held); the same accept given with S1, replayed, is decided as
// an answer to roots/list, allowed, and reaches the upstream, which reads
// an ElicitResult and deploys (the replay is not even needed: the accept
// given with S1 in the first place goes the same way). Expected: the
// answer is withheld. The same confusion holds where toolgate answers for
// a runner of an earlier revision
// (TestRev2026Fix3AttackLegacyRunnerAnswerShapeOtherThanMethod), and with
// mixed shapes (an answer under an elicitation key with "action":"decline"
// and "roots", which the go-sdk reads as a ListRootsResult: a rule on
// roots/list answers is skipped; not reproduced here). Fix:
// decide an answer also as the method its shape stands for (action →
// elicitation/create, role → sampling/createMessage, roots → roots/list;
// no discriminating member → each), or refuse one whose shape is not that
// of the method asked under its key.
// Fixed: an answer is decided as its key's method and as each method its
// shape may be read as (mcp2026.AnswerMethods).
func TestRev2026Fix3AttackAnswerShapeOtherThanKeysMethod(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "shape-upstream", Version: "1.0.0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "deploy", Description: "Deploys after asking.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
			switch a := req.Params.InputResponses["q"].(type) {
			case *mcp.ElicitResult:
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deployed: " + a.Action}}}, nil, nil
			case *mcp.ListRootsResult:
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"q": &mcp.ElicitParams{Message: "deploy?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}}}}, RequestState: "r2"}, nil, nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"q": &mcp.ListRootsParams{}}, RequestState: "r1"}, nil, nil
		})
	up := serveStateless(t, s)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "accepting an elicitation is denied"} if {
	input.method == "elicitation/create"
	input.result.action == "accept"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "deploy", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"roots":{},"elicitation":{"form":{}}}`
	_, msg := statelessPost(t, g, aliceKey, session, saCall(1, "deploy", `{}`, caps, ""), nil)
	s1, _ := aaResult(msg)["requestState"].(string)
	if s1 == "" {
		t.Fatalf("round 1: %s, want input_required", aaJSON(msg))
	}
	roots := map[string]any{"q": map[string]any{"roots": []any{}}}
	_, msg = statelessPost(t, g, aliceKey, session, saCall(2, "deploy", `{}`, caps, retryWith(s1, roots)), nil)
	s2, _ := aaResult(msg)["requestState"].(string)
	if s2 == "" || !strings.Contains(aaJSON(msg), "deploy?") {
		t.Fatalf("round 2: %s, want the elicitation", aaJSON(msg))
	}
	accept := map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{}}}
	// Control: the accept answering the elicitation is withheld.
	_, msg = statelessPost(t, g, aliceKey, session, saCall(3, "deploy", `{}`, caps, retryWith(s2, accept)), nil)
	if strings.Contains(aaJSON(msg), "deployed") {
		t.Fatalf("control: the accept given with round 2's state reached the upstream: %s", aaJSON(msg))
	}
	status, msg := statelessPost(t, g, aliceKey, session, saCall(4, "deploy", `{}`, caps, retryWith(s1, accept)), nil)
	if got := aaJSON(msg); strings.Contains(got, "deployed: accept") {
		t.Fatalf("an accepted elicitation, given under round 1's requestState (where \"q\" was a roots/list), was decided as an "+
			"answer to roots/list and reached the upstream, which read an ElicitResult and deployed: %d %s", status, got)
	}
}

// Attack (fixed): the same confusion where toolgate answers for a runner of an
// earlier revision. In front of an upstream of 2026-07-28, toolgate sends
// the runner each input request as a server→client request, decides the
// runner's response as the answer to that request's method (roots/list
// here), and sends it upstream in inputResponses under the upstream's key
// (modules/mcpproxy/translate.go), whatever its shape. The go-sdk upstream
// decodes it by shape (an "action" member: an ElicitResult). The policy
// denies accepting an elicitation; the runner answers toolgate's
// roots/list with {"action":"accept"}: decided as a roots/list answer,
// allowed, and the upstream deploys. Expected: withheld. Fix: decide the
// answer as the method its shape stands for as well (see
// TestRev2026Fix3AttackAnswerShapeOtherThanKeysMethod), or refuse a
// response whose shape is not that of the method asked.
// Fixed: a runner's answer is decided as each other method its shape may be
// read as too (policy decideAnswerShape), and withheld unless all allow it.
func TestRev2026Fix3AttackLegacyRunnerAnswerShapeOtherThanMethod(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "shape-upstream", Version: "1.0.0"},
		&mcp.ServerOptions{SupportedProtocolVersions: []string{"2026-07-28"}})
	mcp.AddTool(s, &mcp.Tool{Name: "deploy", Description: "Deploys after asking.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
			switch a := req.Params.InputResponses["q"].(type) {
			case *mcp.ElicitResult:
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "deployed: " + a.Action}}}, nil, nil
			case *mcp.ListRootsResult:
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "roots seen"}}}, nil, nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"q": &mcp.ListRootsParams{}}, RequestState: "r1"}, nil, nil
		})
	up := serveStateless(t, s)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "accepting an elicitation is denied"} if {
	input.method == "elicitation/create"
	input.result.action == "accept"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "deploy", RequestPolicy: policies})
	runner := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{},"elicitation":{}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := runner.send(ctx, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"deploy","arguments":{}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	req := trReadUntil(br, `"roots/list"`)
	id := gjson.Get(req, "id").Raw
	if id == "" {
		t.Fatalf("no roots/list on the runner's stream: %q", req)
	}
	if status, _, msgs := runner.post(`{"jsonrpc":"2.0","id":` + id + `,"result":{"action":"accept","content":{}}}`); status != http.StatusAccepted {
		t.Logf("the runner's answer: %d %s", status, msgs)
	}
	if final := trReadUntil(br, `"id":7`); strings.Contains(final, "deployed: accept") {
		t.Fatalf("a runner's {action: accept} answer to toolgate's roots/list was decided as a roots/list answer and reached "+
			"the upstream, which read an accepted elicitation and deployed: %s", final)
	}
}
