package integration

// Second round of attacks on the registry pin lines (159cbe1:
// internal/toolpin/toolpin.go check, registryPinMoved; store.go
// Record.Digest, Record.Replaced, unknownReplaced). Helpers from
// pin_attack_registry_test.go (praSession, praReopen, praDigest,
// praRegistryPinned, praRan, praWaiting).
//
// Fixed: TestPinRegistry2AttackUpgradeThenPinLineRemovedPinsRugPull
// Fixed: TestPinRegistry2AttackShownToSurvivesPinLineMove
// Fixed: TestPinRegistry2AttackOldReplicaPinLineUndoesAcceptance
// Fixed: TestPinRegistry2AttackUnknownReplacedHidesRugPullFromRecording
// Fixed: TestPinRegistry2AttackSinceIsFirstCheckNotReload
// Fixed: TestPinRegistry2AttackPinLineWithoutRecordRemovedPinsRugPull
// Held:  TestPinRegistry2AttackPinLineFlappingKeepsRugPullWaiting

import (
	"net/http"
	"strings"
	"testing"
)

// Attack (fixed): weather is pinned in the registry (pin line A). The hostile
// upstream rug-pulls it to C: a listing hides it and records C, waiting
// for an administrator. The record is as the previous toolgate wrote it
// for a registry-pinned tool (no Digest: changed() cleared it, which
// 159cbe1 still reads: "Records of earlier versions have "" for a
// registry-pinned tool"). The administrator upgrades toolgate and, in the
// same reload, removes the pin line (to manage weather through the API
// from now on). Expected (README, tool pins: "A tool whose pin line is
// removed stays pinned to the digest the line named"; nobody accepted C):
// C stays hidden, refused and waiting. Happens: pinned()
// (internal/toolpin/toolpin.go:244-255) falls back to Record.Digest, ""
// — registryPinMoved (:191-197) only runs while a pin line exists — so
// check takes the first-sight branch (:201-202) and firstSight
// (:373-382, the test at :376) overwrites a record without Digest, its
// waiting change included: the rug pull C is pinned, listed and run, audited only as
// "pinned".
//
// Fixed: first sight never replaces a record with a change waiting.
func TestPinRegistry2AttackUpgradeThenPinLineRemovedPinsRugPull(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	cfg, port, g, m, first := praRegistryPinned(t, up, aliceKey)
	c := praDigest(t, first, praDescC)

	up.addTool(fixWeather(praDescC))
	if names := listedTools(t, m); len(names) != 0 {
		t.Fatalf("control: listing of the rug pull C: %v, want weather hidden", names)
	}
	if rec := fixWeatherPin(t, g); praWaiting(rec) != c {
		t.Fatalf("control: the rug pull is not waiting: %+v", rec)
	}
	if n := praDowngrade(t, cfg.DataDir, "digest", "registry"); n != 1 {
		t.Fatalf("control: %d pin records rewritten, want 1", n)
	}

	cfg.ServiceExtra = ""
	g2 := startGatewayOnPort(t, port, cfg)
	bob := praSession(t, g2, bobKey)
	names := listedTools(t, bob)
	ans := bob.call(1, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, g2)
	if len(names) != 0 || praRan(ans) || praWaiting(rec) != c {
		t.Errorf("the rug pull C waited (record of the previous version, registry pin A %s); toolgate upgraded and the pin line removed: "+
			"listing %v, call ran %v (%.200s); pin record now digest %s (C %s), change waiting %q, replaced %v: "+
			"want C still hidden, refused and waiting", first.Digest, names, praRan(ans), ans, rec.Digest, c, praWaiting(rec), rec.Replaced)
	}
}

