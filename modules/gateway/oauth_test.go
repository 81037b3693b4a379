package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	oauth2srv "github.com/go-oauth2/oauth2/v4"
	"github.com/go-oauth2/oauth2/v4/manage"
	"github.com/go-oauth2/oauth2/v4/models"
	"github.com/go-oauth2/oauth2/v4/server"
	"github.com/go-oauth2/oauth2/v4/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
)

const testSecret = "a-state-secret-of-at-least-32-bytes!"

// oauthApp is an App with one oauth service "svc" whose provider is at
// providerURL, on file storage with the test cipher.
func oauthApp(t testing.TB, providerURL string) (*App, *Service) {
	t.Helper()
	storage, _ := fileStorage(t)
	svc := &Service{ID: "svc", URL: "https://up.example.com/mcp", Tools: []string{"t"}, Auth: &UpstreamAuth{Kind: AuthOAuth, OAuth: &OAuthClient{
		AuthorizationURL: providerURL + "/authorize", TokenURL: providerURL + "/token",
		ClientID: "client", ClientSecret: "secret", Scopes: []string{"read"},
	}}}
	if err := svc.provision(caddy.NewReplacer()); err != nil {
		t.Fatal(err)
	}
	a := &App{PublicURL: "https://gw.example.com", StateSecret: testSecret, Services: []*Service{svc},
		storage: storage, cipher: testCipher(t), httpClient: &http.Client{Transport: newUpstreamTransport()}, logger: zap.NewNop()}
	a.connections = newConnectionStore(storage, a.cipher, time.Minute)
	a.buildOAuthConfig(svc)
	return a, svc
}

func TestStateIsSealedAndBound(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	a := &App{StateSecret: testSecret}
	st := oauthState{User: "alice", Browser: "b1", Service: "svc", Expiry: clock.Add(authorizationTTL).Unix(), Nonce: "n1"}
	state := mustSealState(t, a, st)
	if got, err := a.verifyState(state, "svc"); err != nil || got != st {
		t.Fatalf("verifyState = %+v, %v", got, err)
	}
	// The provider sees the state: it tells nothing of the person.
	if raw, _ := base64.RawURLEncoding.DecodeString(state); bytes.Contains(raw, []byte("alice")) || bytes.Contains(raw, []byte("b1")) {
		t.Errorf("the state reads %q: it names the person or their sign-in to the provider", raw)
	}
	other := &App{StateSecret: strings.ToUpper(testSecret)}
	forged := mustSealState(t, other, oauthState{User: "mallory", Browser: "b1", Service: "svc", Expiry: st.Expiry, Nonce: "n1"})
	flipped := []byte(state)
	flipped[len(flipped)/2] ^= 1
	for name, s := range map[string]string{
		"another service":         "",
		"sealed with another key": forged,
		"altered":                 string(flipped),
		"truncated":               state[:len(state)-2],
		"not base64":              "!!" + state,
		"too long":                state + strings.Repeat("A", maxState),
		"empty":                   "",
	} {
		service := "svc"
		if name == "another service" {
			s, service = state, "other"
		}
		if _, err := a.verifyState(s, service); !errors.Is(err, ErrInvalidState) {
			t.Errorf("%s: err = %v, want ErrInvalidState", name, err)
		}
	}
	*clock = clock.Add(authorizationTTL)
	if _, err := a.verifyState(state, "svc"); !errors.Is(err, ErrInvalidState) {
		t.Errorf("expired state: err = %v", err)
	}
}

func mustSealState(t testing.TB, a *App, st oauthState) string {
	t.Helper()
	state, err := a.sealState(st)
	if err != nil {
		t.Fatal(err)
	}
	return state
}

// A state sealed before state_secret was rotated still opens while the
// old secret is kept as a previous one, and no longer once it is removed.
func TestStateSealedWithAPreviousSecret(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	old := &App{StateSecret: testSecret}
	st := oauthState{User: "alice", Browser: "b1", Service: "svc", Expiry: clock.Add(authorizationTTL).Unix(), Nonce: "n1"}
	state := mustSealState(t, old, st)
	rotated := &App{StateSecret: strings.ToUpper(testSecret), PreviousStateSecrets: []string{testSecret}}
	if got, err := rotated.verifyState(state, "svc"); err != nil || got != st {
		t.Fatalf("after rotation: %+v, %v", got, err)
	}
	if _, err := (&App{StateSecret: testSecret}).verifyState(mustSealState(t, rotated, st), "svc"); !errors.Is(err, ErrInvalidState) {
		t.Errorf("a state signed with the new secret verified under the old one alone: %v", err)
	}
	retired := &App{StateSecret: strings.ToUpper(testSecret)}
	if _, err := retired.verifyState(state, "svc"); !errors.Is(err, ErrInvalidState) {
		t.Errorf("a state signed with a removed secret verified: %v", err)
	}
}

