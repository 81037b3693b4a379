package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/seal"
)

// These tests run toolgate's OAuth client end to end against a real OAuth 2
// authorization server (oauthProvider, built with go-oauth2) and an
// upstream that accepts only that provider's valid access tokens. Time is
// controlled through token lifetimes of one or two seconds.

// testStateSecret signs OAuth state in the test gateways.
const testStateSecret = "integration-test-state-secret-0123456789"

// protectedUpstream is the go-sdk test upstream behind a resource server
// check: every request needs a valid, unexpired access token from the
// provider.
type protectedUpstream struct {
	URL string

	mu      sync.Mutex
	users   []string
	refused int
}

func startProtectedUpstream(t testing.TB, p *oauthProvider) *protectedUpstream {
	t.Helper()
	server := newTestServer(nil)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	u := &protectedUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, err := p.userOf(r.Context(), r.Header.Get("Authorization"))
		u.mu.Lock()
		if err != nil {
			u.refused++
		} else {
			u.users = append(u.users, user)
		}
		u.mu.Unlock()
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, "invalid token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL + "/mcp"
	return u
}

// seen returns the users of accepted requests and how many were refused.
func (u *protectedUpstream) seen() ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.users...), u.refused
}

// oauthBlock is the `auth oauth { … }` of a service using p.
func oauthBlock(p *oauthProvider, extra string) string {
	secret := ""
	if p.ClientSecret != "" {
		secret = "client_secret " + p.ClientSecret
	}
	return fmt.Sprintf(`oauth {
				authorization_url %s
				token_url %s
				client_id %s
				%s
				scopes tickets.read
				login_hint
				refresh_skew 200ms
				%s
			}`, p.AuthorizeURL, p.TokenURL, p.ClientID, secret, extra)
}

// oauthGateway starts a gateway whose service svc (and, with services, more)
// uses p, and registers its callback at p.
func oauthGateway(t testing.TB, p *oauthProvider, up *protectedUpstream, cfg gatewayConfig) *gateway {
	t.Helper()
	cfg.Upstream = up.URL
	cfg.Auth = oauthBlock(p, "")
	cfg.Extra = "state_secret " + testStateSecret + "\n" + cfg.Extra
	g := startGateway(t, cfg)
	p.allowRedirect(g.URL + "/v1/connections/svc/callback")
	return g
}

