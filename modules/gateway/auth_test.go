package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"go.uber.org/zap"
)

func bearer(token string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/mcp/x", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func provisionAuth(t *testing.T, a *AuthConfig) *AuthConfig {
	t.Helper()
	if err := a.provision(caddy.NewReplacer()); err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		for _, j := range a.JWT {
			j.cleanup()
		}
	})
	return a
}

func TestAPIKeys(t *testing.T) {
	ctx := context.Background()
	upper := strings.ToUpper(strings.TrimPrefix(HashAPIKey("key-bob"), "sha256:"))
	a := provisionAuth(t, &AuthConfig{APIKeys: []APIKey{
		{Hash: HashAPIKey("key-alice"), User: "alice", Groups: []string{"eng"}},
		{Hash: "sha256:" + upper, User: "bob"}, // upper-case hex is accepted
	}})
	tests := []struct {
		name   string
		header string
		user   string
		err    error
	}{
		{"alice", "Bearer key-alice", "alice", nil},
		{"bob by an upper-case hash", "Bearer key-bob", "bob", nil},
		{"scheme is case-insensitive", "bearer key-alice", "alice", nil},
		{"surrounding spaces are trimmed", "Bearer  key-alice ", "alice", nil},
		{"wrong key", "Bearer key-mallory", "", ErrBadCredentials},
		{"hash instead of key", "Bearer " + HashAPIKey("key-alice"), "", ErrBadCredentials},
		{"hex digest instead of key", "Bearer " + strings.TrimPrefix(HashAPIKey("key-alice"), "sha256:"), "", ErrBadCredentials},
		{"key with different case", "Bearer KEY-ALICE", "", ErrBadCredentials},
		{"no header", "", "", ErrNoCredentials},
		{"basic auth", "Basic a2V5LWFsaWNl", "", ErrBadCredentials},
		{"scheme only", "Bearer", "", ErrBadCredentials},
		{"empty token", "Bearer ", "", ErrBadCredentials},
		{"blank token", "Bearer    ", "", ErrBadCredentials},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			caller, err := a.Authenticate(ctx, r, true)
			if tt.err != nil {
				if !errors.Is(err, tt.err) || caller != nil {
					t.Fatalf("Authenticate = %+v, %v; want %v", caller, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if caller.User != tt.user || caller.Method != "api_key" || caller.Claims != nil {
				t.Errorf("caller = %+v, want user %q by api_key", caller, tt.user)
			}
		})
	}
	c, _ := a.Authenticate(ctx, bearer("key-alice"), false)
	if c == nil || len(c.Groups) != 1 || c.Groups[0] != "eng" {
		t.Errorf("groups = %+v, want [eng]", c)
	}
	// The console's sign-in looks keys up the same way.
	for key, want := range map[string]string{
		"key-alice":             "alice",
		"key-bob":               "bob",
		"":                      "",
		"KEY-ALICE":             "",
		HashAPIKey("key-alice"): "",
		strings.TrimPrefix(HashAPIKey("key-alice"), "sha256:"): "",
	} {
		c, ok := a.CallerForAPIKey(key)
		if ok != (want != "") || ok && c.User != want {
			t.Errorf("CallerForAPIKey(%q) = %+v, %v; want user %q", key, c, ok, want)
		}
	}
}

func TestAPIKeyHashValidation(t *testing.T) {
	good := HashAPIKey("k")
	tests := []struct {
		name string
		key  APIKey
		want string
	}{
		{"no prefix", APIKey{Hash: strings.TrimPrefix(good, "sha256:"), User: "u"}, `auth api key for "u": hash must be sha256:<64 hex digits>`},
		{"other algorithm", APIKey{Hash: "md5:" + strings.TrimPrefix(good, "sha256:"), User: "u"}, "sha256:<64 hex digits>"},
		{"short digest", APIKey{Hash: good[:len(good)-2], User: "u"}, "sha256:<64 hex digits>"},
		{"long digest", APIKey{Hash: good + "00", User: "u"}, "sha256:<64 hex digits>"},
		{"not hex", APIKey{Hash: "sha256:" + strings.Repeat("zz", 32), User: "u"}, "sha256:<64 hex digits>"},
		{"the key itself", APIKey{Hash: "my-secret-key", User: "u"}, "sha256:<64 hex digits>"},
		{"no user", APIKey{Hash: good}, "user is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := (&AuthConfig{APIKeys: []APIKey{tt.key}}).provision(caddy.NewReplacer())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("provision = %v, want %q", err, tt.want)
			}
			if tt.key.Hash == "my-secret-key" && strings.Contains(err.Error(), "my-secret-key") {
				t.Errorf("error shows the misplaced key: %v", err)
			}
		})
	}
}