// Attack (fixed): a service with per-user credentials (auth bearer); weather is
// pinned at first sight to A. The upstream rolls out B (its next
// version): bob's and alice's sessions S0 start then (toolgate's own
// listing at initialize puts B in their catalogs) and do not list. The
// hostile upstream then rug-pulls weather to C for everyone: carol's
// listing records C, waiting. Bob's account is shown A again and bob
// lists (A is the pinned definition: Change.ShownTo gets bob). The
// administrator, who knows B, pins it in the registry (pin line B) and
// reloads; C still waits. Bob's and alice's S0 sessions, listed before C
// was seen, call weather from their catalogs (B). Expected (check's
// doc, internal/toolpin/toolpin.go:174-181: "a caller calls the pinned
// definition once a listing of theirs since the change showed it to
// them … and is told to list the tools again until then"): both are told
// to list again: neither was shown B since C was seen. Happens: alice is
// (control); bob's call runs: registryPinMoved (:346-371) copies the
// waiting change with its ShownTo (next := *cur, :352; only a change the
// pin line names is dropped, :360-362), which named the callers shown A,
// the digest the pin line replaced, and check lets bob's session
// through on it (:222-225), a session whose catalog is older than the
// rug pull.
//
// Fixed: a pin line that moves clears the waiting change's ShownTo.
func TestPinRegistry2AttackShownToSurvivesPinLineMove(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t), Auth: "bearer"}
	g := startGatewayOnPort(t, port, cfg)
	lsPutToken(t, g, bobKey, "token-bob")
	lsPutToken(t, g, carolKey, "token-carol")
	lsPutToken(t, g, aliceKey, "token-alice")
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 1 {
		t.Fatalf("control: carol's first listing %v", names)
	}
	first := fixWeatherPin(t, g)
	b := praDigest(t, first, praDescB)

	// B rolled out: bob's and alice's sessions start, their catalogs hold B.
	up.addTool(fixWeather(praDescB))
	bobOld := praSession(t, g, bobKey)
	aliceOld := praSession(t, g, aliceKey)

	// The rug pull, recorded by carol's listing.
	up.addTool(fixWeather(praDescC))
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 0 {
		t.Fatalf("control: carol's listing of the rug pull %v, want weather hidden", names)
	}
	c := praDigest(t, first, praDescC)
	if rec := fixWeatherPin(t, g); praWaiting(rec) != c {
		t.Fatalf("control: the rug pull is not waiting: %+v", rec)
	}
	// Bob's account shows A, the pinned definition, and bob lists it.
	up.addTool(fixWeather(praDescA))
	if names := listedTools(t, praSession(t, g, bobKey)); len(names) != 1 {
		t.Fatalf("control: bob's listing of A %v", names)
	}
	if rec := fixWeatherPin(t, g); rec.Changed == nil || len(rec.Changed.ShownTo) != 1 {
		t.Fatalf("control: the change waiting does not name bob as shown the pinned definition: %+v", rec)
	}

	// The administrator pins B in the registry; C still waits.
	up.addTool(fixWeather(praDescB))
	cfg.ServiceExtra = "pin weather " + b
	g2 := startGatewayOnPort(t, port, cfg)
	aliceOld = praReopen(t, g2, aliceOld, aliceKey)
	aliceAns := aliceOld.call(1, "weather", `{"city":"Oslo"}`)
	if praRan(aliceAns) || !strings.Contains(string(aliceAns), "list them again") {
		t.Fatalf("control: alice's session, listed before the rug pull, calls B: %.300s, want told to list again", aliceAns)
	}
	bobOld = praReopen(t, g2, bobOld, bobKey)
	bobAns := bobOld.call(2, "weather", `{"city":"Oslo"}`)
	rec := fixWeatherPin(t, g2)
	if praRan(bobAns) {
		t.Errorf("bob's session, listed before the rug pull C (waiting %q, shown to %v), called the pin line's B (%s) from its catalog and ran (%.200s); "+
			"bob's only listing since C was seen showed A (%s, replaced %v): want told to list again, as alice is",
			praWaiting(rec), rec.Changed.ShownTo, b, bobAns, first.Digest, rec.Replaced)
	}
}

