//go:build open_findings

package integration

// Findings reproduced and not fixed yet: each test fails today. They are
// kept out of `make test` (build tag open_findings) and listed in the
// README's adversarial suite; run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.

import (
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
