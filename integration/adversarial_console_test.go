package integration

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// Attacks on the console and its sign-in, on browser clients (CORS), and on
// clients that have only a URL and a token (implied sessions, protected-
// resource metadata). Tests named …Holds… show attacks the gateway
// resists; every other test reproduces a flaw and fails until it is fixed.

// ---------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------

// The console names a person by user_claim, here "email" (as
// TestBrowserOIDCSignIn configures it, and as the console defaults to when
// the auth block's jwt issuer names callers by email). A real OpenID
// provider (zitadel's certified library) has a second account, mallory's,
// whose email address is alice's but unverified — what any provider with
// self-service sign-up or user-editable profiles gives. The provider says so
// honestly (no email_verified: true), yet the console signs mallory in as
// alice: mallory sees and changes alice's services, sessions and approvals.
func TestConsoleAttackUnverifiedEmailSignsInAsAnotherUser(t *testing.T) {
	const password = "correct horse battery staple"
	issuer := caStartProvider(t, map[string]*storage.User{
		"alice-id":   {ID: "alice-id", Username: "alice", Password: password, Email: alice, EmailVerified: true},
		"mallory-id": {ID: "mallory-id", Username: "mallory", Password: password, Email: alice, EmailVerified: false},
	})
	port := freePort(t)
	gwURL := "http://127.0.0.1:" + caItoa(port)
	storage.RegisterClients(storage.WebClient("attack-console", "attack-secret", gwURL+"/console/signin/callback"))
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "state_secret " + testStateSecret,
		Console: "oidc " + issuer + " {\n\t\t\tclient_id attack-console\n\t\t\tclient_secret attack-secret\n\t\t\tuser_claim email\n\t\t}"})

	// The control: alice, whose address is verified, signs in as herself.
	if status, page := g.newPerson(t).caSignInAtZitadel(g, "alice", password); status != http.StatusOK || !strings.Contains(page, caSignedInAs(alice)) {
		t.Fatalf("alice's own sign-in: %d\n%.2000s", status, page)
	}
	// Mallory, with an unverified claim to alice's address.
	status, page := g.newPerson(t).caSignInAtZitadel(g, "mallory", password)
	if strings.Contains(page, caSignedInAs(alice)) {
		t.Errorf("mallory, whose email the provider has not verified, is signed in to the console as %s (%d, page %q)",
			alice, status, caBetween(page, `<span class="user"`, "</span>"))
	}
}

// An administrator revokes a person's API key (and with it their admin
// group) and reloads. The API refuses the key at once, and so must the
// console: a sign-in made with that key must not live on with the user and
// groups it had (reading everyone's activity as an admin, creating
// sessions, storing tokens, deciding approvals, accepting tool pins) until
// it idles out. The API and the console are documented to apply the same
// rules.
func TestConsoleAttackRevokedAPIKeyKeepsItsConsoleSignIn(t *testing.T) {
	const malloryKey = "test-key-mallory-revoked"
	const mallory = "mallory@example.test"
	up := startUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, AuthExtra: "api_key " + hashKey(malloryKey) + " " + mallory + " admins"}
	g := startGatewayOnPort(t, port, cfg)
	browser := g.signedIn(t, malloryKey)
	if _, page := browser.get(g.URL + "/console/activity?everyone=1"); !strings.Contains(page, "Recent decisions of everyone") {
		t.Fatalf("the control: mallory, an admin, does not see everyone's activity:\n%.2000s", page)
	}

	// The key is revoked: the same gateway, the same storage, without it.
	cfg.AuthExtra, cfg.DataDir = "", g.DataDir
	g = startGatewayOnPort(t, port, cfg)
	// The old server stops accepting a moment after the reload returns:
	// wait until new connections reach only the new one, which refuses the
	// key at the API.
	for refused, deadline := 0, time.Now().Add(5*time.Second); refused < 5; time.Sleep(50 * time.Millisecond) {
		g.pool.CloseIdleConnections()
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		// A connection the old server closes as it stops answers nothing:
		// asked again on the next round.
		req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/catalog", nil)
		req.Header.Set("Authorization", "Bearer "+malloryKey)
		status := 0
		if resp, err := (&http.Client{Transport: g.transport()}).Do(req); err == nil {
			status = resp.StatusCode
			resp.Body.Close()
		}
		if status == http.StatusUnauthorized {
			refused++
		} else if refused = 0; time.Now().After(deadline) {
			t.Fatalf("the revoked key at the API: %d, want 401", status)
		}
	}
	if _, page := browser.get(g.URL + "/console/activity?everyone=1"); strings.Contains(page, "Recent decisions of everyone") || !strings.Contains(page, "Sign in") {
		t.Errorf("after its key was revoked, mallory's console sign-in still shows everyone's activity (admin): %q",
			caBetween(page, `<span class="user"`, "</span>"))
	}
	if _, page := browser.get(g.URL + "/console/sessions"); !strings.Contains(page, "Sign in") {
		t.Errorf("after its key was revoked, mallory's console sign-in still shows her sessions:\n%.1000s", page)
	}
}