func TestAuthorizeURLAndSingleUsePending(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	a, svc := oauthApp(t, "https://auth.example.com")
	svc.Auth.OAuth.LoginHint = true
	if _, err := a.AuthorizeURL(ctx, svc, Browser{User: "alice@example.com"}); err == nil {
		t.Fatal("a connect started without a browser sign-in")
	}
	raw, err := a.AuthorizeURL(ctx, svc, Browser{User: "alice@example.com", Ref: "alice-browser"})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(raw)
	q := u.Query()
	if u.Host != "auth.example.com" || q.Get("code_challenge_method") != "S256" || q.Get("resource") != svc.URL ||
		q.Get("redirect_uri") != "https://gw.example.com/v1/connections/svc/callback" || q.Get("login_hint") != "alice@example.com" ||
		q.Get("client_id") != "client" || q.Has("client_secret") || q.Get("scope") != "read" {
		t.Fatalf("authorize URL = %s", raw)
	}
	st, err := a.verifyState(q.Get("state"), "svc")
	if err != nil {
		t.Fatal(err)
	}
	if st.User != "alice@example.com" || st.Browser != "alice-browser" {
		t.Fatalf("the state names %+v, want alice in her browser", st)
	}

	// Two callbacks racing with one state: exactly one gets the verifier.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []*pendingSecret
	var errs []error
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ps, err := a.takePending(ctx, st)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else {
				got = append(got, ps)
			}
		}()
	}
	wg.Wait()
	if len(got) != 1 || len(errs) != 1 || !errors.Is(errs[0], ErrInvalidState) {
		t.Fatalf("two takes of one pending sign-in: %d succeeded, errors %v", len(got), errs)
	}
	if got[0].User != "alice@example.com" || got[0].Service != "svc" ||
		oauth2.S256ChallengeFromVerifier(got[0].Verifier) != q.Get("code_challenge") {
		t.Fatalf("pending = %+v, does not match the challenge", got[0])
	}

	// Unfinished sign-ins are swept once expired.
	if _, err := a.AuthorizeURL(ctx, svc, Browser{User: "bob@example.com", Ref: "bob-browser"}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.sweepPending(ctx); n != 0 || err != nil {
		t.Fatalf("sweep before expiry removed %d (%v)", n, err)
	}
	*clock = clock.Add(authorizationTTL + time.Second)
	if n, err := a.sweepPending(ctx); n != 1 || err != nil {
		t.Fatalf("sweep after expiry removed %d (%v), want 1", n, err)
	}
}

func TestClassifyTokenError(t *testing.T) {
	retrieve := func(status int, code string) error {
		return &oauth2.RetrieveError{Response: &http.Response{StatusCode: status}, ErrorCode: code, Body: []byte("secret-body")}
	}
	for _, c := range []struct {
		name   string
		err    error
		kind   error
		status int
	}{
		{"invalid_grant 400", retrieve(400, "invalid_grant"), ErrGrantRejected, 400},
		{"invalid_grant 401", retrieve(401, "invalid_grant"), ErrGrantRejected, 401},
		{"invalid_client", retrieve(401, "invalid_client"), ErrGrantRejected, 401},
		{"unauthorized_client", retrieve(400, "unauthorized_client"), ErrGrantRejected, 400},
		{"invalid_request is not a verdict on the grant", retrieve(400, "invalid_request"), ErrProviderUnavailable, 400},
		{"429", retrieve(429, ""), ErrProviderUnavailable, 429},
		{"500", retrieve(500, "server_error"), ErrProviderUnavailable, 500},
		{"503 claiming invalid_grant", retrieve(503, "invalid_grant"), ErrProviderUnavailable, 503},
		{"timeout", context.DeadlineExceeded, ErrProviderUnavailable, 0},
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, ErrProviderUnavailable, 0},
		{"garbage", errors.New("oauth2: server response missing access_token"), ErrProviderUnavailable, 0},
	} {
		pe := classifyTokenError(c.err)
		if !errors.Is(pe, c.kind) || pe.Status != c.status {
			t.Errorf("%s: %v (status %d), want %v", c.name, pe, pe.Status, c.kind)
		}
		if strings.Contains(pe.Error(), "secret-body") {
			t.Errorf("%s: the error shows the provider's body: %v", c.name, pe)
		}
	}
	if got := safeErrorCode("<script>"); got != "other" {
		t.Errorf("safeErrorCode = %q", got)
	}
}

