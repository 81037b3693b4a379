package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// consoleGateway is a gateway with a bearer service "tok" besides "svc",
// and a service "alice-only" that only alice may use.
func consoleGateway(t testing.TB) (*upstream, *gateway) {
	t.Helper()
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Services: `service tok {
			title "Token service"
			url ` + up.URL + `
			allow_http
			tools echo
			auth bearer
		}
		service alice-only {
			url ` + up.URL + `
			allow_http
			tools echo
			allowed_users ` + alice + `
		}`})
	return up, g
}

func TestConsoleSignInAndSignOut(t *testing.T) {
	_, g := consoleGateway(t)
	anon := g.newPerson(t)

	// A page needs a sign-in, and comes back to it after.
	noFollow := *anon.client
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noFollow.Get(g.URL + "/console/sessions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/console/signin?return=%2Fconsole%2Fsessions" {
		t.Fatalf("an anonymous page view: %d to %q", resp.StatusCode, loc)
	}

	// A wrong key says so; a sign-in from another site is refused (login CSRF).
	if status, page := anon.post(g.URL+"/console/signin", url.Values{"api_key": {"wrong"}}); status != http.StatusUnauthorized || !strings.Contains(page, "not known") {
		t.Fatalf("a wrong API key: %d %s", status, page)
	}
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/console/signin", strings.NewReader(url.Values{"api_key": {aliceKey}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if resp, err := anon.client.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a cross-site sign-in: %v %v", resp, err)
	}
	if status, page := anon.post(g.URL+"/console/signin?", url.Values{"api_key": {aliceKey}, "return": {"https://evil.example/x"}}); status != http.StatusOK || !strings.Contains(page, "<h1>Services</h1>") {
		t.Fatalf("a sign-in asking to return to another site: %d (it must land on the console)", status)
	}

	// Sign-out ends the session on the server: the old cookie is dead.
	alice1 := g.signedIn(t, aliceKey)
	cookies := alice1.client.Jar.Cookies(mustURL(t, g.URL))
	_, page := alice1.get(g.URL + "/console/services")
	if status, page := alice1.post(g.URL+"/console/signout", url.Values{"csrf": {alice1.csrf(page)}}); status != http.StatusOK || !strings.Contains(page, "signed out") {
		t.Fatalf("sign-out: %d %s", status, page)
	}
	replay := g.newPerson(t)
	replay.client.Jar.SetCookies(mustURL(t, g.URL), cookies)
	if _, page := replay.get(g.URL + "/console/services"); !strings.Contains(page, "<h1>Sign in</h1>") {
		t.Fatal("the cookie of a signed-out session still works")
	}

	// Sign-out everywhere ends every browser of that person only.
	a, b := g.signedIn(t, aliceKey), g.signedIn(t, aliceKey)
	bobB := g.signedIn(t, bobKey)
	_, page = a.get(g.URL + "/console/services")
	if status, _ := a.post(g.URL+"/console/signout/everywhere", url.Values{"csrf": {a.csrf(page)}}); status != http.StatusOK {
		t.Fatalf("sign-out everywhere: %d", status)
	}
	if _, page := b.get(g.URL + "/console/services"); !strings.Contains(page, "<h1>Sign in</h1>") {
		t.Fatal("alice's other browser is still signed in after sign-out everywhere")
	}
	if _, page := bobB.get(g.URL + "/console/services"); !strings.Contains(page, "<h1>Services</h1>") {
		t.Fatal("alice signing out everywhere signed bob out")
	}
}