// The protected-resource metadata is cacheable for an hour
// (Cache-Control: max-age=3600) and its CORS headers depend on the
// request's Origin, yet an answer to a request without Origin (any runner,
// curl, a health check) carries no "Vary: Origin". A shared cache in front
// of the gateway stores that answer and serves it to the browser clients of
// allowed origins, which then cannot read it (no
// Access-Control-Allow-Origin): one request poisons discovery for every
// browser-based MCP client for an hour.
func TestCORSAttackCacheableMetadataDoesNotVaryOnOrigin(t *testing.T) {
	const allowed = "http://localhost:6274"
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "allowed_origins " + allowed})
	path := "/.well-known/oauth-protected-resource/v1/mcp/svc"
	withOrigin := caGet(t, g.URL+path, map[string]string{"Origin": allowed})
	if withOrigin.Header.Get("Access-Control-Allow-Origin") != allowed {
		t.Fatalf("the control: an allowed origin's request gets %q", withOrigin.Header.Get("Access-Control-Allow-Origin"))
	}
	plain := caGet(t, g.URL+path, nil)
	if plain.StatusCode != http.StatusOK || !strings.Contains(plain.Header.Get("Cache-Control"), "max-age") {
		t.Fatalf("the metadata without Origin: %d, Cache-Control %q", plain.StatusCode, plain.Header.Get("Cache-Control"))
	}
	if !caVaries(plain.Header, "Origin") {
		t.Errorf("the cacheable metadata answered without Origin has Vary %q and Cache-Control %q: a shared cache serves it, without Access-Control-Allow-Origin, to %s",
			plain.Header.Values("Vary"), plain.Header.Get("Cache-Control"), allowed)
	}
}

// ---------------------------------------------------------------------------
// Holds
// ---------------------------------------------------------------------------

