package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// Caller is who sent a request, as the authenticator established it. One
// Caller is shared by every request that authenticates the same way (an API
// key, a JWT until it expires, the anonymous caller): treat it as
// read-only. Steps may key per-caller caches on its address.
type Caller struct {
	// User identifies the caller (an e-mail address, a subject).
	User string
	// Groups the caller belongs to, for policy.
	Groups []string
	// Claims are the verified JWT claims; nil for API keys.
	Claims map[string]any
	// Method is how the caller authenticated: "api_key", "jwt" or "anonymous".
	Method string
}

// AuthConfig says how callers prove who they are. Every option may be
// combined; a bearer token that looks like a JWT is checked as one when JWT
// issuers are configured, anything else as an API key.
type AuthConfig struct {
	// APIKeys are accepted API keys, stored as hashes.
	APIKeys []APIKey `json:"api_keys,omitempty"`

	// APIKeysFile is a JSON file holding more API keys: an array of
	// {"hash": "sha256:…", "user": "…", "groups": ["…"]}. It is read when
	// the config loads.
	APIKeysFile string `json:"api_keys_file,omitempty"`

	// JWT lists trusted JWT issuers.
	JWT []*JWTIssuer `json:"jwt,omitempty"`

	// Scopes are the OAuth scopes an MCP client should ask the
	// authorization server for when it gets a token for toolgate: listed in
	// the protected-resource metadata (scopes_supported) and in the
	// WWW-Authenticate challenge of a 401 (scope). toolgate does not
	// require them in tokens; a policy can check the token's claims.
	Scopes []string `json:"scopes,omitempty"`

	// Anonymous, when set, treats requests without an Authorization header
	// as this caller, and lets them use every service without a session.
	// Only requests from loopback addresses are accepted this way. Meant for
	// local protocol testing; never enable it on a shared gateway.
	Anonymous string `json:"anonymous,omitempty"`

	keys      map[[sha256.Size]byte]*APIKey // by the key's SHA-256
	anonymous *Caller
	verified  *verifiedTokens
}

// APIKey is one accepted API key.
type APIKey struct {
	// Hash is "sha256:" followed by the hex SHA-256 of the key. API keys
	// are long random strings, so a fast hash is enough; the key itself is
	// never stored: printf %s "$KEY" | sha256sum gives the hex digest.
	Hash string `json:"hash"`
	// User is the caller the key authenticates.
	User string `json:"user"`
	// Groups the caller belongs to.
	Groups []string `json:"groups,omitempty"`

	caller *Caller
}

// JWTIssuer is one trusted issuer of JWT bearer tokens.
type JWTIssuer struct {
	// Issuer is the required "iss" claim.
	Issuer string `json:"issuer"`
	// Audience lists accepted "aud" values; the token must carry one.
	Audience []string `json:"audience"`
	// JWKSURL is where the issuer publishes its signing keys: https, or
	// plain http to a loopback address only (a local test server). Fetched
	// when the gateway starts and again (at most once a minute) when a
	// token names an unknown key id or the keys were fetched more than 10
	// minutes ago: a key the issuer stopped publishing verifies no new
	// token after 15 minutes (see keySet.lookup). A token verified once is remembered
	// until it expires, so removing its key does not revoke it.
	JWKSURL string `json:"jwks_url,omitempty"`
	// KeyFiles are PEM files with static public keys (or a JWKS JSON file).
	KeyFiles []string `json:"key_files,omitempty"`
	// UserClaim names the claim that identifies the caller. Default "sub".
	// With "email", a token must also carry email_verified: true (or
	// "true"): an address anyone could put on an account at the issuer
	// names no one.
	UserClaim string `json:"user_claim,omitempty"`
	// GroupsClaim names the claim listing the caller's groups. Default
	// "groups". It must be an array of strings when present: a token whose
	// claim has another shape (a string, an array holding numbers) is
	// refused. A token without it has no groups.
	GroupsClaim string `json:"groups_claim,omitempty"`
	// Leeway tolerates clock skew on exp and nbf. Default 30s, at most 5m.
	Leeway caddy.Duration `json:"leeway,omitempty"`

	keys *keySet
}

