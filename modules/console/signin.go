package console

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/coreos/go-oidc/v3/oidc"
	"go.uber.org/zap"
	"golang.org/x/oauth2"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/websession"
	"github.com/toolgate/toolgate/modules/gateway"
)

// OIDCIssuer is an OpenID Connect provider people sign in to the console
// with (authorization code flow with PKCE; the ID token is verified
// against the issuer's published keys). The console is its client: register
// <public_url>/console/signin/callback as the redirect URI.
type OIDCIssuer struct {
	// Issuer is the issuer URL; its /.well-known/openid-configuration is
	// read at the first sign-in.
	Issuer string `json:"issuer"`
	// ClientID is the console's client id at the issuer.
	ClientID string `json:"client_id"`
	// ClientSecret is the console's client secret; empty for a public
	// client.
	ClientSecret string `json:"client_secret,omitempty"`
	// Scopes are requested at sign-in. Default "openid email profile".
	Scopes []string `json:"scopes,omitempty"`
	// UserClaim names the claim that identifies the person; it must name
	// them the way runners' tokens do. Default: the user_claim of the auth
	// block's jwt issuer with the same issuer URL, else "sub".
	UserClaim string `json:"user_claim,omitempty"`
	// GroupsClaim names the claim listing the person's groups. Default:
	// the groups_claim of that jwt issuer, else "groups".
	GroupsClaim string `json:"groups_claim,omitempty"`
	// Name labels the sign-in button. Default "Sign in with <issuer host>".
	Name string `json:"name,omitempty"`

	client   *http.Client
	mu       sync.Mutex
	provider *oidc.Provider // discovered at the first sign-in
}

func (o *OIDCIssuer) provision(app *gateway.App) error {
	repl := caddy.NewReplacer()
	o.Issuer = strings.TrimSuffix(repl.ReplaceKnown(o.Issuer, ""), "/")
	o.ClientID = repl.ReplaceKnown(o.ClientID, "")
	var err error
	if o.ClientSecret, err = caddyopt.Secret(repl, o.ClientSecret); err != nil {
		return fmt.Errorf("toolgate_console: oidc %s: client_secret %w", caddyopt.RedactURL(o.Issuer), err)
	}
	if len(o.Scopes) == 0 {
		o.Scopes = []string{oidc.ScopeOpenID, "email", "profile"}
	}
	for _, j := range app.Auth.JWT {
		if j.Issuer == o.Issuer {
			if o.UserClaim == "" {
				o.UserClaim = j.UserClaim
			}
			if o.GroupsClaim == "" {
				o.GroupsClaim = j.GroupsClaim
			}
		}
	}
	if o.UserClaim == "" {
		o.UserClaim = "sub"
	}
	if o.GroupsClaim == "" {
		o.GroupsClaim = "groups"
	}
	if o.Name == "" {
		if u, err := url.Parse(o.Issuer); err == nil && u.Host != "" {
			o.Name = "Sign in with " + u.Host
		}
	}
	o.client = app.HTTPClient()
	return nil
}

func (o *OIDCIssuer) validate() error {
	u, err := url.Parse(o.Issuer)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("toolgate_console: oidc issuer %q must be an absolute http(s) URL", caddyopt.RedactURL(o.Issuer))
	}
	if err := caddyopt.FetchURL(o.Issuer); err != nil {
		// Whoever answers for the issuer serves the keys sign-ins are
		// verified with.
		return fmt.Errorf("toolgate_console: oidc issuer %w", err)
	}
	if o.ClientID == "" {
		return fmt.Errorf("toolgate_console: oidc %s: client_id is required", o.Issuer)
	}
	return nil
}

// discover returns the issuer's provider, reading its discovery document
// the first time (and again after a failure).
func (o *OIDCIssuer) discover(ctx context.Context) (*oidc.Provider, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provider != nil {
		return o.provider, nil
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, o.client), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, o.Issuer)
	if err != nil {
		return nil, err
	}
	o.provider = p
	return p, nil
}

func (o *OIDCIssuer) config(p *oidc.Provider, redirect string) *oauth2.Config {
	return &oauth2.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, Endpoint: p.Endpoint(),
		RedirectURL: redirect, Scopes: o.Scopes}
}

// signInData is what the sign-in page shows.
type signInData struct {
	Return      string
	Issuers     []*OIDCIssuer
	APIKeyLogin bool
}