// A key listed twice is refused, whoever it names: otherwise the later
// line would silently decide who its holder is.
func TestAPIKeyGivenTwice(t *testing.T) {
	good := HashAPIKey("k")
	for _, second := range []APIKey{{Hash: good, User: "mallory", Groups: []string{"admins"}}, {Hash: good, User: "alice"}} {
		err := (&AuthConfig{APIKeys: []APIKey{{Hash: good, User: "alice"}, second}}).provision(caddy.NewReplacer())
		if err == nil || !strings.Contains(err.Error(), "given twice") || !strings.Contains(err.Error(), `"alice" and "`+second.User+`"`) {
			t.Errorf("provision with the key for alice and %s = %v", second.User, err)
		}
	}
}

func TestAPIKeysFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "keys.json")
	writeFile(t, file, `[
		{"hash": "`+HashAPIKey("file-key-1")+`", "user": "carol", "groups": ["ops", "oncall"]},
		{"hash": "`+HashAPIKey("file-key-2")+`", "user": "dave"}
	]`)
	t.Setenv("TG_TEST_KEYS_DIR", dir)
	inline := []APIKey{{Hash: HashAPIKey("inline"), User: "alice"}}
	a := provisionAuth(t, &AuthConfig{APIKeys: inline, APIKeysFile: "{env.TG_TEST_KEYS_DIR}/keys.json"})
	for key, user := range map[string]string{"inline": "alice", "file-key-1": "carol", "file-key-2": "dave"} {
		c, err := a.Authenticate(ctx, bearer(key), false)
		if err != nil || c.User != user {
			t.Errorf("key %q: %+v, %v; want %s", key, c, err, user)
		}
	}
	c, _ := a.Authenticate(ctx, bearer("file-key-1"), false)
	if c == nil || strings.Join(c.Groups, ",") != "ops,oncall" {
		t.Errorf("file groups = %+v", c)
	}
	if len(a.APIKeys) != 1 {
		t.Errorf("provision changed the configured APIKeys: %+v", a.APIKeys)
	}

	for name, tc := range map[string]struct{ content, want string }{
		"not JSON":       {`hash=x`, "keys.json"},
		"an object":      {`{"hash":"x"}`, "cannot unmarshal"},
		"a bad hash":     {`[{"hash":"sha256:00","user":"x"}]`, `auth api key for "x"`},
		"a missing user": {`[{"hash":"` + HashAPIKey("k") + `"}]`, "user is required"},
	} {
		t.Run(name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "keys.json")
			writeFile(t, f, tc.content)
			err := (&AuthConfig{APIKeysFile: f}).provision(caddy.NewReplacer())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("provision = %v, want %q", err, tc.want)
			}
		})
	}
	err := (&AuthConfig{APIKeysFile: filepath.Join(dir, "missing.json")}).provision(caddy.NewReplacer())
	if err == nil || !strings.Contains(err.Error(), "auth api_keys") {
		t.Errorf("missing file: %v", err)
	}
}

