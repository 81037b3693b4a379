package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-oauth2/oauth2/v4"
	oauth2errors "github.com/go-oauth2/oauth2/v4/errors"
	"github.com/go-oauth2/oauth2/v4/generates"
	"github.com/go-oauth2/oauth2/v4/manage"
	"github.com/go-oauth2/oauth2/v4/models"
	"github.com/go-oauth2/oauth2/v4/server"
	"github.com/go-oauth2/oauth2/v4/store"
)

// oauthProvider is a real OAuth 2 authorization server built with
// github.com/go-oauth2/oauth2/v4: authorization code grant with PKCE S256
// (required), client credentials in the request body, short-lived access
// tokens and refresh tokens that rotate on every refresh (the old one stops
// working). It approves every authorization at once for the user named by
// login_hint (or "test-user"), except deniedUser, who is refused with
// access_denied.
//
// Its endpoints are wrapped only to record what toolgate sent and the
// tokens the server issued; every answer is go-oauth2's own.
type oauthProvider struct {
	URL          string // http://127.0.0.1:port
	AuthorizeURL string
	TokenURL     string
	ClientID     string
	ClientSecret string // empty for a public client

	server  *server.Server
	manager *manage.Manager
	clients *store.ClientStore
	addr    string

	mu         sync.Mutex
	httpServer *http.Server
	authorizes []url.Values
	tokenCalls []tokenCall
	tokenHold  chan struct{} // token requests wait until it is closed
	held       int           // token requests waiting
}

// tokenCall is one request to the token endpoint and what it got.
type tokenCall struct {
	Form          url.Values // the request body
	BasicAuth     bool       // whether client credentials came in a header
	Status        int
	IssuedAccess  string
	IssuedRefresh string
}

// deniedUser is refused at the authorization endpoint (access_denied).
const deniedUser = bob

// providerConfig shapes the tokens a provider issues.
type providerConfig struct {
	// AccessTTL is the lifetime of the access token a code buys.
	AccessTTL time.Duration
	// RefreshedAccessTTL is the lifetime of an access token a refresh
	// buys; default AccessTTL.
	RefreshedAccessTTL time.Duration
	// RefreshTTL is the lifetime of a refresh token; default 1h.
	RefreshTTL time.Duration
	// Public registers toolgate as a public client (no secret).
	Public bool
	// TokenBytes, when set, makes every issued access and refresh token
	// this long (the library's own token plus random padding), for grants
	// larger than a KMS can encrypt directly.
	TokenBytes int
}

func startOAuthProvider(t testing.TB, cfg providerConfig) *oauthProvider {
	t.Helper()
	if cfg.RefreshedAccessTTL == 0 {
		cfg.RefreshedAccessTTL = cfg.AccessTTL
	}
	if cfg.RefreshTTL == 0 {
		cfg.RefreshTTL = time.Hour
	}
	p := &oauthProvider{ClientID: "toolgate-test"}
	if !cfg.Public {
		p.ClientSecret = "test-client-secret-" + randomString(8)
	}

	m := manage.NewDefaultManager()
	m.SetAuthorizeCodeTokenCfg(&manage.Config{AccessTokenExp: cfg.AccessTTL, RefreshTokenExp: cfg.RefreshTTL, IsGenerateRefresh: true})
	m.SetRefreshTokenCfg(&manage.RefreshingConfig{
		AccessTokenExp:     cfg.RefreshedAccessTTL,
		RefreshTokenExp:    cfg.RefreshTTL,
		IsGenerateRefresh:  true,
		IsResetRefreshTime: true,
		IsRemoveAccess:     true,
		IsRemoveRefreshing: true,
	})
	if cfg.TokenBytes > 0 {
		m.MapAccessGenerate(paddedTokens{AccessGenerate: generates.NewAccessGenerate(), size: cfg.TokenBytes})
	}
	tokens, err := store.NewMemoryTokenStore()
	if err != nil {
		t.Fatal(err)
	}
	m.MapTokenStorage(tokens)
	p.clients = store.NewClientStore()
	m.MapClientStorage(p.clients)
	m.SetValidateURIHandler(func(registered, redirect string) error {
		if registered != redirect {
			return oauth2errors.ErrInvalidRedirectURI
		}
		return nil
	})
	srv := server.NewServer(&server.Config{
		TokenType:                   "Bearer",
		AllowedResponseTypes:        []oauth2.ResponseType{oauth2.Code},
		AllowedGrantTypes:           []oauth2.GrantType{oauth2.AuthorizationCode, oauth2.Refreshing},
		AllowedCodeChallengeMethods: []oauth2.CodeChallengeMethod{oauth2.CodeChallengeS256},
		ForcePKCE:                   true,
	}, m)
	srv.SetClientInfoHandler(server.ClientFormHandler)
	srv.SetUserAuthorizationHandler(func(_ http.ResponseWriter, r *http.Request) (string, error) {
		switch hint := r.FormValue("login_hint"); hint {
		case "":
			return "test-user", nil
		case deniedUser:
			return "", oauth2errors.ErrAccessDenied
		default:
			return hint, nil
		}
	})
	p.server, p.manager = srv, m

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	p.URL = "http://" + p.addr
	p.AuthorizeURL = p.URL + "/authorize"
	p.TokenURL = p.URL + "/token"
	p.serve(l)
	t.Cleanup(p.stop)
	return p
}

