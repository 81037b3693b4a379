package gateway

// Review of 68e6dee (OAuth grants bound to their issuer): paths that
// still send, refresh or revoke a credential at a provider or upstream it
// was not issued for.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

const fixReviewPAT = "pat_FixReview_7c1e9A0b3D5f"

// formRecorder is an HTTP server that keeps every form posted to it and
// answers with status and body.
type formRecorder struct {
	srv   *httptest.Server
	mu    sync.Mutex
	forms []url.Values
}

func newFormRecorder(t *testing.T, status int, body string) *formRecorder {
	fr := &formRecorder{}
	fr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		fr.mu.Lock()
		fr.forms = append(fr.forms, r.PostForm)
		fr.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(fr.srv.Close)
	return fr
}

func (fr *formRecorder) received() []url.Values {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return append([]url.Values(nil), fr.forms...)
}

// storePersonalToken stores alice's personal token for "svc" as
// account.StoreToken does while the service is auth bearer.
func storePersonalToken(t *testing.T, a *App) {
	t.Helper()
	conn := &Connection{Kind: AuthBearer, AccessToken: fixReviewPAT, TokenType: "Bearer", ConnectedAt: now().UTC()}
	if err := a.Connect(context.Background(), "svc", "alice", conn); err != nil {
		t.Fatal(err)
	}
}

// Attack (fixed): service svc was `auth bearer` and alice stored a personal token
// (PUT /v1/connections/svc, Kind bearer, no Issuer); a reload makes svc
// `auth oauth` with a provider that has a revocation_url; alice
// disconnects. Expected: her personal token was issued by no OAuth
// provider, least of all this one: it is forgotten, never posted to the
// new provider's revocation endpoint. Happens: Connection.issuedBy
// (oauth.go:324-326) accepts any connection with an empty Issuer — a
// personal token has none — so Disconnect (revoke.go:42-47) holds it and
// revokeToken posts the personal token to the provider as
// token=<pat>&token_type_hint=access_token. Fix: issuedBy must require
// c.Kind == AuthOAuth (an empty Issuer stands for an earlier OAuth grant
// only).
func TestFixReviewPersonalTokenPostedToNewProviderRevocation(t *testing.T) {
	rev := newFormRecorder(t, http.StatusOK, `{}`)
	a, svc := oauthApp(t, rev.srv.URL)
	storePersonalToken(t, a)
	svc.Auth.OAuth.RevocationURL = rev.srv.URL + "/revoke"
	_ = a.Disconnect(context.Background(), svc, "alice")
	for _, f := range rev.received() {
		if strings.Contains(f.Encode(), fixReviewPAT) {
			t.Errorf("the personal token stored while svc was auth bearer was posted to the OAuth provider: token_type_hint=%s", f.Get("token_type_hint"))
		}
	}
}

// Attack (fixed): as above (a personal token stored while svc was auth bearer,
// then svc reloaded as auth oauth, typically with another url); a call
// reads the credential. Expected: needs_sign_in (ErrGrantElsewhere), as
// for an OAuth grant of another provider: the token was never issued for
// the OAuth service's upstream. Happens: OAuthConnection (grants.go:103-108)
// checks only issuedBy, which passes an empty Issuer (oauth.go:325), and
// never looks at conn.Kind: the personal token goes to the upstream as
// the OAuth access token. Fix: issuedBy requires Kind == AuthOAuth.
func TestFixReviewPersonalTokenUsedAsOAuthGrant(t *testing.T) {
	a, svc := oauthApp(t, "https://auth.example.com")
	storePersonalToken(t, a)
	cred, err := a.CredentialFor(context.Background(), svc, "alice")
	if err == nil {
		t.Errorf("an auth oauth service sends the personal token stored under auth bearer: %q", cred.Value)
	} else if !errors.Is(err, ErrNotConnected) {
		t.Errorf("err = %v, want needs_sign_in", err)
	}
}