func TestAnonymousOnlyFromLoopback(t *testing.T) {
	app := &App{Auth: provisionAuth(t, &AuthConfig{
		Anonymous: "dev@localhost",
		APIKeys:   []APIKey{{Hash: HashAPIKey("k"), User: "alice"}},
	})}
	tests := []struct {
		remote string
		token  string
		user   string
		err    error
	}{
		{"127.0.0.1:5555", "", "dev@localhost", nil},
		{"127.8.9.10:5555", "", "dev@localhost", nil},
		{"[::1]:5555", "", "dev@localhost", nil},
		{"[::ffff:127.0.0.1]:80", "", "dev@localhost", nil},
		{"127.0.0.1", "", "dev@localhost", nil},
		{"10.0.0.1:5555", "", "", ErrNoCredentials},
		{"192.168.1.2:5555", "", "", ErrNoCredentials},
		{"[2001:db8::1]:443", "", "", ErrNoCredentials},
		{"localhost:5555", "", "", ErrNoCredentials}, // a name is not an address
		{"", "", "", ErrNoCredentials},
		// A token is checked as a token, even from loopback: a bad one
		// does not fall back to the anonymous caller.
		{"127.0.0.1:5555", "k", "alice", nil},
		{"127.0.0.1:5555", "wrong", "", ErrBadCredentials},
	}
	for _, tt := range tests {
		r := bearer(tt.token)
		r.RemoteAddr = tt.remote
		c, err := app.Authenticate(r)
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("%s token %q: %+v, %v; want %v", tt.remote, tt.token, c, err, tt.err)
			}
			continue
		}
		if err != nil || c.User != tt.user {
			t.Errorf("%s token %q: %+v, %v; want %s", tt.remote, tt.token, c, err, tt.user)
			continue
		}
		if tt.token == "" && c.Method != "anonymous" {
			t.Errorf("method = %q, want anonymous", c.Method)
		}
	}

	// Without the option, loopback is nothing special.
	plain := &App{Auth: provisionAuth(t, &AuthConfig{})}
	r := bearer("")
	r.RemoteAddr = "127.0.0.1:1"
	if _, err := plain.Authenticate(r); !errors.Is(err, ErrNoCredentials) {
		t.Errorf("no anonymous option: %v, want ErrNoCredentials", err)
	}
}

// --- JWT ---

type signingKey struct {
	priv *ecdsa.PrivateKey
	kid  string
}

func newSigningKey(t *testing.T, kid string) signingKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signingKey{priv: k, kid: kid}
}

func (k signingKey) jwk() jose.JSONWebKey {
	return jose.JSONWebKey{Key: &k.priv.PublicKey, KeyID: k.kid, Algorithm: string(jose.ES256), Use: "sig"}
}

func (k signingKey) pemFile(t *testing.T) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&k.priv.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "key.pem")
	writeFile(t, f, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	return f
}

// sign returns a compact JWT with claims, signed by k, with k's kid (if any).
func (k signingKey) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if k.kid != "" {
		opts = opts.WithHeader("kid", k.kid)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.priv}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func jwksFile(t *testing.T, keys ...signingKey) string {
	t.Helper()
	set := jose.JSONWebKeySet{}
	for _, k := range keys {
		set.Keys = append(set.Keys, k.jwk())
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "jwks.json")
	writeFile(t, f, string(b))
	return f
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

const testIssuer = "https://idp.example.com"

func TestJWTStaticKey(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "")
	other := newSigningKey(t, "")
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"https://gateway.example.com", "toolgate"}, KeyFiles: []string{key.pemFile(t)},
	}}})
	ts := func(d time.Duration) int64 { return clock.Add(d).Unix() }
	valid := func() map[string]any {
		return map[string]any{"iss": testIssuer, "aud": "toolgate", "sub": "alice@example.com", "iat": ts(0), "exp": ts(5 * time.Minute)}
	}
	with := func(mod func(c map[string]any)) map[string]any { c := valid(); mod(c); return c }
	tests := []struct {
		name   string
		claims map[string]any
		key    signingKey
		ok     bool
		why    string // substring of the error, when rejected
	}{
		{"valid", valid(), key, true, ""},
		{"audience list with one match", with(func(c map[string]any) { c["aud"] = []string{"other", "https://gateway.example.com"} }), key, true, ""},
		{"expired within leeway", with(func(c map[string]any) { c["exp"] = ts(-20 * time.Second) }), key, true, ""},
		{"nbf within leeway", with(func(c map[string]any) { c["nbf"] = ts(20 * time.Second) }), key, true, ""},
		{"wrong issuer", with(func(c map[string]any) { c["iss"] = "https://evil.example.com" }), key, false, ""},
		{"issuer with trailing slash", with(func(c map[string]any) { c["iss"] = testIssuer + "/" }), key, false, ""},
		{"no issuer", with(func(c map[string]any) { delete(c, "iss") }), key, false, ""},
		{"wrong audience", with(func(c map[string]any) { c["aud"] = "https://other.example.com" }), key, false, "aud"},
		{"no audience", with(func(c map[string]any) { delete(c, "aud") }), key, false, "aud"},
		{"expired beyond leeway", with(func(c map[string]any) { c["exp"] = ts(-31 * time.Second) }), key, false, "exp"},
		{"long expired", with(func(c map[string]any) { c["exp"] = ts(-24 * time.Hour) }), key, false, "exp"},
		{"nbf in the future", with(func(c map[string]any) { c["nbf"] = ts(time.Minute) }), key, false, "nbf"},
		{"iat in the future", with(func(c map[string]any) { c["iat"] = ts(time.Hour) }), key, false, "iat"},
		{"no exp", with(func(c map[string]any) { delete(c, "exp") }), key, false, "no exp claim"},
		{"no sub", with(func(c map[string]any) { delete(c, "sub") }), key, false, "no sub claim"},
		{"numeric sub", with(func(c map[string]any) { c["sub"] = 42 }), key, false, ""},
		{"empty sub", with(func(c map[string]any) { c["sub"] = "" }), key, false, "no sub claim"},
		{"wrong signature", valid(), other, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := a.Authenticate(ctx, bearer(tt.key.sign(t, tt.claims)), false)
			if !tt.ok {
				if !errors.Is(err, ErrBadCredentials) || c != nil {
					t.Fatalf("accepted: %+v, %v", c, err)
				}
				if !strings.Contains(err.Error(), tt.why) {
					t.Errorf("error %q does not say %q", err, tt.why)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.User != "alice@example.com" || c.Method != "jwt" || c.Claims["iss"] != testIssuer {
				t.Errorf("caller = %+v", c)
			}
		})
	}
}

