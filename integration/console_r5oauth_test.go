package integration

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func r5OIDCBlock(issuer string) string {
	return "oidc " + issuer + " {\n\t\t\tclient_id console-client\n\t\t\tclient_secret console-secret\n\t\t}"
}

// Attack (mix-up across a reload): the console's OpenID Connect sign-in
// keeps, in its sealed sign-in cookie, the issuer as an index into the
// configuration's list of oidc blocks — not which issuer it is. A reload
// that reorders the list (or removes an issuer before it) while someone
// is signing in makes the callback send the code issuer A gave, with the
// PKCE verifier of the sign-in, to issuer B's token endpoint, and verify
// the answer with B's keys: A's authorization code and verifier leak to
// another provider (for a public client at A, that is enough to redeem
// it), the very mix-up the services' connect flow guards against (its
// pending authorizations record their issuer: a connect started before a
// reload moved the service completes nothing).
//
// What should happen: a sign-in started at one issuer completes only at
// that issuer (the cookie names the issuer, not its place in a list); if
// that issuer is gone or moved, the person is asked to start again and no
// other issuer is sent anything.
func TestR5OAuthConsoleSignInSendsCodeToAnotherIssuerAfterReorder(t *testing.T) {
	a, b := startHostileIssuer(t), startHostileIssuer(t)
	b.shape(func(c map[string]any) map[string]any {
		c["sub"], c["email"] = "someone-at-b", "someone@b.example.test"
		return c
	}, nil, nil)
	port := freePort(t)
	cfg := func(console, dataDir string) gatewayConfig {
		return gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "state_secret " + testStateSecret,
			Console: console, DataDir: dataDir}
	}
	g := startGatewayOnPort(t, port, cfg(r5OIDCBlock(a.URL)+"\n\t\t"+r5OIDCBlock(b.URL), ""))

	p := g.newPerson(t)
	noFollow := *p.client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noFollow.Get(g.URL + "/console/signin/oidc/0")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	toA := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(toA, a.URL+"/authorize") {
		t.Fatalf("control: starting the sign-in at issuer 0 (A): %d %q", resp.StatusCode, toA)
	}
	resp, err = noFollow.Get(toA)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	callback := resp.Header.Get("Location")
	if !strings.Contains(callback, "/console/signin/callback?") {
		t.Fatalf("control: issuer A did not send the browser back: %q", callback)
	}

	// While the person is at A, the administrator reloads with the
	// issuers listed the other way round.
	g2 := startGatewayOnPort(t, port, cfg(r5OIDCBlock(b.URL)+"\n\t\t"+r5OIDCBlock(a.URL), g.DataDir))
	p.g = g2
	status, page := p.get(callback)

	for _, form := range b.tokenRequests() {
		t.Errorf("issuer B's token endpoint was sent issuer A's authorization code %q with the sign-in's PKCE verifier "+
			"(verifier sent: %v, client_id %q): want a sign-in completed only at the issuer it started at",
			form.Get("code"), form.Get("code_verifier") != "", form.Get("client_id"))
	}
	if strings.Contains(page, "someone") {
		t.Errorf("the browser that signed in at A is signed in as B's user (%d)", status)
	}
}

// r5DummyOAuth is an `auth oauth` block whose provider is never reached:
// enough to start a connect and read the authorization URL toolgate
// builds. No login_hint: the operator chose not to tell the provider who
// the person is.
const r5DummyOAuth = `oauth {
				authorization_url http://127.0.0.1:1/authorize
				token_url http://127.0.0.1:1/token
				client_id r5-client
				scopes tickets.read
			}`