// Attack (fixed): two replicas on one PostgreSQL during a rolling reload that
// removes weather's pin line (pin line A; the administrator will manage
// the tool through the API from now on). Replica b runs the new
// configuration (no pin line), replica a still the old one (pin line A).
// The upstream ships B; carol's listing through b records it and carol
// accepts it through b's API (POST /v1/tool-pins/accept: 200, "the tool
// is back at once … on other replicas"). Before a is restarted, bob
// lists through it (a refuses B: its configuration still pins A). Then
// a is stopped, the rolling reload done. Expected: weather pinned to B,
// the definition the administrator accepted on the configuration that
// now runs everywhere: listed and callable through b. Happens:
// registryPinMoved (internal/toolpin/toolpin.go:191-197, :346-371) cannot
// tell a pin line that moved from a replica's unchanged old one: a's
// check finds Record.Digest B "another digest than the record" and pins
// A again (B goes to Replaced), then records B as a change (changed,
// :216-221): once a is gone, b (no pin line) falls back to Record.Digest
// A (pinned, :244-255), hides B and refuses it, and the acceptance is
// undone with nothing telling the administrator why.
//
// Fixed: the record keeps the pin line it last saw (Record.Registry), and
// a line counts as moved only from a configuration loaded after the
// record's last acceptance.
func TestPinRegistry2AttackOldReplicaPinLineUndoesAcceptance(t *testing.T) {
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
	if rec := fixWeatherPin(t, b.gateway); praWaiting(rec) != bd {
		t.Fatalf("control: B is not waiting: %+v", rec)
	}
	if r := b.api(t, http.MethodPost, "/v1/tool-pins/accept", carolKey, []byte(`{"service":"svc","tool":"weather","digest":"`+bd+`"}`)); r.StatusCode != http.StatusOK {
		t.Fatalf("control: accepting B through b: %d %s", r.StatusCode, r.Body)
	}
	if names := listedTools(t, carol); len(names) != 1 {
		t.Fatalf("control: carol's listing through b after the acceptance %v", names)
	}

	// Bob lists through a, which still runs the old configuration.
	bob := a.raw(t, bobKey, a.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	t.Logf("bob's listing through a (pin line A): %v", listedTools(t, bob))
	a.kill(t)

	alice := b.raw(t, aliceKey, b.createSession(t, aliceKey, "svc"), "svc")
	alice.initialize()
	names := listedTools(t, alice)
	ans := alice.call(1, "weather", `{"city":"Oslo"}`)
	rec := fixWeatherPin(t, b.gateway)
	if len(names) != 1 || !praRan(ans) {
		t.Errorf("B accepted through b's API (configuration without the pin line); the old replica a (pin line A) served one listing and stopped: "+
			"through b, listing %v, call ran %v (%.200s); pin record digest %s (A %s, B %s), change waiting %q, replaced %v: want B pinned, listed and callable",
			names, praRan(ans), ans, rec.Digest, first.Digest, bd, praWaiting(rec), rec.Replaced)
	}
}

// Attack (fixed): weather is pinned in the registry (pin line A) by a record the
// previous toolgate wrote (no Digest). The administrator upgrades
// toolgate, same configuration. Before anyone lists, the hostile upstream
// rug-pulls weather to C, a definition never seen; bob's session starts
// (toolgate's own listing at initialize puts C in its catalog, without
// Check) and calls it. Expected: the call is refused and C recorded as a
// change, waiting for the administrators and audited (README, tool
// pins): nobody ever accepted or replaced C. Happens: the call's check
// is the first since the upgrade: registryPinMoved (internal/toolpin/
// toolpin.go:191-197, :353-356) puts "unknown" in Record.Replaced and
// sets Since to now, after bob's session started; replaced()
// (store.go:57-59) says any digest was replaced, so check (:203-213)
// tells bob the definition "was replaced since by an administrator's
// acceptance" and records nothing: the rug pull escapes recording and
// audit for every session older than the last pin line move, for as
// long as "unknown" stays among the 64 replaced digests.
//
// Fixed: a pin line takes effect when its configuration was loaded
// (Since), so a session started after the reload is not stale.
func TestPinRegistry2AttackUnknownReplacedHidesRugPullFromRecording(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	cfg, port, _, _, first := praRegistryPinned(t, up, aliceKey)
	if n := praDowngrade(t, cfg.DataDir, "digest", "registry"); n != 1 {
		t.Fatalf("control: %d pin records rewritten, want 1", n)
	}
	c := praDigest(t, first, praDescC)
	g2 := startGatewayOnPort(t, port, cfg)
	up.addTool(fixWeather(praDescC))
	bob := praSession(t, g2, bobKey)
	ans := bob.call(1, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, g2)
	if praRan(ans) {
		t.Fatalf("the rug pull C ran: %.300s", ans)
	}
	if praWaiting(rec) != c {
		t.Errorf("the rug pull C (%s), never seen, called from a session's catalog after the upgrade: told %.250s; "+
			"change waiting %q, replaced %v: want C recorded as a change", c, ans, praWaiting(rec), rec.Replaced)
	}
}

// Attack (fixed): weather is pinned at first sight to A; the upstream changes it
// to B, which a listing records; the administrator pins B in the registry
// and reloads. Before anyone lists, the hostile upstream flips weather
// back to A; bob's session starts after the reload and the flip
// (toolgate's own listing at initialize, without Check, puts A in its
// catalog) and calls it. Expected (check's comment,
// internal/toolpin/toolpin.go:211-212, "A session started since listed
// what the upstream shows: the upstream went back, a change recorded
// below"; TestPinRegistryAttackFlipBackAfterPinLineAcceptance, where a
// listing came first): refused, and the flip back to A recorded as a
// change. Happens: Since is not when the pin line was loaded but when a
// check first saw it (registryPinMoved, :353-359): bob's call is that
// check, so bob's session, started after the reload, counts as listed
// before the "acceptance" (:203), is told A was replaced and to list
// again, and nothing is recorded or audited.
//
// Fixed: Since is when the configuration was loaded (Service.Loaded).
func TestPinRegistry2AttackSinceIsFirstCheckNotReload(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t)}
	g := startGatewayOnPort(t, port, cfg)
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 1 {
		t.Fatalf("control: %v", names)
	}
	a := fixWeatherPin(t, g).Digest
	up.addTool(fixWeather(praDescB))
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 0 {
		t.Fatalf("control: %v", names)
	}
	cfg.ServiceExtra = "pin weather " + fixWeatherPin(t, g).Changed.Digest
	g2 := startGatewayOnPort(t, port, cfg)

	up.addTool(fixWeather(praDescA))
	bob := praSession(t, g2, bobKey)
	ans := bob.call(1, "weather", `{"city":"Oslo"}`)
	rec := fixWeatherPin(t, g2)
	if praRan(ans) {
		t.Fatalf("the flip back to A ran: %.300s", ans)
	}
	if praWaiting(rec) != a {
		t.Errorf("a session started after the pin line's reload and the upstream's flip back to A (%s) calls A: told %.250s; "+
			"change waiting %q, since %s: want the flip back recorded as a change", a, ans, praWaiting(rec), rec.Since)
	}
}