func TestRefreshSkewNeverExceedsHalfTheLifetime(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	short := &Connection{ConnectedAt: *clock, Expiry: clock.Add(time.Second)}
	long := &Connection{ConnectedAt: *clock, RefreshedAt: clock.Add(-time.Hour), Expiry: clock.Add(time.Hour)}
	if got := short.refreshSkew(time.Minute); got != 500*time.Millisecond {
		t.Errorf("1s token, 60s skew: %v", got)
	}
	if got := long.refreshSkew(time.Minute); got != time.Minute {
		t.Errorf("2h token, 60s skew: %v", got)
	}
	if short.NeedsRefresh(time.Minute) {
		t.Error("a fresh 1s token needs no refresh yet")
	}
	*clock = clock.Add(600 * time.Millisecond)
	if !short.NeedsRefresh(time.Minute) {
		t.Error("a 1s token past half its life needs a refresh")
	}
	if (&Connection{ConnectedAt: *clock}).NeedsRefresh(time.Minute) {
		t.Error("a token without expiry never needs a refresh")
	}
}

func TestApplyTokenKeepsRefreshTokenAndScopes(t *testing.T) {
	c := &Connection{RefreshToken: "old", Scopes: []string{"a"}}
	c.applyToken((&oauth2.Token{AccessToken: "at", TokenType: "Bearer"}).WithExtra(map[string]any{}), []string{"req"})
	if c.RefreshToken != "old" || c.AccessToken != "at" || strings.Join(c.Scopes, " ") != "a" || !c.Expiry.IsZero() {
		t.Fatalf("without refresh token or scope: %+v", c)
	}
	c.applyToken((&oauth2.Token{AccessToken: "at2", RefreshToken: "new"}).WithExtra(map[string]any{"scope": "y x"}), []string{"x", "y", "z"})
	if c.RefreshToken != "new" || strings.Join(c.Scopes, " ") != "x y" {
		t.Fatalf("with rotation and scope: %+v", c)
	}
	// Only requested scopes are kept of what the response names: a token
	// endpoint can write anything there, the tokens and the client secret
	// it was sent included, and the catalog shows the scopes.
	c.applyToken((&oauth2.Token{AccessToken: "at3", RefreshToken: "newer"}).WithExtra(map[string]any{"scope": "x newer at3 the-client-secret offline_access"}), []string{"x", "y"})
	if strings.Join(c.Scopes, " ") != "x" {
		t.Fatalf("scopes kept of a response naming others: %q", c.Scopes)
	}
}

// testProvider is a go-oauth2 token endpoint for the refresh tests, with
// tokens issued directly through its manager.
type testProvider struct {
	srv     *httptest.Server
	manager *manage.Manager
	mu      sync.Mutex
	calls   int
}