// allowRedirect registers toolgate's callback URL as the client's one
// redirect URI.
func (p *oauthProvider) allowRedirect(uri string) {
	_ = p.clients.Set(p.ClientID, &models.Client{ID: p.ClientID, Secret: p.ClientSecret, Domain: uri, Public: p.ClientSecret == ""})
}

func (p *oauthProvider) serve(l net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/authorize", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.authorizes = append(p.authorizes, r.URL.Query())
		p.mu.Unlock()
		if err := p.server.HandleAuthorizeRequest(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		p.mu.Lock()
		hold := p.tokenHold
		if hold != nil {
			p.held++
		}
		p.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		rec := &recordingWriter{ResponseWriter: w, status: http.StatusOK}
		_ = p.server.HandleTokenRequest(rec, r)
		_, _, basic := r.BasicAuth()
		call := tokenCall{Form: r.PostForm, BasicAuth: basic, Status: rec.status}
		var issued struct {
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
		}
		if json.Unmarshal(rec.body.Bytes(), &issued) == nil {
			call.IssuedAccess, call.IssuedRefresh = issued.AccessToken, issued.RefreshToken
		}
		p.mu.Lock()
		p.tokenCalls = append(p.tokenCalls, call)
		p.mu.Unlock()
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	p.mu.Lock()
	p.httpServer = hs
	p.mu.Unlock()
	go func() { _ = hs.Serve(l) }()
}

// holdTokens makes token requests wait, as a slow provider's do, until
// the returned function is called.
func (p *oauthProvider) holdTokens() (release func()) {
	hold := make(chan struct{})
	p.mu.Lock()
	p.tokenHold = hold
	p.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			p.tokenHold = nil
			p.mu.Unlock()
			close(hold)
		})
	}
}

// heldTokenRequests counts the token requests that waited so far.
func (p *oauthProvider) heldTokenRequests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// stop shuts the provider down: token requests fail to connect.
func (p *oauthProvider) stop() {
	p.mu.Lock()
	hs := p.httpServer
	p.httpServer = nil
	p.mu.Unlock()
	if hs != nil {
		_ = hs.Close()
	}
}

// restart serves again on the same address, with the same grants.
func (p *oauthProvider) restart(t testing.TB) {
	t.Helper()
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("restarting the provider on %s: %v", p.addr, err)
	}
	p.serve(l)
}

// calls returns the token requests so far.
func (p *oauthProvider) calls() []tokenCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]tokenCall(nil), p.tokenCalls...)
}

// authorizeRequests returns the query of every authorization request.
func (p *oauthProvider) authorizeRequests() []url.Values {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]url.Values(nil), p.authorizes...)
}

// refreshes returns the refresh requests so far.
func (p *oauthProvider) refreshes() []tokenCall {
	var out []tokenCall
	for _, c := range p.calls() {
		if c.Form.Get("grant_type") == "refresh_token" {
			out = append(out, c)
		}
	}
	return out
}

// userOf validates an access token like a resource server would, and
// returns its user.
func (p *oauthProvider) userOf(ctx context.Context, authorization string) (string, error) {
	token, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return "", errors.New("no bearer token")
	}
	ti, err := p.manager.LoadAccessToken(ctx, token)
	if err != nil {
		return "", err
	}
	return ti.GetUserID(), nil
}

// checkRotation verifies that every refresh sent the refresh token the
// provider issued last, so no rotated-out refresh token was ever sent
// again.
func (p *oauthProvider) checkRotation(t testing.TB) {
	t.Helper()
	sent := map[string]int{}
	latest := ""
	for i, c := range p.calls() {
		switch c.Form.Get("grant_type") {
		case "refresh_token":
			rt := c.Form.Get("refresh_token")
			sent[rt]++
			if sent[rt] > 1 {
				t.Errorf("token call %d: refresh token sent %d times (reused after rotation)", i, sent[rt])
			}
			if rt != latest {
				t.Errorf("token call %d: sent a refresh token that is not the latest one issued", i)
			}
		}
		if c.Status == http.StatusOK && c.IssuedRefresh != "" {
			latest = c.IssuedRefresh
		}
	}
}

// paddedTokens issues the library's tokens padded with random characters
// to size bytes.
type paddedTokens struct {
	*generates.AccessGenerate
	size int
}

func (g paddedTokens) Token(ctx context.Context, data *oauth2.GenerateBasic, isGenRefresh bool) (string, string, error) {
	access, refresh, err := g.AccessGenerate.Token(ctx, data, isGenRefresh)
	if err != nil {
		return "", "", err
	}
	pad := func(tok string) string {
		if tok == "" || len(tok) >= g.size {
			return tok
		}
		n := g.size - len(tok) - 1
		return tok + "." + randomString(n/2 + 1)[:n]
	}
	return pad(access), pad(refresh), nil
}

type recordingWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *recordingWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

func (w *recordingWriter) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}
