package integration

// A review of the fixes of 3463cd7 to the stateless revision's paths
// (2026-07-28): answers decided as each method their members may be read
// as (mcp2026.AnswerMethods), the opening decided under every request
// policy of the route, implied sessions keyed by the declared clientInfo,
// a refused opening retired, at most 64 answers per retry, no requestState
// in complete results. "Attack (fixed):" tests reproduced a defect (each
// failed before its fix); "Attack (held):" ones show an attack the gateway
// resists.

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

// fx4Answers is an inputResponses member of n unattributed answers.
func fx4Answers(n int) string {
	var b strings.Builder
	b.WriteString(`,"inputResponses":{`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + aaItoa(i) + `":{"action":"accept","content":{"n":` + aaItoa(i) + `}}`)
	}
	b.WriteString(`}`)
	return b.String()
}

// fx4AnswerDecisions counts the audit entries of answers decided.
func fx4AnswerDecisions(entries []map[string]any) int {
	n := 0
	for _, e := range auditOf(entries, "policy decision") {
		switch e["method"] {
		case "elicitation/create", "sampling/createMessage", "roots/list":
			n++
		}
	}
	return n
}

// Attack (fixed): the bound of 64 answers per retry (mcp2026.Check,
// MaxInputResponses) is checked only for requests. Check returns early for
// a message that is not a request (internal/mcp2026/mcp2026.go: a
// notification gets Stateless{Capabilities} before the inputResponses
// checks), yet the request policy's allow (modules/policy/request.go
// allow → decideInputResponses) decides every inputResponses member of
// any stateless message, notifications included, each unattributed one
// as elicitation/create, sampling/createMessage and roots/list with its own
// evaluation and audit entry. A stateless notification carrying 1,000
// answers makes 3,000 decisions and audit lines (the amplification fix3
// closed for requests). Expected: the notification refused (or its
// answers bounded, or not decided at all: a notification answers nothing).
// Fix: apply the inputResponses checks (object, at most 64) to every
// stateless message in Check, or refuse inputResponses/requestState in a
// notification.
// Fixed: a stateless notification carrying inputResponses or a requestState
// is refused (mcp2026.Check).
func TestRev2026Fix4AttackNotificationAnswersUnbounded(t *testing.T) {
	logCfg, audit := auditLog(t)
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm", Log: logCfg})
	session := g.createSession(t, aliceKey, "svc")
	// Control: a request with as many answers is refused before the policy.
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, `{}`, fx4Answers(1000)), nil)
	if status != http.StatusBadRequest || fx4AnswerDecisions(audit()) != 0 {
		t.Fatalf("control: a request with 1000 answers: %d %s, %d answer decisions", status, aaJSON(msg), fx4AnswerDecisions(audit()))
	}
	const n = 1000
	body := `{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":{` + aaStatelessMeta(`{}`) + fx4Answers(n) + `}}`
	status, msg = saSend(t, g, "/v1/mcp/svc", aliceKey, session, "notifications/roots/list_changed", "", body, nil)
	if answers := fx4AnswerDecisions(audit()); answers > 3*64 {
		t.Fatalf("one stateless notification with %d input responses (answered %d %.200s) made %d answer decisions and audit "+
			"entries; the bound of 64 answers holds for requests only", n, status, aaJSON(msg), answers)
	}
}