func startTestProvider(t *testing.T) *testProvider {
	m := manage.NewDefaultManager()
	m.SetPasswordTokenCfg(&manage.Config{AccessTokenExp: time.Hour, RefreshTokenExp: time.Hour, IsGenerateRefresh: true})
	m.SetRefreshTokenCfg(&manage.RefreshingConfig{AccessTokenExp: time.Hour, IsGenerateRefresh: true, IsRemoveAccess: true, IsRemoveRefreshing: true})
	m.MustTokenStorage(store.NewMemoryTokenStore())
	clients := store.NewClientStore()
	_ = clients.Set("client", &models.Client{ID: "client", Secret: "secret", Domain: "https://gw.example.com"})
	m.MapClientStorage(clients)
	s := server.NewDefaultServer(m)
	s.SetClientInfoHandler(server.ClientFormHandler)
	p := &testProvider{manager: m}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.calls++
		p.mu.Unlock()
		_ = s.HandleTokenRequest(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// grant issues a token pair for user, already expired for toolgate.
func (p *testProvider) grant(t *testing.T, user string) *Connection {
	ti, err := p.manager.GenerateAccessToken(context.Background(), oauth2srv.PasswordCredentials,
		&oauth2srv.TokenGenerateRequest{ClientID: "client", ClientSecret: "secret", UserID: user})
	if err != nil {
		t.Fatal(err)
	}
	return &Connection{Kind: AuthOAuth, AccessToken: ti.GetAccess(), RefreshToken: ti.GetRefresh(),
		ConnectedAt: now().Add(-time.Hour), Expiry: now().Add(-time.Second)}
}

func TestRefreshOutcomes(t *testing.T) {
	ctx := context.Background()
	p := startTestProvider(t)
	a, svc := oauthApp(t, p.srv.URL)
	refreshed := func(outcome string) float64 {
		return testutil.ToFloat64(oauthMetrics.refreshes.WithLabelValues("svc", outcome))
	}
	base := map[string]float64{}
	for _, o := range []string{"refreshed", "rejected", "failed"} {
		base[o] = refreshed(o)
	}

	// Concurrent callers share one refresh; the rotated token is stored.
	conn := p.grant(t, "alice")
	if err := a.connections.Save(ctx, "svc", "alice", conn); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := a.OAuthConnection(ctx, svc, "alice"); err != nil || c.RefreshCount != 1 {
				t.Errorf("OAuthConnection = %v, %v", c, err)
			}
		}()
	}
	wg.Wait()
	if p.calls != 1 || refreshed("refreshed")-base["refreshed"] != 1 {
		t.Fatalf("20 concurrent callers made %d token requests", p.calls)
	}
	stored, err := a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil || stored.RefreshToken == conn.RefreshToken || stored.RefreshCount != 1 || stored.NeedsRefresh(time.Minute) {
		t.Fatalf("stored after refresh: %v, %v", stored, err)
	}

	// The provider revoked the grant: deleted, marked, needs sign-in.
	if err := p.manager.RemoveRefreshToken(ctx, stored.RefreshToken); err != nil {
		t.Fatal(err)
	}
	stored.Expiry = now().Add(-time.Second)
	if err := a.connections.Save(ctx, "svc", "alice", stored); err != nil {
		t.Fatal(err)
	}
	_, err = a.OAuthConnection(ctx, svc, "alice")
	if !errors.Is(err, ErrGrantRejected) || !IsSignInError(err) {
		t.Fatalf("revoked grant: %v", err)
	}
	if _, err := a.connections.LoadFresh(ctx, "svc", "alice"); !errors.Is(err, ErrNotConnected) || !a.connections.WasRejected(ctx, "svc", "alice") {
		t.Fatalf("after rejection: %v, rejected mark %v", err, a.connections.WasRejected(ctx, "svc", "alice"))
	}
	if refreshed("rejected")-base["rejected"] != 1 {
		t.Error("the rejection was not counted")
	}

	// The provider is down: retryable, the grant kept as it was.
	bob := p.grant(t, "bob")
	if err := a.connections.Connect(ctx, "svc", "bob", bob); err != nil {
		t.Fatal(err)
	}
	p.srv.Close()
	_, err = a.OAuthConnection(ctx, svc, "bob")
	if !errors.Is(err, ErrProviderUnavailable) || IsSignInError(err) {
		t.Fatalf("provider down: %v", err)
	}
	kept, err := a.connections.LoadFresh(ctx, "svc", "bob")
	if err != nil || kept.RefreshToken != bob.RefreshToken {
		t.Fatalf("provider down: grant %v, %v; want it kept", kept, err)
	}
	if refreshed("failed")-base["failed"] != 1 {
		t.Error("the failure was not counted")
	}

	// An expired token without a refresh token needs a sign-in.
	if err := a.connections.Save(ctx, "svc", "carol", &Connection{Kind: AuthOAuth, AccessToken: "x", Expiry: now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.OAuthConnection(ctx, svc, "carol"); !errors.Is(err, ErrGrantExpired) {
		t.Fatalf("no refresh token: %v", err)
	}
}

// A needs_sign_in answer points at the console's connect page for the
// caller and stores nothing (each -32010 once stored a pending sign-in:
// storage anyone could fill).
func TestNeedsSignInPointsAtTheConsoleAndStoresNothing(t *testing.T) {
	a, svc := oauthApp(t, "https://auth.example.com")
	a.RegisterConsole()
	r := httptest.NewRequest(http.MethodPost, "https://gw.example.com/v1/mcp/svc", nil)
	r = WithCall(r, &Call{Caller: &Caller{User: "alice@example.com"}})
	data := a.NeedsSignIn(r, svc)
	if data["connect_url"] != "https://gw.example.com/console/connect/svc?for=alice%40example.com" || data["connect_method"] != nil {
		t.Fatalf("NeedsSignIn = %v", data)
	}
	if keys, _ := a.storage.List(context.Background(), "toolgate", true); len(keys) != 0 {
		t.Fatalf("NeedsSignIn stored %v", keys)
	}
	// Without a console, a bearer service is connected through the API.
	bearer := &Service{ID: "tok", Auth: &UpstreamAuth{Kind: AuthBearer}}
	plain, _ := oauthApp(t, "https://auth.example.com")
	data = plain.NeedsSignIn(r, bearer)
	if data["connect_url"] != "https://gw.example.com/v1/connections/tok" || data["connect_method"] != "PUT" {
		t.Fatalf("NeedsSignIn without a console = %v", data)
	}
}

// Starting a connect never leaves more than maxPendingPerUser unfinished
// ones of one person: the oldest go.
func TestPendingConnectsPerUserAreBounded(t *testing.T) {
	ctx := context.Background()
	a, svc := oauthApp(t, "https://auth.example.com")
	var states []oauthState
	for range maxPendingPerUser + 3 {
		raw, err := a.AuthorizeURL(ctx, svc, Browser{User: "alice", Ref: "b"})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(raw)
		st, err := a.verifyState(u.Query().Get("state"), "svc")
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, st)
	}
	if _, err := a.AuthorizeURL(ctx, svc, Browser{User: "bob", Ref: "b"}); err != nil {
		t.Fatal(err)
	}
	keys, _ := a.storage.List(ctx, path.Join(pendingPrefix, hashKey("alice")), false)
	if len(keys) != maxPendingPerUser {
		t.Fatalf("alice has %d pending connects, want %d", len(keys), maxPendingPerUser)
	}
	for i, st := range states {
		_, err := a.takePending(ctx, st)
		if old := i < 3; old != errors.Is(err, ErrInvalidState) {
			t.Errorf("connect %d (of %d): take = %v", i, len(states), err)
		}
	}
}

// FuzzVerifyState feeds the callback's state parameter, as an attacker
// controls it, to the verifier: it never panics, and nothing but a state
// signed with the secret passes.
func FuzzVerifyState(f *testing.F) {
	a := &App{StateSecret: testSecret}
	good, err := a.sealState(oauthState{User: "alice", Browser: "b", Service: "svc", Expiry: time.Now().Add(time.Hour).Unix(), Nonce: "n"})
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{good, "", ".", "a.b", good + "x", strings.Repeat("A", 3000), "eyJ1IjoiYSJ9.AAAA"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, state string) {
		st, err := a.verifyState(state, "svc")
		if err == nil && state != good {
			// Another spelling of the sealed state (base64 padding bits)
			// must carry the same content.
			if st.User != "alice" || st.Nonce != "n" {
				t.Fatalf("a state toolgate did not seal passed: %q → %+v", state, st)
			}
		}
	})
}

// A token that cannot go in a header as it is connects nothing.
func TestCheckBearer(t *testing.T) {
	for _, c := range []struct {
		typ, token string
		ok         bool
	}{
		{"Bearer", "eyJhbGciOi.abc-_~+/=", true},
		{"", "opaque", true},
		{"bearer", "x", true},
		{"DPoP", "x", false},
		{"mac", "x", false},
		{"Bearer", "", false},
		{"Bearer", "two\r\nlines", false},
		{"Bearer", "with space", false},
		{"Bearer", "non-ascii-é", false},
		{"Bearer", strings.Repeat("a", maxAccessToken+1), false},
	} {
		err := checkBearer(&oauth2.Token{TokenType: c.typ, AccessToken: c.token})
		if (err == nil) != c.ok || err != nil && !errors.Is(err, ErrTokenType) {
			t.Errorf("checkBearer(%q, %.20q) = %v, want ok %v", c.typ, c.token, err, c.ok)
		}
	}
}