const (
	defaultLeeway = 30 * time.Second
	maxLeeway     = 5 * time.Minute
)

// users are the callers the configuration names (its API keys' and the
// anonymous one), each once.
func (a *AuthConfig) users() []string {
	var users []string
	seen := make(map[string]bool, len(a.keys)+1)
	add := func(u string) {
		if u != "" && !seen[u] {
			seen[u] = true
			users = append(users, u)
		}
	}
	for _, k := range a.keys {
		add(k.User)
	}
	add(a.Anonymous)
	return users
}

// HashAPIKey returns the stored form of an API key.
func HashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Authentication errors. Messages are safe to show to the caller.
var (
	ErrNoCredentials  = errors.New("missing bearer token")
	ErrBadCredentials = errors.New("invalid bearer token")
)

var signingAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

func (a *AuthConfig) provision(repl *caddy.Replacer) error {
	a.keys = make(map[[sha256.Size]byte]*APIKey)
	a.verified = &verifiedTokens{tokens: make(map[[sha256.Size]byte]verifiedToken)}
	if a.Anonymous != "" {
		a.anonymous = &Caller{User: a.Anonymous, Method: "anonymous"}
	}
	keys := a.APIKeys
	if a.APIKeysFile != "" {
		path := repl.ReplaceKnown(a.APIKeysFile, "")
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("auth api_keys: %v", err)
		}
		var fromFile []APIKey
		if err := json.Unmarshal(data, &fromFile); err != nil {
			return fmt.Errorf("auth api_keys %s: %v", path, err)
		}
		keys = append(keys[:len(keys):len(keys)], fromFile...)
	}
	for i := range keys {
		k := &keys[i]
		digest, ok := strings.CutPrefix(k.Hash, "sha256:")
		if !ok || len(digest) != hex.EncodedLen(sha256.Size) {
			return fmt.Errorf("auth api key for %q: hash must be sha256:<64 hex digits>", k.User)
		}
		var sum [sha256.Size]byte
		if _, err := hex.Decode(sum[:], []byte(digest)); err != nil {
			return fmt.Errorf("auth api key for %q: hash must be sha256:<64 hex digits>", k.User)
		}
		if k.User == "" {
			return fmt.Errorf("auth api key %s…: user is required", k.Hash[:15])
		}
		if prev, dup := a.keys[sum]; dup {
			// One key is one identity: which line wins would decide who
			// its holder is (and which groups they have).
			return fmt.Errorf("auth api keys: the key %s… is given twice, for %q and %q: give each person their own key", k.Hash[:15], prev.User, k.User)
		}
		k.caller = &Caller{User: k.User, Groups: k.Groups, Method: "api_key"}
		a.keys[sum] = k
	}
	issuers := make(map[string]bool, len(a.JWT))
	for _, j := range a.JWT {
		if issuers[j.Issuer] {
			// verifyJWT consults the first block of an issuer only: the
			// second one's audience, keys and claims would never apply.
			return fmt.Errorf("auth jwt %s: issuer given twice: merge the two blocks into one", j.Issuer)
		}
		issuers[j.Issuer] = true
		if err := j.provision(repl); err != nil {
			return err
		}
	}
	for _, scope := range a.Scopes {
		if !validScope(scope) {
			return fmt.Errorf("auth scopes: %q is not an OAuth scope (printable ASCII without spaces, quotes or backslashes)", scope)
		}
	}
	return nil
}