// Attack (disclosure to the provider): login_hint is opt-in — "send the
// caller's user as login_hint" — so an operator who leaves it out expects
// the provider (often a third party: a SaaS tracker, a code host) not to
// learn who each toolgate user is. The signed state toolgate sends it is
// only signed, not sealed: base64url JSON carrying the toolgate user name
// ("u"), the service and the browser sign-in's reference, readable by the
// provider, in its logs, and in the browser's history of both sites.
//
// What should happen: the state says nothing about the person (a nonce
// and a MAC suffice: user, service and browser are in the sealed pending
// authorization already), so that without login_hint the provider learns
// nothing toolgate knows about them.
func TestR5OAuthStateTellsTheProviderTheUserWithoutLoginHint(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Auth: r5DummyOAuth,
		Extra: "state_secret " + testStateSecret})
	authURL := g.signedIn(t, aliceKey).startConnect("svc")
	u, err := url.Parse(authURL)
	if err != nil || !strings.HasPrefix(authURL, "http://127.0.0.1:1/authorize") {
		t.Fatalf("control: the connect went to %q", authURL)
	}
	if hint := u.Query().Get("login_hint"); hint != "" {
		t.Fatalf("control: login_hint %q sent though not configured", hint)
	}
	decoded, _ := base64.RawURLEncoding.DecodeString(u.Query().Get("state"))
	if strings.Contains(string(decoded), alice) {
		t.Errorf("the state sent to the provider reads %s: it names the toolgate user %q to the provider though login_hint is off", decoded, alice)
	}
}

// Attack (content injection on the console's origin): the connect page
// takes ?for=<user> from the link — a link anyone can write and send — and
// prints it, whole and as it is, in a red notice in the console: "This
// link was made for <for>, but you are signed in as alice … sign out and
// sign in as <for>". The text is escaped as HTML, but it has no length
// bound and its bidirectional and invisible characters are not escaped,
// unlike every other outside text the console shows (approval reasons,
// tool names, arguments: approval.Visible), so a link can put a
// convincing, reordered instruction on toolgate's own page.
//
// What should happen: a `for` that is not the signed-in person's name is
// shown with its invisible and bidirectional characters escaped (and
// bounded), or not echoed at all.
func TestR5OAuthConnectPageEchoesCraftedForTextRaw(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Auth: r5DummyOAuth,
		Extra: "state_secret " + testStateSecret})
	p := g.signedIn(t, aliceKey)
	crafted := "security@example.test\u202e moc.elpmaxe-lieve//:sptth ta ngis-er tsum uoY \u202c"
	status, page := p.get(g.URL + "/console/connect/svc?for=" + url.QueryEscape(crafted))
	if status != http.StatusForbidden {
		t.Fatalf("control: the connect page for another person answered %d", status)
	}
	if text := htmlUnescape(page); strings.ContainsRune(text, '\u202e') {
		t.Errorf("the connect page shows the link's `for` text with a raw U+202E (right-to-left override): " +
			"a crafted link reorders toolgate's own notice; want it escaped like other outside text")
	}
}

// Attack (provider text on toolgate's page): when the provider sends the
// browser back with an error, the callback page shows its
// error_description ("The provider said: …", up to 300 bytes) on
// toolgate's origin, escaped as HTML but with its bidirectional and
// invisible characters as they are — unlike every other outside text
// toolgate shows a person (approval.Visible on the console). A provider
// (or whatever answers for its authorization endpoint) can make the page
// read otherwise than what it holds.
//
// What should happen: the description is shown with such characters
// escaped, as the console shows outside text.
func TestR5OAuthCallbackShowsProviderDescriptionWithBidiRaw(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Auth: r5DummyOAuth,
		Extra: "state_secret " + testStateSecret})
	p := g.signedIn(t, aliceKey)
	u, _ := url.Parse(p.startConnect("svc"))
	q := url.Values{"state": {u.Query().Get("state")}, "error": {"access_denied"},
		"error_description": {"contact support at \u202emoc.elpmaxe-live//:sptth\u202c to restore access"}}
	status, page := p.get(g.URL + "/v1/connections/svc/callback?" + q.Encode())
	if status != http.StatusBadRequest || !strings.Contains(page, "The provider said") {
		t.Fatalf("control: the callback's error page: %d %s", status, page)
	}
	if strings.ContainsRune(htmlUnescape(page), '\u202e') {
		t.Errorf("the callback page shows the provider's error_description with a raw U+202E: want it escaped like other outside text")
	}
}
