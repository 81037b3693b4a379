package demo

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-oauth2/oauth2/v4"
	oauth2errors "github.com/go-oauth2/oauth2/v4/errors"
	"github.com/go-oauth2/oauth2/v4/manage"
	"github.com/go-oauth2/oauth2/v4/models"
	"github.com/go-oauth2/oauth2/v4/server"
	"github.com/go-oauth2/oauth2/v4/store"
)

// provider is the tracker's OAuth 2 authorization server, built with
// github.com/go-oauth2/oauth2/v4: the authorization code grant with PKCE
// S256 (required), one registered client with one exact redirect URI,
// short-lived access tokens and refresh tokens that rotate on every use.
// It has no login page: every authorization is approved at once, for the
// user named by the login_hint parameter, or DefaultUser.
type provider struct {
	server  *server.Server
	manager *manage.Manager
}

// DefaultUser is who the demo provider signs in when the authorization
// request has no login_hint.
const DefaultUser = "demo-user"

// Token extension keys: whether the grant's first access token was issued,
// and how many times the grant was refreshed since.
const (
	extIssued    = "demo_issued"
	extRefreshes = "demo_refreshes"
)

func newProvider(h *Handler) (*provider, error) {
	m := manage.NewDefaultManager()
	m.SetAuthorizeCodeExp(time.Minute)
	life := time.Duration(h.AccessTokenLifetime)
	m.SetAuthorizeCodeTokenCfg(&manage.Config{AccessTokenExp: life, RefreshTokenExp: 24 * time.Hour, IsGenerateRefresh: true})
	m.SetRefreshTokenCfg(&manage.RefreshingConfig{
		AccessTokenExp:     life,
		IsGenerateRefresh:  true, // rotate: every refresh returns a new refresh token
		IsResetRefreshTime: true,
		IsRemoveAccess:     true,
		IsRemoveRefreshing: true, // and the old one stops working
	})
	tokens, err := store.NewMemoryTokenStore()
	if err != nil {
		return nil, err
	}
	m.MapTokenStorage(chainCounter{tokens})
	clients := store.NewClientStore()
	if err := clients.Set(h.ClientID, &models.Client{ID: h.ClientID, Secret: h.ClientSecret, Domain: h.RedirectURI, Public: h.ClientSecret == ""}); err != nil {
		return nil, err
	}
	m.MapClientStorage(clients)
	// The redirect URI must be exactly the registered one.
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
	// Client credentials in the request body (client_secret_post); a
	// public client sends only its id.
	srv.SetClientInfoHandler(server.ClientFormHandler)
	srv.SetUserAuthorizationHandler(func(_ http.ResponseWriter, r *http.Request) (string, error) {
		if hint := r.FormValue("login_hint"); hint != "" {
			return hint, nil
		}
		return DefaultUser, nil
	})
	// Errors go back to the client's redirect URI only when that is the
	// registered one; anything else gets a plain 400 here.
	srv.SetPreRedirectErrorHandler(func(w http.ResponseWriter, req *server.AuthorizeRequest, err error) error {
		if req == nil || req.ClientID != h.ClientID || req.RedirectURI != h.RedirectURI {
			http.Error(w, "invalid authorization request: "+err.Error(), http.StatusBadRequest)
			return nil
		}
		data, _, _ := srv.GetErrorData(err)
		uri, uerr := srv.GetRedirectURI(req, data)
		if uerr != nil {
			http.Error(w, "invalid authorization request", http.StatusBadRequest)
			return nil
		}
		http.Redirect(w, req.Request, uri, http.StatusFound)
		return nil
	})
	return &provider{server: srv, manager: m}, nil
}

func (p *provider) authorize(w http.ResponseWriter, r *http.Request) {
	if err := p.server.HandleAuthorizeRequest(w, r); err != nil {
		http.Error(w, "invalid authorization request", http.StatusBadRequest)
	}
}

func (p *provider) token(w http.ResponseWriter, r *http.Request) {
	_ = p.server.HandleTokenRequest(w, r)
}

// grant is what an access token tells the tracker.
type grant struct {
	User      string
	Refreshes int
}

// lookup validates an access token against the token store.
func (p *provider) lookup(ctx context.Context, access string) (grant, bool) {
	ti, err := p.manager.LoadAccessToken(ctx, access)
	if err != nil {
		return grant{}, false
	}
	g := grant{User: ti.GetUserID()}
	if et, ok := ti.(oauth2.ExtendableTokenInfo); ok {
		g.Refreshes, _ = strconv.Atoi(et.GetExtension().Get(extRefreshes))
	}
	return g, true
}

// chainCounter counts refreshes per grant chain in the tokens themselves:
// go-oauth2 stores a refreshed token with the extension fields of the token
// it replaces, so a counter there follows the chain of rotations.
type chainCounter struct {
	oauth2.TokenStore
}

func (s chainCounter) Create(ctx context.Context, info oauth2.TokenInfo) error {
	et, ok := info.(oauth2.ExtendableTokenInfo)
	if ok && info.GetCode() == "" && info.GetAccess() != "" {
		ext := et.GetExtension()
		if ext == nil {
			ext = url.Values{}
		}
		if ext.Get(extIssued) == "" {
			ext.Set(extIssued, "1")
		} else {
			n, _ := strconv.Atoi(ext.Get(extRefreshes))
			ext.Set(extRefreshes, strconv.Itoa(n+1))
		}
		et.SetExtension(ext)
	}
	return s.TokenStore.Create(ctx, info)
}