// validScope reports whether s is a scope token (RFC 6749, section 3.3),
// which can be quoted in a WWW-Authenticate challenge as it is.
func validScope(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

func (j *JWTIssuer) provision(repl *caddy.Replacer) error {
	j.JWKSURL = repl.ReplaceKnown(j.JWKSURL, "")
	if j.Issuer == "" {
		return errors.New("auth jwt: issuer is required")
	}
	if len(j.Audience) == 0 {
		return fmt.Errorf("auth jwt %s: audience is required", j.Issuer)
	}
	if j.JWKSURL == "" && len(j.KeyFiles) == 0 {
		return fmt.Errorf("auth jwt %s: give jwks_url or key_file", j.Issuer)
	}
	if j.JWKSURL != "" {
		// Whoever serves the keys can sign a token for any user.
		if err := caddyopt.FetchURL(j.JWKSURL); err != nil {
			return fmt.Errorf("auth jwt %s: jwks_url %v", j.Issuer, err)
		}
	}
	if j.Leeway < 0 || time.Duration(j.Leeway) > maxLeeway {
		// A token expired longer ago than the leeway is refused: a long
		// one keeps expired tokens working.
		return fmt.Errorf("auth jwt %s: leeway %s is out of range: 0 to %s (it only absorbs clock skew; default %s)",
			j.Issuer, caddyopt.DurationText(time.Duration(j.Leeway)), caddyopt.DurationText(maxLeeway), caddyopt.DurationText(defaultLeeway))
	}
	if j.UserClaim == "" {
		j.UserClaim = "sub"
	}
	if j.GroupsClaim == "" {
		j.GroupsClaim = "groups"
	}
	if j.Leeway == 0 {
		j.Leeway = caddy.Duration(defaultLeeway)
	}
	var static []jose.JSONWebKey
	for _, f := range j.KeyFiles {
		keys, err := loadKeyFile(repl.ReplaceKnown(f, ""))
		if err != nil {
			return fmt.Errorf("auth jwt %s: key_file %s: %v", j.Issuer, f, err)
		}
		static = append(static, keys...)
	}
	if j.JWKSURL == "" {
		j.keys = &keySet{static: static}
		return nil
	}
	// The fetched JWKS is shared across config reloads.
	v, _, err := jwksPool.LoadOrNew(j.JWKSURL, func() (caddy.Destructor, error) {
		return &keySet{url: j.JWKSURL}, nil
	})
	if err != nil {
		return err
	}
	shared := v.(*keySet)
	j.keys = &keySet{url: j.JWKSURL, static: static, shared: shared}
	return nil
}

func (j *JWTIssuer) cleanup() {
	if j.keys != nil && j.keys.shared != nil {
		_, _ = jwksPool.Delete(j.JWKSURL)
	}
}

// start fetches the JWKS, waiting for it only at the first start. A
// failure is logged, not fatal: tokens are rejected until the keys can be
// fetched.
func (a *AuthConfig) start(ctx context.Context, client *http.Client, logger *zap.Logger) {
	for _, j := range a.JWT {
		if j.JWKSURL == "" {
			continue
		}
		// On a reload the set is shared with the configuration in force,
		// which fetched it (or tried): it is fetched again in the
		// background, as lookups do (at most once a minute). Waiting for
		// it here would hold the requests taken meanwhile (App.Started)
		// on an issuer that is slow to answer.
		reload := j.keys.shared.fetchTried()
		if !reload {
			if err := j.keys.refresh(ctx, client); err != nil {
				logger.Warn("cannot fetch JWKS; JWTs from this issuer are rejected until it succeeds",
					zap.String("issuer", j.Issuer), zap.String("jwks_url", caddyopt.RedactURL(j.JWKSURL)), zap.Error(err))
			}
		}
		j.keys.client = client
		j.keys.shared.mu.Lock()
		j.keys.shared.logger = logger
		j.keys.shared.mu.Unlock()
		if reload {
			j.keys.shared.startFetch(client)
		}
	}
}

// Authenticate checks the request's bearer token. remoteLoopback says
// whether the request came from a loopback address (for Anonymous).
func (a *AuthConfig) Authenticate(ctx context.Context, r *http.Request, remoteLoopback bool) (*Caller, error) {
	return a.authenticate(ctx, r, remoteLoopback, "", false)
}

// authenticate is Authenticate; a JWT whose audience is resource (when
// not "") is accepted besides those of its issuer's audience list. With
// underway, r was authenticated before (by an earlier configuration) and
// what it began goes on: a JWT that expired since still vouches for it,
// as its expiry ends nothing under way when no reload comes.
func (a *AuthConfig) authenticate(ctx context.Context, r *http.Request, remoteLoopback bool, resource string, underway bool) (*Caller, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		if a.anonymous != nil && remoteLoopback {
			return a.anonymous, nil
		}
		return nil, ErrNoCredentials
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, ErrBadCredentials
	}
	token = strings.TrimSpace(token)
	if len(a.JWT) > 0 && strings.Count(token, ".") == 2 {
		// One verdict per token, whichever endpoint it is sent to: it
		// keeps the token's audience, which decides where it serves
		// (remembered per endpoint, one token sent to many paths would
		// be verified and remembered once per path).
		sum := sha256.Sum256([]byte(token))
		if c := a.verified.get(sum, resource); c != nil {
			return c, nil
		}
		v, err := a.verifyJWT(ctx, token, resource, underway)
		if err != nil {
			return nil, err
		}
		if !underway {
			a.verified.put(sum, v)
		}
		return v.caller, nil
	}
	k := a.keys[sha256.Sum256([]byte(token))]
	if k == nil {
		return nil, ErrBadCredentials
	}
	return k.caller, nil
}