// Attack (fixed): alice connected svc through its OAuth provider (Issuer set); a
// reload makes svc `auth bearer` at another upstream (the operator moved
// the service off OAuth). Expected (README: a reload that moves a service
// "leaves earlier grants unused: their tokens are not sent to the new
// upstream"): needs_sign_in until she stores a personal token. Happens:
// CredentialFor's AuthBearer case (grants.go:291-299) loads whatever
// connection is stored, with no look at its Kind or Issuer, and sends the
// OAuth access token (issued for the old resource) to the new upstream.
// Fix: in the AuthBearer case refuse a connection whose Kind is not
// AuthBearer (ErrGrantElsewhere).
func TestFixReviewOAuthGrantSentToBearerService(t *testing.T) {
	a, svc := oauthApp(t, "https://auth.example.com")
	grant := &Connection{Kind: AuthOAuth, AccessToken: "at_FixReview_oauth", RefreshToken: "rt_FixReview_oauth",
		ConnectedAt: now().UTC(), Expiry: now().Add(time.Hour), Issuer: svc.Auth.OAuth.issuer()}
	if err := a.Connect(context.Background(), "svc", "alice", grant); err != nil {
		t.Fatal(err)
	}
	moved := &Service{ID: "svc", URL: "https://elsewhere.example.com/mcp", Tools: []string{"t"}, Auth: &UpstreamAuth{Kind: AuthBearer}}
	if err := moved.provision(caddy.NewReplacer()); err != nil {
		t.Fatal(err)
	}
	cred, err := a.CredentialFor(context.Background(), moved, "alice")
	if err == nil && strings.Contains(cred.Value, "at_FixReview_oauth") {
		t.Errorf("the OAuth access token of the old provider goes to the bearer service's new upstream: %q", cred.Value)
	}
}

// Attack (fixed): alice starts a connect (AuthorizeURL) while svc's provider is
// A; before she comes back, a reload points svc at provider B (another
// token_url and client); A redirects her browser to the callback with
// A's code. Expected: the callback connects nothing and sends nothing to
// B (the pending sign-in was started under A). Happens:
// CompleteAuthorization (oauth.go:461) exchanges A's code and PKCE
// verifier at B's token endpoint (with B's client secret), and stores
// whatever B answers stamped with B's Issuer (oauth.go:478): the pending
// authorization (pendingSecret) records no issuer. Fix: record
// o.issuer() in pendingSecret/oauthState at AuthorizeURL and refuse the
// callback (ErrInvalidState) when it differs from the current one.
func TestFixReviewCallbackAfterReloadSendsCodeToNewProvider(t *testing.T) {
	ctx := context.Background()
	providerB := newFormRecorder(t, http.StatusOK, `{"access_token":"at_from_B","token_type":"Bearer","expires_in":3600}`)
	a, svc := oauthApp(t, "https://provider-a.example.com")
	browser := Browser{User: "alice", Ref: "alice-browser"}
	raw, err := a.AuthorizeURL(ctx, svc, browser)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(raw)
	state := u.Query().Get("state")
	// The reload: provider B, another client.
	svc.Auth.OAuth.AuthorizationURL = providerB.srv.URL + "/authorize"
	svc.Auth.OAuth.TokenURL = providerB.srv.URL + "/token"
	svc.Auth.OAuth.ClientID = "client-b"
	a.buildOAuthConfig(svc)
	_, err = a.CompleteAuthorization(ctx, svc, state, "code_issued_by_A", browser)
	for _, f := range providerB.received() {
		if f.Get("code") == "code_issued_by_A" {
			t.Errorf("provider A's code and PKCE verifier were sent to provider B (verifier sent: %v)", f.Get("code_verifier") != "")
		}
	}
	if err == nil {
		t.Errorf("a connect started under provider A completed under provider B")
	}
}

