package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// hostileIssuer is an OpenID provider that signs in everyone at once and
// answers the token request with an ID token (and userinfo) a test shapes:
// what a misconfigured or malicious provider, or an attacker who got hold
// of a token, could present. No real provider can be made to misbehave on
// purpose, so this one is written here.
type hostileIssuer struct {
	URL string
	key *ecdsa.PrivateKey

	mu        sync.Mutex
	claims    func(base map[string]any) map[string]any // shapes the ID token's claims
	userinfo  map[string]any                           // the userinfo answer, nil for 401
	signer    func(claims map[string]any) string       // nil: ES256 with key
	nonces    map[string]string                        // code → nonce of the authorization request
	verifiers map[string]string                        // code → PKCE challenge
	received  []url.Values                             // every token request's form
}

// tokenRequests returns the forms of the token requests h was sent.
func (h *hostileIssuer) tokenRequests() []url.Values {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.received)
}

func startHostileIssuer(t *testing.T) *hostileIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileIssuer{URL: "http://" + l.Addr().String(), key: key, nonces: map[string]string{}, verifiers: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"issuer": h.URL, "authorization_endpoint": h.URL + "/authorize",
			"token_endpoint": h.URL + "/token", "userinfo_endpoint": h.URL + "/userinfo", "jwks_uri": h.URL + "/keys",
			"id_token_signing_alg_values_supported": []string{"ES256"}, "response_types_supported": []string{"code"},
			"subject_types_supported": []string{"public"}})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		code := randomText()
		h.mu.Lock()
		h.nonces[code], h.verifiers[code] = q.Get("nonce"), q.Get("code_challenge")
		h.mu.Unlock()
		http.Redirect(w, r, q.Get("redirect_uri")+"?"+url.Values{"code": {code}, "state": {q.Get("state")}}.Encode(), http.StatusFound)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		code := r.PostForm.Get("code")
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		h.mu.Lock()
		defer h.mu.Unlock()
		h.received = append(h.received, r.PostForm)
		nonce, ok := h.nonces[code]
		if !ok || base64.RawURLEncoding.EncodeToString(sum[:]) != h.verifiers[code] {
			w.WriteHeader(http.StatusBadRequest)
			writeJSON(w, map[string]string{"error": "invalid_grant"})
			return
		}
		delete(h.nonces, code)
		now := time.Now()
		claims := map[string]any{"iss": h.URL, "sub": "alice-id", "aud": "console-client", "nonce": nonce,
			"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix(), "email": alice, "email_verified": true}
		if h.claims != nil {
			claims = h.claims(claims)
		}
		var idToken string
		if h.signer != nil {
			idToken = h.signer(claims)
		} else {
			idToken = h.sign(claims)
		}
		writeJSON(w, map[string]any{"access_token": "at-" + code, "token_type": "Bearer", "expires_in": 300, "id_token": idToken})
	})
	mux.HandleFunc("GET /userinfo", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.userinfo == nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		writeJSON(w, h.userinfo)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return h
}

func (h *hostileIssuer) sign(claims map[string]any) string {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: h.key}, (&jose.SignerOptions{}).WithHeader("kid", "k1").WithType("JWT"))
	if err != nil {
		panic(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		panic(err)
	}
	return tok
}

func (h *hostileIssuer) shape(claims func(map[string]any) map[string]any, userinfo map[string]any, signer func(map[string]any) string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claims, h.userinfo, h.signer = claims, userinfo, signer
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func randomText() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// The console's OpenID Connect sign-in accepts only an ID token signed by
// its issuer, for its client, for this sign-in (nonce), naming the person
// and listing groups as strings; claims from userinfo count only for the
// ID token's subject.
func TestConsoleOIDCRefusesWhatItCannotTrust(t *testing.T) {
	idp := startHostileIssuer(t)
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Extra: "state_secret " + testStateSecret,
		Console: "oidc " + idp.URL + " {\n\t\t\tclient_id console-client\n\t\t\tclient_secret console-secret\n\t\t\tuser_claim email\n\t\t}\n\t\tadmin_groups admins"})
	with := func(change func(map[string]any)) func(map[string]any) map[string]any {
		return func(c map[string]any) map[string]any { change(c); return c }
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, c := range []struct {
		name     string
		claims   func(map[string]any) map[string]any
		userinfo map[string]any
		signer   func(map[string]any) string
		in       bool // signed in; otherwise refused
		admin    bool // as an admin
	}{
		{name: "groups as strings", claims: with(func(c map[string]any) { c["groups"] = []string{"admins"} }), in: true, admin: true},
		{name: "groups as one string", claims: with(func(c map[string]any) { c["groups"] = "admins" })},
		{name: "groups holding an object", claims: with(func(c map[string]any) { c["groups"] = []any{"eng", map[string]any{"name": "admins"}} })},
		{name: "an email not verified", claims: with(func(c map[string]any) { c["email_verified"] = false })},
		{name: "email_verified as text", claims: with(func(c map[string]any) { c["email_verified"] = "true" }), in: true},
		{name: "another nonce", claims: with(func(c map[string]any) { c["nonce"] = "replayed" })},
		{name: "no nonce", claims: with(func(c map[string]any) { delete(c, "nonce") })},
		{name: "another client's token", claims: with(func(c map[string]any) { c["aud"] = "another-client" })},
		{name: "another issuer", claims: with(func(c map[string]any) { c["iss"] = "https://idp.evil.example" })},
		{name: "expired", claims: with(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() })},
		{name: "signed with another key", signer: func(c map[string]any) string {
			s, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: other}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
			tok, _ := jwt.Signed(s).Claims(c).Serialize()
			return tok
		}},
		{name: "unsigned (alg none)", signer: func(c map[string]any) string {
			header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
			payload, _ := json.Marshal(c)
			return header + "." + base64.RawURLEncoding.EncodeToString(payload) + "."
		}},
		{name: "the user only in another subject's userinfo",
			claims:   with(func(c map[string]any) { delete(c, "email") }),
			userinfo: map[string]any{"sub": "mallory-id", "email": alice, "groups": []string{"admins"}}},
		{name: "groups only in another subject's userinfo", in: true,
			userinfo: map[string]any{"sub": "mallory-id", "groups": []string{"admins"}}},
		{name: "groups in the subject's userinfo", in: true, admin: true,
			userinfo: map[string]any{"sub": "alice-id", "groups": []string{"admins"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			idp.shape(c.claims, c.userinfo, c.signer)
			p := g.newPerson(t)
			status, page := p.get(g.URL + "/console/signin/oidc/0?return=%2Fconsole%2Factivity%3Feveryone%3D1")
			signedIn := strings.Contains(page, "<h1>Activity</h1>")
			if signedIn != c.in {
				t.Fatalf("signed in: %v, want %v (%d)\n%.3000s", signedIn, c.in, status, page)
			}
			if admin := strings.Contains(page, "Recent decisions of everyone"); signedIn && admin != c.admin {
				t.Errorf("admin: %v, want %v", admin, c.admin)
			}
		})
	}
}
