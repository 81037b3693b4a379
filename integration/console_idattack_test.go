package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/storage"
)

// Attack (revocation): an administrator takes an OpenID provider out of the
// console (it is no longer trusted — compromised, or replaced) and
// reloads. Sign-ins made through it live on for their whole lifetime
// (12h by default), with the user and groups that provider vouched for:
// the record says only "oidc", not which provider, so nothing can tell
// that it came from one the configuration no longer has. An API-key
// sign-in ends the moment its key is removed
// (TestConsoleAttackRevokedAPIKeyKeepsItsConsoleSignIn was fixed so); an
// OIDC sign-in from a removed provider should end the same way.
func TestIDAttackConsoleSignInOutlivesRemovedOIDCProvider(t *testing.T) {
	const password = "correct horse battery staple"
	issuer := caStartProvider(t, map[string]*storage.User{
		"alice-id": {ID: "alice-id", Username: "alice", Password: password, Email: alice, EmailVerified: true},
	})
	port := freePort(t)
	gwURL := "http://127.0.0.1:" + caItoa(port)
	storage.RegisterClients(storage.WebClient("idattack-console", "idattack-secret", gwURL+"/console/signin/callback"))
	oidc := "oidc " + issuer + " {\n\t\t\tclient_id idattack-console\n\t\t\tclient_secret idattack-secret\n\t\t\tuser_claim email\n\t\t}"
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "state_secret " + testStateSecret,
		Console: oidc + "\n\t\tapi_key_login"})
	p := g.newPerson(t)
	if status, page := p.caSignInAtZitadel(g, "alice", password); status != http.StatusOK || !strings.Contains(page, caSignedInAs(alice)) {
		t.Fatalf("control: alice's sign-in through the provider: %d\n%.1000s", status, page)
	}

	// The provider is removed from the console.
	g2 := startGatewayOnPort(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "state_secret " + testStateSecret,
		DataDir: g.DataDir, Console: "api_key_login"})
	status, page := p.get(g2.URL + "/console/sessions")
	if strings.Contains(page, caSignedInAs(alice)) {
		t.Errorf("a sign-in through an OpenID provider the console no longer has still works (%d): want it ended", status)
	}
}

// Attack (revocation): the README's remedy for a console sign-in that
// keeps groups its person lost — "shorten session_lifetime" — changes
// nothing for sign-ins already made: each record keeps the idle time and
// expiry of the configuration it was made under. An administrator who
// reloads with session_lifetime 1s finds the old sign-in still deciding
// approvals hours later.
//
// What should happen: a sign-in ends once it is older than the
// session_lifetime in force (or unused longer than session_idle in force).
func TestIDAttackConsoleSignInOutlivesShortenedLifetime(t *testing.T) {
	port := freePort(t)
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp"})
	p := g.signedIn(t, carolKey) // an admin
	g2 := startGatewayOnPort(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", DataDir: g.DataDir,
		Console: "api_key_login\n\t\tsession_lifetime 1s\n\t\tsession_idle 1s"})
	time.Sleep(2500 * time.Millisecond)
	resp, err := p.client.Get(g2.URL + "/console/approvals")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Path != "/console/signin" {
		t.Errorf("a sign-in older than the session_lifetime (and session_idle) in force still opens %s (%d); want it ended", resp.Request.URL.Path, resp.StatusCode)
	}
}