// Attack (fixed): alice's grant was stored by a version before Connection.Issuer
// (Issuer empty); it is refreshed, many times, at provider A — then a
// reload moves svc to provider B. Expected: a grant toolgate refreshed at
// A is known to be A's: once refreshed it records A's issuer, and after
// the move its refresh token is not sent to B. Happens: refresh
// (grants.go:254-258) copies cur, Issuer "" included, so a legacy grant
// stays unbound forever, and issuedBy (oauth.go:325) lets B receive its
// refresh token after any later move. Fix: stamp next.Issuer = o.issuer()
// in refresh (and in OAuthConnection's first use) when it is empty.
func TestFixReviewLegacyGrantNeverBound(t *testing.T) {
	ctx := context.Background()
	p := startTestProvider(t)
	a, svc := oauthApp(t, p.srv.URL)
	legacy := p.grant(t, "alice") // expired, Issuer ""
	if err := a.connections.Save(ctx, "svc", "alice", legacy); err != nil {
		t.Fatal(err)
	}
	if _, err := a.OAuthConnection(ctx, svc, "alice"); err != nil {
		t.Fatalf("refresh at provider A: %v", err)
	}
	cur, err := a.connections.LoadFresh(ctx, "svc", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if cur.RefreshCount == 0 {
		t.Fatal("control: the grant was not refreshed")
	}
	if cur.Issuer != svc.Auth.OAuth.issuer() {
		t.Errorf("a legacy grant refreshed at provider A still records issuer %q: a later move sends its refresh token to the new provider", cur.Issuer)
	}
}

// Attack (fixed): none needed — an operator's reload that only respells the
// token_url (the host in capitals, the scheme's default port written
// out: RFC 3986 6.2.2.1 and 6.2.3, the same endpoint; toolgate's own
// CanonicalURL treats a service url so respelled as the same upstream and
// ends no MCP session for it). Expected: every person's grant keeps
// working: nothing moved. Happens: buildOAuthConfig (oauth.go:294-295)
// digests o.TokenURL (and o.Resource, the url as written when resource is
// not set: registry.go:251-253) as written, so issuedBy (oauth.go:325)
// refuses every stored grant with ErrGrantElsewhere and every person gets
// needs_sign_in. Fix: digest CanonicalURL(o.TokenURL) (and the canonical
// resource) in the issuer.
func TestFixReviewRespelledTokenURLRefusesEveryGrant(t *testing.T) {
	ctx := context.Background()
	a, svc := oauthApp(t, "https://auth.example.com")
	grant := &Connection{Kind: AuthOAuth, AccessToken: "at_FixReview_live", RefreshToken: "rt_FixReview_live",
		ConnectedAt: now().UTC(), Expiry: now().Add(time.Hour), Issuer: svc.Auth.OAuth.issuer()}
	if err := a.Connect(ctx, "svc", "alice", grant); err != nil {
		t.Fatal(err)
	}
	svc.Auth.OAuth.TokenURL = "https://AUTH.example.com:443/token"
	a.buildOAuthConfig(svc)
	if _, err := a.OAuthConnection(ctx, svc, "alice"); err != nil {
		t.Errorf("after a reload that only respelled token_url, alice's grant is refused: %v", err)
	}
}

// Attack (fixed): alice connected svc at provider A; a reload moves svc to
// provider B, which has a revocation_url; alice disconnects svc (DELETE
// /v1/connections/svc) to withdraw toolgate's access. Expected (README:
// "A revocation the provider does not confirm leaves the credential
// forgotten and returns an error wrapping ErrNotRevoked" → the API's 200
// {"revoked": false, "message": "… revoke toolgate's access in your
// account at the provider"}): she is told that A's grant was not revoked
// (its refresh token still works at A). Happens: Disconnect
// (revoke.go:42-46) logs a warning, leaves held nil and returns nil
// (revoke.go:61-62): the API answers 204 as for a confirmed revocation,
// and A's grant stays live with nobody told. Fix: in that case set an
// error wrapping ErrNotRevoked ("issued under another provider than the
// service uses now") after the delete, as for an unreadable record.
func TestFixReviewDisconnectOfGrantElsewhereReportsRevoked(t *testing.T) {
	ctx := context.Background()
	rev := newFormRecorder(t, http.StatusOK, `{}`)
	a, svc := oauthApp(t, "https://provider-a.example.com")
	grant := &Connection{Kind: AuthOAuth, AccessToken: "at_FixReview_A", RefreshToken: "rt_FixReview_A",
		ConnectedAt: now().UTC(), Expiry: now().Add(time.Hour), Issuer: svc.Auth.OAuth.issuer()}
	if err := a.Connect(ctx, "svc", "alice", grant); err != nil {
		t.Fatal(err)
	}
	svc.Auth.OAuth.TokenURL = rev.srv.URL + "/token"
	svc.Auth.OAuth.RevocationURL = rev.srv.URL + "/revoke"
	a.buildOAuthConfig(svc)
	err := a.Disconnect(ctx, svc, "alice")
	if n := len(rev.received()); n != 0 {
		t.Fatalf("provider B was sent %d revocation(s) of provider A's grant", n)
	}
	if !errors.Is(err, ErrNotRevoked) {
		t.Errorf("Disconnect of a grant issued by another provider returns %v: the API answers 204 as if it was revoked", err)
	}
}