// connectURL asks the gateway where key's user connects service.
func (g *gateway) connectURL(t testing.TB, key, service string) string {
	t.Helper()
	resp := g.api(t, http.MethodPost, "/v1/connections/"+service+"/authorize", key, nil)
	var body struct {
		AuthorizeURL string `json:"authorize_url"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(resp.Body, &body) != nil || body.AuthorizeURL == "" {
		t.Fatalf("POST /v1/connections/%s/authorize: %d %s", service, resp.StatusCode, resp.Body)
	}
	return body.AuthorizeURL
}

// providerRedirect opens u at the provider like a browser, up to the
// provider's redirect back to the gateway's callback, and returns that
// callback URL without opening it.
func providerRedirect(t testing.TB, u string) *url.URL {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.StatusCode != http.StatusFound {
		t.Fatalf("the provider answered %d, Location %q; want a redirect", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc
}

// connectionFiles returns the stored connection records of service.
func (g *gateway) connectionFiles(t testing.TB, service string) map[string][]byte {
	t.Helper()
	return readFiles(t, filepath.Join(g.DataDir, "toolgate", "connections", service))
}

// countFiles counts the files under dir, at any depth.
func countFiles(t testing.TB, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return n
}

func readFiles(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// catalogService returns the caller's catalog entry of service.
func (g *gateway) catalogService(t testing.TB, key, service string) catalogView {
	t.Helper()
	resp := g.api(t, http.MethodGet, "/v1/catalog", key, nil)
	var body struct{ Services []catalogView }
	if resp.StatusCode != http.StatusOK || json.Unmarshal(resp.Body, &body) != nil {
		t.Fatalf("GET /v1/catalog: %d %s", resp.StatusCode, resp.Body)
	}
	for _, s := range body.Services {
		if s.ID == service {
			return s
		}
	}
	t.Fatalf("the catalog has no %s: %s", service, resp.Body)
	return catalogView{}
}

type catalogView struct {
	ID         string
	Status     string
	Connection *struct {
		RefreshCount int      `json:"refresh_count"`
		Scopes       []string `json:"scopes"`
	}
}

// rpcAnswer is a JSON-RPC response as toolgate sends it.
type rpcAnswer struct {
	Result json.RawMessage
	Error  *struct {
		Code    int
		Message string
		Data    struct {
			NeedsSignIn   bool   `json:"needs_sign_in"`
			ConnectURL    string `json:"connect_url"`
			ConnectMethod string `json:"connect_method"`
			Retryable     bool
		}
	}
}

// callEcho makes one tools/call on the raw MCP session and decodes the
// answer. It is safe from any goroutine.
func (m *rawMCP) callEcho(text string) (rpcAnswer, error) {
	id := strconv.Quote(text)
	body := `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"echo","arguments":{"text":` + id + `}}}`
	req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Mcp-Session-Id", m.sessionID)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rpcAnswer{}, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return rpcAnswer{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, line := range strings.Split(string(data), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(d, `"id":`+id) {
				data = []byte(d)
			}
		}
	}
	var a rpcAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		return a, fmt.Errorf("decoding %s: %v", data, err)
	}
	return a, nil
}

// mustEcho calls echo and fails unless the upstream answered.
func (m *rawMCP) mustEcho(t testing.TB, text string) {
	t.Helper()
	a, err := m.callEcho(text)
	if err != nil {
		t.Fatal(err)
	}
	if a.Error != nil || !strings.Contains(string(a.Result), text) {
		t.Fatalf("echo %q: result %s, error %+v", text, a.Result, a.Error)
	}
}

// waitExpiry sleeps until tokens issued by now with lifetime ttl have
// expired (and a bit more).
func waitExpiry(ttl time.Duration) { time.Sleep(ttl + 150*time.Millisecond) }

func TestOAuthConnectCallAndRefresh(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	sess := g.createSession(t, aliceKey, "svc")

	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "needs_sign_in" {
		t.Fatalf("catalog before connecting: %+v, want needs_sign_in", s)
	}
	// A call before connecting: needs_sign_in, with a connect URL: the
	// console's connect page, made for alice.
	m := g.raw(t, aliceKey, sess, "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	var first rpcAnswer
	wantConnect := g.URL + "/console/connect/svc?for=" + url.QueryEscape(alice)
	if len(msgs) != 1 || json.Unmarshal(msgs[0], &first) != nil || first.Error == nil || first.Error.Code != -32010 ||
		!first.Error.Data.NeedsSignIn || first.Error.Data.ConnectURL != wantConnect {
		t.Fatalf("initialize before connecting = %s, want -32010 needs_sign_in with connect_url %s", msgs, wantConnect)
	}
	// Many clients show the message only: it says where to connect too.
	if !strings.Contains(first.Error.Message, "connect it at "+wantConnect) {
		t.Errorf("the needs_sign_in message %q does not say where to connect (%s)", first.Error.Message, wantConnect)
	}
	if pending := countFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending")); pending != 0 {
		t.Fatalf("a needs_sign_in answer stored %d pending sign-ins; it must store nothing", pending)
	}

	// Connect in alice's browser, through the page the API points to.
	if got := g.connectURL(t, aliceKey, "svc"); got != wantConnect {
		t.Fatalf("POST /authorize = %s, want %s", got, wantConnect)
	}
	browser := g.signedIn(t, aliceKey)
	authURL := browser.startConnect(wantConnect)
	checkAuthorizeURL(t, authURL, p, g, up)
	status, page := browser.get(authURL)
	if status != http.StatusOK || !strings.Contains(page, "is connected") || !strings.Contains(page, "close this window") {
		t.Fatalf("callback page: %d %s", status, page)
	}
	authReqs := p.authorizeRequests()
	if len(authReqs) != 1 || authReqs[0].Get("resource") != up.URL || authReqs[0].Get("code_challenge_method") != "S256" {
		t.Fatalf("the provider's authorization requests: %v, want one with the resource and an S256 challenge", authReqs)
	}
	calls := p.calls()
	if len(calls) != 1 {
		t.Fatalf("the provider saw %d token requests, want 1 code exchange", len(calls))
	}
	ex := calls[0].Form
	if ex.Get("grant_type") != "authorization_code" || ex.Get("code_verifier") == "" || ex.Get("resource") != up.URL ||
		ex.Get("redirect_uri") != g.URL+"/v1/connections/svc/callback" || ex.Get("client_id") != p.ClientID ||
		ex.Get("client_secret") != p.ClientSecret || calls[0].BasicAuth || calls[0].Status != http.StatusOK {
		t.Fatalf("code exchange sent %v (basic auth %v), answered %d", redactForm(ex), calls[0].BasicAuth, calls[0].Status)
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" || s.Connection == nil ||
		s.Connection.RefreshCount != 0 || strings.Join(s.Connection.Scopes, " ") != "tickets.read" {
		t.Fatalf("catalog after connecting: %+v", s)
	}
	checkNoTokensAtRest(t, g, p)

	m.initialize()
	m.mustEcho(t, "first")
	if r := g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil); r.StatusCode != http.StatusOK || string(bytes.TrimSpace(r.Body)) != `{"ok":true}` {
		t.Fatalf("connection test: %d %s", r.StatusCode, r.Body)
	}

	// The access token expires: the next call refreshes it first, and
	// again after the next expiry.
	for i := 1; i <= 2; i++ {
		before := len(p.refreshes())
		waitExpiry(time.Second)
		m.mustEcho(t, fmt.Sprintf("after expiry %d", i))
		n := len(p.refreshes())
		if n != before+1 {
			t.Fatalf("after expiry %d the provider saw %d more refreshes, want 1", i, n-before)
		}
		if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" || s.Connection == nil || s.Connection.RefreshCount != n {
			t.Fatalf("catalog after refresh %d: %+v, want refresh_count %d", i, s, n)
		}
	}
	for _, r := range p.refreshes() {
		if r.Form.Get("resource") != up.URL || r.Form.Get("client_secret") != p.ClientSecret || r.BasicAuth || r.Status != http.StatusOK {
			t.Errorf("refresh sent %v (basic auth %v), answered %d", redactForm(r.Form), r.BasicAuth, r.Status)
		}
	}
	p.checkRotation(t)
	checkNoTokensAtRest(t, g, p)
	users, refused := up.seen()
	if refused != 0 {
		t.Errorf("the upstream refused %d requests: toolgate sent an expired or unknown token", refused)
	}
	for _, u := range users {
		if u != alice {
			t.Fatalf("the upstream saw user %q, want %q", u, alice)
		}
	}

	// DELETE forgets the grant.
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", r.StatusCode, r.Body)
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "needs_sign_in" {
		t.Fatalf("catalog after DELETE: %+v", s)
	}
	if files := g.connectionFiles(t, "svc"); len(files) != 0 {
		t.Fatalf("DELETE left %d connection records", len(files))
	}
	if r := g.api(t, http.MethodPost, "/v1/connections/svc/test", aliceKey, nil); !strings.Contains(string(r.Body), `"ok":false`) ||
		!strings.Contains(string(r.Body), `"needs_sign_in":true`) {
		t.Fatalf("connection test without a grant: %d %s", r.StatusCode, r.Body)
	}
	requireMetrics(t, g, oauthMetricNames...) // what the dashboard charts of OAuth
}

// checkAuthorizeURL checks an authorization URL toolgate built.
func checkAuthorizeURL(t testing.TB, raw string, p *oauthProvider, g *gateway, up *protectedUpstream) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for k, want := range map[string]string{
		"response_type":         "code",
		"client_id":             p.ClientID,
		"redirect_uri":          g.URL + "/v1/connections/svc/callback",
		"code_challenge_method": "S256",
		"resource":              up.URL,
		"scope":                 "tickets.read",
		"login_hint":            alice,
	} {
		if got := q.Get(k); got != want {
			t.Errorf("authorize URL %s = %q, want %q", k, got, want)
		}
	}
	if len(q.Get("code_challenge")) != 43 {
		t.Errorf("code_challenge %q is not a base64url SHA-256", q.Get("code_challenge"))
	}
	if raw, err := base64.RawURLEncoding.DecodeString(q.Get("state")); err != nil || bytes.Contains(raw, []byte(alice)) {
		t.Errorf("state %q is not sealed base64url (%v)", q.Get("state"), err)
	}
	if q.Has("client_secret") {
		t.Error("the authorize URL carries the client secret")
	}
}

// checkNoTokensAtRest reads the stored connection records and the provider's
// issued tokens: no token may appear in storage.
func checkNoTokensAtRest(t testing.TB, g *gateway, p *oauthProvider) {
	t.Helper()
	files := g.connectionFiles(t, "svc")
	if len(files) == 0 {
		t.Fatal("no connection record stored")
	}
	for _, c := range p.calls() {
		for _, tok := range []string{c.IssuedAccess, c.IssuedRefresh, c.Form.Get("code"), c.Form.Get("code_verifier")} {
			if tok == "" {
				continue
			}
			err := filepath.Walk(g.DataDir, func(path string, info os.FileInfo, err error) error {
				if err != nil || info.IsDir() {
					return err
				}
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				if bytes.Contains(b, []byte(tok)) {
					t.Errorf("%s holds a token or code in the clear", path)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// redactForm shows a token request without its secrets.
func redactForm(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		switch k {
		case "code", "code_verifier", "refresh_token", "client_secret":
			out.Set(k, fmt.Sprintf("[%d bytes]", len(vs[0])))
		default:
			out[k] = vs
		}
	}
	return out
}

func TestOAuthRefreshStampedeIsOneRefresh(t *testing.T) {
	// The first access token lives two seconds; the refreshed one an
	// hour, so any second refresh would be a duplicate.
	p := startOAuthProvider(t, providerConfig{AccessTTL: 2 * time.Second, RefreshedAccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	connectedAt := time.Now()
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if len(p.refreshes()) != 0 {
		t.Fatal("a refresh happened before the token expired")
	}
	time.Sleep(time.Until(connectedAt.Add(2*time.Second + 150*time.Millisecond)))

	errs := concurrentEchoes(50, m)
	for _, err := range errs {
		t.Error(err)
	}
	if n := len(p.refreshes()); n != 1 {
		t.Fatalf("50 concurrent calls with an expired token made %d refreshes at the provider, want exactly 1", n)
	}
	p.checkRotation(t)
	if _, refused := up.seen(); refused != 0 {
		t.Errorf("the upstream refused %d requests", refused)
	}
}

// concurrentEchoes makes n tools/call at once, spread over the sessions,
// and returns what went wrong.
func concurrentEchoes(n int, sessions ...*rawMCP) []error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	start := make(chan struct{})
	for i := range n {
		m := sessions[i%len(sessions)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			text := fmt.Sprintf("call-%d", i)
			a, err := m.callEcho(text)
			if err == nil && (a.Error != nil || !strings.Contains(string(a.Result), text)) {
				err = fmt.Errorf("call %d: result %s, error %+v", i, a.Result, a.Error)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

func TestOAuthProviderDownKeepsTheGrant(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	before := g.connectionFiles(t, "svc")

	p.stop()
	waitExpiry(time.Second)
	a, err := m.callEcho("provider down")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || a.Error.Code != -32011 || !a.Error.Data.Retryable || a.Error.Data.NeedsSignIn {
		t.Fatalf("a call while the provider is down: result %s, error %+v; want -32011 retryable", a.Result, a.Error)
	}
	if strings.Contains(a.Error.Message, p.URL) || strings.Contains(a.Error.Message, "127.0.0.1") {
		t.Errorf("the error shows the provider's address: %q", a.Error.Message)
	}
	after := g.connectionFiles(t, "svc")
	if len(after) != 1 || len(before) != 1 {
		t.Fatalf("connection records before %d, after %d; want the grant kept", len(before), len(after))
	}
	for k := range before {
		if !bytes.Equal(before[k], after[k]) {
			t.Fatal("the stored grant changed although the refresh failed")
		}
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" {
		t.Fatalf("catalog while the provider is down: %+v, want connected (the refresh token is kept)", s)
	}

	// The provider comes back: the kept refresh token works.
	refreshed := len(p.refreshes())
	p.restart(t)
	m.mustEcho(t, "provider back")
	if n := len(p.refreshes()); n != refreshed+1 {
		t.Fatalf("the provider saw %d refreshes after it came back, want 1", n-refreshed)
	}
	p.checkRotation(t)
}

func TestOAuthRejectedRefreshNeedsSignIn(t *testing.T) {
	// Refresh tokens expire with the access token: the refresh is refused
	// with invalid_grant.
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second, RefreshTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	waitExpiry(time.Second)

	a, err := m.callEcho("after expiry")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error == nil || a.Error.Code != -32010 || !a.Error.Data.NeedsSignIn || !strings.HasPrefix(a.Error.Data.ConnectURL, g.URL+"/console/connect/svc?") {
		t.Fatalf("a call after the provider rejected the refresh: result %s, error %+v; want -32010 needs_sign_in with a connect_url", a.Result, a.Error)
	}
	if !strings.Contains(a.Error.Message, "again at "+a.Error.Data.ConnectURL) {
		t.Errorf("the needs_sign_in message %q does not say where to connect again (%s)", a.Error.Message, a.Error.Data.ConnectURL)
	}
	refreshes := p.refreshes()
	if len(refreshes) == 0 || refreshes[len(refreshes)-1].Status != http.StatusUnauthorized {
		t.Fatalf("refreshes: %+v, want the last one answered 401 invalid_grant", refreshes)
	}
	for _, r := range refreshes[:len(refreshes)-1] {
		if r.Status != http.StatusOK {
			t.Fatalf("a refresh before the rejected one answered %d: toolgate kept using a rejected grant", r.Status)
		}
	}
	if files := g.connectionFiles(t, "svc"); len(files) != 0 {
		t.Fatalf("%d connection records left; the rejected grant must be deleted", len(files))
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "expired" {
		t.Fatalf("catalog after a rejected refresh: %+v, want expired", s)
	}

	// The connect_url from the error works as is, in alice's browser.
	status, page := g.signedIn(t, aliceKey).connect(a.Error.Data.ConnectURL)
	if status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("connecting with the connect_url: %d %s", status, page)
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" {
		t.Fatalf("catalog after connecting again: %+v", s)
	}
	// Connecting again made another connection (maybe to another account
	// at the provider): the MCP session of the old one is over, and the
	// runner initializes a new one.
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`); status != http.StatusNotFound || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "connected to the service again") {
		t.Fatalf("a call on the session of the old connection: %d %s, want 404", status, msgs)
	}
	m.sessionID = ""
	m.initialize()
	m.mustEcho(t, "connected again")
}