func mustURL(t testing.TB, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Every state change needs the person's CSRF token and a same-origin
// request; pages carry a strict CSP and may not be framed.
func TestConsoleRefusesForgedForms(t *testing.T) {
	_, g := consoleGateway(t)
	aliceB := g.signedIn(t, aliceKey)
	bobB := g.signedIn(t, bobKey)
	_, page := aliceB.get(g.URL + "/console/sessions")
	token := aliceB.csrf(page)
	_, bobPage := bobB.get(g.URL + "/console/sessions")

	send := func(origin, fetchSite string, form url.Values) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/console/sessions", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if fetchSite != "" {
			req.Header.Set("Sec-Fetch-Site", fetchSite)
		}
		resp, err := aliceB.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, c := range []struct {
		name              string
		origin, fetchSite string
		form              url.Values
	}{
		{"a cross-site form", "https://evil.example", "", url.Values{"csrf": {token}, "service": {"svc"}}},
		{"no Origin, cross-site fetch", "", "cross-site", url.Values{"csrf": {token}, "service": {"svc"}}},
		{"no Origin and no fetch metadata", "", "", url.Values{"csrf": {token}, "service": {"svc"}}},
		{"no CSRF token", g.URL, "", url.Values{"service": {"svc"}}},
		{"bob's CSRF token", g.URL, "", url.Values{"csrf": {aliceB.csrf(bobPage)}, "service": {"svc"}}},
	} {
		if status, page := send(c.origin, c.fetchSite, c.form); status != http.StatusForbidden || !strings.Contains(page, "nothing was changed") {
			t.Errorf("%s: %d %s", c.name, status, page)
		}
	}
	if sessions := g.listSessions(t, aliceB); len(sessions) != 0 {
		t.Fatalf("forged forms created sessions: %v", sessions)
	}
	if status, _ := send("", "same-origin", url.Values{"csrf": {token}, "service": {"svc"}}); status != http.StatusCreated {
		t.Fatalf("a same-origin form without Origin: %d", status)
	}

	resp, err := http.Get(g.URL + "/console/signin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("security headers: CSP %q, X-Frame-Options %q", csp, resp.Header.Get("X-Frame-Options"))
	}
}

// The end-session form names a session by its fingerprint in the URL. An
// escaped path in its place (the router decodes "%2e%2e%2f%2e%2e" to
// "../..") ends nothing: not the storage directory, not bob's session.
func TestConsoleEndSessionTakesOnlyFingerprints(t *testing.T) {
	_, g := consoleGateway(t)
	bobSession := g.createSession(t, bobKey, "svc")
	aliceB := g.signedIn(t, aliceKey)
	_, page := aliceB.get(g.URL + "/console/sessions")
	token := aliceB.csrf(page)
	for _, ref := range []string{"%2e%2e", "%2e%2e%2f%2e%2e", "%2e%2e%2f%2e%2e%2f%2e%2e", "x%2f%2e%2e%2f%2e%2e"} {
		aliceB.post(g.URL+"/console/sessions/"+ref+"/end", url.Values{"csrf": {token}})
		if _, err := os.Stat(filepath.Join(g.DataDir, "toolgate", "sessions")); err != nil {
			t.Fatalf("ending session %q removed the stored sessions: %v", ref, err)
		}
	}
	if r := g.api(t, http.MethodGet, "/v1/sessions/"+bobSession, bobKey, nil); r.StatusCode != http.StatusOK {
		t.Fatalf("bob's session after alice ended escaped paths: %d %s", r.StatusCode, r.Body)
	}
	if _, page := aliceB.get(g.URL + "/console/sessions"); !strings.Contains(page, "<h1>Sessions</h1>") {
		t.Fatal("alice's own sign-in did not survive")
	}
}

// cardOf is the part of the Services page about service.
func cardOf(page, service string) string {
	_, card, _ := strings.Cut(page, `id="service-`+service+`"`)
	card, _, _ = strings.Cut(card, "</li>")
	return card
}

var sessionRow = regexp.MustCompile(`action="/console/sessions/([0-9a-f]{64})/end"`)

// listSessions returns the session refs the Sessions page lists.
func (g *gateway) listSessions(t testing.TB, p *person) []string {
	t.Helper()
	_, page := p.get(g.URL + "/console/sessions")
	var refs []string
	for _, m := range sessionRow.FindAllStringSubmatch(page, -1) {
		refs = append(refs, m[1])
	}
	return refs
}

// createConsoleSession creates a session with the picker and returns the
// page showing it.
func (p *person) createConsoleSession(services ...string) (int, string) {
	p.t.Helper()
	_, page := p.get(p.g.URL + "/console/sessions")
	return p.post(p.g.URL+"/console/sessions", url.Values{"csrf": {p.csrf(page)}, "service": services})
}

var inspectorSetup = regexp.MustCompile(`(?s)<code id="inspector-([^"]+)" data-setup="inspector"[^>]*>(.*?)</code>`)

