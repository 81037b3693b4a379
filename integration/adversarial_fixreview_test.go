package integration

// Review of 68e6dee (OAuth grants bound to their issuer): what the
// person is told about a grant of another provider.

import (
	"net/http"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed): alice connected svc at provider A; a reload moves svc to
// provider B (another token_url, client and upstream). Her calls now get
// needs_sign_in (ErrGrantElsewhere). She looks at her catalog (GET
// /v1/catalog) and the console's Services page to see why. Expected
// (README: "each person gets needs_sign_in until they connect again"):
// svc's status is needs_sign_in, so she knows to connect. Happens:
// account.connectionStatus (internal/account/account.go:193-205) reads the
// stored connection and reports "connected" (with A's connected_at and
// scopes) without asking whether it was issued under the service's
// provider — the catalog says connected while every call says
// needs_sign_in. Fix: export an App method (e.g. App.UsableConnection or
// Connection.IssuedFor(svc)) that applies issuedBy, and report
// needs_sign_in in connectionStatus when it fails.
func TestFixReviewCatalogSaysConnectedForGrantOfAnotherProvider(t *testing.T) {
	g2 := frvMoveProvider(t).g2
	// Control: a call says needs_sign_in.
	m := g2.raw(t, aliceKey, g2.createSession(t, aliceKey, "svc"), "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"runner","version":"1"}}}`)
	if len(msgs) == 0 || !gjson.GetBytes(msgs[len(msgs)-1], "error.data.needs_sign_in").Bool() {
		t.Fatalf("control: initialize with provider A's grant after the move: %s", msgs)
	}
	resp := g2.api(t, http.MethodGet, "/v1/catalog", aliceKey, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/catalog: %d %s", resp.StatusCode, resp.Body)
	}
	if st := gjson.GetBytes(resp.Body, `services.#(id=="svc").status`).String(); st != "needs_sign_in" {
		t.Errorf("the catalog says svc is %q while every call says needs_sign_in: %s", st, resp.Body)
	}
}

// Attack (fixed): none needed — routine use. alice's runner holds a federated
// session whose svc part started (a list); she connects svc again (a new
// grant, or a refreshed connect), then her runner sets the log level.
// Expected: as a routed call and (since 68e6dee) a list do, the
// federated endpoint initializes svc's part again and the level is set:
// a success. Happens: broadcast (modules/federation/route.go:351-375)
// sub-calls the outdated child session, which the registry ends (404),
// and, unlike route (route.go:184) and listOne (lists.go:148-153), neither
// forgets nor initializes it again: the runner is answered with svc's
// "session ended" error as a refusal (route.go:33-34) — a legitimate
// setLevel reported as refused — and the next one succeeds without
// reaching svc at all (started() no longer lists it). Fix: in broadcast,
// on a 404 forget the child (x.forget) and retry once with childSession,
// as listOne does; a service whose session is gone does not count as a
// refusal.
func TestFixReviewSetLevelAfterReconnectReportedRefused(t *testing.T) {
	_, _, g := frvOAuth(t)
	m := faRunner(t, g, aliceKey, `{}`)
	if list := faRPC(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); refused(list) {
		t.Fatalf("list: %s", list)
	}
	if a := faRPC(t, m, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`); refused(a) {
		t.Skipf("control: svc's upstream does not take logging/setLevel: %s", a)
	}
	time.Sleep(10 * time.Millisecond) // a grant is named by when it was made
	g.connectOAuth(t, aliceKey)
	if a := faRPC(t, m, `{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"info"}}`); refused(a) {
		t.Errorf("logging/setLevel after connecting svc again was answered as refused: %s", a)
	}
}
