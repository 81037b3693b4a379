package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/toolpin"
)

// fixWeather is a weather tool whose description is desc.
func fixWeather(desc string) *mcp.Tool {
	return &mcp.Tool{Name: "weather", Description: desc, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
}

// fixWeatherPin is weather's pin record as carol (an admin) reads it.
func fixWeatherPin(t *testing.T, g *gateway) toolpin.Record {
	t.Helper()
	r := g.api(t, http.MethodGet, "/v1/tool-pins", carolKey, nil)
	var list struct{ Pins []toolpin.Record }
	if err := json.Unmarshal(r.Body, &list); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/tool-pins: %d %s", r.StatusCode, r.Body)
	}
	for _, p := range list.Pins {
		if p.Tool == "weather" {
			return p
		}
	}
	t.Fatalf("no pin for weather: %s", r.Body)
	return toolpin.Record{}
}

// fixAcceptChange has carol accept the change waiting for weather (seen
// by m's listing) and returns its digest.
func fixAcceptChange(t *testing.T, g *gateway, m *rawMCP) string {
	t.Helper()
	if names := listedTools(t, m); len(names) != 0 {
		t.Fatalf("tools/list after a change: %v, want weather hidden", names)
	}
	rec := fixWeatherPin(t, g)
	if rec.Changed == nil {
		t.Fatalf("no change recorded: %+v", rec)
	}
	body, _ := json.Marshal(map[string]string{"service": "svc", "tool": "weather", "digest": rec.Changed.Digest})
	if r := g.api(t, http.MethodPost, "/v1/tool-pins/accept", carolKey, body); r.StatusCode != http.StatusOK {
		t.Fatalf("accepting %s: %d %s", rec.Changed.Digest, r.StatusCode, r.Body)
	}
	if names := listedTools(t, m); len(names) != 1 {
		t.Fatalf("tools/list after the acceptance: %v", names)
	}
	return rec.Changed.Digest
}

// Attack (fixed): the upstream flips back. weather is pinned to A; the upstream
// changes it to B, which an administrator accepts (A goes to
// Record.Replaced); then the upstream shows A again — a change from the
// accepted definition, which A is to be treated as (the README: every
// other definition is recorded, audited and hidden until accepted). Bob
// starts a session after the flip (toolgate's own listing at initialize
// puts A, what the upstream shows now, in its catalog) and calls weather
// without listing first. Expected: the call is refused and the change
// back to A is recorded for the administrators (GET /v1/tool-pins shows
// it waiting, and the audit log a "changed" event). What happened: the
// call is refused as a "stale catalog" ("was replaced since by an
// administrator's acceptance ... list the tools again") and nothing is
// recorded or audited: check takes any digest in Record.Replaced for a
// catalog listed before the acceptance, whatever its age
// (internal/toolpin/toolpin.go:195), so the upstream's flip back escapes
// the record until some runner happens to list the tools.
// Fixed: only a session older than the latest acceptance is told to list
// again; one started since listed what the upstream shows, and its call
// records the change.
func TestFixAttackPinFlipBackToReplacedEscapesRecording(t *testing.T) {
	const descA = "Reports the weather for a city."
	up := startSmallUpstream(t, "weather", fixWeather(descA))
	logCfg, audit := auditLog(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "weather", Log: logCfg})
	m := g.raw(t, aliceKey, "", "svc")
	delete(m.headers, "X-Toolgate-Session")
	m.initialize()
	if names := listedTools(t, m); len(names) != 1 {
		t.Fatalf("tools/list: %v", names)
	}
	mustSucceed(t, m.call(1, "weather", `{"city":"Oslo"}`))
	first := fixWeatherPin(t, g).Digest

	up.addTool(fixWeather(descA + " In Celsius."))
	second := fixAcceptChange(t, g, m)
	mustSucceed(t, m.call(2, "weather", `{"city":"Oslo"}`))
	changedBefore := len(pinEvents(audit(), "changed"))

	// The flip back to A, and a session that starts after it.
	up.addTool(fixWeather(descA))
	mb := g.raw(t, bobKey, "", "svc")
	delete(mb.headers, "X-Toolgate-Session")
	mb.initialize()
	answer := string(mb.call(3, "weather", `{"city":"Oslo"}`))
	if !strings.Contains(answer, `"isError":true`) {
		t.Fatalf("bob's call of the flipped-back definition ran: %s", answer)
	}
	rec := fixWeatherPin(t, g)
	if rec.Digest != second {
		t.Fatalf("the pin moved: %+v", rec)
	}
	if rec.Changed == nil || rec.Changed.Digest != first {
		t.Errorf("the upstream flipped weather back from the accepted %s to the replaced %s and bob's session (started after the flip) called it: "+
			"pin record changed=%+v (want the flip back recorded for the administrators); %d new changed audit events; bob was told: %.300s",
			second, first, rec.Changed, len(pinEvents(audit(), "changed"))-changedBefore, answer)
	}
}

// Attack (fixed): Record.Replaced keeps only the last 8 digests. A runner's
// session listed before the first of nine acceptances (an upstream that
// revises a tool's description often: a version or a date in it) still
// holds the first definition; it calls the tool. Expected (the fix: "a
// session listed before an administrator's acceptance no longer undoes
// it"): that runner is told to list again, and the accepted definition
// stays callable for alice, whose listing shows it. What happened: the
// ninth acceptance pushed the first digest out of Replaced
// (internal/toolpin/toolpin.go:432, maxReplaced store.go:49), so the
// stale call records it as a new change, which hides and refuses the
// accepted definition to everyone again.
// Fixed: Record.Replaced keeps 64 digests.
func TestFixAttackPinReplacedBoundLetsStaleSessionUndoAcceptance(t *testing.T) {
	up := startSmallUpstream(t, "weather", fixWeather("Reports the weather for a city (rev 0)."))
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "weather"})
	stale := g.raw(t, bobKey, "", "svc")
	delete(stale.headers, "X-Toolgate-Session")
	stale.initialize()
	mustSucceed(t, stale.call(1, "weather", `{"city":"Oslo"}`))
	m := g.raw(t, aliceKey, "", "svc")
	delete(m.headers, "X-Toolgate-Session")
	m.initialize()
	if names := listedTools(t, m); len(names) != 1 {
		t.Fatalf("tools/list: %v", names)
	}
	var last string
	for rev := 1; rev <= 9; rev++ {
		up.addTool(fixWeather(fmt.Sprintf("Reports the weather for a city (rev %d).", rev)))
		last = fixAcceptChange(t, g, m)
	}
	mustSucceed(t, m.call(2, "weather", `{"city":"Oslo"}`))

	staleAnswer := string(stale.call(3, "weather", `{"city":"Oslo"}`))
	if !strings.Contains(staleAnswer, `"isError":true`) {
		t.Fatalf("the stale session's call of rev 0 ran: %s", staleAnswer)
	}
	got := string(m.call(4, "weather", `{"city":"Oslo"}`))
	rec := fixWeatherPin(t, g)
	if strings.Contains(got, `"isError":true`) || rec.Changed != nil {
		waiting := ""
		if rec.Changed != nil {
			waiting = rec.Changed.Digest
		}
		t.Errorf("after nine acceptances (pinned %s), one call from a session listed before the first undid the last for everyone: "+
			"alice's call of the accepted definition: %.300s; change now waiting: %s (rev 0's); the stale session was told: %.200s", last, got, waiting, staleAnswer)
	}
}