// inspectorSetup reads the Inspector setup of service from a page, as a
// person copies it: the URL and the headers.
func inspectorSetupOf(t testing.TB, page, service string) (string, map[string]string) {
	t.Helper()
	for _, m := range inspectorSetup.FindAllStringSubmatch(page, -1) {
		if m[1] != service {
			continue
		}
		return parseSetup(t, htmlUnescape(m[2]))
	}
	t.Fatalf("no Inspector setup for %s on the page:\n%s", service, page)
	return "", nil
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&", "&#34;", `"`, "&#39;", "'").Replace(s)
}

// parseSetup reads "Transport: …", "URL: …" and header lines.
func parseSetup(t testing.TB, text string) (string, map[string]string) {
	t.Helper()
	headers := map[string]string{}
	var endpoint string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("setup line %q is not Name: value", line)
		}
		switch k {
		case "Transport":
		case "URL":
			endpoint = v
		default:
			headers[k] = v
		}
	}
	if endpoint == "" || len(headers) == 0 {
		t.Fatalf("the setup %q has no URL or headers", text)
	}
	return endpoint, headers
}

// connectWithSetup connects a go-sdk client with a setup copied from the
// console, the token placeholder replaced by key.
func connectWithSetup(t testing.TB, endpoint string, headers map[string]string, key string) *mcp.ClientSession {
	t.Helper()
	filled := map[string]string{}
	for k, v := range headers {
		filled[k] = strings.ReplaceAll(v, "<your token>", key)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "copied-setup", Version: "1"}, nil)
	transport := &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headerTransport{base: http.DefaultTransport, headers: filled}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connecting with the copied setup: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// A person stores a personal token, creates a session with the picker,