// signInPage offers the ways to sign in.
func (h *Handler) signInPage(w http.ResponseWriter, r *http.Request) {
	v := view{Title: "Sign in", Data: signInData{Return: safeReturn(r.URL.Query().Get("return")), Issuers: h.OIDC, APIKeyLogin: h.APIKeyLogin}}
	switch r.URL.Query().Get("notice") {
	case "signed-out":
		v.Notice = ok("You are signed out.")
	case "signed-out-everywhere":
		v.Notice = ok("You are signed out in every browser.")
	}
	h.render(w, http.StatusOK, "signin", v)
}

// safeReturn keeps a return path only if it is a console page of this
// gateway: never another site (open redirect).
func safeReturn(p string) string {
	if !strings.HasPrefix(p, gateway.ConsolePath) || !strings.HasPrefix(path.Clean(p), gateway.ConsolePath) ||
		strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return gateway.ConsolePath + "services"
	}
	return p
}

// apiKeySignIn signs a person in with an API key of the auth block.
func (h *Handler) apiKeySignIn(w http.ResponseWriter, r *http.Request) {
	if !h.APIKeyLogin {
		h.refuse(w, r, http.StatusNotFound, "Not found", "Signing in with an API key is not enabled on this gateway.")
		return
	}
	if !h.sameOrigin(r) {
		h.refuse(w, r, http.StatusForbidden, "Refused", "This form was not sent from a toolgate page.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	key := strings.TrimSpace(r.PostFormValue("api_key"))
	back := safeReturn(r.PostFormValue("return"))
	caller, found := h.app.Auth.CallerForAPIKey(key)
	if !found {
		h.logger.Info("console sign-in with an unknown API key", zap.String("remote_ip", r.RemoteAddr))
		v := view{Title: "Sign in", Notice: problem("That API key is not known to this gateway.", "Check it and try again; API keys are case-sensitive."),
			Data: signInData{Return: back, Issuers: h.OIDC, APIKeyLogin: h.APIKeyLogin}}
		h.render(w, http.StatusUnauthorized, "signin", v)
		return
	}
	h.startSession(w, r, caller.User, caller.Groups, websession.MethodAPIKey, gateway.KeyDigest(key), back)
}

// startSession signs user in in this browser (by method; key is an API
// key's digest, or the OpenID Connect issuer) and goes to back.
func (h *Handler) startSession(w http.ResponseWriter, r *http.Request, user string, groups []string, method, key, back string) {
	s, err := h.browsers.Create(r.Context(), user, groups, method, key, time.Duration(h.SessionIdle), time.Duration(h.SessionLifetime))
	if err != nil {
		h.logger.Error("storing a browser session", zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate could not sign you in because its storage is unavailable. Try again in a moment.")
		return
	}
	h.logger.Info("signed in to the console", zap.String("user", user), zap.String("method", method))
	websession.SetCookie(w, s, h.secure(r))
	http.Redirect(w, r, back, http.StatusSeeOther)
}

func (h *Handler) signOut(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	if err := h.browsers.Delete(r.Context(), s); err != nil {
		h.logger.Error("ending a browser session", zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate could not sign you out because its storage is unavailable. Try again in a moment.")
		return
	}
	websession.ClearCookie(w, h.secure(r))
	http.Redirect(w, r, gateway.ConsolePath+"signin?notice=signed-out", http.StatusSeeOther)
}

func (h *Handler) signOutEverywhere(w http.ResponseWriter, r *http.Request, s *websession.Session) {
	if _, err := h.browsers.DeleteAll(r.Context(), s.User); err != nil {
		h.logger.Error("ending browser sessions", zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Unavailable", "toolgate could not sign you out everywhere because its storage is unavailable. Try again in a moment.")
		return
	}
	websession.ClearCookie(w, h.secure(r))
	http.Redirect(w, r, gateway.ConsolePath+"signin?notice=signed-out-everywhere", http.StatusSeeOther)
}

// The OpenID Connect sign-in keeps its state (state, nonce, PKCE verifier,
// where to return) in a short-lived cookie sealed with a key derived from
// the toolgate state_secret: nothing is stored for a visitor who has not
// signed in yet.
const (
	signInCookie       = "toolgate_signin"
	secureSignInCookie = "__Host-toolgate_signin"
	signInTTL          = 10 * time.Minute
)

// signInState is what the browser's sign-in cookie carries between the
// start of an OpenID Connect sign-in and its callback. It names the
// issuer and client the sign-in started at, not their place among the
// oidc blocks: after a reload that reorders or removes them, a code
// completes nothing at another issuer (it would learn the code and the
// PKCE verifier).
type signInState struct {
	Issuer   string `json:"iss"`
	ClientID string `json:"cid"`
	State    string `json:"s"`
	Nonce    string `json:"n"`
	Verifier string `json:"v"`
	Return   string `json:"r"`
	Expiry   int64  `json:"e"`
}

func signInCookieName(secure bool) string {
	if secure {
		return secureSignInCookie
	}
	return signInCookie
}

// signInAEAD is the cookie's AEAD under secret (the state_secret, or a
// previous one).
func signInAEAD(secret string) cipher.AEAD {
	key := sha256.Sum256([]byte("toolgate console sign-in\x00" + secret))
	block, _ := aes.NewCipher(key[:])
	aead, _ := cipher.NewGCM(block)
	return aead
}

func (h *Handler) sealSignIn(st signInState) string {
	plain, _ := json.Marshal(st)
	aead := signInAEAD(h.app.StateSecret)
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(aead.Seal(nonce, nonce, plain, []byte(signInCookie)))
}

func (h *Handler) openSignIn(value string) (signInState, bool) {
	var st signInState
	sealed, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(sealed) < 12 {
		return st, false
	}
	for _, secret := range append([]string{h.app.StateSecret}, h.app.PreviousStateSecrets...) {
		aead := signInAEAD(secret)
		plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], []byte(signInCookie))
		if err == nil {
			return st, json.Unmarshal(plain, &st) == nil && time.Now().Unix() <= st.Expiry
		}
	}
	return st, false
}

// issuer returns the oidc block the request's path names by its place.
func (h *Handler) issuer(r *http.Request) *OIDCIssuer {
	i, err := strconv.Atoi(r.PathValue("issuer"))
	if err != nil || i < 0 || i >= len(h.OIDC) {
		return nil
	}
	return h.OIDC[i]
}

// oidcIssuer returns the oidc block of issuer and clientID, nil when none.
func (h *Handler) oidcIssuer(issuer, clientID string) *OIDCIssuer {
	for _, o := range h.OIDC {
		if o.Issuer == issuer && o.ClientID == clientID {
			return o
		}
	}
	return nil
}

// oidcStart sends the browser to the issuer.
func (h *Handler) oidcStart(w http.ResponseWriter, r *http.Request) {
	o := h.issuer(r)
	if o == nil {
		h.refuse(w, r, http.StatusNotFound, "Not found", "There is no such sign-in on this gateway.")
		return
	}
	p, err := o.discover(r.Context())
	if err != nil {
		h.logger.Warn("cannot read the identity provider's configuration", zap.String("issuer", o.Issuer), zap.Error(err))
		h.refuse(w, r, http.StatusServiceUnavailable, "Sign-in unavailable", "toolgate cannot reach the identity provider right now. Try again in a moment; if it persists, tell the gateway's administrator.")
		return
	}
	st := signInState{Issuer: o.Issuer, ClientID: o.ClientID, State: gateway.NewID(), Nonce: gateway.NewID(), Verifier: oauth2.GenerateVerifier(),
		Return: safeReturn(r.URL.Query().Get("return")), Expiry: time.Now().Add(signInTTL).Unix()}
	secure := h.secure(r)
	http.SetCookie(w, &http.Cookie{Name: signInCookieName(secure), Value: h.sealSignIn(st), Path: "/", MaxAge: int(signInTTL.Seconds()),
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode})
	cfg := o.config(p, h.app.BaseURL(r)+gateway.ConsolePath+"signin/callback")
	http.Redirect(w, r, cfg.AuthCodeURL(st.State, oidc.Nonce(st.Nonce), oauth2.S256ChallengeOption(st.Verifier)), http.StatusSeeOther)
}

// oidcCallback finishes an OpenID Connect sign-in.
func (h *Handler) oidcCallback(w http.ResponseWriter, r *http.Request) {
	secure := h.secure(r)
	c, err := r.Cookie(signInCookieName(secure))
	if err != nil {
		h.refuse(w, r, http.StatusBadRequest, "Not signed in", "This sign-in was not started in this browser, or took too long. Start again from the sign-in page.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signInCookieName(secure), Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode})
	st, valid := h.openSignIn(c.Value)
	q := r.URL.Query()
	if !valid || q.Get("state") != st.State {
		h.refuse(w, r, http.StatusBadRequest, "Not signed in", "This sign-in link is invalid, was already used, or took too long. Start again from the sign-in page.")
		return
	}
	o := h.oidcIssuer(st.Issuer, st.ClientID)
	if o == nil {
		h.refuse(w, r, http.StatusBadRequest, "Not signed in", "The identity provider this sign-in started at is no longer configured here. Start again from the sign-in page.")
		return
	}
	if e := q.Get("error"); e != "" {
		h.refuse(w, r, http.StatusBadRequest, "Not signed in", "The identity provider did not sign you in ("+safeCode(e)+"). Start again from the sign-in page.")
		return
	}
	user, groups, err := h.verifySignIn(r, o, st, q.Get("code"))
	if err != nil {
		h.logger.Warn("console sign-in refused", zap.String("issuer", o.Issuer), zap.Error(err))
		h.refuse(w, r, http.StatusUnauthorized, "Not signed in", "toolgate could not verify your sign-in: "+err.Error()+". Start again from the sign-in page.")
		return
	}
	h.startSession(w, r, user, groups, websession.MethodOIDC, o.Issuer, st.Return)
}

// verifySignIn exchanges the code and reads the person from the verified
// ID token (or, for claims the ID token lacks, from the userinfo endpoint,
// whose subject must be the token's). Errors are safe to show.
func (h *Handler) verifySignIn(r *http.Request, o *OIDCIssuer, st signInState, code string) (string, []string, error) {
	if code == "" {
		return "", nil, errors.New("the provider sent no authorization code")
	}
	p, err := o.discover(r.Context())
	if err != nil {
		return "", nil, errors.New("the identity provider is unreachable")
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(context.Background(), o.client), 10*time.Second)
	defer cancel()
	ctx = context.WithValue(ctx, oauth2.HTTPClient, o.client)
	tok, err := o.config(p, h.app.BaseURL(r)+gateway.ConsolePath+"signin/callback").Exchange(ctx, code, oauth2.VerifierOption(st.Verifier))
	if err != nil {
		return "", nil, errors.New("the identity provider did not accept the sign-in")
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", nil, errors.New("the identity provider sent no ID token")
	}
	idToken, err := p.Verifier(&oidc.Config{ClientID: o.ClientID}).Verify(ctx, raw)
	if err != nil {
		return "", nil, errors.New("the ID token did not verify")
	}
	if idToken.Nonce != st.Nonce {
		return "", nil, errors.New("the ID token is not for this sign-in")
	}
	claims := map[string]any{}
	if err := idToken.Claims(&claims); err != nil {
		return "", nil, errors.New("the ID token's claims are unreadable")
	}
	if _, ok := claims[o.UserClaim]; !ok || claims[o.GroupsClaim] == nil {
		// Many providers put profile claims only in userinfo.
		if info, err := p.UserInfo(ctx, oauth2.StaticTokenSource(tok)); err == nil && info.Subject == idToken.Subject {
			extra := map[string]any{}
			if info.Claims(&extra) == nil {
				for k, v := range extra {
					if _, have := claims[k]; !have {
						claims[k] = v
					}
				}
			}
		}
	}
	user, _ := claims[o.UserClaim].(string)
	if user == "" {
		return "", nil, fmt.Errorf("the identity provider did not say who you are (no %q claim)", o.UserClaim)
	}
	if o.UserClaim == "email" && !gateway.EmailVerified(claims["email_verified"]) {
		// Anyone who can put an address on an account at the provider
		// (sign-up, an editable profile) would sign in as its owner.
		return "", nil, errors.New("the identity provider has not verified your email address, which names you here; verify it there, or ask the administrator to name users by another claim (such as sub)")
	}
	groups, err := gateway.GroupsClaim(claims, o.GroupsClaim)
	if err != nil {
		return "", nil, fmt.Errorf("the %q claim is not a list of group names", o.GroupsClaim)
	}
	return user, groups, nil
}

// safeCode keeps an OAuth error code printable and short.
func safeCode(code string) string {
	if len(code) > 40 {
		code = code[:40]
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r == '_' {
			return r
		}
		return -1
	}, code)
}
