package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
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

	"go.uber.org/zap"
	"golang.org/x/oauth2"
)

// OAuth for services with `auth oauth`: the connect flow (an authorization
// URL with PKCE S256, an RFC 8707 resource and a signed, single-use state;
// then the callback's code exchange), and the provider's errors. Keeping
// the grants it stores fresh is grants.go's.
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
		return fmt.Errorf("%w (token_type %s); the gateway's administrator must configure the provider to issue bearer tokens to toolgate", ErrTokenType, tokenTypeName(tok.TokenType))
	}
	if !headerToken(tok.AccessToken) {
		return fmt.Errorf("%w: its access token is empty, longer than %d bytes, or holds characters a header cannot carry", ErrTokenType, maxAccessToken)
	}
	return nil
}

// tokenTypeName names a token_type a provider gave for the log and the
// caller's error: one of the types RFC 6749's registry and RFC 9449 know,
// else none. The provider writes the member, so it can write anything
// into it, the refresh token or the client secret it was sent included.
func tokenTypeName(t string) string {
	for _, known := range []string{"DPoP", "MAC", "N_A", "PoP"} {
		if strings.EqualFold(t, known) {
			return known
		}
	}
	return "of another kind"
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

// oauthState is what the state parameter carries, sealed: who started the
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

// statePurpose names the keys that seal the OAuth state (Keyring).
const statePurpose = "toolgate/v1/oauth-state"

// maxState bounds the state parameter read back.
const maxState = 2048

// sealState encodes st sealed (AES-256-GCM under a key of the
// state_secret), bound to its service, as base64url: the provider, its
// logs and the browser's history see the state but learn nothing from it
// (who the person is goes to the provider only with login_hint).
func (a *App) sealState(st oauthState) (string, error) {
	keys, err := a.Keyring(statePurpose)
	if err != nil {
		return "", err
	}
	plain, _ := json.Marshal(st)
	return base64.RawURLEncoding.EncodeToString(keys.Seal(plain, []byte(st.Service))), nil
}

// verifyState opens a state (sealed with state_secret, or a previous one)
// and checks its expiry and service.
func (a *App) verifyState(state, service string) (oauthState, error) {
	var st oauthState
	if len(state) > maxState {
		return st, ErrInvalidState
	}
	sealed, err := base64.RawURLEncoding.DecodeString(state)
	if err != nil {
		return st, ErrInvalidState
	}
	keys, err := a.Keyring(statePurpose)
	if err != nil {
		return st, ErrInvalidState
	}
	plain, err := keys.Open(sealed, []byte(service))
	if err != nil {
		return st, ErrInvalidState
	}
	if err := json.Unmarshal(plain, &st); err != nil || st.Nonce == "" || st.User == "" || st.Browser == "" {
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
	// Issuer is the service's OAuthClient.issuer when the connect started:
	// a reload that moved the service since leaves the code and verifier
	// unsent to the new provider.
	Issuer string `json:"issuer,omitempty"`
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
	sum := sha256.Sum256([]byte(CanonicalURL(o.TokenURL) + "\x00" + o.ClientID + "\x00" + CanonicalURL(o.Resource)))
	o.issued = hex.EncodeToString(sum[:16])
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

// issuer names where o's grants come from: its token endpoint, client id
// and resource (Connection.Issuer).
func (o *OAuthClient) issuer() string { return o.issued }

// ErrGrantElsewhere: the person's grant was issued under another
// authorization server, client or resource than the service names now.
var ErrGrantElsewhere = fmt.Errorf("%w: your connection was made with another OAuth provider or client than the service uses now; connect again", ErrNotConnected)

// issuedBy reports whether c may be used with o: an OAuth grant issued
// under o, or one of an earlier version that did not record its issuer
// (its first refresh records o's).
func (c *Connection) issuedBy(o *OAuthClient) bool {
	return c.Kind == AuthOAuth && (c.Issuer == "" || c.Issuer == o.issuer())
}

// UsableFor reports whether c is a credential of the kind svc takes now:
// a personal token for auth bearer, an OAuth grant issued under svc's
// client for auth oauth (a reload may have changed the kind; the token
// stored for the other is not sent).
func (c *Connection) UsableFor(svc *Service) bool {
	switch svc.Auth.Kind {
	case AuthBearer:
		return c.Kind == AuthBearer
	case AuthOAuth:
		return svc.Auth.OAuth != nil && c.issuedBy(svc.Auth.OAuth)
	}
	return false
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
// sealed state valid for 10 minutes, bound to that browser sign-in. The
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
	secret, _ := json.Marshal(pendingSecret{Verifier: verifier, User: user, Service: svc.ID, Issuer: o.issuer()})
	sealed, err := a.cipher.Encrypt(ctx, secret, pendingContext(svc.ID, user))
	clear(secret)
	if err != nil {
		return "", fmt.Errorf("encrypting the pending sign-in: %w", err)
	}
	state, err := a.sealState(oauthState{User: user, Browser: browser.Ref, Service: svc.ID, Expiry: expires.Unix(), Nonce: nonce})
	if err != nil {
		return "", err
	}
	rec, _ := json.Marshal(pendingAuthorization{StartedAt: now().UTC(), ExpiresAt: expires.UTC(), Sealed: sealed})
	if err := a.storage.Store(ctx, pendingKey(user, nonce), rec); err != nil {
		return "", fmt.Errorf("%w: storing the pending sign-in: %v", ErrStorageUnavailable, err)
	}
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
	if !svc.AllowsUser(st.User) {
		// A reload removed them from the service's allowed_users since
		// the connect started: nothing is exchanged or stored, and the
		// started connect goes.
		_, _ = a.takePending(ctx, st)
		countConnect(svc.ID, "invalid_state")
		a.logger.Warn("oauth callback for a user the service no longer allows; nothing connected",
			zap.String("service", svc.ID), zap.String("user", st.User))
		return "", ErrInvalidState
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
	if pending.Issuer != o.issuer() {
		// Started under another provider, client or resource: the code is
		// that one's, and the verifier is not the new provider's to see.
		countConnect(svc.ID, "invalid_state")
		a.logger.Warn("oauth callback of a connect started before a reload changed the service's provider; nothing connected",
			zap.String("service", svc.ID), zap.String("user", st.User))
		return "", ErrInvalidState
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
	conn := &Connection{Kind: AuthOAuth, ConnectedAt: now().UTC(), Issuer: o.issuer()}
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
