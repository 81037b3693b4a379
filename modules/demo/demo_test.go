package demo

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"
)

const testRedirect = "http://127.0.0.1:9/v1/connections/tracker/callback"

func startDemo(t *testing.T) (*Handler, *httptest.Server, *oauth2.Config) {
	t.Helper()
	h := &Handler{RedirectURI: testRedirect}
	if err := h.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = h.ServeHTTP(w, r, nil)
	}))
	t.Cleanup(srv.Close)
	cfg := &oauth2.Config{
		ClientID: DefaultClientID, ClientSecret: DefaultClientSecret, RedirectURL: testRedirect,
		Endpoint: oauth2.Endpoint{AuthURL: srv.URL + "/oauth/authorize", TokenURL: srv.URL + "/oauth/token", AuthStyle: oauth2.AuthStyleInParams},
	}
	return h, srv, cfg
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// authorize runs the authorization request and returns where the provider
// redirects to.
func authorize(t *testing.T, u string) (int, *url.URL) {
	t.Helper()
	resp, err := noRedirects.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	return resp.StatusCode, loc
}

func TestDemoProviderConnectAndRotate(t *testing.T) {
	ctx := context.Background()
	h, srv, cfg := startDemo(t)
	verifier := oauth2.GenerateVerifier()
	status, loc := authorize(t, cfg.AuthCodeURL("st-1", oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("login_hint", "alice@example.test")))
	if status != http.StatusFound || loc.Query().Get("state") != "st-1" || loc.Query().Get("code") == "" ||
		loc.Scheme+"://"+loc.Host+loc.Path != testRedirect {
		t.Fatalf("authorize: %d %s", status, loc)
	}
	tok, err := cfg.Exchange(ctx, loc.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatal(err)
	}
	if life := time.Until(tok.Expiry); tok.RefreshToken == "" || life < 40*time.Second || life > 46*time.Second {
		t.Fatalf("token: refresh %v, lifetime %v; want a refresh token and 45s", tok.RefreshToken != "", life)
	}
	if g, ok := h.grantOf(ctx, http.Header{"Authorization": {"Bearer " + tok.AccessToken}}); !ok || g.User != "alice@example.test" || g.Refreshes != 0 {
		t.Fatalf("grant = %+v, %v", g, ok)
	}

	// A refresh rotates both tokens and counts.
	tok2, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	if err != nil {
		t.Fatal(err)
	}
	if tok2.RefreshToken == tok.RefreshToken || tok2.AccessToken == tok.AccessToken {
		t.Fatal("the refresh did not rotate the tokens")
	}
	if _, ok := h.grantOf(ctx, http.Header{"Authorization": {"Bearer " + tok.AccessToken}}); ok {
		t.Error("the replaced access token still works")
	}
	_, err = cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Fatalf("reusing a rotated refresh token: %v, want invalid_grant", err)
	}

	// whoami through MCP reports the user and the refreshes.
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   srv.URL + "/mcp",
		HTTPClient: oauth2.NewClient(ctx, oauth2.StaticTokenSource(tok2)),
	}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := res.StructuredContent.(map[string]any)
	if got["user"] != "alice@example.test" || got["refresh_count"] != float64(1) {
		t.Fatalf("whoami = %v", res.StructuredContent)
	}
}

func TestDemoProviderRefusesBadRequests(t *testing.T) {
	_, srv, cfg := startDemo(t)
	verifier := oauth2.GenerateVerifier()
	// Without login_hint: demo-user.
	if status, loc := authorize(t, cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier))); status != http.StatusFound || loc.Query().Get("code") == "" {
		t.Fatalf("without login_hint: %d %s", status, loc)
	}
	// No PKCE, or another redirect URI: a 400 here, never a redirect.
	other := *cfg
	other.RedirectURL = "https://evil.example/callback"
	for name, u := range map[string]string{
		"no PKCE":        cfg.AuthCodeURL("s"),
		"plain PKCE":     cfg.AuthCodeURL("s", oauth2.SetAuthURLParam("code_challenge", verifier), oauth2.SetAuthURLParam("code_challenge_method", "plain")),
		"other redirect": other.AuthCodeURL("s", oauth2.S256ChallengeOption(verifier)),
	} {
		if status, loc := authorize(t, u); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", name, status, loc)
		}
	}
	// The tracker refuses calls without a valid token.
	resp, err := http.Post(srv.URL+"/mcp", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %d", resp.StatusCode)
	}
}

func TestDemoCaddyfile(t *testing.T) {
	h := new(Handler)
	d := caddyfile.NewTestDispenser(`toolgate_demo {
		client_id c
		client_secret -
		redirect_uri https://gw/cb
		access_token_lifetime 2s
	}`)
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if h.ClientID != "c" || h.ClientSecret != "-" || h.RedirectURI != "https://gw/cb" || time.Duration(h.AccessTokenLifetime) != 2*time.Second {
		t.Fatalf("parsed %+v", h)
	}
	for _, bad := range []string{
		"toolgate_demo x",
		"toolgate_demo {\n nope 1\n}",
		"toolgate_demo {\n client_id a\n client_id b\n}",
		"toolgate_demo {\n access_token_lifetime soon\n}",
		"toolgate_demo {\n client_id\n}",
	} {
		if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