// Attack (fixed): weather is pinned in the registry from the start (pin line A,
// "a definition known in advance"), and the upstream has only ever shown
// A: no check ever found anything to record, so there is no pin record.
// The administrator removes the pin line (to manage weather through the
// API); at that moment the hostile upstream rug-pulls weather to C.
// Expected (README, tool pins: "A tool whose pin line is removed stays
// pinned to the digest the line named"): C is a change, hidden, refused
// and waiting. Happens: registryPinMoved stores nothing without a record
// (internal/toolpin/toolpin.go:349-351, "cur == nil"), and a check of the
// pinned definition writes none (:239); without the line, pinned()
// finds no record (:251-253) and check pins C at first sight (:201-202):
// the rug pull is listed and run, audited only as "pinned".
//
// Fixed: the first check under a pin line records its digest.
func TestPinRegistry2AttackPinLineWithoutRecordRemovedPinsRugPull(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	port := freePort(t)
	// A's digest, from a gateway of its own (another storage).
	g0 := startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t)})
	if names := listedTools(t, praSession(t, g0, carolKey)); len(names) != 1 {
		t.Fatalf("control: %v", names)
	}
	first := fixWeatherPin(t, g0)
	c := praDigest(t, first, praDescC)

	cfg := gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t), ServiceExtra: "pin weather " + first.Digest}
	g := startGatewayOnPort(t, port, cfg)
	alice := praSession(t, g, aliceKey)
	if names := listedTools(t, alice); len(names) != 1 {
		t.Fatalf("control: listing of the registry-pinned A %v", names)
	}
	mustSucceed(t, alice.call(1, "weather", `{"city":"Oslo"}`))
	r := g.api(t, http.MethodGet, "/v1/tool-pins", carolKey, nil)
	t.Logf("pin records while the pin line pins A (a record for weather: %v): %d %.300s",
		strings.Contains(string(r.Body), `"tool":"weather"`), r.StatusCode, r.Body)

	up.addTool(fixWeather(praDescC))
	cfg.ServiceExtra = ""
	g2 := startGatewayOnPort(t, port, cfg)
	bob := praSession(t, g2, bobKey)
	names := listedTools(t, bob)
	ans := bob.call(2, "weather", `{"city":"~/.ssh/id_rsa"}`)
	rec := fixWeatherPin(t, g2)
	if len(names) != 0 || praRan(ans) {
		t.Errorf("weather was pinned by its pin line to A (%s), which was removed as the upstream rug-pulled it to C: listing %v, call ran %v (%.200s); "+
			"pin record now digest %s (C %s), change waiting %q: want C hidden, refused and waiting", first.Digest, names, praRan(ans), ans, rec.Digest, c, praWaiting(rec))
	}
}

