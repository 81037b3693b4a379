package integration

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
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

// authorizeURL asks the gateway to start connecting service for key.
func (g *gateway) authorizeURL(t testing.TB, key, service string) string {
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

// browse opens u like a browser (following redirects) and returns the
// final status and page.
func browse(t testing.TB, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connectOAuth connects key's user to svc through the whole browser flow.
func (g *gateway) connectOAuth(t testing.TB, key string) {
	t.Helper()
	status, page := browse(t, g.authorizeURL(t, key, "svc"))
	if status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("connecting: %d %s", status, page)
	}
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
	// A call before connecting: needs_sign_in, with a connect URL that is a
	// started sign-in at the provider.
	m := g.raw(t, aliceKey, sess, "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	var first rpcAnswer
	if len(msgs) != 1 || json.Unmarshal(msgs[0], &first) != nil || first.Error == nil || first.Error.Code != -32010 ||
		!first.Error.Data.NeedsSignIn || !strings.HasPrefix(first.Error.Data.ConnectURL, p.AuthorizeURL+"?") {
		t.Fatalf("initialize before connecting = %s, want -32010 needs_sign_in with the provider's authorize URL", msgs)
	}
	checkAuthorizeURL(t, first.Error.Data.ConnectURL, p, g, up)

	// Connect through the browser flow, with the URL the API hands out.
	authURL := g.authorizeURL(t, aliceKey, "svc")
	checkAuthorizeURL(t, authURL, p, g, up)
	status, page := browse(t, authURL)
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
	if parts := strings.Split(q.Get("state"), "."); len(parts) != 2 {
		t.Errorf("state %q is not payload.signature", q.Get("state"))
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
	if a.Error == nil || a.Error.Code != -32010 || !a.Error.Data.NeedsSignIn || !strings.HasPrefix(a.Error.Data.ConnectURL, p.AuthorizeURL+"?") {
		t.Fatalf("a call after the provider rejected the refresh: result %s, error %+v; want -32010 needs_sign_in with a connect_url", a.Result, a.Error)
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

	// The connect_url from the error works as is.
	status, page := browse(t, a.Error.Data.ConnectURL)
	if status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("connecting with the connect_url: %d %s", status, page)
	}
	if s := g.catalogService(t, aliceKey, "svc"); s.Status != "connected" {
		t.Fatalf("catalog after connecting again: %+v", s)
	}
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
	cb := providerRedirect(t, g.authorizeURL(t, aliceKey, "svc"))
	code, state := cb.Query().Get("code"), cb.Query().Get("state")
	if code == "" || state == "" {
		t.Fatalf("the provider redirected to %s, want a code and the state", cb)
	}
	payloadB64, sig, _ := strings.Cut(state, ".")
	payload, err := base64.RawURLEncoding.DecodeString(payloadB64)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(payload []byte) string {
		mac := hmac.New(sha256.New, []byte(testStateSecret))
		mac.Write(payload)
		return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	}
	if sign(payload) != state {
		t.Fatal("the state is not base64url(payload).base64url(HMAC-SHA256(state_secret, payload))")
	}
	var fields map[string]any
	if err := json.Unmarshal(payload, &fields); err != nil {
		t.Fatal(err)
	}
	expired := map[string]any{}
	for k, v := range fields {
		expired[k] = v
	}
	expired["e"] = time.Now().Add(-time.Minute).Unix()
	expiredPayload, _ := json.Marshal(expired)
	forged := map[string]any{}
	for k, v := range fields {
		forged[k] = v
	}
	forged["u"] = bob
	forgedPayload, _ := json.Marshal(forged)

	flipped := []byte(sig)
	flipped[3] ^= 1
	callback := func(service, state string) (int, string) {
		q := url.Values{"code": {code}, "state": {state}}
		return browse(t, g.URL+"/v1/connections/"+service+"/callback?"+q.Encode())
	}
	for _, c := range []struct{ name, service, state string }{
		{"tampered signature", "svc", payloadB64 + "." + string(flipped)},
		{"payload changed (another user)", "svc", base64.RawURLEncoding.EncodeToString(forgedPayload) + "." + sig},
		{"expired", "svc", sign(expiredPayload)},
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
	if pending := readFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending")); len(pending) != 0 {
		t.Errorf("%d pending sign-ins left after the callback", len(pending))
	}
}

func TestOAuthProviderErrorIsAPage(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	// The provider refuses bob (access_denied) and sends him back.
	cb := providerRedirect(t, g.authorizeURL(t, bobKey, "svc"))
	if cb.Query().Get("error") != "access_denied" {
		t.Fatalf("the provider redirected to %s, want error=access_denied", cb)
	}
	status, page := browse(t, cb.String())
	if status != http.StatusBadRequest || !strings.Contains(page, "declined") || !strings.Contains(page, "access_denied") {
		t.Fatalf("error page: %d %s", status, page)
	}
	if len(g.connectionFiles(t, "svc")) != 0 || len(p.calls()) != 0 {
		t.Fatal("a declined sign-in stored a grant or reached the token endpoint")
	}
	if pending := readFiles(t, filepath.Join(g.DataDir, "toolgate", "oauth-pending")); len(pending) != 0 {
		t.Errorf("%d pending sign-ins left: a declined sign-in's state must be consumed", len(pending))
	}
	// The same state cannot be used again, even with a code.
	q := cb.Query()
	q.Del("error")
	q.Set("code", "anything")
	if status, _ := browse(t, g.URL+"/v1/connections/svc/callback?"+q.Encode()); status != http.StatusBadRequest {
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