// A token whose audience is an MCP endpoint (the resource an MCP client
// asked the authorization server for) is accepted at that endpoint only,
// and only when public_url says what the gateway's URL is; the verdict
// remembered for one endpoint serves no other.
func TestJWTEndpointAudience(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "")
	auth := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"toolgate"}, KeyFiles: []string{key.pemFile(t)},
	}}})
	token := key.sign(t, map[string]any{"iss": testIssuer, "aud": "https://gateway.example.com/v1/mcp/tracker",
		"sub": "alice@example.com", "exp": clock.Add(time.Minute).Unix()})
	at := func(publicURL, path string) error {
		app := &App{PublicURL: publicURL, Auth: auth}
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Header.Set("Authorization", "Bearer "+token)
		_, err := app.AuthenticateEndpoint(r)
		return err
	}
	if err := at("https://gateway.example.com", "/v1/mcp/tracker"); err != nil {
		t.Fatalf("at its endpoint: %v", err)
	}
	if err := at("https://gateway.example.com", "/v1/mcp/tracker/"); err != nil {
		t.Fatalf("at its endpoint with a trailing slash: %v", err)
	}
	for _, path := range []string{"/v1/mcp/search", "/v1/mcp", "/v1/mcp/tracker/x", "/v1/mcp/trackers"} {
		if err := at("https://gateway.example.com", path); !errors.Is(err, ErrBadCredentials) {
			t.Errorf("at %s: %v, want refused", path, err)
		}
	}
	if err := at("", "/v1/mcp/tracker"); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("without public_url: %v, want refused", err)
	}
	if _, err := auth.Authenticate(context.Background(), bearer(token), false); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("outside an MCP endpoint: %v, want refused", err)
	}
}