// Attack (held): a rug pull C waits (weather pinned at first sight to
// A). The pin line flaps across reloads — B, A, B, A (a rolling reload
// going back and forth) — then is removed; the upstream keeps showing C.
// Expected: after each reload C is hidden from a listing, its call
// refused and C still waiting (no move ends a change the line does not
// name); once the line is gone, weather stays pinned to the last digest
// it named (A) and C still waits. Happens: so (registryPinMoved keeps a
// change the pin line does not name, internal/toolpin/toolpin.go:360-362;
// the record keeps the line's digest, :359).
func TestPinRegistry2AttackPinLineFlappingKeepsRugPullWaiting(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather(praDescA))
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "weather", DataDir: gatewayDataDir(t)}
	g := startGatewayOnPort(t, port, cfg)
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 1 {
		t.Fatalf("control: %v", names)
	}
	first := fixWeatherPin(t, g)
	a, b, c := first.Digest, praDigest(t, first, praDescB), praDigest(t, first, praDescC)
	up.addTool(fixWeather(praDescC))
	if names := listedTools(t, praSession(t, g, carolKey)); len(names) != 0 {
		t.Fatalf("control: listing of the rug pull %v", names)
	}
	for i, pin := range []string{b, a, b, a, ""} {
		cfg.ServiceExtra = ""
		if pin != "" {
			cfg.ServiceExtra = "pin weather " + pin
		}
		g = startGatewayOnPort(t, port, cfg)
		m := praSession(t, g, bobKey)
		names := listedTools(t, m)
		ans := m.call(i+1, "weather", `{"city":"~/.ssh/id_rsa"}`)
		rec := fixWeatherPin(t, g)
		if len(names) != 0 || praRan(ans) || praWaiting(rec) != c {
			t.Fatalf("reload %d (pin line %q): listing %v, call ran %v (%.200s), change waiting %q (C %s)", i, pin, names, praRan(ans), ans, praWaiting(rec), c)
		}
		if pin == "" && rec.Digest != a {
			t.Errorf("the pin line (last A %s) removed: the record pins %s", a, rec.Digest)
		}
	}
}