// CallerForAPIKey returns the caller an API key authenticates, as a bearer
// token would (the console's API-key sign-in).
func (a *AuthConfig) CallerForAPIKey(key string) (*Caller, bool) {
	if key == "" {
		return nil, false
	}
	k := a.keys[sha256.Sum256([]byte(key))]
	if k == nil {
		return nil, false
	}
	return k.caller, true
}

// KeyDigest is the SHA-256 (hex) of an API key, as CallerForAPIKeyDigest
// takes it.
func KeyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// CallerForAPIKeyDigest returns the caller the API key with that digest
// (KeyDigest) authenticates now.
func (a *AuthConfig) CallerForAPIKeyDigest(digest string) (*Caller, bool) {
	b, err := hex.DecodeString(digest)
	if err != nil || len(b) != sha256.Size {
		return nil, false
	}
	k := a.keys[[sha256.Size]byte(b)]
	if k == nil {
		return nil, false
	}
	return k.caller, true
}

// verifyJWT checks a JWT's signature and claims, and gives its verdict:
// the caller, until when it holds (its exp, plus the leeway), and where
// (its audience). Its audience must be one of its issuer's, or resource
// when that is not "".
func (a *AuthConfig) verifyJWT(ctx context.Context, token, resource string, underway bool) (verifiedToken, error) {
	tok, err := jwt.ParseSigned(token, signingAlgorithms)
	if err != nil || len(tok.Headers) != 1 {
		return verifiedToken{}, ErrBadCredentials
	}
	var unverified jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return verifiedToken{}, ErrBadCredentials
	}
	for _, j := range a.JWT {
		if unverified.Issuer != j.Issuer {
			continue
		}
		keys, err := j.keys.lookup(ctx, tok.Headers[0].KeyID)
		if err != nil {
			return verifiedToken{}, ErrBadCredentials
		}
		var claims jwt.Claims
		var all map[string]any
		verified := false
		for _, key := range keys {
			if tok.Claims(key, &claims, &all) == nil {
				verified = true
				break
			}
		}
		if !verified {
			return verifiedToken{}, ErrBadCredentials
		}
		if claims.Expiry == nil {
			return verifiedToken{}, fmt.Errorf("%w: no exp claim", ErrBadCredentials)
		}
		audience := j.Audience
		if resource != "" {
			audience = append(audience[:len(audience):len(audience)], resource)
		}
		expected := jwt.Expected{Issuer: j.Issuer, AnyAudience: audience, Time: now()}
		if last := claims.Expiry.Time().Add(time.Duration(j.Leeway) - time.Nanosecond); underway && last.Before(expected.Time) {
			// The last instant this token was accepted at (see
			// authenticate): its nbf and iat are judged at it too.
			expected.Time = last
		}
		if err := claims.ValidateWithLeeway(expected, time.Duration(j.Leeway)); err != nil {
			return verifiedToken{}, fmt.Errorf("%w: %s", ErrBadCredentials, claimsProblem(err))
		}
		user, _ := all[j.UserClaim].(string)
		if user == "" {
			return verifiedToken{}, fmt.Errorf("%w: no %s claim", ErrBadCredentials, j.UserClaim)
		}
		if j.UserClaim == "email" && !EmailVerified(all["email_verified"]) {
			// Anyone who can put an address on an account at the issuer
			// (sign-up, an editable profile) would be its owner here.
			return verifiedToken{}, fmt.Errorf("%w: the email claim names the caller and the token does not say email_verified: true", ErrBadCredentials)
		}
		groups, err := GroupsClaim(all, j.GroupsClaim)
		if err != nil {
			return verifiedToken{}, fmt.Errorf("%w: %v", ErrBadCredentials, err)
		}
		return verifiedToken{
			caller:    &Caller{User: user, Groups: groups, Claims: all, Method: "jwt"},
			until:     claims.Expiry.Time().Add(time.Duration(j.Leeway)),
			audiences: claims.Audience,
			anywhere:  slices.ContainsFunc(j.Audience, claims.Audience.Contains),
		}, nil
	}
	return verifiedToken{}, ErrBadCredentials
}