// Holds: people whose names differ from alice's only in case, by a
// compatibility-equivalent Unicode spelling, a trailing space or a
// trailing escape text are not alice anywhere: not for her
// toolgate session, her MCP session, her approvals, nor a service that
// allows only her. Names are compared exactly; nothing folds them.
func TestIDAttackHoldsLookalikeNamesAreOtherPeople(t *testing.T) {
	lookalikes := map[string]string{
		"test-key-idattack-case":  "Alice@example.test",
		"test-key-idattack-full":  "ａlice@example.test", // fullwidth a
		"test-key-idattack-space": alice + " ",
		"test-key-idattack-nul":   alice + "\\u0000", // the six characters, as a careless decoder might leave them
	}
	auth := ""
	for key, user := range lookalikes {
		auth += "api_key " + hashKey(key) + " \"" + user + "\" eng\n\t\t\t"
	}
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), AuthExtra: auth,
		Services: "service only_alice {\n\t\t\turl " + up.URL + "\n\t\t\tallow_http\n\t\t\ttools echo\n\t\t\tallowed_users " + alice + "\n\t\t}"})
	sess := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, sess, "svc")
	m.initialize()
	approvalID := mustPend(t, m.call(1, "gated_tool", `{"text":"alice's"}`)).ApprovalID

	for key, user := range lookalikes {
		if r := g.api(t, http.MethodGet, "/v1/catalog", key, nil); r.StatusCode != http.StatusOK || strings.Contains(string(r.Body), "only_alice") {
			t.Errorf("%q: the catalog (%d) lists alice's service: %s", user, r.StatusCode, r.Body)
		}
		if r := g.api(t, http.MethodGet, "/v1/sessions/"+sess, key, nil); r.StatusCode != http.StatusForbidden && r.StatusCode != http.StatusNotFound {
			t.Errorf("%q reads alice's session: %d", user, r.StatusCode)
		}
		if r := g.api(t, http.MethodGet, "/v1/approvals/"+approvalID, key, nil); r.StatusCode != http.StatusNotFound {
			t.Errorf("%q reads alice's approval: %d %s", user, r.StatusCode, r.Body)
		}
		if r := g.decide(t, key, approvalID, true, "once", ""); r.StatusCode == http.StatusOK {
			t.Errorf("%q approved alice's call", user)
		}
		other := g.raw(t, key, sess, "svc")
		other.sessionID = m.sessionID
		if status, _, _ := other.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`); status != http.StatusForbidden {
			t.Errorf("%q with alice's toolgate and MCP session: %d, want 403", user, status)
		}
		own := g.raw(t, key, g.createSession(t, key, "svc"), "only_alice")
		if status, _, _ := own.post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`); status != http.StatusNotFound {
			t.Errorf("%q reaches only_alice: %d, want 404", user, status)
		}
	}
	if n := up.upstreamCalls("echo"); n != 0 {
		t.Errorf("the upstream saw %d echo calls from lookalikes", n)
	}
}

// Holds: bob reaches no service that allows only alice — not through the
// federated endpoint (its listing, a prefixed tool name, a prefixed
// resource URI), not by spelling the service's path another way (trailing
// slash, an extra segment before it, case, percent-encoding), and not
// through a federated session he started while the service still allowed
// him, once a reload took him off it.
func TestIDAttackHoldsOtherPeoplesServiceUnreachable(t *testing.T) {
	up := startUpstream(t)
	port := freePort(t)
	service := func(users string) string {
		return "service only_alice {\n\t\t\turl " + up.URL + "\n\t\t\tallow_http\n\t\t\ttools echo\n\t\t\tallowed_users " + users + "\n\t\t}"
	}
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL, Federation: " ", Services: service(alice + " " + bob)})
	fed := g.raw(t, bobKey, "", "svc")
	fed.url = g.URL + "/v1/mcp"
	fed.initialize()
	mustSucceed(t, fed.call(1, "only_alice__echo", `{"text":"while allowed"}`)) // the control

	g2 := startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL, Federation: " ", Services: service(alice), DataDir: g.DataDir})
	fed.transport = g2.transport()
	if answer := string(fed.call(2, "only_alice__echo", `{"text":"after the reload"}`)); !strings.Contains(answer, "error") || strings.Contains(answer, "after the reload") {
		t.Errorf("bob's federated session after the reload took him off only_alice: %s", answer)
	}
	_, _, msgs := fed.post(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if len(msgs) == 0 || strings.Contains(string(msgs[0]), "only_alice__") {
		t.Errorf("bob's federated tools/list after the reload: %s", msgs)
	}
	_, _, msgs = fed.post(`{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"only_alice__test://watched"}}`)
	if len(msgs) == 0 || !strings.Contains(string(msgs[0]), `"error"`) {
		t.Errorf("bob's federated resources/read of only_alice: %s", msgs)
	}

	fresh := g2.raw(t, bobKey, "", "svc")
	fresh.url = g2.URL + "/v1/mcp"
	fresh.initialize()
	if answer := string(fresh.call(1, "only_alice__echo", `{"text":"fresh"}`)); strings.Contains(answer, "fresh") {
		t.Errorf("a new federated session of bob reaches only_alice: %s", answer)
	}
	for _, path := range []string{"/v1/mcp/only_alice", "/v1/mcp/only_alice/", "/v1/mcp/x/only_alice", "/v1/mcp/Only_alice", "/v1/mcp/only%5Falice", "/v1/mcp/only_alice%2F"} {
		m := g2.raw(t, bobKey, "", "svc")
		m.url = g2.URL + path
		status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		if status == http.StatusOK {
			t.Errorf("bob initialized at %s: %s", path, msgs)
		}
	}
	if n := up.upstreamCalls("echo"); n != 1 {
		t.Errorf("the upstream saw %d echo calls; want the control's one", n)
	}
}