func TestJWTRejectsForgeries(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "k1")
	a := provisionAuth(t, &AuthConfig{
		JWT:     []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, KeyFiles: []string{jwksFile(t, key)}}},
		APIKeys: []APIKey{{Hash: HashAPIKey("a.b.c"), User: "dotty"}},
	})
	claims := map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()}
	good := key.sign(t, claims)
	if _, err := a.Authenticate(ctx, bearer(good), false); err != nil {
		t.Fatalf("the good token is rejected: %v", err)
	}
	parts := strings.Split(good, ".")
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	hmacSigner, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	hs, err := jwt.Signed(hmacSigner).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	forged := map[string]string{
		"alg none":             enc(map[string]string{"alg": "none", "kid": "k1"}) + "." + parts[1] + ".",
		"HS256":                hs,
		"claims swapped":       parts[0] + "." + enc(map[string]any{"iss": testIssuer, "aud": "gw", "sub": "root", "exp": clock.Add(time.Hour).Unix()}) + "." + parts[2],
		"signature truncated":  parts[0] + "." + parts[1] + "." + parts[2][:10],
		"unknown kid":          newSigningKey(t, "k2").sign(t, claims),
		"known kid, other key": signingKey{priv: newSigningKey(t, "").priv, kid: "k1"}.sign(t, claims),
		// Two dots: treated as a JWT when issuers exist, never as an API key.
		"API key that looks like a JWT": "a.b.c",
	}
	for name, tok := range forged {
		if c, err := a.Authenticate(ctx, bearer(tok), false); !errors.Is(err, ErrBadCredentials) {
			t.Errorf("%s: %+v, %v; want ErrBadCredentials", name, c, err)
		}
	}
}

func TestJWTUserAndGroupsClaims(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "k1")
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"gw"}, KeyFiles: []string{jwksFile(t, key)},
		UserClaim: "email", GroupsClaim: "roles",
	}}})
	c, err := a.Authenticate(ctx, bearer(key.sign(t, map[string]any{
		"iss": testIssuer, "aud": "gw", "sub": "0042", "email": "alice@example.com", "email_verified": true,
		"roles": []any{"eng", "ops"}, "groups": []string{"ignored"}, "tenant": "acme",
		"exp": clock.Add(time.Hour).Unix(),
	})), false)
	if err != nil {
		t.Fatal(err)
	}
	if c.User != "alice@example.com" {
		t.Errorf("user = %q, want the email claim", c.User)
	}
	if strings.Join(c.Groups, ",") != "eng,ops" {
		t.Errorf("groups = %q, want the members of roles", c.Groups)
	}
	if c.Claims["tenant"] != "acme" || c.Claims["sub"] != "0042" {
		t.Errorf("claims = %v, want every verified claim", c.Claims)
	}
	// The user claim is required.
	_, err = a.Authenticate(ctx, bearer(key.sign(t, map[string]any{
		"iss": testIssuer, "aud": "gw", "sub": "0042", "exp": clock.Add(time.Hour).Unix(),
	})), false)
	if !errors.Is(err, ErrBadCredentials) || !strings.Contains(err.Error(), "no email claim") {
		t.Errorf("without the user claim: %v", err)
	}
	// A groups claim of another shape refuses the token: a rule such as
	// "deny unless in eng" must not be dodged by a string claim.
	for _, roles := range []any{"admin", []any{"eng", 7}, map[string]any{"eng": true}} {
		_, err = a.Authenticate(ctx, bearer(key.sign(t, map[string]any{
			"iss": testIssuer, "aud": "gw", "email": "a@b", "email_verified": true, "roles": roles, "exp": clock.Add(time.Hour).Unix(),
		})), false)
		if !errors.Is(err, ErrBadCredentials) || !strings.Contains(err.Error(), "roles claim must be an array of strings") {
			t.Errorf("roles claim %v: %v, want the token refused", roles, err)
		}
	}
	// Without the claim (or null) the caller has no groups: an empty list.
	for _, claims := range []map[string]any{{}, {"roles": nil}} {
		claims["iss"], claims["aud"], claims["email"], claims["exp"] = testIssuer, "gw", "a@b", clock.Add(time.Hour).Unix()
		claims["email_verified"] = true
		c, err = a.Authenticate(ctx, bearer(key.sign(t, claims)), false)
		if err != nil || c.Groups == nil || len(c.Groups) != 0 {
			t.Errorf("no roles claim: %+v, %v; want an empty list of groups", c, err)
		}
	}
}