// Attack (fixed): answers the request policy withholds reach an upstream of
// 2026-07-28 in a stateless runner's notification. decideInputResponses
// decides (and withholds, gateway.Stateless.Withheld) the inputResponses
// of a stateless notification as it does a request's, but
// statelessNotification (modules/mcpproxy/stateless.go) relays
// call.Message.Raw to an upstream of the revision as the runner sent it:
// the withheld answers, and any requestState, go upstream undecided by
// nothing (statelessBody, which leaves them out of a request, is not
// applied). Here the policy denies accepting an elicitation; the runner's
// notification carries {"confirm": {"action":"accept", …}} and the
// upstream gets it. Expected: no withheld answer reaches the upstream
// (README: "no answer reaches the upstream undecided"; a notification
// answers no input request at all). The same raw relay carries a
// notification's requestState (toolgate's own sealed one included), and a
// runner of an earlier revision's notification to an upstream that speaks
// both revisions keeps its inputResponses too (mcpproxy forward relays
// call.Message.Raw; WithoutRetry is applied to requests only). Not
// reproduced: a side effect. A tools/call sent as a notification with the
// withheld accept is decided by the policy as a tools/call and relayed,
// but the go-sdk answers it 400 and runs nothing; a server that handles
// such a notification would act on the withheld answer. Fix: refuse a
// stateless notification carrying inputResponses or requestState
// (mcp2026.Check; a notification answers nothing), or relay it through
// statelessBody like a request.
// Fixed: a stateless notification carrying inputResponses or a requestState
// is refused (mcp2026.Check).
func TestRev2026Fix4AttackNotificationCarriesWithheldAnswers(t *testing.T) {
	logCfg, audit := auditLog(t)
	up := startStatelessUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "accepting an elicitation is denied"} if {
	input.method == "elicitation/create"
	input.result.action == "accept"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm", RequestPolicy: policies, Log: logCfg})
	session := g.createSession(t, aliceKey, "svc")
	// Control: the same answer in a request is withheld.
	const mark = "fx4-withheld-mark"
	answer := `,"inputResponses":{"confirm":{"action":"accept","content":{"ok":"` + mark + `"}}}`
	statelessPost(t, g, aliceKey, session, saCall(1, "confirm", `{}`, `{"elicitation":{"form":{}}}`, answer), nil)
	if got := up.seen(mark); len(got) > 0 {
		t.Fatalf("control: a withheld answer in a request reached the upstream: %s", got[0].Body)
	}
	body := `{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":{` + aaStatelessMeta(`{"elicitation":{"form":{}}}`) + answer + `}}`
	status, msg := saSend(t, g, "/v1/mcp/svc", aliceKey, session, "notifications/roots/list_changed", "", body, nil)
	denied := 0
	for _, e := range auditOf(audit(), "policy decision") {
		if e["method"] == "elicitation/create" && e["action"] == "deny" {
			denied++
		}
	}
	if got := up.seen(mark); len(got) > 0 {
		t.Fatalf("an answer the policy withheld (%d deny entries for it) reached the upstream in a stateless notification "+
			"(runner got %d %s): %s", denied, status, aaJSON(msg), got[0].Body)
	}
}

// Attack (held): the conformance behaviour fix3 must keep. A retry whose
// inputResponses come without any requestState (as a client answering
// before being asked, or a server that keeps no state expects) still goes
// upstream when the policy allows every reading of the answer.
func TestRev2026Fix4HeldAnswersWithoutStateStillServed(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm"})
	session := g.createSession(t, aliceKey, "svc")
	answer := `,"inputResponses":{"confirm":{"action":"accept","content":{"ok":true}}}`
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "confirm", `{}`, `{"elicitation":{"form":{}}}`, answer), nil)
	if got := aaJSON(msg); status != http.StatusOK || aaResult(msg) == nil || gjson.Get(got, "result.isError").Bool() ||
		len(up.seen(`"inputResponses":{"confirm":{"action":"accept"`)) == 0 {
		t.Fatalf("an allowed answer without requestState: %d %s, want it upstream and the call served", status, got)
	}
}

