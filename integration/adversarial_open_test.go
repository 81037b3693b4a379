//go:build open_findings

package integration

// Findings reproduced and not fixed yet: each test fails today. They are
// kept out of `make test` (build tag open_findings) and listed in the
// README's adversarial suite; run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// Attack: weather is pinned in the registry (pin line A) by a record an
// earlier toolgate wrote (no Digest, no Registry). Bob's session starts
// on that version; the upstream has just rug-pulled weather to C, which
// toolgate's own listing at initialize put in bob's catalog without a
// check. The administrator upgrades toolgate (same configuration). Bob's
// call is the first check since: registryPinMoved puts "unknown" in
// Replaced (no line was kept) with Since = the new configuration's load
// time, after bob's session started. Expected: C, which nobody accepted
// or replaced, refused and recorded as a change, audited (README: a
// definition that differs "is recorded … and audited"); "list again"
// with nothing recorded is for a definition an acceptance replaced.
// Happens: check (internal/toolpin/toolpin.go:205-215) finds C
// "replaced" (store.go replaced: "unknown" matches any digest), tells bob
// that an administrator's acceptance replaced C, and records nothing;
// "unknown" stays in Replaced for the next 64 moves, so every session
// older than the latest move has its rug-pull calls unrecorded. (The
// call is refused; the runner, told to list the tools again, lists, and
// its listing records C. Only records of a version before Record.Registry
// have "unknown", and only sessions started before the upgrade see it.)
func TestPinRegistry3AttackUnknownReplacedHidesRugPullInOlderSession(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	cfg, port, g, _, first := praRegistryPinned(t, up, aliceKey)
	c := praDigest(t, first, praDescC)
	up.addTool(fixWeather(praDescC))
	bob := praSession(t, g, bobKey)
	if n := praDowngrade(t, cfg.DataDir, "digest", "registry"); n != 1 {
		t.Fatalf("control: %d pin records rewritten, want 1", n)
	}
	g2 := startGatewayOnPort(t, port, cfg)
	bob = praReopen(t, g2, bob, bobKey)
	ans := bob.call(1, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, g2)
	if praRan(ans) {
		t.Fatalf("the rug pull C ran: %.300s", ans)
	}
	if praWaiting(rec) != c {
		t.Errorf("the rug pull C (%s), never seen, called from the catalog of a session started before the upgrade: told %.250s; "+
			"change waiting %q, replaced %v: want C recorded as a change", c, ans, praWaiting(rec), rec.Replaced)
	}
}

// Attack: a rule on answers to elicitation/create holds for every pairing
// of revisions but one. The policy denies every answer to
// elicitation/create (input.method "elicitation/create"). It holds for a
// runner that initializes (answers are decided on their way,
// registry.go:203-223), for a runner of 2025-11-25 in front of an upstream
// of 2026-07-28 (README, "Runners that initialize, in front of an upstream
// of 2026-07-28 only": "its answer passes the request policy as the answer
// to that request (method elicitation/create, …)"), and for a stateless
// runner in front of an upstream that initializes (README: "the request
// policy judges each round, and each answer as the answer to its request";
// TestTranslateAttackStatelessAnswerSkipsAnswerRule). A stateless runner in
// front of an upstream of 2026-07-28 answers the upstream's input request
// in its retry's inputResponses, and decideInputResponses
// (modules/policy/inputs.go:34) decides answers only when the requestState
// is toolgate's own (call.Stateless.Inputs, set in
// registry/stateless.go:51): the upstream's requestState is opaque, the
// answers go upstream undecided, and the upstream runs "confirm" with the
// "accept" the policy denies. Fix: when an upstream's input_required
// reaches a stateless runner, keep the methods of its input requests by key
// (seal them with the upstream's requestState in a toolgate requestState,
// restoring the upstream's byte for byte on the retry), and decide each
// input response of the retry as the answer to its request, as for a held
// exchange.
func TestRev2026AttackModernUpstreamAnswersSkipAnswerRule(t *testing.T) {
	up := startStatelessUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "answers to elicitation/create are denied"} if {
	input.method == "elicitation/create"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"elicitation":{"form":{}}}`
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "confirm", `{}`, caps, ""), nil)
	res := aaResult(msg)
	state, _ := res["requestState"].(string)
	if status != http.StatusOK || res["resultType"] != "input_required" || state == "" {
		t.Fatalf("confirm: %d %s, want input_required", status, aaJSON(msg))
	}
	answer := retryWith(state, map[string]any{"confirm": map[string]any{"action": "accept", "content": map[string]any{"ok": true}}})
	status, msg = statelessPost(t, g, aliceKey, session, saCall(2, "confirm", `{}`, caps, answer), nil)
	if got := aaJSON(msg); strings.Contains(got, "confirmed: accept") || len(up.seen(`"accept"`)) > 0 {
		t.Fatalf("a stateless runner's answer to the upstream's elicitation/create reached an upstream of 2026-07-28 past the rule "+
			"that denies every such answer (the upstream got %d; the runner got %d %s)", len(up.seen(`"accept"`)), status, got)
	}
}

// Attack: a request rule written for initialize does not hold for a
// stateless runner. The site keeps clients that offer their model to
// upstreams (the sampling capability) away: the request policy denies an
// initialize whose params declare sampling, and a runner that initializes
// so is refused before anything reaches the upstream. A runner of
// 2026-07-28 declares the same capability in every request's
// _meta (io.modelcontextprotocol/clientCapabilities); toolgate then
// initializes the upstream session of the earlier revision itself, "with the
// capabilities and clientInfo the runner declared" (README, "Protocol
// 2026-07-28"; modules/mcpproxy/stateless.go openImplied), an initialize no
// policy decides, and the call goes on: the upstream is told the client
// samples and the runner's tools/call is served. toolgate decides a
// discovery again as the initialize result it stands for
// (policy/channels.go:235, discoverAsInitialize: "So a rule about what an
// upstream says of itself, written for initialize, holds for both",
// policies/README.md), but not the request side. Fix: decide the opening
// of an implied MCP session for a stateless runner as the initialize it
// stands for (method "initialize", params {protocolVersion, capabilities,
// clientInfo} as declared), once per implied session, and refuse the
// runner's request when that decision is not allow.
func TestRev2026AttackInitializeRuleSkippedByStatelessRunner(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "clients that offer sampling may not connect"} if {
	input.method == "initialize"
	input.params.capabilities.sampling
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	// Control: a runner that initializes declaring sampling is refused.
	m := g.raw(t, aliceKey, session, "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"r","version":"1"}}}`)
	if len(msgs) != 1 || !gjson.GetBytes(msgs[0], "error").Exists() {
		t.Fatalf("control: an initialize declaring sampling was not refused: %s", msgs)
	}
	before := len(paUpstreamBodies(up, `"sampling"`))
	status, msg := statelessPost(t, g, aliceKey, session, saCall(1, "echo", `{"text":"hi"}`, `{"sampling":{}}`, ""), nil)
	inits := paUpstreamBodies(up, `"sampling"`)
	if status == 200 && aaResult(msg) != nil || len(inits) > before {
		t.Fatalf("a stateless runner declaring sampling was served past the rule denying initialize to such clients "+
			"(runner got %d %s; the upstream was initialized declaring sampling: %v)", status, aaJSON(msg), len(inits) > before)
	}
}
