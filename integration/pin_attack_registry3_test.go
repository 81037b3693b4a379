package integration

// Third round of attacks on the registry pin lines (c256cfe:
// internal/toolpin/toolpin.go check, registryPinMoved, firstSight,
// changed; store.go Record.Registry, Record.Since; gateway.Service.Loaded).
// Helpers from pin_attack_registry_test.go (praSession, praDigest, praRan,
// praWaiting) and replicas on PostgreSQL as in pin_attack_registry2_test.go.
//
// Fixed: TestPinRegistry3AttackOldReplicaFirstSightHidesPinLine
// Fixed: TestPinRegistry3AttackUpgradeNoChangeThenPinLineRemovedPinsRugPull
// Fixed: TestPinRegistry3AttackOldReplicaRefusesAcceptedToFreshSession
// Fixed: TestPinRegistry3AttackOldReplicaOldPinLineRefusesNewPin
// Open:  TestPinRegistry3AttackUnknownReplacedHidesRugPullInOlderSession
//        (adversarial_open_test.go, build tag open_findings)
// Held: TestPinRegistry3AttackUnnamedPinLineAddedThenRemovedKeepsChange
// Held: TestPinRegistry3AttackApiAcceptanceThenOldPinLineReadded

import (
	"net/http"
	"testing"

	"github.com/toolgate/toolgate/internal/toolpin"
)

// pr3FirstRecord is weather's pin record as a throwaway gateway (its own
// data directory, nothing shared) records it from up at first sight: the
// digest and definition of what up shows now, without a record in the
// storage under test.
func pr3FirstRecord(t *testing.T, up *smallUpstream) toolpin.Record {
	t.Helper()
	g := startGatewayOnPort(t, freePort(t), gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t)})
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 1 {
		t.Fatalf("control: throwaway gateway's listing %v", names)
	}
	return fixWeatherPin(t, g)
}