// Attack (held): the answer's shape member spelled with an escape
// ("\u0061ction"), or with U+017F folding onto the s of "roots", under a
// key the upstream asked as another method. mcpmsg.Members decodes keys
// and AnswerMethods compares them with strings.EqualFold (the folding
// encoding/json's probe in the go-sdk applies), so the answer is decided
// as an elicitation's too and withheld.
func TestRev2026Fix4HeldEscapedShapeMember(t *testing.T) {
	up := startStatelessUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "accepting an elicitation is denied"} if {
	input.method == "elicitation/create"
	input.result.action == "accept"
}
decision := {"action": "deny", "reason": "answers to roots/list are denied"} if {
	input.method == "roots/list"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"elicitation":{"form":{}},"roots":{}}`
	_, msg := statelessPost(t, g, aliceKey, session, saCall(1, "confirm", `{}`, caps, ""), nil)
	state, _ := aaResult(msg)["requestState"].(string)
	if state == "" {
		t.Fatalf("confirm: %s, want input_required", aaJSON(msg))
	}
	s := aaJSON(state)
	for i, answer := range []string{
		`{"\u0061ction":"accept","content":{"ok":"fx4-m0"}}`,
		`{"action":"decline","content":{"ok":"fx4-m1"},"root\u017f":[]}`,
		`{"action":"decline","content":{"ok":"fx4-m2"},"rootſ":[]}`,
	} {
		extra := `,"inputResponses":{"confirm":` + answer + `},"requestState":` + s
		status, msg := statelessPost(t, g, aliceKey, session, saCall(2+i, "confirm", `{}`, caps, extra), nil)
		if got := aaJSON(msg); strings.Contains(got, "confirmed:") || len(up.seen("fx4-m"+aaItoa(i))) > 0 {
			t.Fatalf("answer %s reached the upstream past the rules: %d %s", answer, status, got)
		}
	}
}

// Attack (fixed): a rule on initialize refusing clients that declare sampling is
// dodged by declaring the capability in another case. The opening of a
// stateless runner's implied session is decided on the initialize params
// as they will be sent (modules/policy/opening.go decideOpening), with the
// declared capabilities copied byte for byte (mcpproxy initializeFor), and
// the parser refuses a case variant only beside its original (a
// duplicate) or among the members it knows (params, results, input
// responses): "SAMPLING" (or "ſampling", U+017F) inside
// clientCapabilities passes. The policy reads input.params.capabilities.
// sampling as absent and allows the opening; an upstream that decodes
// capabilities with encoding/json (mark3labs/mcp-go, most Go servers)
// reads a client that offers sampling — the client the rule refuses to
// let connect. The same holds for a runner of 2025-11-25's own initialize.
// Expected: refused (-32013, or as a case variant of an MCP member) and
// nothing initialized upstream with it. Fix: refuse case variants of the
// capability names (sampling, elicitation, roots, tasks, experimental,
// form, url, tools, listChanged) in declared capabilities, as
// paramsMembers does for params.
// Fixed: capabilities declared under a known name in another case are
// refused (mcp2026.CapabilityVariant), in a stateless request and in an
// initialize.
func TestRev2026Fix4AttackCapabilityCaseVariantDodgesOpeningRule(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "clients that offer sampling may not connect"} if {
	input.method == "initialize"
	input.params.capabilities.sampling
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	// Control: sampling, as spelled, is refused.
	status, msg := statelessPost(t, g, aliceKey, session, fx3Call(1, `{"sampling":{}}`, "r"), nil)
	if got := aaJSON(msg); gjson.Get(got, "error.code").Int() != -32013 {
		t.Fatalf("control: %d %s, want the policy's denial (-32013)", status, got)
	}
	for i, caps := range []string{`{"SAMPLING":{}}`, `{"ſampling":{}}`} {
		status, msg := statelessPost(t, g, aliceKey, session, fx3Call(2+i, caps, "r"), nil)
		key := strings.Trim(strings.SplitN(caps, ":", 2)[0], `{"`)
		if sent := paUpstreamBodies(up, `"`+key+`"`); aaResult(msg) != nil || len(sent) > 0 {
			// What an upstream decoding with encoding/json reads.
			var init struct {
				Params struct {
					Capabilities struct {
						Sampling *json.RawMessage `json:"sampling"`
					} `json:"capabilities"`
				} `json:"params"`
			}
			if len(sent) > 0 {
				_ = json.Unmarshal([]byte(sent[0]), &init)
			}
			t.Errorf("a stateless runner declaring %s was served past the rule on initialize: %d %.200s; upstream "+
				"initialized with it: %d, which encoding/json reads as offering sampling: %v", caps, status, aaJSON(msg), len(sent),
				init.Params.Capabilities.Sampling != nil)
		}
	}
}