// Holds: a hostile page cannot sign a victim in to the attacker's account
// (login CSRF) from a null, lookalike, other-port or differently-cased
// origin, nor without Origin unless the browser says same-origin; a
// session id planted in the victim's browser is replaced at sign-in
// (fixation); a sign-in's return address never leaves the gateway.
func TestConsoleAttackHoldsLoginCSRFFixationAndOpenRedirect(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp"})
	port := g.URL[strings.LastIndexByte(g.URL, ':')+1:]
	for _, c := range []struct{ origin, fetchSite string }{
		{"null", ""},
		{g.URL + ".evil.example", ""},
		{"http://127.0.0.1.evil.example:" + port, ""},
		{"http://127.0.0.1:1" + port, ""},
		{"HTTP://127.0.0.1:" + port, ""},
		{"http://localhost:" + port, ""},
		{"", "same-site"},
		{"", "cross-site"},
		{"", ""},
	} {
		p := g.newPerson(t)
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/console/signin", strings.NewReader(url.Values{"api_key": {bobKey}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		if c.fetchSite != "" {
			req.Header.Set("Sec-Fetch-Site", c.fetchSite)
		}
		resp := caNoFollow(t, p.client, req)
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Set-Cookie") != "" {
			t.Errorf("a sign-in form with Origin %q, Sec-Fetch-Site %q: %d, Set-Cookie %q", c.origin, c.fetchSite, resp.StatusCode, resp.Header.Get("Set-Cookie"))
		}
	}

	// Fixation: bob's live session id planted in alice's browser.
	bobB := g.signedIn(t, bobKey)
	planted := caCookie(bobB.client.Jar.Cookies(mustURL(t, g.URL)), "toolgate_session")
	victim := g.newPerson(t)
	victim.client.Jar.SetCookies(mustURL(t, g.URL), []*http.Cookie{{Name: "toolgate_session", Value: planted, Path: "/"}})
	victim.post(g.URL+"/console/signin", url.Values{"api_key": {aliceKey}})
	if now := caCookie(victim.client.Jar.Cookies(mustURL(t, g.URL)), "toolgate_session"); now == "" || now == planted {
		t.Errorf("signing in kept the planted session id")
	}
	if _, page := bobB.get(g.URL + "/console/services"); !strings.Contains(page, caSignedInAs(bob)) {
		t.Errorf("the planted session no longer names bob")
	}

	// Open redirect: every return address lands on this origin.
	for _, back := range []string{"https://evil.example/x", "//evil.example/x", "/\\evil.example", "/console/..//evil.example",
		"/console//evil.example", "/console/\\/evil.example", "/console/%0d%0aLocation:%20https://evil.example", "/console/%2f%2fevil.example"} {
		p := g.newPerson(t)
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/console/signin", strings.NewReader(url.Values{"api_key": {aliceKey}, "return": {back}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", g.URL)
		resp := caNoFollow(t, p.client, req)
		loc := resp.Header.Get("Location")
		target, err := mustURL(t, g.URL).Parse(loc)
		if resp.StatusCode != http.StatusSeeOther || err != nil || target.Host != mustURL(t, g.URL).Host || strings.ContainsAny(loc, "\\\r\n\t") {
			t.Errorf("return %q: %d to %q", back, resp.StatusCode, loc)
		}
	}
}

// Holds: login CSRF through OpenID Connect. The attacker signs in at the
// real provider as themselves and stops before the redirect back; the
// victim's browser opening that callback URL (code and state of the
// attacker's sign-in) is not signed in to anything, and once the attacker
// completed it, the same callback replayed is refused.
func TestConsoleAttackHoldsOIDCLoginCSRFAndCallbackReplay(t *testing.T) {
	const password = "correct horse battery staple"
	const mallory = "mallory@example.test"
	issuer := caStartProvider(t, map[string]*storage.User{
		"mallory-id": {ID: "mallory-id", Username: "mallory", Password: password, Email: mallory, EmailVerified: true},
	})
	port := freePort(t)
	gwURL := "http://127.0.0.1:" + caItoa(port)
	storage.RegisterClients(storage.WebClient("attack-console-csrf", "attack-secret", gwURL+"/console/signin/callback"))
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "state_secret " + testStateSecret,
		Console: "oidc " + issuer + " {\n\t\t\tclient_id attack-console-csrf\n\t\t\tclient_secret attack-secret\n\t\t\tuser_claim email\n\t\t}"})

	attacker := g.newPerson(t)
	var callback string
	attacker.client.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), gwURL+"/console/signin/callback") {
			callback = req.URL.String()
			return http.ErrUseLastResponse
		}
		return nil
	}
	attacker.caSignInAtZitadel(g, "mallory", password)
	if callback == "" {
		t.Fatal("the provider did not send the attacker back to the console")
	}
	victim := g.newPerson(t)
	if status, page := victim.get(callback); status != http.StatusBadRequest || strings.Contains(page, caSignedInAs(mallory)) ||
		caCookie(victim.client.Jar.Cookies(mustURL(t, g.URL)), "toolgate_session") != "" {
		t.Errorf("the victim opening the attacker's callback: %d %q", status, caBetween(page, "<h1>", "</h1>"))
	}
	attacker.client.CheckRedirect = nil
	if _, page := attacker.get(callback); !strings.Contains(page, caSignedInAs(mallory)) {
		t.Fatalf("the control: the attacker's own browser does not complete the sign-in:\n%.2000s", page)
	}
	replay := g.newPerson(t)
	replay.client.Jar.SetCookies(mustURL(t, g.URL), attacker.client.Jar.Cookies(mustURL(t, g.URL)))
	for _, p := range []*person{attacker, replay} {
		if status, page := p.get(callback); status != http.StatusBadRequest {
			t.Errorf("the callback replayed: %d %q", status, caBetween(page, "<h1>", "</h1>"))
		}
	}
}