func TestOAuthStateIsVerifiedAndSingleUse(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Services: `service other {
			url ` + up.URL + `
			allow_http
			tools echo
			auth ` + oauthBlock(p, "") + `
		}`})
	browser := g.signedIn(t, aliceKey)
	cb := providerRedirect(t, browser.startConnect("svc"))
	code, state := cb.Query().Get("code"), cb.Query().Get("state")
	if code == "" || state == "" {
		t.Fatalf("the provider redirected to %s, want a code and the state", cb)
	}
	// The state is sealed with a key of the state_secret (AES-256-GCM,
	// bound to the service): the provider learns nothing of the person.
	keys, err := seal.New("toolgate/v1/oauth-state", []byte(testStateSecret))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(state)
	if err != nil {
		t.Fatalf("the state is not base64url: %v", err)
	}
	if bytes.Contains(raw, []byte(alice)) {
		t.Errorf("the state sent to the provider names the person: %q", raw)
	}
	payload, err := keys.Open(raw, []byte("svc"))
	if err != nil {
		t.Fatalf("the state does not open with the state_secret's key, bound to the service: %v", err)
	}
	var fields map[string]any
	if err := json.Unmarshal(payload, &fields); err != nil {
		t.Fatal(err)
	}
	reseal := func(change func(map[string]any)) string {
		f := map[string]any{}
		for k, v := range fields {
			f[k] = v
		}
		change(f)
		p, _ := json.Marshal(f)
		return base64.RawURLEncoding.EncodeToString(keys.Seal(p, []byte("svc")))
	}
	other, _ := seal.New("toolgate/v1/oauth-state", []byte(strings.ToUpper(testStateSecret)))
	flipped := []byte(state)
	flipped[len(flipped)/2] ^= 1
	callback := func(service, state string) (int, string) {
		q := url.Values{"code": {code}, "state": {state}}
		return browser.get(g.URL + "/v1/connections/" + service + "/callback?" + q.Encode())
	}
	for _, c := range []struct{ name, service, state string }{
		{"altered", "svc", string(flipped)},
		{"sealed with another key", "svc", base64.RawURLEncoding.EncodeToString(other.Seal(payload, []byte("svc")))},
		{"expired", "svc", reseal(func(f map[string]any) { f["e"] = time.Now().Add(-time.Minute).Unix() })},
		{"another service", "other", state},
		{"no state", "svc", ""},
		{"garbage", "svc", "not-a-state"},
	} {
		status, page := callback(c.service, c.state)
		if status != http.StatusBadRequest || !strings.Contains(page, "invalid, has expired or was already used") {
			t.Errorf("%s: %d %s", c.name, status, page)
		}
		if len(p.calls()) != 0 {
			t.Fatalf("%s: the code was sent to the provider", c.name)
		}
		if n := len(g.connectionFiles(t, "svc")) + len(g.connectionFiles(t, "other")); n != 0 {
			t.Fatalf("%s: a connection was stored", c.name)
		}
	}

	// The genuine state works once.
	if status, page := callback("svc", state); status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("the genuine callback: %d %s", status, page)
	}
	stored := g.connectionFiles(t, "svc")
	if len(stored) != 1 {
		t.Fatalf("%d connection records, want 1", len(stored))
	}
	if status, page := callback("svc", state); status != http.StatusBadRequest || !strings.Contains(page, "already used") {
		t.Errorf("a replayed callback: %d %s", status, page)
	}
	if n := len(p.calls()); n != 1 {
		t.Errorf("the provider saw %d code exchanges, want 1 (a replay must not reach it)", n)
	}
	again := g.connectionFiles(t, "svc")
	for k := range stored {
		if !bytes.Equal(stored[k], again[k]) {
			t.Error("a replayed callback changed the stored grant")
		}
	}
	if pending := countFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending")); pending != 0 {
		t.Errorf("%d pending sign-ins left after the callback", pending)
	}
}