// Identity providers put a kid in every token; an operator who gives the
// provider's public key as a PEM file (which has no kid) must still be able
// to verify them. Several key_file entries (key rotation) must all work.
func TestJWTStaticKeysWithoutKeyIDs(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	oldKey := newSigningKey(t, "")
	newKey := newSigningKey(t, "")
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"gw"}, KeyFiles: []string{oldKey.pemFile(t), newKey.pemFile(t)},
	}}})
	claims := map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()}
	for name, tok := range map[string]string{
		"first key, no kid":    oldKey.sign(t, claims),
		"second key, no kid":   newKey.sign(t, claims),
		"first key with a kid": signingKey{priv: oldKey.priv, kid: "2026-01"}.sign(t, claims),
		"second key with kid":  signingKey{priv: newKey.priv, kid: "2026-11"}.sign(t, claims),
	} {
		if c, err := a.Authenticate(ctx, bearer(tok), false); err != nil || c.User != "alice" {
			t.Errorf("%s: %+v, %v", name, c, err)
		}
	}
	if _, err := a.Authenticate(ctx, bearer(newSigningKey(t, "").sign(t, claims)), false); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("a third key is accepted: %v", err)
	}
}

func TestJWTIssuerProvisionErrors(t *testing.T) {
	pemFile := newSigningKey(t, "").pemFile(t)
	notPEM := filepath.Join(t.TempDir(), "x.pem")
	writeFile(t, notPEM, "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	writeFile(t, empty, "nothing here")
	tests := []struct {
		name string
		j    JWTIssuer
		want string
	}{
		{"no issuer", JWTIssuer{Audience: []string{"a"}, KeyFiles: []string{pemFile}}, "issuer is required"},
		{"no audience", JWTIssuer{Issuer: "i", KeyFiles: []string{pemFile}}, "auth jwt i: audience is required"},
		{"no keys", JWTIssuer{Issuer: "i", Audience: []string{"a"}}, "give jwks_url or key_file"},
		{"missing key file", JWTIssuer{Issuer: "i", Audience: []string{"a"}, KeyFiles: []string{"/nonexistent.pem"}}, "key_file /nonexistent.pem"},
		{"private key block", JWTIssuer{Issuer: "i", Audience: []string{"a"}, KeyFiles: []string{notPEM}}, "not a public key"},
		{"no PEM block", JWTIssuer{Issuer: "i", Audience: []string{"a"}, KeyFiles: []string{empty}}, "no public key found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.j.provision(caddy.NewReplacer())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("provision = %v, want %q", err, tt.want)
			}
		})
	}
	j := &JWTIssuer{Issuer: "i", Audience: []string{"a"}, KeyFiles: []string{pemFile}}
	if err := j.provision(caddy.NewReplacer()); err != nil {
		t.Fatal(err)
	}
	if j.UserClaim != "sub" || j.GroupsClaim != "groups" || time.Duration(j.Leeway) != 30*time.Second {
		t.Errorf("defaults = %q %q %v", j.UserClaim, j.GroupsClaim, time.Duration(j.Leeway))
	}
}

// jwksServer serves a JWKS whose keys the test can change, and counts fetches.
type jwksServer struct {
	*httptest.Server
	fetches atomic.Int32
	mu      sync.Mutex
	keys    []signingKey
	status  int
}

