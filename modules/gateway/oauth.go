package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
	"golang.org/x/sync/singleflight"
)

// OAuth for services with `auth oauth`: the connect flow (an authorization
// URL with PKCE S256, an RFC 8707 resource and a signed, single-use state;
// then the callback's code exchange) and access tokens kept fresh by the
// gateway, one refresh per grant at a time across every replica that shares
// the storage.
//
// Nothing here logs or returns a token, a code, a verifier or a state.

const (
	// authorizationTTL is how long a started sign-in may take.
	authorizationTTL = 10 * time.Minute
	// providerTimeout bounds one token request (code exchange or refresh).
	providerTimeout = 10 * time.Second
	// refreshTimeout bounds a whole refresh: waiting for the storage lock
	// another replica may hold, then the token request.
	refreshTimeout = 30 * time.Second
	// pendingLockTimeout bounds waiting for a pending authorization's lock.
	pendingLockTimeout = 10 * time.Second

	pendingPrefix = "toolgate/oauth-pending"
)

// Errors of the OAuth flow. Their texts are safe to show to users.
var (
	// ErrInvalidState: a callback's state is malformed, forged, expired,
	// for another service, or already used.
	ErrInvalidState = errors.New("the sign-in link is invalid, has expired or was already used")
	// ErrOtherBrowser: a callback arrived in a browser that is not signed in
	// to toolgate as the person who started the connect, in the toolgate
	// sign-in it was started from. Nothing is connected, and the started
	// connect can no longer complete.
	ErrOtherBrowser = errors.New("this connect was started by another toolgate user or in another browser")
	// ErrGrantRejected: the provider refused the code or the refresh token
	// (4xx invalid_grant, invalid_client or unauthorized_client). A refused
	// grant is deleted; the user must connect again.
	ErrGrantRejected = errors.New("the provider rejected the grant")
	// ErrGrantExpired: the access token expired and there is no refresh
	// token to renew it.
	ErrGrantExpired = errors.New("the access token expired and the provider gave no refresh token")
	// ErrProviderUnavailable: the provider failed (5xx), timed out or could
	// not be reached. Retrying later may succeed; the grant is kept.
	ErrProviderUnavailable = errors.New("the OAuth provider is unavailable")
	// ErrTokenType: the provider issued a token of a type toolgate does not
	// present (it sends bearer tokens only; RFC 6749 section 7.1: a client
	// must not use a token type it does not understand, and a DPoP-bound
	// token sent as a bearer token loses its binding). Nothing is stored.
	ErrTokenType = errors.New("the provider issued a token toolgate cannot present (it sends bearer tokens only)")
)

// checkBearer checks that tok is a bearer token (a missing token_type counts as
// one, as golang.org/x/oauth2 takes it).
func checkBearer(tok *oauth2.Token) error {
	if tok.Type() != "Bearer" {
		return fmt.Errorf("%w (token_type %q); the gateway's administrator must configure the provider to issue bearer tokens to toolgate", ErrTokenType, tok.TokenType)
	}
	if !headerToken(tok.AccessToken) {
		return fmt.Errorf("%w: its access token is empty, longer than %d bytes, or holds characters a header cannot carry", ErrTokenType, maxAccessToken)
	}
	return nil
}

// maxAccessToken bounds an access token toolgate keeps and sends.
const maxAccessToken = 64 << 10

