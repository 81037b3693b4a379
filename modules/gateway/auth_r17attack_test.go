package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"
)

// Attack: with public_url set, the verdict on a JWT was remembered under
// the endpoint it was verified for (resource + token), whatever its
// audience. A runner holding one ordinary token (audience: the issuer
// block's) that sends it to /v1/mcp/a1, /v1/mcp/a2, … (any path under the
// MCP route reaches toolgate_session, which authenticates before the
// registry looks the service up) makes the gateway verify the signature
// anew for each path and remember one more copy of the token's caller,
// claims and all, up to 10,000, then forget everyone's remembered tokens
// and start again: one caller holds the cache, and every other runner pays
// a signature check per call again.
//
// Expected: README, auth: "A verified JWT is remembered until it expires,
// so a runner's calls do not each pay for a signature check"; gateway
// Caller: "One Caller is shared by every request that authenticates the
// same way (an API key, a JWT until it expires …)". One token is one
// remembered verdict, whichever endpoint it is sent to; a token for one
// endpoint still works at no other.
//
// Reproduced: 2,000 requests with one token at 2,000 paths left 2,000
// remembered entries (2,000 distinct callers, each with its own claims),
// and pushed out another runner's remembered token at 10,000.
//
// Severity: low (memory held by one authenticated runner, bounded at
// 10,000 copies of its token's claims; the cache defeated for everyone).
func TestR17JWTRememberedOncePerToken(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "")
	auth := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"toolgate"}, KeyFiles: []string{key.pemFile(t)},
	}}})
	app := &App{PublicURL: "https://gateway.example.com", Auth: auth}
	groups := make([]string, 40)
	for i := range groups {
		groups[i] = fmt.Sprintf("group-of-the-organisation-%03d", i)
	}
	token := key.sign(t, map[string]any{"iss": testIssuer, "aud": "toolgate", "sub": "mallory@example.com",
		"groups": groups, "exp": clock.Add(time.Hour).Unix()})
	other := key.sign(t, map[string]any{"iss": testIssuer, "aud": "toolgate", "sub": "alice@example.com",
		"exp": clock.Add(time.Hour).Unix()})
	at := func(tok, path string) *Caller {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		c, err := app.AuthenticateEndpoint(r)
		if err != nil {
			t.Fatalf("at %s: %v", path, err)
		}
		return c
	}
	alice := at(other, "/v1/mcp/tracker")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const paths = 2000
	callers := map[*Caller]bool{}
	for i := range paths {
		callers[at(token, fmt.Sprintf("/v1/mcp/a%d", i))] = true
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	auth.verified.mu.Lock()
	entries := len(auth.verified.tokens)
	auth.verified.mu.Unlock()
	t.Logf("%d requests at %d paths: %d remembered entries, %d callers, heap %+d KiB",
		paths, paths, entries, len(callers), (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>10)
	if len(callers) != 1 || entries > 2 {
		t.Errorf("one token sent to %d paths is remembered %d times (%d callers); want once", paths, entries, len(callers))
	}
	// Filling the cache up to its bound pushes out nobody else's token.
	for i := paths; i < maxVerifiedTokens+10; i++ {
		at(token, fmt.Sprintf("/v1/mcp/a%d", i))
	}
	if at(other, "/v1/mcp/tracker") != alice {
		t.Errorf("another runner's remembered token was forgotten after one caller's requests at %d paths", maxVerifiedTokens+10)
	}
}

// Holds (after the fix): a token remembered at its endpoint is still
// refused at another, and one remembered outside any endpoint (the API)
// with its issuer's audience still works at every endpoint.
func TestR17RememberedJWTKeepsItsAudience(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "")
	auth := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"toolgate"}, KeyFiles: []string{key.pemFile(t)},
	}}})
	app := &App{PublicURL: "https://gateway.example.com", Auth: auth}
	endpoint := key.sign(t, map[string]any{"iss": testIssuer, "aud": "https://gateway.example.com/v1/mcp/tracker",
		"sub": "alice@example.com", "exp": clock.Add(time.Hour).Unix()})
	at := func(tok, path string) error {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		_, err := app.AuthenticateEndpoint(r)
		return err
	}
	for range 2 {
		if err := at(endpoint, "/v1/mcp/tracker"); err != nil {
			t.Fatalf("at its endpoint: %v", err)
		}
		for _, path := range []string{"/v1/mcp/search", "/v1/mcp", "/v1/mcp/tracker/x"} {
			if err := at(endpoint, path); !errors.Is(err, ErrBadCredentials) {
				t.Errorf("remembered at its endpoint, then at %s: %v, want refused", path, err)
			}
		}
		if _, err := app.Authenticate(bearer(endpoint)); !errors.Is(err, ErrBadCredentials) {
			t.Errorf("remembered at its endpoint, then at the API: %v, want refused", err)
		}
	}
	general := key.sign(t, map[string]any{"iss": testIssuer, "aud": "toolgate", "sub": "alice@example.com",
		"exp": clock.Add(time.Hour).Unix()})
	if _, err := app.Authenticate(bearer(general)); err != nil {
		t.Fatalf("at the API: %v", err)
	}
	if err := at(general, "/v1/mcp/search"); err != nil {
		t.Errorf("remembered at the API, then at an endpoint: %v", err)
	}
}