func newJWKSServer(t *testing.T, keys ...signingKey) *jwksServer {
	s := &jwksServer{keys: keys, status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fetches.Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.status != http.StatusOK {
			w.WriteHeader(s.status)
			return
		}
		set := jose.JSONWebKeySet{}
		for _, k := range s.keys {
			set.Keys = append(set.Keys, k.jwk())
		}
		_ = json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) setKeys(keys ...signingKey) {
	s.mu.Lock()
	s.keys = keys
	s.mu.Unlock()
}

func TestJWKSRotation(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	k1, k2, k3 := newSigningKey(t, "k1"), newSigningKey(t, "k2"), newSigningKey(t, "k3")
	srv := newJWKSServer(t, k1)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	if srv.fetches.Load() != 0 {
		t.Fatal("provision fetched the JWKS: Provision must do no network I/O")
	}
	a.start(ctx, srv.Client(), zap.NewNop())
	awaitFetches(t, a)
	if n := srv.fetches.Load(); n != 1 {
		t.Fatalf("start fetched %d times, want 1", n)
	}
	claims := func() map[string]any {
		return map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()}
	}
	auth := func(k signingKey) error {
		_, err := a.Authenticate(ctx, bearer(k.sign(t, claims())), false)
		return err
	}
	expectFetches := func(step string, want int32) {
		t.Helper()
		if n := srv.fetches.Load(); n != want {
			t.Errorf("%s: %d JWKS fetches, want %d", step, n, want)
		}
	}

	if err := auth(k1); err != nil {
		t.Fatalf("k1: %v", err)
	}
	expectFetches("known kid", 1)

	// The issuer rotates to k2. Within a minute of the last fetch a new kid
	// does not trigger another one.
	srv.setKeys(k1, k2)
	*clock = clock.Add(30 * time.Second)
	if err := auth(k2); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("k2 within a minute of the last fetch: %v, want rejected", err)
	}
	expectFetches("new kid within a minute", 1)

	// After a minute it does, once, and the token verifies.
	*clock = clock.Add(31 * time.Second)
	if err := auth(k2); err != nil {
		t.Errorf("k2 after a minute: %v", err)
	}
	expectFetches("new kid after a minute", 2)
	if err := auth(k2); err != nil {
		t.Errorf("k2 again: %v", err)
	}
	expectFetches("now known kid", 2)

	// A flood of unknown kids fetches at most once a minute.
	for range 10 {
		if err := auth(k3); !errors.Is(err, ErrBadCredentials) {
			t.Errorf("k3 is not published: %v", err)
		}
	}
	expectFetches("unknown kids right after a fetch", 2)
	*clock = clock.Add(61 * time.Second)
	for range 10 {
		_ = auth(k3)
	}
	expectFetches("unknown kids a minute later", 3)

	// A failing JWKS endpoint: keys already fetched keep working.
	srv.mu.Lock()
	srv.status = http.StatusInternalServerError
	srv.mu.Unlock()
	*clock = clock.Add(61 * time.Second)
	if err := auth(k3); !errors.Is(err, ErrBadCredentials) {
		t.Errorf("k3 with the JWKS down: %v", err)
	}
	expectFetches("refetch while down", 4)
	if err := auth(k1); err != nil {
		t.Errorf("k1 with the JWKS down: %v", err)
	}
}

func TestJWKSConcurrentUnknownKidsFetchOnce(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	k1 := newSigningKey(t, "k1")
	srv := newJWKSServer(t, k1)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	a.start(ctx, srv.Client(), zap.NewNop())
	awaitFetches(t, a)
	*clock = clock.Add(2 * time.Minute)
	tokens := make([]string, 32)
	for i := range tokens {
		tokens[i] = newSigningKey(t, "unknown-"+string(rune('a'+i))).sign(t, map[string]any{
			"iss": testIssuer, "aud": "gw", "sub": "x", "exp": clock.Add(time.Hour).Unix(),
		})
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, tok := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, _ = a.Authenticate(ctx, bearer(tok), false)
		}()
	}
	close(start)
	wg.Wait()
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d concurrent unknown kids caused %d fetches, want 1 (plus the initial one)", len(tokens), n-1)
	}
}

func TestJWKSSharedAcrossReloads(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	k1 := newSigningKey(t, "k1")
	srv := newJWKSServer(t, k1)
	first := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	first.start(ctx, srv.Client(), zap.NewNop())
	// A reload provisions a new config with the same URL before the old
	// one is cleaned up: it verifies with the keys already fetched, before
	// its own start and without a fetch of its own.
	second := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	for _, j := range first.JWT {
		j.cleanup()
	}
	tok := k1.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()})
	if _, err := second.Authenticate(ctx, bearer(tok), false); err != nil {
		t.Errorf("after reload: %v", err)
	}
	if n := srv.fetches.Load(); n != 1 {
		t.Errorf("%d fetches, want 1: the reload refetched", n)
	}
}

// A verified JWT is remembered until it expires: later requests with it get
// the same Caller without a signature check; after exp (and the leeway) it
// is refused again.
func TestVerifiedJWTsAreRememberedUntilExpiry(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "")
	keyFile := key.pemFile(t)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"toolgate"}, KeyFiles: []string{keyFile},
	}}})
	token := key.sign(t, map[string]any{"iss": testIssuer, "aud": "toolgate", "sub": "alice@example.com", "exp": clock.Add(time.Minute).Unix()})
	first, err := a.Authenticate(ctx, bearer(token), false)
	if err != nil {
		t.Fatal(err)
	}
	// Without its keys the issuer could verify nothing: a remembered token
	// needs none.
	a.JWT[0].keys = &keySet{}
	again, err := a.Authenticate(ctx, bearer(token), false)
	if err != nil || again != first {
		t.Fatalf("the same token again: %p %v, want the remembered caller %p", again, err, first)
	}
	setClock(t, clock.Add(time.Minute+31*time.Second))
	if c, err := a.Authenticate(ctx, bearer(token), false); !errors.Is(err, ErrBadCredentials) || c != nil {
		t.Fatalf("after exp and the leeway: %+v, %v; want it refused", c, err)
	}
}