// headerToken reports whether a token can go in an Authorization header as
// it is: not empty, at most maxAccessToken bytes, visible ASCII only (RFC
// 6750's b64token is a subset). Any other would fail every call, each
// time as a retryable error, instead of asking the person to connect again.
func headerToken(t string) bool {
	if t == "" || len(t) > maxAccessToken {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// ProviderError describes a failed token request without its response
// body, which may hold secrets: only the HTTP status and the RFC 6749 error
// code. It wraps ErrGrantRejected or ErrProviderUnavailable.
type ProviderError struct {
	Status int    // the provider's HTTP status; 0 when it did not answer
	Code   string // the RFC 6749 error code, e.g. invalid_grant; may be empty
	Reason string // what went wrong when the provider did not answer
	kind   error
}

func (e *ProviderError) Error() string {
	var b strings.Builder
	b.WriteString(e.kind.Error())
	switch {
	case e.Status != 0 && e.Code != "":
		fmt.Fprintf(&b, " (HTTP %d, %s)", e.Status, e.Code)
	case e.Status != 0:
		fmt.Fprintf(&b, " (HTTP %d)", e.Status)
	case e.Reason != "":
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	return b.String()
}

func (e *ProviderError) Unwrap() error { return e.kind }

// rejectingCodes are the token-endpoint error codes after which a grant is
// useless: retrying cannot succeed, the user must connect again.
var rejectingCodes = map[string]bool{"invalid_grant": true, "invalid_client": true, "unauthorized_client": true}

// classifyTokenError turns an error of golang.org/x/oauth2 into a
// *ProviderError.
func classifyTokenError(err error) *ProviderError {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		pe := &ProviderError{Code: safeErrorCode(re.ErrorCode), kind: ErrProviderUnavailable}
		if re.Response != nil {
			pe.Status = re.Response.StatusCode
		}
		if pe.Status < 500 && rejectingCodes[pe.Code] {
			pe.kind = ErrGrantRejected
		}
		return pe
	}
	pe := &ProviderError{kind: ErrProviderUnavailable, Reason: "unexpected answer"}
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		pe.Reason = "timeout"
	case errors.As(err, &netErr):
		pe.Reason = "unreachable"
	}
	return pe
}

// safeErrorCode keeps an RFC 6749 error code if it looks like one (its
// grammar is printable ASCII; real codes are lower-case words), so nothing
// a provider sends reaches logs or pages unfiltered.
func safeErrorCode(code string) string {
	if code == "" || len(code) > 64 {
		return ""
	}
	for _, c := range code {
		if (c < 'a' || c > 'z') && c != '_' {
			return "other"
		}
	}
	return code
}

// oauthState is what the signed state parameter carries: who started the
// sign-in, from which toolgate browser sign-in, for which service, until
// when, and the nonce naming its pending authorization.
type oauthState struct {
	User    string `json:"u"`
	Browser string `json:"b"`
	Service string `json:"s"`
	Expiry  int64  `json:"e"` // Unix seconds
	Nonce   string `json:"n"`
}

// Browser is the toolgate sign-in of a person's browser: who is signed in,
// and a reference to that sign-in which reveals nothing usable (see the
// console's browser sessions). A connect started in one Browser completes
// only in the same one.
type Browser struct {
	User string
	Ref  string
}

// signState encodes st as base64url(payload) "." base64url(HMAC-SHA256).
func (a *App) signState(st oauthState) string {
	payload, _ := json.Marshal(st)
	mac := hmac.New(sha256.New, []byte(a.StateSecret))
	mac.Write(payload)
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verifyState checks a state's signature (with state_secret, or a previous
// one), expiry and service.
func (a *App) verifyState(state, service string) (oauthState, error) {
	var st oauthState
	p, s, ok := strings.Cut(state, ".")
	if !ok || len(state) > 2048 {
		return st, ErrInvalidState
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p)
	sig, err2 := base64.RawURLEncoding.DecodeString(s)
	if err1 != nil || err2 != nil {
		return st, ErrInvalidState
	}
	signed := false
	for _, secret := range append([]string{a.StateSecret}, a.PreviousStateSecrets...) {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(payload)
		signed = signed || hmac.Equal(sig, mac.Sum(nil))
	}
	if !signed {
		return st, ErrInvalidState
	}
	if err := json.Unmarshal(payload, &st); err != nil || st.Nonce == "" || st.User == "" || st.Browser == "" {
		return st, ErrInvalidState
	}
	if st.Service != service || !now().Before(time.Unix(st.Expiry, 0)) {
		return st, ErrInvalidState
	}
	return st, nil
}

// pendingAuthorization is a started sign-in, stored under the hash of its
// nonce until the callback consumes it. Only the expiry is readable (for
// sweeping); the rest is cipher output.
type pendingAuthorization struct {
	StartedAt time.Time `json:"started_at"`
	ExpiresAt time.Time `json:"expires_at"`
	Sealed    []byte    `json:"sealed"`
}

// pendingSecret is the sealed part of a pending authorization.
type pendingSecret struct {
	Verifier string `json:"verifier"`
	User     string `json:"user"`
	Service  string `json:"service"`
}

// pendingKey is where user's started sign-in named by nonce waits for its
// callback: under the user, so that their number can be bounded.
func pendingKey(user, nonce string) string {
	return path.Join(pendingPrefix, hashKey(user), hashKey(nonce))
}

// maxPendingPerUser bounds the sign-ins one person may have started and not
// finished; starting another forgets the oldest.
const maxPendingPerUser = 5

// pendingContext is the cipher context of a pending authorization.
func pendingContext(service, user string) []byte {
	return []byte("toolgate/v1/oauth-pending/" + service + "/" + user)
}

// oauthConfig returns the OAuth client configuration of svc, or an error
// when svc does not use oauth.
func (a *App) oauthConfig(svc *Service) (*OAuthClient, error) {
	if svc.Auth == nil || svc.Auth.Kind != AuthOAuth || svc.Auth.OAuth == nil || svc.Auth.OAuth.config == nil {
		return nil, fmt.Errorf("service %s does not use oauth", svc.ID)
	}
	if a.connections == nil {
		return nil, errors.New("no cipher is configured")
	}
	return svc.Auth.OAuth, nil
}

// buildOAuthConfig prepares svc's OAuth client. The redirect URI is
// exactly <public_url>/v1/connections/<service>/callback; the client
// secret, when there is one, goes in the request body (public clients send
// none).
func (a *App) buildOAuthConfig(svc *Service) {
	o := svc.Auth.OAuth
	o.config = &oauth2.Config{
		ClientID:     o.ClientID,
		ClientSecret: o.ClientSecret,
		Endpoint: oauth2.Endpoint{
			AuthURL:   o.AuthorizationURL,
			TokenURL:  o.TokenURL,
			AuthStyle: oauth2.AuthStyleInParams,
		},
		RedirectURL: a.PublicURL + "/v1/connections/" + url.PathEscape(svc.ID) + "/callback",
		Scopes:      o.Scopes,
	}
	o.refreshConfig = &oauth2.Config{
		ClientID:     o.ClientID,
		ClientSecret: o.ClientSecret,
		Endpoint:     o.config.Endpoint,
	}
}

// RedirectURI is the callback URL registered at svc's provider.
func (a *App) RedirectURI(svc *Service) string {
	if o, err := a.oauthConfig(svc); err == nil {
		return o.config.RedirectURL
	}
	return ""
}

// AuthorizeURL starts a connect of svc by the person signed in to
// toolgate in browser: it stores a pending authorization (the PKCE
// verifier, sealed by the cipher) and returns the provider's authorization
// URL with the S256 challenge, the resource, the exact redirect URI and a
// signed state valid for 10 minutes, bound to that browser sign-in. The
// console calls it once that person confirmed, in that browser.
func (a *App) AuthorizeURL(ctx context.Context, svc *Service, browser Browser) (string, error) {
	o, err := a.oauthConfig(svc)
	if err != nil {
		return "", err
	}
	if browser.User == "" || browser.Ref == "" {
		return "", errors.New("a connect starts in a browser signed in to toolgate")
	}
	user := browser.User
	if err := a.boundPending(ctx, user); err != nil {
		return "", err
	}
	nonce, verifier := NewID(), oauth2.GenerateVerifier()
	expires := now().Add(authorizationTTL).Truncate(time.Second)
	secret, _ := json.Marshal(pendingSecret{Verifier: verifier, User: user, Service: svc.ID})
	sealed, err := a.cipher.Encrypt(ctx, secret, pendingContext(svc.ID, user))
	clear(secret)
	if err != nil {
		return "", fmt.Errorf("encrypting the pending sign-in: %w", err)
	}
	rec, _ := json.Marshal(pendingAuthorization{StartedAt: now().UTC(), ExpiresAt: expires.UTC(), Sealed: sealed})
	if err := a.storage.Store(ctx, pendingKey(user, nonce), rec); err != nil {
		return "", fmt.Errorf("%w: storing the pending sign-in: %v", ErrStorageUnavailable, err)
	}
	state := a.signState(oauthState{User: user, Browser: browser.Ref, Service: svc.ID, Expiry: expires.Unix(), Nonce: nonce})
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", o.Resource)}
	if o.LoginHint {
		opts = append(opts, oauth2.SetAuthURLParam("login_hint", user))
	}
	return o.config.AuthCodeURL(state, opts...), nil
}

// boundPending makes room for one more started sign-in of user: expired
// ones are deleted, and the oldest while user has maxPendingPerUser.
func (a *App) boundPending(ctx context.Context, user string) error {
	keys, err := a.storage.List(ctx, path.Join(pendingPrefix, hashKey(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: listing pending sign-ins: %v", ErrStorageUnavailable, err)
	}
	type started struct {
		key string
		at  time.Time
	}
	var live []started
	for _, key := range keys {
		data, err := a.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: reading a pending sign-in: %v", ErrStorageUnavailable, err)
		}
		var rec pendingAuthorization
		if json.Unmarshal(data, &rec) != nil || now().After(rec.ExpiresAt) {
			_ = a.storage.Delete(ctx, key)
			continue
		}
		live = append(live, started{key, rec.StartedAt})
	}
	slices.SortFunc(live, func(x, y started) int { return x.at.Compare(y.at) })
	for len(live) >= maxPendingPerUser {
		if err := a.storage.Delete(ctx, live[0].key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: deleting a pending sign-in: %v", ErrStorageUnavailable, err)
		}
		live = live[1:]
	}
	return nil
}

// CompleteAuthorization finishes a connect at svc's callback, opened in
// browser: it checks the state, and that browser is the toolgate sign-in
// the connect was started from (ErrOtherBrowser otherwise); consumes the
// pending authorization (a state works once); exchanges the code with the
// verifier and the resource; and stores the grant, replacing any earlier
// one. It returns the user who connected.
func (a *App) CompleteAuthorization(ctx context.Context, svc *Service, state, code string, browser Browser) (string, error) {
	o, err := a.oauthConfig(svc)
	if err != nil {
		return "", err
	}
	st, err := a.verifyState(state, svc.ID)
	if err != nil {
		countConnect(svc.ID, "invalid_state")
		return "", err
	}
	if browser.User != st.User || browser.Ref != st.Browser {
		// Someone else's browser finished the flow (a leaked link, or the
		// provider's redirect replayed elsewhere): connect nothing, and let
		// the started connect go, so the code cannot be tried again.
		_, _ = a.takePending(ctx, st)
		countConnect(svc.ID, "other_browser")
		a.logger.Warn("oauth callback in a browser that did not start the connect; nothing connected",
			zap.String("service", svc.ID), zap.String("user", st.User), zap.Bool("signed_in", browser.User != ""))
		return "", ErrOtherBrowser
	}
	pending, err := a.takePending(ctx, st)
	if err != nil {
		if errors.Is(err, ErrInvalidState) {
			countConnect(svc.ID, "invalid_state")
		} else {
			countConnect(svc.ID, "failed")
		}
		return "", err
	}
	tctx, cancel := a.tokenContext(providerTimeout)
	defer cancel()
	tok, err := o.config.Exchange(tctx, code, oauth2.VerifierOption(pending.Verifier), oauth2.SetAuthURLParam("resource", o.Resource))
	if err != nil {
		pe := classifyTokenError(err)
		if errors.Is(pe, ErrGrantRejected) {
			countConnect(svc.ID, "rejected")
		} else {
			countConnect(svc.ID, "failed")
		}
		a.logger.Warn("oauth code exchange failed", zap.String("service", svc.ID),
			zap.Int("status", pe.Status), zap.String("error_code", pe.Code), zap.String("reason", pe.Reason))
		return "", pe
	}
	if err := checkBearer(tok); err != nil {
		countConnect(svc.ID, "failed")
		a.logger.Warn("oauth code exchange gave a token toolgate cannot present; nothing connected", zap.String("service", svc.ID), zap.Error(err))
		return "", err
	}
	conn := &Connection{Kind: AuthOAuth, ConnectedAt: now().UTC()}
	conn.applyToken(tok, o.Scopes)
	if err := a.Connect(ctx, svc.ID, st.User, conn); err != nil {
		countConnect(svc.ID, "failed")
		a.logger.Error("storing a new oauth grant failed", zap.String("service", svc.ID), zap.Error(err))
		return "", err
	}
	countConnect(svc.ID, "connected")
	a.logger.Info("oauth grant connected", zap.String("service", svc.ID), zap.String("user", st.User),
		zap.Bool("refresh_token", conn.RefreshToken != ""), zap.Time("expiry", conn.Expiry))
	return st.User, nil
}

// AbandonAuthorization ends a sign-in the provider answered with an error
// (the user declined, …): the pending authorization is consumed so its
// state cannot be used again. Only the browser that started it may.
func (a *App) AbandonAuthorization(ctx context.Context, svc *Service, state string, browser Browser) error {
	if _, err := a.oauthConfig(svc); err != nil {
		return err
	}
	st, err := a.verifyState(state, svc.ID)
	if err != nil {
		countConnect(svc.ID, "invalid_state")
		return err
	}
	if browser.User != st.User || browser.Ref != st.Browser {
		return ErrOtherBrowser
	}
	_, err = a.takePending(ctx, st)
	countConnect(svc.ID, "denied")
	return err
}

// takePending consumes the pending authorization st names. It holds the
// storage lock of that authorization while reading and deleting it, so
// two callbacks racing with one state cannot both succeed.
func (a *App) takePending(ctx context.Context, st oauthState) (*pendingSecret, error) {
	key := pendingKey(st.User, st.Nonce)
	lock := "toolgate_oauth_pending_" + hashKey(st.Nonce)
	lctx, cancel := context.WithTimeout(ctx, pendingLockTimeout)
	defer cancel()
	if err := a.storage.Lock(lctx, lock); err != nil {
		return nil, fmt.Errorf("%w: locking the pending sign-in: %v", ErrStorageUnavailable, err)
	}
	defer a.unlock(lock)
	data, err := a.storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrInvalidState
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading the pending sign-in: %v", ErrStorageUnavailable, err)
	}
	var rec pendingAuthorization
	if err := json.Unmarshal(data, &rec); err != nil || now().After(rec.ExpiresAt) {
		_ = a.storage.Delete(ctx, key)
		return nil, ErrInvalidState
	}
	plain, err := a.cipher.Decrypt(ctx, rec.Sealed, pendingContext(st.Service, st.User))
	if err != nil {
		if errors.Is(err, ErrCipherUnavailable) {
			// Not consumed: the same link works once the cipher is back.
			return nil, fmt.Errorf("decrypting the pending sign-in: %w", err)
		}
		_ = a.storage.Delete(ctx, key)
		return nil, ErrInvalidState
	}
	var ps pendingSecret
	err = json.Unmarshal(plain, &ps)
	clear(plain)
	if err != nil || ps.User != st.User || ps.Service != st.Service || ps.Verifier == "" {
		_ = a.storage.Delete(ctx, key)
		return nil, ErrInvalidState
	}
	if err := a.storage.Delete(ctx, key); err != nil {
		return nil, fmt.Errorf("%w: consuming the pending sign-in: %v", ErrStorageUnavailable, err)
	}
	return &ps, nil
}

// sweepPending deletes pending authorizations that expired unused (or
// cannot be read).
func (a *App) sweepPending(ctx context.Context) (int, error) {
	t := now()
	return sweepExpired(ctx, a.storage, pendingPrefix, true, func(data []byte) bool {
		var rec pendingAuthorization
		return json.Unmarshal(data, &rec) != nil || t.After(rec.ExpiresAt)
	})
}

// tokenContext is the context of a token request: never a request's
// context (a refresh outlives the request that triggered it), bounded by
// timeout, using the app's HTTP client, which never follows redirects.
func (a *App) tokenContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	return context.WithValue(ctx, oauth2.HTTPClient, a.httpClient), cancel
}

// refreshes makes concurrent refreshes of one grant inside this process
// share a single attempt; the storage lock does the same across replicas.
// It is process-wide so that it spans config reloads and every handler.
var refreshes singleflight.Group

// refreshSkew is how long before its expiry c's access token is renewed:
// skew, but at most half the lifetime the provider gave the token.
func (c *Connection) refreshSkew(skew time.Duration) time.Duration {
	obtained := c.RefreshedAt
	if obtained.IsZero() {
		obtained = c.ConnectedAt
	}
	if life := c.Expiry.Sub(obtained); !obtained.IsZero() && life > 0 && skew > life/2 {
		return life / 2
	}
	return skew
}

// NeedsRefresh reports whether c's access token should be renewed before
// use, given the service's refresh_skew.
func (c *Connection) NeedsRefresh(skew time.Duration) bool {
	return c.Expired(c.refreshSkew(skew))
}

// applyToken copies what a token response holds into c. A response without
// a refresh token keeps the current one; without a scope, the scopes stay
// (or become the requested ones).
func (c *Connection) applyToken(tok *oauth2.Token, requested []string) {
	c.AccessToken = tok.AccessToken
	c.TokenType = tok.TokenType
	c.Expiry = tok.Expiry.UTC()
	if tok.Expiry.IsZero() {
		c.Expiry = time.Time{}
	}
	if tok.RefreshToken != "" {
		c.RefreshToken = tok.RefreshToken
	}
	if scope, _ := tok.Extra("scope").(string); scope != "" {
		c.Scopes = strings.Fields(scope)
	} else if c.Scopes == nil {
		c.Scopes = requested
	}
}

// OAuthConnection returns user's grant for the oauth service svc with an
// access token that is not about to expire. The steady state costs no
// provider or cipher round trip (the decrypted grant is cached); when the
// token is within refresh_skew of expiry it is refreshed first, once per
// grant however many calls wait for it, here or on other replicas.
//
// Errors: ErrNotConnected, ErrGrantExpired and ErrGrantRejected mean the
// user must connect (again); anything else (ErrProviderUnavailable,
// ErrCipherUnavailable, ErrStorageUnavailable) is worth retrying.
func (a *App) OAuthConnection(ctx context.Context, svc *Service, user string) (*Connection, error) {
	o, err := a.oauthConfig(svc)
	if err != nil {
		return nil, err
	}
	conn, err := a.connections.Load(ctx, svc.ID, user)
	if err != nil {
		return nil, err
	}
	if !conn.NeedsRefresh(time.Duration(o.RefreshSkew)) {
		return conn, nil
	}
	if conn.RefreshToken == "" {
		return nil, ErrGrantExpired
	}
	return a.refreshShared(ctx, svc, user, "")
}

// refreshShared refreshes user's grant for svc once however many callers
// ask at the same time. refused, when set, is an access token an upstream
// refused: the grant is refreshed even though it is not near expiry,
// unless the stored token is already another one.
func (a *App) refreshShared(ctx context.Context, svc *Service, user, refused string) (*Connection, error) {
	ch := refreshes.DoChan(ConnectionKey(svc.ID, user), func() (any, error) {
		conn, outcome, err := a.refresh(svc, user, refused)
		if outcome != "" {
			countRefresh(svc.ID, outcome)
		}
		return refreshed{conn, outcome}, err
	})
	select {
	case res := <-ch:
		r := res.Val.(refreshed)
		trace.SpanFromContext(ctx).AddEvent("oauth refresh", trace.WithAttributes(attribute.String("outcome", r.outcome)))
		if res.Err != nil {
			return nil, res.Err
		}
		return r.conn, nil
	case <-ctx.Done():
		return nil, &ProviderError{kind: ErrProviderUnavailable, Reason: "timeout"}
	}
}

// refreshed is what one refresh gave all who waited for it.
type refreshed struct {
	conn    *Connection
	outcome string // as toolgate_oauth_refreshes_total counts it; "" when not counted
}

// refreshLockName is the storage lock serializing refreshes of user's
// grant for service, derived from the grant's storage key. Connecting and
// disconnecting take it too, so that a refresh on its way never writes
// back a grant that was replaced or forgotten meanwhile.
func refreshLockName(service, user string) string {
	return "toolgate_refresh_" + hashKey(ConnectionKey(service, user))
}

// withGrantLock runs fn holding user's grant lock for service (see
// refreshLockName).
func (a *App) withGrantLock(ctx context.Context, service, user string, fn func() error) error {
	lock := refreshLockName(service, user)
	if err := a.storage.Lock(ctx, lock); err != nil {
		return fmt.Errorf("%w: waiting for the credential's lock: %v", ErrStorageUnavailable, err)
	}
	defer a.unlock(lock)
	return fn()
}

// Connect stores user's new credential for service (see
// ConnectionStore.Connect), after any refresh of the old one on its way.
func (a *App) Connect(ctx context.Context, service, user string, conn *Connection) error {
	if err := a.withGrantLock(ctx, service, user, func() error { return a.connections.Connect(ctx, service, user, conn) }); err != nil {
		return err
	}
	a.connections.settle(ctx, service, user)
	return nil
}

// refresh renews user's grant for svc under the grant's storage lock, and
// says how it went (the outcome toolgate_oauth_refreshes_total counts). It
// re-reads the grant first: another replica may have refreshed it while
// this one waited, and then no provider call is made. A rotated refresh
// token is stored before the new access token is returned.
func (a *App) refresh(svc *Service, user, refused string) (*Connection, string, error) {
	o := svc.Auth.OAuth
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	lock := refreshLockName(svc.ID, user)
	if err := a.storage.Lock(ctx, lock); err != nil {
		return nil, "failed", fmt.Errorf("%w: waiting for the refresh lock: %v", ErrStorageUnavailable, err)
	}
	defer a.unlock(lock)

	cur, err := a.connections.LoadFresh(ctx, svc.ID, user)
	if err != nil {
		if errors.Is(err, ErrNotConnected) {
			return nil, "", err
		}
		return nil, "failed", err
	}
	if !cur.NeedsRefresh(time.Duration(o.RefreshSkew)) && (refused == "" || cur.AccessToken != refused) {
		return cur, "already_refreshed", nil
	}
	if cur.RefreshToken == "" {
		return nil, "", ErrGrantExpired
	}

	tctx, tcancel := a.tokenContext(providerTimeout)
	defer tcancel()
	// golang.org/x/oauth2 has no refresh request that takes parameters,
	// and the RFC 8707 resource belongs on every token request; Exchange
	// with the grant type replaced sends one. Its empty "code" parameter
	// counts as absent (RFC 6749 section 3.2: "Parameters sent without a
	// value MUST be treated as if they were omitted from the request").
	tok, err := o.refreshConfig.Exchange(tctx, "",
		oauth2.SetAuthURLParam("grant_type", "refresh_token"),
		oauth2.SetAuthURLParam("refresh_token", cur.RefreshToken),
		oauth2.SetAuthURLParam("resource", o.Resource))
	if err != nil {
		pe := classifyTokenError(err)
		fields := []zap.Field{zap.String("service", svc.ID), zap.String("user", user),
			zap.Int("status", pe.Status), zap.String("error_code", pe.Code), zap.String("reason", pe.Reason)}
		if errors.Is(pe, ErrGrantRejected) {
			if err := a.connections.Reject(ctx, svc.ID, user); err != nil {
				a.logger.Error("deleting a rejected oauth grant failed", zap.String("service", svc.ID), zap.Error(err))
			}
			a.logger.Warn("the provider rejected the refresh token; the grant is deleted and the user must connect again", fields...)
			return nil, "rejected", pe
		}
		a.logger.Warn("oauth token refresh failed; the grant is kept", fields...)
		return nil, "failed", pe
	}
	if err := checkBearer(tok); err != nil {
		a.logger.Warn("oauth token refresh gave a token toolgate cannot present; the grant is kept", zap.String("service", svc.ID),
			zap.String("user", user), zap.Error(err))
		return nil, "failed", err
	}
	next := *cur
	next.applyToken(tok, o.Scopes)
	next.RefreshedAt = now().UTC()
	next.RefreshCount++
	if err := a.connections.Save(ctx, svc.ID, user, &next); err != nil {
		a.logger.Error("storing a refreshed oauth grant failed; if the provider rotated the refresh token, the user must connect again",
			zap.String("service", svc.ID), zap.String("user", user), zap.Error(err))
		return nil, "failed", err
	}
	a.logger.Debug("oauth token refreshed", zap.String("service", svc.ID), zap.String("user", user),
		zap.Int("refresh_count", next.RefreshCount), zap.Time("expiry", next.Expiry))
	stored := next
	return &stored, "refreshed", nil
}

// unlock releases a storage lock, logging a failure (the lock then expires
// by itself).
func (a *App) unlock(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.storage.Unlock(ctx, name); err != nil {
		a.logger.Warn("releasing a storage lock failed", zap.String("lock", name), zap.Error(err))
	}
}

// CredentialFor returns what toolgate attaches to svc's upstream requests
// for user: nil for auth none, the configured header, the user's personal
// token, or the user's OAuth access token (refreshed when near expiry).
// See [App.OAuthConnection] for the errors; [IsSignInError] tells which
// mean the user must connect.
func (a *App) CredentialFor(ctx context.Context, svc *Service, user string) (*Credential, error) {
	switch svc.Auth.Kind {
	case AuthNone:
		return nil, nil
	case AuthHeader:
		return &Credential{Header: svc.Auth.Header, Value: svc.Auth.Value}, nil
	case AuthBearer:
		if a.connections == nil {
			return nil, errors.New("no cipher is configured")
		}
		conn, err := a.connections.Load(ctx, svc.ID, user)
		if err != nil {
			return nil, err
		}
		return credentialOf(conn), nil
	case AuthOAuth:
		conn, err := a.OAuthConnection(ctx, svc, user)
		if err != nil {
			return nil, err
		}
		return credentialOf(conn), nil
	}
	return nil, fmt.Errorf("service %s: unknown auth kind %q", svc.ID, svc.Auth.Kind)
}

// credentialOf is the credential of a per-user connection.
func credentialOf(conn *Connection) *Credential {
	return &Credential{Header: "Authorization", Value: "Bearer " + conn.AccessToken, Grant: conn.Grant()}
}

// GrantFor names user's connection to svc as it stands (Connection.Grant),
// from the cache, without refreshing anything: "" for a service without
// per-user credentials, or when the user has none (the credentials step
// reports that). An error says the connection could not be read.
func (a *App) GrantFor(ctx context.Context, svc *Service, user string) (string, error) {
	if !svc.PerUserCredentials() || a.connections == nil {
		return "", nil
	}
	conn, err := a.connections.Load(ctx, svc.ID, user)
	switch {
	case errors.Is(err, ErrNotConnected):
		return "", nil
	case err != nil:
		return "", err
	}
	return conn.Grant(), nil
}

// CredentialRefused is called when the upstream answered 401 or 403 to a
// request carrying refused, the credential CredentialFor gave for user. It
// returns a credential worth one more try, or an error. The stored grant is
// read again first: another replica may have refreshed it (and the
// provider revoked the token this replica had cached). An OAuth grant whose
// stored token is the refused one is refreshed now, whatever its expiry.
// A personal bearer token or a service-wide header gets no second try.
func (a *App) CredentialRefused(ctx context.Context, svc *Service, user string, refused *Credential) (*Credential, error) {
	if refused == nil || (svc.Auth.Kind != AuthOAuth && svc.Auth.Kind != AuthBearer) {
		return nil, errors.New("no other credential to try")
	}
	conn, err := a.connections.LoadFresh(ctx, svc.ID, user)
	if err != nil {
		return nil, err
	}
	fresh := credentialOf(conn)
	if fresh.Value != refused.Value {
		return fresh, nil
	}
	if svc.Auth.Kind != AuthOAuth || conn.RefreshToken == "" {
		return nil, ErrGrantRejected
	}
	if !conn.RefreshedAt.IsZero() && now().Sub(conn.RefreshedAt) < refusedRefreshInterval {
		// Refreshed a moment ago, and refused all the same: a new token
		// would be refused too, and each refusal must not cost a token
		// request (a runner could make every call one).
		return nil, ErrGrantRejected
	}
	conn, err = a.refreshShared(ctx, svc, user, conn.AccessToken)
	if err != nil {
		return nil, err
	}
	if fresh = credentialOf(conn); fresh.Value == refused.Value {
		return nil, ErrGrantRejected
	}
	return fresh, nil
}

// refusedRefreshInterval is how long after a refresh an upstream's refusal
// of the token makes no new refresh: the person is asked to connect again.
const refusedRefreshInterval = time.Minute

// IsSignInError reports whether err (from CredentialFor) means the user
// must connect the service (again), as opposed to a failure worth retrying.
func IsSignInError(err error) bool {
	return errors.Is(err, ErrNotConnected) || errors.Is(err, ErrGrantExpired) || errors.Is(err, ErrGrantRejected)
}