// Holds: on an https gateway the browser session cookie is __Host-,
// Secure, HttpOnly and SameSite=Lax; pages that change things may not be
// framed; signing out ends the stolen cookie's session for good.
func TestConsoleAttackHoldsCookieFlagsAndSignOut(t *testing.T) {
	const public = "https://gw.example.test"
	port := freePort(t)
	caddyfile, _ := gatewayCaddyfile(t, port, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp"})
	caddyfile = strings.Replace(caddyfile, "public_url http://127.0.0.1:"+caItoa(port), "public_url "+public, 1)
	loadCaddyfile(t, caddyfile)
	base := "http://127.0.0.1:" + caItoa(port)
	waitListening(t, base)

	req, _ := http.NewRequest(http.MethodPost, base+"/console/signin", strings.NewReader(url.Values{"api_key": {aliceKey}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", public)
	resp := caNoFollow(t, http.DefaultClient, req)
	set := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"__Host-toolgate_session=", "Path=/", "HttpOnly", "Secure", "SameSite=Lax"} {
		if !strings.Contains(set, want) {
			t.Errorf("the session cookie %q lacks %s", set, want)
		}
	}
	if strings.Contains(strings.ToLower(set), "domain=") {
		t.Errorf("the session cookie %q names a domain", set)
	}
	cookie := strings.SplitN(set, ";", 2)[0]
	page := func() (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, base+"/console/sessions", nil)
		req.Header.Set("Cookie", cookie)
		resp := caNoFollow(t, http.DefaultClient, req)
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	r, body := page()
	if r.StatusCode != http.StatusOK || r.Header.Get("X-Frame-Options") != "DENY" || !strings.Contains(r.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("the sessions page: %d, X-Frame-Options %q, CSP %q", r.StatusCode, r.Header.Get("X-Frame-Options"), r.Header.Get("Content-Security-Policy"))
	}
	csrf := csrfField.FindStringSubmatch(body)
	if csrf == nil {
		t.Fatal("no CSRF token on the sessions page")
	}
	req, _ = http.NewRequest(http.MethodPost, base+"/console/signout", strings.NewReader(url.Values{"csrf": {csrf[1]}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", public)
	req.Header.Set("Cookie", cookie)
	if resp := caNoFollow(t, http.DefaultClient, req); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("signing out: %d", resp.StatusCode)
	}
	if r, _ := page(); r.StatusCode != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), "/console/signin") {
		t.Errorf("the signed-out cookie, replayed: %d to %q", r.StatusCode, r.Header.Get("Location"))
	}
}

// Holds: a person's name, as an OpenID provider states it, is shown as text
// on every page (no stored XSS through claims), and an admin's activity
// filter is reflected as text.
func TestConsoleAttackHoldsXSSThroughClaims(t *testing.T) {
	idp := startHostileIssuer(t)
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:1/mcp", Extra: "state_secret " + testStateSecret,
		Console: "oidc " + idp.URL + " {\n\t\t\tclient_id console-client\n\t\t\tclient_secret console-secret\n\t\t\tuser_claim email\n\t\t}"})
	const evil = `"><img src=x onerror=alert(1)><script>alert(2)</script>@evil.example`
	idp.shape(func(c map[string]any) map[string]any {
		c["email"], c["groups"] = evil, []string{"admins", `</span><script>alert(3)</script>`}
		return c
	}, nil, nil)
	p := g.newPerson(t)
	for _, u := range []string{"/console/signin/oidc/0", "/console/sessions", "/console/approvals",
		"/console/activity?user=" + url.QueryEscape(`"><script>alert(4)</script>`)} {
		_, page := p.get(g.URL + u)
		if strings.Contains(page, "<img src=x") || strings.Contains(page, "<script>alert") {
			t.Errorf("%s renders markup from a claim or the query:\n%.3000s", u, page)
		}
		if !strings.Contains(page, "&lt;img src=x onerror=alert(1)&gt;") {
			t.Errorf("%s does not show the person's name as text", u)
		}
	}
}

// Holds: CORS names only the exact allowed origins — not lookalikes that
// add a suffix, change the scheme, port or case, add a trailing dot, or are
// null — never sends Access-Control-Allow-Credentials, never lets a page
// send a Cookie header, answers console pages with no CORS header at all,
// and a console sign-in cookie does not authenticate an MCP request.
func TestCORSAttackHoldsExactOriginsWithoutCredentials(t *testing.T) {
	const allowed = "http://localhost:6274"
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "allowed_origins " + allowed})
	preflight := func(path, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, g.URL+path, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, cookie, x-evil")
		return caNoFollow(t, http.DefaultClient, req)
	}
	for _, origin := range []string{"null", "https://localhost:6274", "http://localhost:62740", "http://localhost:6274.evil.example",
		"http://evil.localhost:6274", "http://LOCALHOST:6274", "http://localhost.:6274", "http://localhost:6274/", "http://localhost"} {
		for _, path := range []string{"/v1/mcp/svc", "/v1/sessions", "/.well-known/oauth-protected-resource/v1/mcp/svc"} {
			resp := preflight(path, origin)
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("preflight of %s from %q: %d, Allow-Origin %q", path, origin, resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
			}
		}
		resp := caGet(t, g.URL+"/.well-known/oauth-protected-resource", map[string]string{"Origin": origin})
		if resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("the metadata for %q names it: %q", origin, resp.Header.Get("Access-Control-Allow-Origin"))
		}
	}
	for _, path := range []string{"/v1/mcp/svc", "/v1/sessions"} {
		resp := preflight(path, allowed)
		h := resp.Header
		if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != allowed || h.Get("Access-Control-Allow-Credentials") != "" ||
			h.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
			t.Errorf("preflight of %s from the allowed origin: %d %v", path, resp.StatusCode, h)
		}
	}

	// A page of the allowed origin with a person's console cookie: the
	// console answers without CORS headers, and the cookie is no credential.
	aliceB := g.signedIn(t, aliceKey)
	cookie := "toolgate_session=" + caCookie(aliceB.client.Jar.Cookies(mustURL(t, g.URL)), "toolgate_session")
	resp := caGet(t, g.URL+"/console/sessions", map[string]string{"Origin": allowed, "Cookie": cookie})
	if resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("a console page answers a foreign page with CORS headers: %v", resp.Header)
	}
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/mcp/svc", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"page","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Origin", allowed)
	req.Header.Set("Cookie", cookie)
	resp = caNoFollow(t, http.DefaultClient, req)
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("an MCP request carrying only the console cookie: %d %v", resp.StatusCode, resp.Header)
	}
}