// Attack (fixed): two replicas on one PostgreSQL during a rolling reload that
// adds weather's pin line (pin A, the definition the administrator
// vetted) before anyone used the tool. Replica a runs the new
// configuration (pin line A); replica b still the old one (no pin line):
// a rollout with surge, every new replica started before the old ones
// stop, so none loads the new configuration after b's first sight below.
// The hostile upstream serves the rug pull C; carol's session through b
// lists it first: b pins C at first sight. Bob lists through a: C is
// hidden (a's pin line wins). b is retired; later the administrator
// removes the pin line (to manage the tool through the API) and a is
// reloaded. Expected (README, registry_pinned: "a removed pin line
// leaves the tool pinned to the digest it named"): weather stays pinned
// to A, C hidden and refused. Happens: b's firstSight
// (internal/toolpin/toolpin.go:398-420) stores Digest C with Since = now,
// after a's configuration was loaded; a's check (:191) takes its pin line
// for one from an older configuration (svc.Loaded().Before(rec.Since))
// and never records it (Record.Registry stays ""), so changed (:425-449)
// records C as a change on a record whose Digest is C. Once the pin line
// is removed, pinned() (:246-257) falls back to Record.Digest C, the
// listing ends the "change" as a revert (reverted, :323-339), and the
// rug pull is listed and runs.
//
// Fixed: a pin of first sight is no acceptance (Record.acceptedAfter): a
// pin line overrides it whenever its configuration was loaded.
func TestPinRegistry3AttackOldReplicaFirstSightHidesPinLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	first := pr3FirstRecord(t, up)
	c := praDigest(t, first, praDescC)

	replica := praReplicas(t, up)
	a := replica("pin weather " + first.Digest)
	b := replica("")

	up.addTool(fixWeather(praDescC))
	carol := b.raw(t, carolKey, b.createSession(t, carolKey, "svc"), "svc")
	carol.initialize()
	t.Logf("carol's listing through b (old configuration, no pin line): %v", listedTools(t, carol))

	bob := a.raw(t, bobKey, a.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	if names := listedTools(t, bob); len(names) != 0 {
		t.Fatalf("control: bob's listing of C through a (pin line A) %v, want weather hidden", names)
	}
	if praRan(bob.call(1, "weather", `{"city":"Oslo"}`)) {
		t.Fatal("control: the rug pull C ran through a, whose pin line names A")
	}
	mid := fixWeatherPin(t, a.gateway)
	b.kill(t)
	a.kill(t)

	// The pin line removed; a reloaded.
	a2 := replica("")
	alice := a2.raw(t, aliceKey, a2.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	names := listedTools(t, alice)
	ans := alice.call(2, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, a2.gateway)
	if len(names) != 0 || praRan(ans) {
		t.Errorf("pin line A (%s) added, the rug pull C (%s) first seen through a replica on the older configuration, then the pin line removed: "+
			"listing %v, call ran %v (%.200s); record under the pin line: digest %s, registry %q, waiting %q; now: digest %s, waiting %q: "+
			"want weather pinned to A, C hidden and refused",
			first.Digest, c, names, praRan(ans), ans, mid.Digest, mid.Registry, praWaiting(mid), rec.Digest, praWaiting(rec))
	}
}

// Attack (fixed): as TestPinRegistry2AttackOldReplicaPinLineUndoesAcceptance (a
// rolling reload that removes weather's pin line A; B accepted through
// the API of replica b, new configuration; bob lists once through a,
// still on pin line A; a stopped), but alice's new session through b
// calls weather straight away, from the catalog toolgate listed at
// initialize, without a tools/list of her own. Expected: B, accepted and
// pinned, runs. Happens: a's check no longer moves anything (Since is
// after a's load, toolpin.go:191) but still compares with its own pin
// line and has changed (:425-449) record B as a change on the record
// whose Digest is B; on b, check (:236-237) refuses every call of the
// pinned definition while a change — here the pinned digest itself —
// waits ("pinned B, now B"), until someone's listing ends it as a revert
// (on a service with per-user credentials, each caller's own listing).
//
// Fixed: a replica whose pin line is older than the record's acceptance
// follows the record (effectivePin) rather than record the accepted
// definition as a change.
func TestPinRegistry3AttackOldReplicaRefusesAcceptedToFreshSession(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	replica := praReplicas(t, up)
	b := replica("")
	carol := b.raw(t, carolKey, b.createSession(t, carolKey, "svc"), "svc")
	carol.initialize()
	if names := listedTools(t, carol); len(names) != 1 {
		t.Fatalf("control: carol's first listing through b %v", names)
	}
	first := fixWeatherPin(t, b.gateway)
	a := replica("pin weather " + first.Digest)

	up.addTool(fixWeather(praDescB))
	if names := listedTools(t, carol); len(names) != 0 {
		t.Fatalf("control: carol's listing of B through b %v, want weather hidden", names)
	}
	bd := praDigest(t, first, praDescB)
	if r := b.api(t, http.MethodPost, "/v1/tool-pins/accept", carolKey, []byte(`{"service":"svc","tool":"weather","digest":"`+bd+`"}`)); r.StatusCode != http.StatusOK {
		t.Fatalf("control: accepting B through b: %d %s", r.StatusCode, r.Body)
	}

	bob := a.raw(t, bobKey, a.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	t.Logf("bob's listing through a (pin line A): %v", listedTools(t, bob))
	a.kill(t)

	alice := b.raw(t, aliceKey, b.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	ans := alice.call(1, "weather", `{"city":"Oslo"}`)
	rec := fixWeatherPin(t, b.gateway)
	if !praRan(ans) {
		t.Errorf("B (%s) accepted through b's API; the old replica a (pin line A) served one listing and stopped; alice's new session through b calls weather: "+
			"%.250s; record digest %s, change waiting %q: want B, pinned, to run",
			bd, ans, rec.Digest, praWaiting(rec))
	}
}

// Attack (fixed): two reloads in quick succession across replicas: weather pinned
// at first sight to A (replica b, no pin line); replica a gets pin line A,
// then replica c the next configuration, pin line B (the upstream ships
// B). Carol lists through c: B moves the pin (Since = c's load time).
// Bob lists once through a, still on pin line A, before a is retired.
// Expected: B, the newest pin line, runs through c for a new session.
// Happens: a's configuration is older than the record's Since, so its
// line does not move the pin back (check, toolpin.go:191) — but check
// (:216-222) still compares with a's line and changed (:425-449) records
// B, the pinned digest, as a change waiting; through c every call of B is
// refused (:236-237, "pinned B, now B") until a listing ends it.
//
// Fixed: as above, the older line gives way to the newer one's record.
func TestPinRegistry3AttackOldReplicaOldPinLineRefusesNewPin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	replica := praReplicas(t, up)
	b := replica("")
	if names := listedTools(t, praSession(t, b.gateway, carolKey)); len(names) != 1 {
		t.Fatalf("control: carol's first listing through b %v", names)
	}
	first := fixWeatherPin(t, b.gateway)
	bd := praDigest(t, first, praDescB)
	a := replica("pin weather " + first.Digest)
	up.addTool(fixWeather(praDescB))
	c := replica("pin weather " + bd)
	b.kill(t)
	if names := listedTools(t, praSession(t, c.gateway, carolKey)); len(names) != 1 {
		t.Fatalf("control: carol's listing through c (pin line B) %v", names)
	}

	bob := a.raw(t, bobKey, a.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	t.Logf("bob's listing through a (pin line A): %v", listedTools(t, bob))
	a.kill(t)

	alice := c.raw(t, aliceKey, c.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	ans := alice.call(1, "weather", `{"city":"Oslo"}`)
	rec := fixWeatherPin(t, c.gateway)
	if !praRan(ans) {
		t.Errorf("pin line B (%s) through c, pin line A on the retired older replica a, which served one listing; alice's new session through c calls weather: "+
			"%.250s; record digest %s, registry %s, change waiting %q: want B to run",
			bd, ans, rec.Digest, rec.Registry, praWaiting(rec))
	}
}

// Attack (held): weather pinned at first sight to A; the upstream
// rug-pulls it to C, recorded as a change waiting. The administrator adds
// a pin line naming B (vetted, not what the upstream shows), then removes
// it. Expected: weather pinned to B, C still waiting, hidden and refused,
// A (replaced) refused to a session listed before the pin line.
func TestPinRegistry3AttackUnnamedPinLineAddedThenRemovedKeepsChange(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t)}
	g := startGatewayOnPort(t, port, cfg)
	old := praSession(t, g, aliceKey)
	if names := listedTools(t, old); len(names) != 1 {
		t.Fatalf("control: first listing %v", names)
	}
	first := fixWeatherPin(t, g)
	bd, c := praDigest(t, first, praDescB), praDigest(t, first, praDescC)
	up.addTool(fixWeather(praDescC))
	if names := listedTools(t, praSession(t, g, bobKey)); len(names) != 0 {
		t.Fatalf("control: listing of the rug pull %v", names)
	}

	cfg.ServiceExtra = "pin weather " + bd
	g2 := startGatewayOnPort(t, port, cfg)
	if names := listedTools(t, praSession(t, g2, bobKey)); len(names) != 0 {
		t.Fatalf("control: listing of C under pin line B %v", names)
	}
	cfg.ServiceExtra = ""
	g3 := startGatewayOnPort(t, port, cfg)
	oldAns := praReopen(t, g3, old, aliceKey).call(1, "weather", `{"city":"Oslo"}`)
	m := praSession(t, g3, bobKey)
	names := listedTools(t, m)
	ans := m.call(2, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, g3)
	if praRan(oldAns) || praRan(ans) || len(names) != 0 || rec.Digest != bd || praWaiting(rec) != c {
		t.Errorf("pin line B added while C waited, then removed: A from an old session ran %v (%.150s); C listed %v, ran %v (%.150s); "+
			"record digest %s (B %s), waiting %q (C %s)", praRan(oldAns), oldAns, names, praRan(ans), ans, rec.Digest, bd, praWaiting(rec), c)
	}
}

// Attack (fixed): weather is pinned in the registry (pin line A) by a record an
// earlier toolgate wrote (no Digest, no Registry: "Records of earlier
// versions have "" for a registry-pinned tool", store.go Record.Digest),
// with no change waiting (a pin line of that version had ended it). The
// administrator upgrades toolgate and, in the same reload, removes the pin
// line; the hostile upstream has switched weather to the rug pull C,
// never listed. Expected (README: "a tool pinned there never pins at
// first sight"; "A tool whose pin line is removed stays pinned to the
// digest the line named"): C hidden and refused, recorded as a change for
// an administrator, as a waiting change of such a record is kept
// (TestPinRegistry2AttackUpgradeThenPinLineRemovedPinsRugPull). Happens:
// pinned() (internal/toolpin/toolpin.go:246-257) returns Record.Digest ""
// so check takes the first-sight branch, and firstSight (:398-420) keeps
// only a record with a digest or a waiting change (:401): it overwrites
// the record and pins C, listed and run, audited only as "pinned".
//
// Fixed: first sight never replaces a record; what the upstream shows is a
// change.
func TestPinRegistry3AttackUpgradeNoChangeThenPinLineRemovedPinsRugPull(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	cfg, port, _, _, first := praRegistryPinned(t, up, aliceKey)
	c := praDigest(t, first, praDescC)
	if n := praDowngrade(t, cfg.DataDir, "digest", "registry"); n != 1 {
		t.Fatalf("control: %d pin records rewritten, want 1", n)
	}
	up.addTool(fixWeather(praDescC))
	cfg.ServiceExtra = ""
	g2 := startGatewayOnPort(t, port, cfg)
	bob := praSession(t, g2, bobKey)
	names := listedTools(t, bob)
	ans := bob.call(1, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, g2)
	if len(names) != 0 || praRan(ans) {
		t.Errorf("record of an earlier version (registry pin A %s, no digest kept, nothing waiting); upgraded and the pin line removed in one reload, "+
			"the upstream on the rug pull C (%s): listing %v, call ran %v (%.200s); record now digest %s, accepted by %q, waiting %q: want C hidden, refused and waiting",
			first.Digest, c, names, praRan(ans), ans, rec.Digest, rec.AcceptedBy, praWaiting(rec))
	}
}

// Attack (held): weather pinned in the registry (pin line A); the
// administrator removes the line, the upstream ships B and the
// administrator accepts it through the API (the record keeps no pin line
// now); alice's session lists B. Then the administrator re-adds the old
// pin line A (a rollback). Expected: the line, newer than the
// acceptance, pins A again: B (replaced) is refused to alice's older
// session with "list again", hidden from a new listing and recorded as a
// change; the record names A as its digest and its pin line.
func TestPinRegistry3AttackApiAcceptanceThenOldPinLineReadded(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	cfg, port, _, _, first := praRegistryPinned(t, up, aliceKey)
	bd := praDigest(t, first, praDescB)
	cfg.ServiceExtra = ""
	g2 := startGatewayOnPort(t, port, cfg)
	up.addTool(fixWeather(praDescB))
	if names := listedTools(t, praSession(t, g2, carolKey)); len(names) != 0 {
		t.Fatalf("control: listing of B without the pin line %v", names)
	}
	if r := g2.api(t, http.MethodPost, "/v1/tool-pins/accept", carolKey, []byte(`{"service":"svc","tool":"weather","digest":"`+bd+`"}`)); r.StatusCode != http.StatusOK {
		t.Fatalf("control: accepting B: %d %s", r.StatusCode, r.Body)
	}
	alice := praSession(t, g2, aliceKey)
	if names := listedTools(t, alice); len(names) != 1 {
		t.Fatalf("control: alice's listing of the accepted B %v", names)
	}

	cfg.ServiceExtra = "pin weather " + first.Digest
	g3 := startGatewayOnPort(t, port, cfg)
	aliceAns := praReopen(t, g3, alice, aliceKey).call(1, "weather", `{"city":"Oslo"}`)
	bob := praSession(t, g3, bobKey)
	names := listedTools(t, bob)
	bobAns := bob.call(2, "weather", `{"city":"Oslo"}`)
	rec := fixWeatherPin(t, g3)
	if praRan(aliceAns) || praRan(bobAns) || len(names) != 0 || rec.Digest != first.Digest || rec.Registry != first.Digest || praWaiting(rec) != bd {
		t.Errorf("B accepted through the API after pin line A was removed, then pin line A re-added: alice's older session ran B %v (%.150s); "+
			"bob's listing %v, call ran %v (%.150s); record digest %s, registry %s (A %s), waiting %q (B %s), replaced %v",
			praRan(aliceAns), aliceAns, names, praRan(bobAns), bobAns, rec.Digest, rec.Registry, first.Digest, praWaiting(rec), bd, rec.Replaced)
	}
}

// Attack (fixed): weather is pinned in the registry (pin line A) by a record an
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
// Fixed: the digest a record of an earlier version pinned is that of the
// definition it kept (Record.Definition); "unknown" is left only for a
// record that kept none.
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