// EmailVerified reads an email_verified claim: true, or "true" as some
// providers write it. A person named by their email is named so only when
// the issuer says it verified the address (the runners' JWTs and the
// console's OpenID Connect sign-in alike).
func EmailVerified(v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case string:
		return v == "true"
	}
	return false
}

// GroupsClaim reads the caller's groups from the claim name: absent or
// null is no group (an empty list, never a missing one); anything but an
// array of strings refuses the token, so that a rule such as "deny unless
// in group eng" cannot be dodged by a claim of another shape.
func GroupsClaim(claims map[string]any, name string) ([]string, error) {
	raw := claims[name]
	if raw == nil {
		return []string{}, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("the %s claim must be an array of strings, not %T", name, raw)
	}
	groups := make([]string, 0, len(list))
	for _, g := range list {
		s, ok := g.(string)
		if !ok {
			return nil, fmt.Errorf("the %s claim must be an array of strings; it holds a %T", name, g)
		}
		groups = append(groups, s)
	}
	return groups, nil
}

// verifiedTokens remembers the callers of JWTs already verified, until
// each token expires, so that a runner's every call does not pay for a
// signature check. Keyed by the token's SHA-256 (one entry per token,
// whichever endpoints it is sent to); bounded.
type verifiedTokens struct {
	mu     sync.Mutex
	tokens map[[sha256.Size]byte]verifiedToken
}

// verifiedToken is the verdict on one JWT.
type verifiedToken struct {
	caller *Caller
	until  time.Time
	// audiences are the token's aud values; anywhere says one of them
	// is its issuer's, which makes it good outside any endpoint and at
	// every one. Otherwise it serves only at an endpoint it names.
	audiences []string
	anywhere  bool
}

// serves reports whether the token is for resource (see authenticate).
func (t *verifiedToken) serves(resource string) bool {
	return t.anywhere || resource != "" && slices.Contains(t.audiences, resource)
}

const maxVerifiedTokens = 10_000

// get returns the caller of the token with SHA-256 sum when it was
// verified, has not expired and serves resource; nil otherwise (a token
// sent where its audience does not serve is verified again, and refused).
func (v *verifiedTokens) get(sum [sha256.Size]byte, resource string) *Caller {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.tokens[sum]
	if !ok {
		return nil
	}
	if !now().Before(t.until) {
		delete(v.tokens, sum)
		return nil
	}
	if !t.serves(resource) {
		return nil
	}
	return t.caller
}

func (v *verifiedTokens) put(sum [sha256.Size]byte, t verifiedToken) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, known := v.tokens[sum]; !known && len(v.tokens) >= maxVerifiedTokens {
		clear(v.tokens)
	}
	v.tokens[sum] = t
}

// claimsProblem says which of a token's registered claims is refused, in
// a runner's words rather than the JWT library's.
func claimsProblem(err error) string {
	switch {
	case errors.Is(err, jwt.ErrInvalidAudience):
		return "the token is not for this gateway or endpoint (aud)"
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return "the token's issuer is not the one configured (iss)"
	case errors.Is(err, jwt.ErrExpired):
		return "the token expired (exp)"
	case errors.Is(err, jwt.ErrNotValidYet):
		return "the token is not valid yet (nbf)"
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return "the token was issued in the future (iat): check the issuer's clock"
	}
	return "its claims are refused"
}