// Holds: a JWT whose audience is one endpoint (what an MCP client gets
// for that endpoint's resource) opens an implied session there and
// nowhere else — not another service, not its escaped or slash-appended
// variants, not the API; another caller cannot take over the implied MCP
// session even with a session of their own; and forwarding headers do not
// move the challenge or the metadata to another host.
func TestImpliedAttackHoldsEndpointAudienceAndForwardedHeaders(t *testing.T) {
	key := newJWTKey(t, "k1")
	up := startUpstream(t)
	port := freePort(t)
	gwURL := "http://127.0.0.1:" + caItoa(port)
	g := startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL,
		AuthExtra: "jwt {\n\t\t\t\tissuer " + jwtIssuer + "\n\t\t\t\taudience toolgate-test\n\t\t\t\tkey_file " + jwksFile(t, key) + "\n\t\t\t}",
		Services:  "service other {\n\t\t\turl " + up.URL + "\n\t\t\tallow_http\n\t\t\ttools echo\n\t\t}"})
	token := key.sign(t, map[string]any{"iss": jwtIssuer, "aud": gwURL + "/v1/mcp/svc", "sub": alice, "exp": time.Now().Add(time.Hour).Unix()})
	init := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

	m := g.raw(t, token, "", "svc")
	delete(m.headers, "X-Toolgate-Session")
	m.initialize()
	for _, path := range []string{"/v1/mcp/other", "/v1/mcp/other/", "/v1/mcp/%6fther", "/v1/mcp/svc/../other"} {
		o := &rawMCP{t: t, url: g.URL + path, transport: g.transport(), headers: map[string]string{"Authorization": "Bearer " + token}}
		if status, _, msgs := o.post(init); status != http.StatusUnauthorized {
			t.Errorf("svc's token at %s: %d %s", path, status, msgs)
		}
	}
	if r := g.api(t, http.MethodPost, "/v1/sessions", token, []byte(`{"services":["svc"]}`)); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("svc's token at the API: %d %s", r.StatusCode, r.Body)
	}

	// Bob, with alice's implied MCP session, with and without a session of his own.
	for _, session := range []string{"", g.createSession(t, bobKey, "svc")} {
		b := g.raw(t, bobKey, session, "svc")
		if session == "" {
			delete(b.headers, "X-Toolgate-Session")
		}
		b.sessionID = m.sessionID
		if status, _, _ := b.post(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`); status != http.StatusForbidden {
			t.Errorf("bob (session %q) with alice's implied MCP session: %d, want 403", session, status)
		}
	}

	// Forwarding headers choose nothing.
	hostile := map[string]string{"X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https", "Forwarded": "host=evil.example;proto=https",
		"X-Original-Host": "evil.example"}
	anon := &rawMCP{t: t, url: g.URL + "/v1/mcp/svc", transport: g.transport(), headers: hostile}
	_, hdr, _ := anon.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	if want := `Bearer resource_metadata="` + gwURL + `/.well-known/oauth-protected-resource/v1/mcp/svc"`; hdr.Get("WWW-Authenticate") != want {
		t.Errorf("the challenge with forwarding headers: %q, want %q", hdr.Get("WWW-Authenticate"), want)
	}
	resp := caGet(t, g.URL+"/.well-known/oauth-protected-resource/v1/mcp/svc", hostile)
	var meta struct{ Resource string }
	_ = json.NewDecoder(resp.Body).Decode(&meta)
	if meta.Resource != gwURL+"/v1/mcp/svc" {
		t.Errorf("the metadata with forwarding headers names %q", meta.Resource)
	}
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// caStartProvider runs zitadel's example OpenID provider (as
// startExampleProvider does) with the given users, and returns its issuer.
func caStartProvider(t *testing.T, users map[string]*storage.User) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + l.Addr().String()
	file := filepath.Join(t.TempDir(), "users.json")
	data, _ := json.Marshal(users)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := storage.StoreFromFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var s exampleop.Storage = storage.NewStorage(store)
	srv := &http.Server{Handler: exampleop.SetupServer(issuer, s, nil, false), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return issuer
}

// caSignInAtZitadel is a person signing in to the console with the first
// OpenID provider, whose login page takes username and password; it
// returns the console page the browser ends on.
func (p *person) caSignInAtZitadel(g *gateway, username, password string) (int, string) {
	p.t.Helper()
	resp, err := p.client.Get(g.URL + "/console/signin/oidc/0")
	if err != nil {
		p.t.Fatal(err)
	}
	resp.Body.Close()
	login := resp.Request.URL
	id := login.Query().Get("authRequestID")
	if id == "" {
		p.t.Fatalf("the provider did not show its login page (at %s, %s)", login, resp.Status)
	}
	form := url.Values{"id": {id}, "username": {username}, "password": {password}}
	req, _ := http.NewRequest(http.MethodPost, login.Scheme+"://"+login.Host+"/login/username", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = p.client.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// caSignedInAs is how a console page names the person signed in.
func caSignedInAs(user string) string {
	return `">` + user + `</span>`
}

func caBetween(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	rest, _, _ = strings.Cut(rest, to)
	return rest
}

func caItoa(n int) string { return strconv.Itoa(n) }

// caGet sends a GET with headers
// and returns the answer, its body unread.
func caGet(t testing.TB, u string, headers map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return caNoFollow(t, http.DefaultClient, req)
}

// caNoFollow sends req with client's cookies but follows no redirect; the
// body is closed when the test ends.
func caNoFollow(t testing.TB, client *http.Client, req *http.Request) *http.Response {
	t.Helper()
	c := *client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func caCookie(cookies []*http.Cookie, name string) string {
	for _, c := range cookies {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// caVaries reports whether the Vary header lists name (or is "*").
func caVaries(h http.Header, name string) bool {
	for _, line := range h.Values("Vary") {
		for v := range strings.SplitSeq(line, ",") {
			if v = strings.TrimSpace(v); v == "*" || strings.EqualFold(v, name) {
				return true
			}
		}
	}
	return false
}