// Every request with one API key gets the same Caller.
func TestAPIKeyCallersAreShared(t *testing.T) {
	a := provisionAuth(t, &AuthConfig{APIKeys: []APIKey{{Hash: HashAPIKey("k1"), User: "alice@example.com"}}})
	one, err1 := a.Authenticate(context.Background(), bearer("k1"), false)
	two, err2 := a.Authenticate(context.Background(), bearer("k1"), false)
	if err1 != nil || err2 != nil || one != two {
		t.Fatalf("two requests with one key: %p %p (%v, %v)", one, two, err1, err2)
	}
}

// A client that sends a token with an unknown key id and hangs up at once
// must not cancel the refetch it triggered, nor use up the minute: a valid
// token signed with the issuer's new key, arriving right after, waits for
// that same fetch and is accepted.
func TestJWKSRefetchOutlivesAnAbandonedRequest(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	k1, k2 := newSigningKey(t, "k1"), newSigningKey(t, "k2")
	srv := newJWKSServer(t, k1)
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: srv.URL}}})
	a.start(context.Background(), srv.Client(), zap.NewNop())
	awaitFetches(t, a)

	// The issuer rotates to k2; its JWKS endpoint is slow to answer.
	srv.setKeys(k1, k2)
	srv.mu.Lock() // held: the next fetch waits until the test releases it
	*clock = clock.Add(2 * time.Minute)
	forged := newSigningKey(t, "attacker").sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "x", "exp": clock.Add(time.Hour).Unix()})
	hangUp, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() {
		_, err := a.Authenticate(hangUp, bearer(forged), false)
		result <- err
	}()
	for srv.fetches.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-result; err == nil {
		t.Fatal("the forged token was accepted")
	}

	valid := k2.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "alice", "exp": clock.Add(time.Hour).Unix()})
	accepted := make(chan error, 1)
	go func() {
		_, err := a.Authenticate(context.Background(), bearer(valid), false)
		accepted <- err
	}()
	srv.mu.Unlock()
	if err := <-accepted; err != nil {
		t.Fatalf("a valid token signed with the new key after an abandoned refetch: %v", err)
	}
	if n := srv.fetches.Load(); n != 2 {
		t.Errorf("%d JWKS fetches, want 2 (start, and one refetch shared by both requests)", n)
	}
}

func TestHashKeyCommandInput(t *testing.T) {
	for in, want := range map[string]string{
		"demo-alice":   HashAPIKey("demo-alice"),
		"demo-alice\n": HashAPIKey("demo-alice"),
		"k\r\nignored": HashAPIKey("k"),
	} {
		if got, err := hashKeyFrom(strings.NewReader(in)); err != nil || got != want {
			t.Errorf("%q: %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "\n", " padded", "tab\t\n"} {
		if _, err := hashKeyFrom(strings.NewReader(in)); err == nil {
			t.Errorf("%q was hashed", in)
		}
	}
}

// Scopes are quoted in a challenge as they are: a scope that could end the
// quoted string, or hold a space, is refused when the config loads.
func TestScopesAreScopeTokens(t *testing.T) {
	for _, bad := range []string{`a"b`, `a\b`, "a b", "", "ä"} {
		if err := (&AuthConfig{Scopes: []string{"openid", bad}}).provision(caddy.NewReplacer()); err == nil || !strings.Contains(err.Error(), "auth scopes") {
			t.Errorf("scope %q: %v, want refused", bad, err)
		}
	}
	if err := (&AuthConfig{Scopes: []string{"openid", "mcp:tools", "https://api.example.com/read"}}).provision(caddy.NewReplacer()); err != nil {
		t.Errorf("valid scopes: %v", err)
	}
}
