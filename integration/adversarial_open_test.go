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