// uses the copied setup, and sees the decisions on the Activity page; no
// one else sees any of it.
func TestConsoleTokenSessionSetupAndActivity(t *testing.T) {
	up, g := consoleGateway(t)
	aliceB := g.signedIn(t, aliceKey)
	bobB := g.signedIn(t, bobKey)
	carolB := g.signedIn(t, carolKey) // an admin

	// A personal token for the bearer service, stored encrypted.
	_, page := aliceB.get(g.URL + "/console/services")
	if !strings.Contains(page, `id="service-tok"`) || !strings.Contains(page, "Sign in needed") || !strings.Contains(page, `id="service-alice-only"`) {
		t.Fatalf("alice's services page:\n%s", page)
	}
	const token = "personal-token-of-alice-0123456789"
	if status, page := aliceB.post(g.URL+"/console/services/tok/token", url.Values{"csrf": {aliceB.csrf(page)}, "token": {token}}); status != http.StatusOK || !strings.Contains(page, "is stored, encrypted") {
		t.Fatalf("storing a token: %d %s", status, page)
	}
	if status, page := aliceB.post(g.URL+"/console/services/tok/token", url.Values{"csrf": {aliceB.csrf(page)}, "token": {"two\nlines"}}); status != http.StatusOK || !strings.Contains(page, "one line") {
		t.Fatalf("storing a bad token: %d %s", status, page)
	}
	filepath.WalkDir(g.DataDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), token) {
				t.Errorf("%s holds the token in plaintext", p)
			}
		}
		return nil
	})
	_, page = aliceB.get(g.URL + "/console/services")
	if status, page := aliceB.post(g.URL+"/console/services/tok/test", url.Values{"csrf": {aliceB.csrf(page)}}); status != http.StatusOK || !strings.Contains(page, "Test passed") {
		t.Fatalf("testing the token: %d %s", status, page)
	}
	sawToken := false
	for _, h := range up.headers() {
		if h.Get("Authorization") == "Bearer "+token {
			sawToken = true
		}
	}
	if !sawToken {
		t.Error("the connection test did not send alice's token upstream")
	}

	// Bob sees neither alice's connection nor her service.
	_, page = bobB.get(g.URL + "/console/services")
	if strings.Contains(page, "alice-only") || !strings.Contains(cardOf(page, "tok"), "Sign in needed") {
		t.Fatalf("bob's services page shows alice's service or connection:\n%s", page)
	}
	if status, _ := bobB.get(g.URL + "/console/connect/alice-only"); status != http.StatusNotFound {
		t.Errorf("bob's connect page for alice's service: %d", status)
	}

	// A session with the picker; its Inspector setup works as copied.
	status, page := aliceB.createConsoleSession("svc", "tok")
	if status != http.StatusCreated || !strings.Contains(page, "cannot show it again") {
		t.Fatalf("creating a session: %d %s", status, page)
	}
	endpoint, headers := inspectorSetupOf(t, page, "svc")
	if endpoint != g.URL+"/v1/mcp/svc" || headers["Authorization"] != "Bearer <your token>" || headers["X-Toolgate-Session"] == "" {
		t.Fatalf("the Inspector setup: %s %v", endpoint, headers)
	}
	cs := connectWithSetup(t, endpoint, headers, aliceKey)
	ctx := context.Background()
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "from the copied setup"}}); err != nil || res.IsError {
		t.Fatalf("a call with the copied setup: %+v, %v", res, err)
	}
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "forbidden_tool", Arguments: map[string]any{}}); err != nil || !res.IsError {
		t.Fatalf("a denied call: %+v, %v", res, err)
	}
	refs := g.listSessions(t, aliceB)
	if len(refs) != 1 {
		t.Fatalf("alice's sessions page lists %d sessions, want 1", len(refs))
	}
	if _, list := aliceB.get(g.URL + "/console/sessions"); strings.Contains(list, headers["X-Toolgate-Session"]) {
		t.Error("the sessions page shows a session id again")
	}

	// Bob sees none of it, and cannot end alice's session by its ref.
	if refs := g.listSessions(t, bobB); len(refs) != 0 {
		t.Fatalf("bob's sessions page lists %v", refs)
	}
	_, page = bobB.get(g.URL + "/console/sessions")
	bobB.post(g.URL+"/console/sessions/"+g.listSessions(t, aliceB)[0]+"/end", url.Values{"csrf": {bobB.csrf(page)}})
	if len(g.listSessions(t, aliceB)) != 1 {
		t.Fatal("bob ended alice's session")
	}
	if r := g.api(t, http.MethodGet, "/v1/sessions/"+headers["X-Toolgate-Session"], bobKey, nil); r.StatusCode != http.StatusForbidden {
		t.Errorf("bob reading alice's session through the API: %d", r.StatusCode)
	}

	// Activity: alice sees her allow and deny with their reasons; bob sees
	// nothing of hers; carol, an admin, finds them with the filter.
	var activity string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		_, activity = aliceB.get(g.URL + "/console/activity")
		if strings.Contains(activity, "forbidden_tool is forbidden in tests") {
			break
		}
	}
	for _, want := range []string{`<span class="action allow">allow</span>`, `<span class="action deny">deny</span>`, "forbidden_tool is forbidden in tests", "<code>echo</code>"} {
		if !strings.Contains(activity, want) {
			t.Fatalf("alice's activity lacks %q:\n%s", want, activity)
		}
	}
	if _, page := bobB.get(g.URL + "/console/activity"); strings.Contains(page, "forbidden_tool") {
		t.Error("bob's activity shows alice's decisions")
	}
	if _, page := bobB.get(g.URL + "/console/activity?user=" + url.QueryEscape(alice)); strings.Contains(page, "forbidden_tool") {
		t.Error("bob, no admin, used the user filter")
	}
	if _, page := carolB.get(g.URL + "/console/activity?user=" + url.QueryEscape(alice)); !strings.Contains(page, "forbidden_tool is forbidden in tests") {
		t.Errorf("carol, an admin, does not see alice's decisions:\n%s", page)
	}

	// Ending the session refuses its runner.
	_, page = aliceB.get(g.URL + "/console/sessions")
	aliceB.post(g.URL+"/console/sessions/"+refs[0]+"/end", url.Values{"csrf": {aliceB.csrf(page)}})
	if n := len(g.listSessions(t, aliceB)); n != 0 {
		t.Fatalf("after ending it, %d sessions are listed", n)
	}
	r := g.api(t, http.MethodGet, "/v1/sessions/"+headers["X-Toolgate-Session"], aliceKey, nil)
	var body map[string]any
	_ = json.Unmarshal(r.Body, &body)
	if r.StatusCode != http.StatusNotFound {
		t.Errorf("the ended session through the API: %d %v", r.StatusCode, body)
	}

	// Disconnect forgets the token.
	_, page = aliceB.get(g.URL + "/console/services")
	if status, page := aliceB.post(g.URL+"/console/services/tok/disconnect", url.Values{"csrf": {aliceB.csrf(page)}}); status != http.StatusOK || !strings.Contains(page, "is disconnected") {
		t.Fatalf("disconnecting: %d %s", status, page)
	}
	if s := g.catalogService(t, aliceKey, "tok"); s.Status != "needs_sign_in" {
		t.Errorf("after disconnecting: %+v", s)
	}
}

