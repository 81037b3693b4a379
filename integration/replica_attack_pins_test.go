package integration

// Replica attacks on tool pins: a changed definition accepted through one
// replica while sessions served by the other still hold the old catalog.

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// rpaPins reads GET /v1/tool-pins through g as carol (an admin).
func rpaPins(t *testing.T, g *replica) string {
	t.Helper()
	r := g.api(t, http.MethodGet, "/v1/tool-pins", carolKey, nil)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/tool-pins: %d %s", r.StatusCode, r.Body)
	}
	return string(r.Body)
}

// rpaChangedDigest is the digest of the change waiting for weather, "" when
// none waits.
func rpaChangedDigest(t *testing.T, g *replica) string {
	t.Helper()
	body := rpaPins(t, g)
	i := strings.Index(body, `"changed":{`)
	if i < 0 {
		return ""
	}
	rest := body[i:]
	j := strings.Index(rest, `"digest":"`)
	if j < 0 {
		return ""
	}
	rest = rest[j+len(`"digest":"`):]
	return rest[:strings.Index(rest, `"`)]
}

// Attack (fixed): the upstream changes its weather tool; carol's listing through
// replica a records the change and carol, an administrator, reads it and
// accepts it there: "the tool is back at once (on other replicas as
// above)". Bob's MCP session, listed through replica b before the change,
// still holds the old definition in its catalog. Bob's next call of
// weather through b — an ordinary runner with a session a little older
// than the change — checks the old definition against the new pin and
// records it as a new change (the upstream no longer shows it), which
// hides and refuses weather for every caller again: carol's own call
// through a, in the session whose listing showed the accepted
// definition, is refused, and the administrators are asked to accept the
// old definition back. Expected: bob is told to list the tools again
// (his catalog is older than the pin), and the accepted definition stays
// callable for those who listed it. What happens: one stale session
// undoes the acceptance for everyone until someone lists the tools again
// (a listing of the accepted definition ends the "change" as reverted),
// so a runner that keeps calling from its stale catalog can keep the tool
// refused to everyone and re-raise the old definition to the
// administrators, each re-recording audited as a new "changed" event
// (internal/toolpin/toolpin.go:188-195: any digest other than the pin is
// recorded by changed(), whatever the age of the catalog it comes from;
// :211 then refuses every call). Not specific to replicas: one replica
// does the same; two make it easy (the stale session is on the replica
// the administrator never used).
//
// On a service with per-user credentials (auth bearer) the old definition
// recorded by the stale session is not ended by anyone's listing (such
// listings never withdraw a change): it waits for the administrators for
// good, and every caller is told to list the tools again. Fixed: a pin
// record keeps the digests its acceptances replaced (Record.Replaced); a
// call whose session's catalog holds one is told to list again, and
// nothing is recorded from it.
func TestReplicaAttackStaleCatalogUndoesPinAcceptance(t *testing.T) {
	for _, auth := range []string{"", "auth bearer"} {
		name := "auth none"
		if auth != "" {
			name = auth
		}
		t.Run(name, func(t *testing.T) { rpaStaleCatalog(t, auth) })
	}
}

func rpaStaleCatalog(t *testing.T, auth string) {
	up := startSmallUpstream(t, "weather", &mcp.Tool{Name: "weather", Description: "Reports the weather for a city.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}})
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "weather", auth, "")
	})
	if auth != "" {
		soPutToken(t, a, bobKey, "bob-token")
		soPutToken(t, a, carolKey, "carol-token")
	}
	bobSess := b.createSession(t, bobKey, "svc")
	mb := b.raw(t, bobKey, bobSess, "svc")
	mb.initialize()
	if names := listedTools(t, mb); len(names) != 1 {
		t.Fatalf("tools/list on b before the change: %v", names)
	}
	mustSucceed(t, mb.call(1, "weather", `{"city":"Oslo"}`))

	// The change, seen and accepted through a.
	up.addTool(&mcp.Tool{Name: "weather", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		Description: "Reports the weather for a city, in Celsius."})
	mc := a.raw(t, carolKey, a.createSession(t, carolKey, "svc"), "svc")
	mc.initialize()
	if names := listedTools(t, mc); len(names) != 0 {
		t.Fatalf("tools/list on a after the change: %v, want weather hidden until accepted", names)
	}
	digest := rpaChangedDigest(t, a)
	if digest == "" {
		t.Fatalf("no change waiting after carol's listing: %s", rpaPins(t, a))
	}
	if r := a.api(t, http.MethodPost, "/v1/tool-pins/accept", carolKey, []byte(`{"service":"svc","tool":"weather","digest":"`+digest+`"}`)); r.StatusCode != http.StatusOK {
		t.Fatalf("accepting %s on a: %d %s", digest, r.StatusCode, r.Body)
	}
	if names := listedTools(t, mc); len(names) != 1 {
		t.Fatalf("tools/list on a after the acceptance: %v, want weather back", names)
	}
	mustSucceed(t, mc.call(2, "weather", `{"city":"Oslo"}`))
	time.Sleep(500 * time.Millisecond) // b hears of the acceptance

	// Bob's session, listed before the change, calls through b.
	bobAnswer := string(mb.call(3, "weather", `{"city":"Oslo"}`))
	t.Logf("bob's call through b with his catalog from before the change: %s", bobAnswer)

	if d := rpaChangedDigest(t, b); d != "" {
		t.Errorf("after the acceptance, bob's stale catalog recorded a change waiting for the administrators (%s, the old definition)", d)
	}
	if auth != "" {
		// Carol lists again (as she is told), and calls: the "change" stays.
		listedTools(t, mc)
		mc.call(5, "weather", `{"city":"Oslo"}`)
		if d := rpaChangedDigest(t, a); d != "" {
			t.Errorf("after carol listed the accepted definition again, the old definition still waits for the administrators (%s)", d)
		}
	}
	// The accepted definition, for carol, through a.
	if got := string(mc.call(4, "weather", `{"city":"Oslo"}`)); !strings.Contains(got, "weather {") || strings.Contains(got, "changed since it was pinned") {
		t.Errorf("carol's call of the accepted definition through a, after bob's stale session called through b: %s, want it to run", got)
	}
}