// Attack (held): a runner of 2025-11-25 answering, in front of an upstream
// of 2026-07-28, toolgate's roots/list with a JSON-RPC error whose data
// has an elicitation's shape. decideAnswerShape decides only results; the
// error is not one: askTranslated (modules/mcpproxy/translate.go) takes
// only a result to the upstream and ends the call ("the client refused
// the upstream's input request"), so nothing of the error's data reaches
// the upstream as an answer.
func TestRev2026Fix4HeldLegacyErrorAnswerNotRelayed(t *testing.T) {
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
	runner.post(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32000,"message":"no","data":{"action":"accept","content":{"m":"fx4-err"}}}}`)
	if final := trReadUntil(br, `"id":7`); strings.Contains(final, "deployed") || len(up.seen("fx4-err")) > 0 {
		t.Fatalf("a runner's error answer reached the upstream as an answer: %s", final)
	}
}

// Attack (fixed): a rule on initialize that reads the runner's address (or the
// time) holds for a stateless runner only when its request happens to
// open the implied MCP session. fix3 keyed the implied session by the
// declared clientInfo (internal/mcp2026/runtime.go Session), but the
// opening is decided with the request's other members too
// (modules/policy/opening.go decideOpening: commonItems — caller,
// session, service, request.remote_ip, time), and decided once. The
// site's policy lets clients connect only from 10.0.0.0/8; a runner of
// 2025-11-25 from 203.0.113.9 is refused at its initialize, and so is a
// stateless runner from there opening its own session (control). But once
// a request from 10.0.0.5 opened the implied session, the same caller's
// stateless requests from 203.0.113.9, with the same capabilities and
// clientInfo, share it: no initialize is decided for them and their
// tools/call is served (a runner of an earlier revision would need the
// other client's Mcp-Session-Id; here nothing but the caller's token).
// Expected: refused as that address's initialize is. Fix: put
// request.remote_ip in the implied session's key, or decide "initialize"
// again (without sending it) whenever a request's own members differ from
// those its session was opened with.
// Fixed: implied sessions are keyed by the client's address too
// (mcp2026.Runtime.Session).
func TestRev2026Fix4AttackOpeningRuleOnAddressSkippedOnceOpened(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "clients connect from the office network only"} if {
	input.method == "initialize"
	not net.cidr_contains("10.0.0.0/8", input.request.remote_ip)
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies,
		Global: "servers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}"})
	office := map[string]string{"X-Forwarded-For": "10.0.0.5"}
	outside := map[string]string{"X-Forwarded-For": "203.0.113.9"}
	// Control: from outside, opening a session is refused.
	control := g.createSession(t, aliceKey, "svc")
	status, msg := statelessPost(t, g, aliceKey, control, fx3Call(1, `{}`, "r"), outside)
	if got := aaJSON(msg); gjson.Get(got, "error.code").Int() != -32013 {
		t.Fatalf("control: a stateless runner from outside opening its session: %d %s, want the policy's denial (-32013)", status, got)
	}
	session := g.createSession(t, aliceKey, "svc")
	if status, msg := statelessPost(t, g, aliceKey, session, fx3Call(2, `{}`, "r"), office); status != http.StatusOK || aaResult(msg) == nil {
		t.Fatalf("from the office: %d %s, want served", status, aaJSON(msg))
	}
	status, msg = statelessPost(t, g, aliceKey, session, fx3Call(3, `{}`, "r"), outside)
	if aaResult(msg) != nil {
		t.Fatalf("a stateless runner from 203.0.113.9, whose initialize the policy refuses, was served through the implied "+
			"session a request from the office opened: %d %s", status, aaJSON(msg))
	}
}

// Attack (held): the bound of 64 answers per retry counted on keys spelled
// with escapes or repeated. Check counts the members of inputResponses as
// they are (mcpmsg.Members): 65 keys, some escaped, are refused before the
// policy (400), a key given twice (once escaped) is refused by the parser,
// and 64 answers pass.
func TestRev2026Fix4HeldAnswerBoundCountsSpellings(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo"})
	session := g.createSession(t, aliceKey, "svc")
	answers := func(n int, dup bool) string {
		var b strings.Builder
		b.WriteString(`,"inputResponses":{`)
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"k\u0030` + aaItoa(i) + `":{"action":"decline"}`)
		}
		if dup {
			b.WriteString(`,"k00":{"action":"accept"}`)
		}
		b.WriteString(`}`)
		return b.String()
	}
	if status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{}`, `{}`, answers(65, false)), nil); status != http.StatusBadRequest {
		t.Errorf("65 escaped answers: %d %s, want 400", status, aaJSON(msg))
	}
	if status, msg := statelessPost(t, g, aliceKey, session, saCall(2, "echo", `{}`, `{}`, answers(63, true)), nil); status != http.StatusBadRequest {
		t.Errorf("a key given twice, once escaped: %d %s, want 400", status, aaJSON(msg))
	}
	if status, msg := statelessPost(t, g, aliceKey, session, saCall(3, "echo", `{}`, `{}`, answers(64, false)), nil); status != http.StatusOK || aaResult(msg) == nil {
		t.Errorf("64 answers: %d %s, want served", status, aaJSON(msg))
	}
}

// Attack (held): an upstream's requestState in a complete result spelled
// with an escape ("request\u0053tate"), in another case, or given twice.
// mcp2026.Complete finds the member by its decoded key and removes it; the
// parser refuses the case variant and the duplicate as the upstream's
// answer. The runner never reads the upstream's state.
func TestRev2026Fix4HeldCompleteResultStateSpellings(t *testing.T) {
	const secret = "fx4-upstream-state"
	for name, rs := range map[string]string{
		"escaped": `"request\u0053tate":"` + secret + `"`,
		"case":    `"RequestState":"` + secret + `"`,
		"twice":   `"requestState":"` + secret + `","request\u0053tate":"` + secret + `"`,
	} {
		t.Run(name, func(t *testing.T) {
			up := saStartModern(t, `["2026-07-28"]`, `[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]`,
				func(gjson.Result) (int, string) {
					return http.StatusOK, `"result":{"resultType":"complete","content":[{"type":"text","text":"done"}],` + rs + `}`
				})
			g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo"})
			session := g.createSession(t, aliceKey, "svc")
			status, msg := statelessPost(t, g, aliceKey, session, fx3Call(1, `{}`, "r"), nil)
			if got := aaJSON(msg); strings.Contains(got, secret) {
				t.Fatalf("the upstream's requestState reached the runner: %d %s", status, got)
			} else if name == "escaped" && !strings.Contains(got, "done") {
				t.Fatalf("the escaped spelling: %d %s, want the result served without the state", status, got)
			}
		})
	}
}

// Attack (fixed): a refused opening retires the implied session that a concurrent
// allowed request of the same key holds. Both requests get the one
// implied session (mcp2026.Runtime.Session: same caller, toolgate
// session, service, capabilities and clientInfo); openings of a session
// are serialized (mcpsession.Session.Reinitialize). The refused one's
// openImplied (modules/mcpproxy/stateless.go) retires the session, and
// the allowed one, waiting behind it, finds it closed (or, when it got
// there first, has it ended under it): it fails with 404 -32001 "the MCP
// session was ended: initialize a new one", which a stateless runner
// cannot do. The opening decision reads request.remote_ip (see
// TestRev2026Fix4AttackOpeningRuleOnAddressSkippedOnceOpened), so the two
// decide differently. Here 30 pairs of requests, one from the office
// (allowed) and one from outside (refused), each pair in a fresh toolgate
// session: most allowed requests fail. Expected: every allowed request
// served (the one that is refused gets -32013, the other its answer).
// Fix: on a closed implied session, take a new one (Runtime.Session again)
// instead of answering 404, or retire only a session no opening succeeded
// on and that no other request is waiting to open.
// Fixed: a refused opening retires the implied session only when it was
// never opened and nothing uses it (mcpsession.Sessions.RetireUnopened),
// and a stateless request bound to a session ended meanwhile takes the one
// implied now.
func TestRev2026Fix4AttackRefusedOpeningRetiresAllowedOne(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "clients connect from the office network only"} if {
	input.method == "initialize"
	not net.cidr_contains("10.0.0.0/8", input.request.remote_ip)
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies,
		Global: "servers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}"})
	office := map[string]string{"X-Forwarded-For": "10.0.0.5"}
	outside := map[string]string{"X-Forwarded-For": "203.0.113.9"}
	failed, last := 0, ""
	for i := 0; i < 30; i++ {
		session := g.createSession(t, aliceKey, "svc")
		done := make(chan struct{})
		go func() {
			defer close(done)
			statelessPost(t, g, aliceKey, session, fx3Call(1, `{}`, "r"), outside)
		}()
		status, msg := statelessPost(t, g, aliceKey, session, fx3Call(2, `{}`, "r"), office)
		<-done
		if status != http.StatusOK || aaResult(msg) == nil {
			failed++
			last = aaItoa(status) + " " + aaJSON(msg)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 30 allowed requests failed as a concurrent refused opening of the same implied session retired it "+
			"(last: %.300s)", failed, last)
	}
}