// Holds: claims of odd types never name a person or give a group. With
// user_claim email, email_verified must be true or "true" (not 1, "True",
// "yes", ["true"], {"value": true}); the user claim must be a non-empty
// string (not an array, a number, an object, or the email of an array);
// the groups claim an array of strings (not a string, an object, nested
// arrays, or an array holding null).
func TestR17OddClaimTypesHeld(t *testing.T) {
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	key := newSigningKey(t, "")
	auth := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{
		Issuer: testIssuer, Audience: []string{"toolgate"}, KeyFiles: []string{key.pemFile(t)}, UserClaim: "email",
	}}})
	base := func() map[string]any {
		return map[string]any{"iss": testIssuer, "aud": "toolgate", "sub": "s-1", "email": "alice@example.com",
			"email_verified": true, "exp": clock.Add(time.Hour).Unix()}
	}
	if c, err := auth.Authenticate(t.Context(), bearer(key.sign(t, base())), false); err != nil || c.User != "alice@example.com" {
		t.Fatalf("control: %+v, %v", c, err)
	}
	odd := map[string]func(c map[string]any){
		"email_verified 1":      func(c map[string]any) { c["email_verified"] = 1 },
		"email_verified True":   func(c map[string]any) { c["email_verified"] = "True" },
		"email_verified yes":    func(c map[string]any) { c["email_verified"] = "yes" },
		"email_verified [true]": func(c map[string]any) { c["email_verified"] = []any{true} },
		"email_verified object": func(c map[string]any) { c["email_verified"] = map[string]any{"value": true} },
		"email_verified absent": func(c map[string]any) { delete(c, "email_verified") },
		"email array":           func(c map[string]any) { c["email"] = []any{"alice@example.com"} },
		"email number":          func(c map[string]any) { c["email"] = 42 },
		"email object":          func(c map[string]any) { c["email"] = map[string]any{"value": "alice@example.com"} },
		"email empty":           func(c map[string]any) { c["email"] = "" },
		"groups string":         func(c map[string]any) { c["groups"] = "admins" },
		"groups object":         func(c map[string]any) { c["groups"] = map[string]any{"admins": true} },
		"groups nested":         func(c map[string]any) { c["groups"] = []any{[]any{"admins"}} },
		"groups with null":      func(c map[string]any) { c["groups"] = []any{"eng", nil} },
		"groups with number":    func(c map[string]any) { c["groups"] = []any{"eng", 7} },
		"aud nested array":      func(c map[string]any) { c["aud"] = []any{[]any{"toolgate"}} },
		"exp as string":         func(c map[string]any) { c["exp"] = fmt.Sprint(clock.Add(time.Hour).Unix()) },
		"iss as array":          func(c map[string]any) { c["iss"] = []any{testIssuer} },
	}
	for name, mod := range odd {
		claims := base()
		mod(claims)
		if c, err := auth.Authenticate(t.Context(), bearer(key.sign(t, claims)), false); err == nil {
			t.Errorf("%s: accepted as %+v", name, c)
		}
	}
}