func TestOAuthProviderErrorIsAPage(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	// The provider refuses bob (access_denied) and sends him back.
	browser := g.signedIn(t, bobKey)
	cb := providerRedirect(t, browser.startConnect("svc"))
	if cb.Query().Get("error") != "access_denied" {
		t.Fatalf("the provider redirected to %s, want error=access_denied", cb)
	}
	status, page := browser.get(cb.String())
	if status != http.StatusBadRequest || !strings.Contains(page, "declined") || !strings.Contains(page, "access_denied") {
		t.Fatalf("error page: %d %s", status, page)
	}
	if len(g.connectionFiles(t, "svc")) != 0 || len(p.calls()) != 0 {
		t.Fatal("a declined sign-in stored a grant or reached the token endpoint")
	}
	if pending := countFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending")); pending != 0 {
		t.Errorf("%d pending sign-ins left: a declined sign-in's state must be consumed", pending)
	}
	// The same state cannot be used again, even with a code.
	q := cb.Query()
	q.Del("error")
	q.Set("code", "anything")
	if status, _ := browser.get(g.URL + "/v1/connections/svc/callback?" + q.Encode()); status != http.StatusBadRequest {
		t.Errorf("reusing a declined sign-in's state: %d", status)
	}
}

func TestOAuthPublicClientSendsNoSecret(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second, Public: true})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	waitExpiry(time.Second)
	m.mustEcho(t, "refreshed")
	calls := p.calls()
	if len(calls) < 2 || len(p.refreshes()) == 0 {
		t.Fatalf("%d token requests, want a code exchange and a refresh", len(calls))
	}
	for _, c := range calls {
		if c.Form.Has("client_secret") || c.BasicAuth || c.Form.Get("client_id") != p.ClientID || c.Status != http.StatusOK {
			t.Errorf("a public client's token request: %v (basic auth %v), answered %d", redactForm(c.Form), c.BasicAuth, c.Status)
		}
	}
}

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// An access token the provider revoked before its expiry (or one another
// replica replaced by refreshing) is refused by the upstream; toolgate
// refreshes the grant once and the call goes through.
func TestOAuthRefusedTokenIsRefreshedOnce(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "before")

	calls := p.calls()
	issued := calls[len(calls)-1].IssuedAccess
	if err := p.manager.RemoveAccessToken(context.Background(), issued); err != nil {
		t.Fatal(err)
	}
	m.mustEcho(t, "after")
	if n := len(p.refreshes()); n != 1 {
		t.Errorf("the provider saw %d refreshes, want 1", n)
	}
	if _, refused := up.seen(); refused != 1 {
		t.Errorf("the upstream refused %d requests, want exactly the one with the revoked token", refused)
	}
}