// Pages say what went wrong and what to do, with the right status.
func TestConsoleErrorPages(t *testing.T) {
	_, g := consoleGateway(t)
	aliceB := g.signedIn(t, aliceKey)
	for _, c := range []struct {
		path   string
		status int
		want   string
	}{
		{"/console/nowhere", http.StatusNotFound, "no such page"},
		{"/console/connect/nope", http.StatusNotFound, "no service nope"},
		{"/console/connect/svc", http.StatusNotFound, "nothing to connect"},
		{"/console/signin/oidc/0", http.StatusNotFound, "no such sign-in"},
		{"/console/signin/callback?state=x&code=y", http.StatusBadRequest, "not started in this browser"},
	} {
		status, page := aliceB.get(g.URL + c.path)
		if status != c.status || !strings.Contains(page, c.want) {
			t.Errorf("%s: %d, want %d with %q:\n%s", c.path, status, c.status, c.want, page)
		}
	}
	_, page := aliceB.get(g.URL + "/console/sessions")
	if status, page := aliceB.post(g.URL+"/console/sessions", url.Values{"csrf": {aliceB.csrf(page)}}); status != http.StatusBadRequest || !strings.Contains(page, "Choose at least one service") {
		t.Errorf("a session without services: %d %s", status, page)
	}
	if status, page := aliceB.post(g.URL+"/console/sessions", url.Values{"csrf": {aliceB.csrf(page)}, "service": {"nope"}}); status != http.StatusBadRequest || !strings.Contains(page, "unknown service nope") {
		t.Errorf("a session with an unknown service: %d %s", status, page)
	}
	if status, page := aliceB.post(g.URL+"/console/services/svc/token", url.Values{"csrf": {aliceB.csrf(page)}, "token": {"x"}}); status != http.StatusOK || !strings.Contains(page, "only bearer services take a personal token") {
		t.Errorf("a token for a service without personal tokens: %d %s", status, page)
	}
}

// Every form that changes something — whatever it changes — is refused
// without the person's CSRF token, and from another site even with it.
func TestConsoleEveryChangeNeedsCSRFAndSameOrigin(t *testing.T) {
	_, g := approvalsGateway(t, "")
	sess := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, sess, "svc")
	m.initialize()
	pending := mustPend(t, m.call(1, "gated_tool", `{"text":"forged decisions"}`))
	aliceB := g.signedIn(t, aliceKey)
	refs := g.listSessions(t, aliceB)
	if len(refs) != 1 {
		t.Fatalf("alice's sessions: %v", refs)
	}
	_, page := aliceB.get(g.URL + "/console/services")
	token := aliceB.csrf(page)
	routes := []string{"signout", "signout/everywhere", "services/svc/test", "services/svc/disconnect", "services/svc/token",
		"connect/svc", "sessions", "sessions/" + refs[0] + "/end", "approvals",
		"approvals/" + pending.ApprovalID + "/approve", "approvals/" + pending.ApprovalID + "/deny"}
	for _, route := range routes {
		form := url.Values{"service": {"svc"}, "id": {pending.ApprovalID}, "action": {"approve"}, "token": {"t"}}
		for _, c := range []struct {
			name   string
			origin string
			csrf   string
		}{{"without a CSRF token", g.URL, ""}, {"from another site", "https://evil.example", token}, {"with a made-up token", g.URL, strings.Repeat("A", len(token))}} {
			if c.csrf != "" {
				form.Set("csrf", c.csrf)
			}
			req, _ := http.NewRequest(http.MethodPost, g.URL+"/console/"+route, strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", c.origin)
			resp, err := aliceB.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "nothing was changed") {
				t.Errorf("POST %s %s: %d", route, c.name, resp.StatusCode)
			}
		}
	}
	if r := g.api(t, http.MethodGet, "/v1/approvals/"+pending.ApprovalID, aliceKey, nil); !strings.Contains(string(r.Body), `"state":"pending"`) {
		t.Errorf("the approval after forged decisions: %s", r.Body)
	}
	if r := g.api(t, http.MethodGet, "/v1/sessions/"+sess, aliceKey, nil); r.StatusCode != http.StatusOK {
		t.Errorf("the session after a forged end: %d", r.StatusCode)
	}
	if _, page := aliceB.get(g.URL + "/console/services"); !strings.Contains(page, "<h1>Services</h1>") {
		t.Error("a forged sign-out signed alice out")
	}
}