// A connect completes only in the browser, signed in to toolgate as the
// person it is for, that started it. The attack this stops: carol sends
// alice her connect link (or the provider URL her own browser was sent
// to); alice's browser, signed in at the provider, is redirected back
// silently, and alice's provider account would land in carol's slot —
// carol's calls would then act as alice upstream.
func TestOAuthConnectCompletesOnlyInTheBrowserThatStartedIt(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	aliceBrowser := g.signedIn(t, aliceKey)
	carolBrowser := g.signedIn(t, carolKey)
	pendingDir := filepath.Join(g.DataDir, "toolgate", "oauth-pending")
	nothingConnected := func(step string) {
		t.Helper()
		if n := len(g.connectionFiles(t, "svc")); n != 0 {
			t.Fatalf("%s: %d connections stored", step, n)
		}
		if n := len(p.calls()); n != 0 {
			t.Fatalf("%s: the provider saw %d token requests", step, n)
		}
	}

	// carol's connect link, opened by alice: refused before anything starts.
	carolLink := g.connectURL(t, carolKey, "svc")
	status, page := aliceBrowser.get(carolLink)
	if status != http.StatusForbidden || !strings.Contains(page, "made for <strong>"+carol) || strings.Contains(page, `name="csrf" value`) && strings.Contains(page, "Continue to") {
		t.Fatalf("alice opening carol's connect link: %d %s", status, page)
	}
	if n := countFiles(t, pendingDir); n != 0 {
		t.Fatalf("opening someone else's connect link started %d sign-ins", n)
	}

	// The provider URL carol's own browser was sent to, opened by alice (or
	// by a browser signed in to nobody): the callback refuses it.
	callback := providerRedirect(t, carolBrowser.startConnect(carolLink))
	for _, other := range []struct {
		name    string
		browser *person
	}{{"alice's browser", aliceBrowser}, {"a browser signed in to nobody", g.newPerson(t)}} {
		status, page := other.browser.get(callback.String())
		if status != http.StatusForbidden || !strings.Contains(page, "another toolgate user, or in another browser") {
			t.Fatalf("carol's callback in %s: %d %s", other.name, status, page)
		}
		nothingConnected(other.name)
	}
	// The refused flow is spent: not even carol's browser can finish it now.
	if status, page := carolBrowser.get(callback.String()); status != http.StatusBadRequest || !strings.Contains(page, "already used") {
		t.Fatalf("carol finishing his flow after another browser hit its callback: %d %s", status, page)
	}
	nothingConnected("the spent flow")

	// Signed in as carol in another browser is another browser too.
	otherCarol := g.signedIn(t, carolKey)
	callback = providerRedirect(t, carolBrowser.startConnect(carolLink))
	if status, _ := otherCarol.get(callback.String()); status != http.StatusForbidden {
		t.Fatalf("carol's callback in carol's other browser: %d", status)
	}
	nothingConnected("carol's other browser")

	// The browser that started it completes it.
	if status, page := carolBrowser.connect(carolLink); status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("carol connecting in his own browser: %d %s", status, page)
	}
	if n := len(g.connectionFiles(t, "svc")); n != 1 {
		t.Fatalf("%d connections stored, want carol's", n)
	}

	// Connecting again says it replaces the existing grant before anything
	// starts.
	status, page = carolBrowser.get(carolLink)
	if status != http.StatusOK || !strings.Contains(page, "Replace my connection") || !strings.Contains(page, "replaces") {
		t.Fatalf("the connect page of a connected service: %d %s", status, page)
	}
}

// Each person may have a bounded number of connects started and not
// finished: starting one more forgets the oldest.
func TestOAuthPendingConnectsAreBounded(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	browser := g.signedIn(t, aliceKey)
	var first string
	for i := range 12 {
		u := browser.startConnect("svc")
		if i == 0 {
			first = u
		}
	}
	if n := countFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending")); n != 5 {
		t.Fatalf("%d pending sign-ins after 12 started, want the newest 5", n)
	}
	if status, page := browser.get(first); status != http.StatusBadRequest || !strings.Contains(page, "already used") {
		t.Fatalf("the oldest started connect after 11 newer ones: %d %s", status, page)
	}
}