// Another signed-in person can neither see nor decide someone's approval
// in the console, one at a time or in bulk; what people write (a note) is
// shown as text.
func TestConsoleApprovalsOfOthers(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"alice's call"}`))
	bobB := g.signedIn(t, bobKey)
	if status, page := bobB.get(g.URL + "/console/approvals/" + p.ApprovalID); status != http.StatusNotFound || strings.Contains(page, "alice's call") {
		t.Fatalf("bob opening alice's approval: %d", status)
	}
	_, page := bobB.get(g.URL + "/console/approvals")
	if strings.Contains(page, p.ApprovalID) {
		t.Fatal("bob's queue lists alice's approval")
	}
	token := bobB.csrf(page)
	bobB.post(g.URL+"/console/approvals/"+p.ApprovalID+"/approve", url.Values{"csrf": {token}, "scope": {"session"}})
	bobB.post(g.URL+"/console/approvals/"+p.ApprovalID+"/deny", url.Values{"csrf": {token}})
	if _, page := bobB.post(g.URL+"/console/approvals", url.Values{"csrf": {token}, "id": {p.ApprovalID}, "action": {"approve"}}); !strings.Contains(page, "Not decided") {
		t.Errorf("bob's bulk approval of alice's call does not say it was not decided")
	}
	if r := g.api(t, http.MethodGet, "/v1/approvals/"+p.ApprovalID, aliceKey, nil); !strings.Contains(string(r.Body), `"state":"pending"`) {
		t.Fatalf("after bob's attempts: %s", r.Body)
	}
	const note = `<img src=x onerror=alert(1)>"'`
	if r := g.decide(t, aliceKey, p.ApprovalID, false, "", note); r.StatusCode != http.StatusOK {
		t.Fatalf("denying: %d %s", r.StatusCode, r.Body)
	}
	aliceB := g.signedIn(t, aliceKey)
	for _, u := range []string{"/console/approvals", "/console/approvals/" + p.ApprovalID} {
		_, page := aliceB.get(g.URL + u)
		if strings.Contains(page, "<img") || !strings.Contains(page, "&lt;img src=x onerror=alert(1)&gt;") {
			t.Errorf("%s does not show the note as text", u)
		}
	}
}

// The page that shows a new session's id, the one time it is shown, is
// kept by no cache; nor is any other page of a signed-in person.
func TestConsolePagesAreNotCached(t *testing.T) {
	_, g := consoleGateway(t)
	aliceB := g.signedIn(t, aliceKey)
	_, page := aliceB.get(g.URL + "/console/sessions")
	form := url.Values{"csrf": {aliceB.csrf(page)}, "service": {"svc"}}
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/console/sessions", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", g.URL)
	resp, err := aliceB.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(body), `id="session-id"`) {
		t.Fatalf("creating a session: %d", resp.StatusCode)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" || resp.Header.Get("Referrer-Policy") != "same-origin" {
		t.Errorf("the page with the new session id: Cache-Control %q, Referrer-Policy %q", cc, resp.Header.Get("Referrer-Policy"))
	}
	for _, u := range []string{"/console/services", "/console/sessions", "/console/approvals", "/console/activity", "/console/connect/tok"} {
		resp, err := aliceB.client.Get(g.URL + u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if cc := resp.Header.Get("Cache-Control"); resp.StatusCode != http.StatusOK || cc != "no-store" {
			t.Errorf("%s: %d, Cache-Control %q", u, resp.StatusCode, cc)
		}
	}
}
