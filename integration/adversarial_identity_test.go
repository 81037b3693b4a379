package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Hostile runners at the door: bad tokens, foreign origins and hosts, and
// headers that must never reach an upstream. Also covered elsewhere:
// TestAnotherUsersSessionIs403 (another user's toolgate or MCP session),
// TestMissingTokenIs401WithResourceMetadata, and the token rules one by
// one in modules/gateway (TestJWTStaticKey, TestJWTRejectsForgeries).

const jwtIssuer = "https://idp.example.test"

// jwtKey signs test tokens with ES256 under key id kid.
type jwtKey struct {
	priv *ecdsa.PrivateKey
	kid  string
}

func newJWTKey(t testing.TB, kid string) jwtKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return jwtKey{priv: priv, kid: kid}
}

// jwksFile writes the public keys as a JWKS file.
func jwksFile(t testing.TB, keys ...jwtKey) string {
	t.Helper()
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.priv.PublicKey, KeyID: k.kid, Algorithm: "ES256", Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func (k jwtKey) sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.priv},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", k.kid))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestAdversarialTokens(t *testing.T) {
	key := newJWTKey(t, "k1")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, AuthExtra: `jwt {
				issuer ` + jwtIssuer + `
				audience toolgate-test
				key_file ` + jwksFile(t, key) + `
			}`})
	sess := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, sess, "svc")
	m.initialize()
	claims := func(change func(map[string]any)) map[string]any {
		c := map[string]any{"iss": jwtIssuer, "aud": "toolgate-test", "sub": alice, "exp": time.Now().Add(time.Hour).Unix()}
		if change != nil {
			change(c)
		}
		return c
	}
	good := key.sign(t, claims(nil))
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"jwt"}}}`

	// The control: alice's token works on alice's sessions.
	if status, _, answer := m.rawRequest(http.MethodPost, map[string]string{"Authorization": "Bearer " + good}, strings.NewReader(call)); status != http.StatusOK || !strings.Contains(answer, `\"text\":\"jwt\"`) {
		t.Fatalf("a good token: %d %s", status, answer)
	}
	tokens := map[string]string{
		"wrong audience":            key.sign(t, claims(func(c map[string]any) { c["aud"] = "another-service" })),
		"expired":                   key.sign(t, claims(func(c map[string]any) { c["exp"] = time.Now().Add(-time.Hour).Unix() })),
		"alg none":                  enc(map[string]string{"alg": "none", "typ": "JWT", "kid": "k1"}) + "." + strings.Split(good, ".")[1] + ".",
		"unknown key id":            newJWTKey(t, "k2").sign(t, claims(nil)),
		"known key id, another key": jwtKey{priv: newJWTKey(t, "").priv, kid: "k1"}.sign(t, claims(nil)),
		"wrong issuer":              key.sign(t, claims(func(c map[string]any) { c["iss"] = "https://evil.example.test" })),
		"no expiry":                 key.sign(t, claims(func(c map[string]any) { delete(c, "exp") })),
		"not yet valid":             key.sign(t, claims(func(c map[string]any) { c["nbf"] = time.Now().Add(time.Hour).Unix() })),
		"claims swapped":            strings.Split(good, ".")[0] + "." + enc(claims(func(c map[string]any) { c["sub"] = carol })) + "." + strings.Split(good, ".")[2],
	}
	for name, tok := range tokens {
		t.Run(name, func(t *testing.T) {
			before := snapshot(t, up, g)
			status, hdr, answer := m.rawRequest(http.MethodPost, map[string]string{"Authorization": "Bearer " + tok}, strings.NewReader(call))
			if status != http.StatusUnauthorized || !strings.Contains(hdr.Get("WWW-Authenticate"), `error="invalid_token"`) {
				t.Errorf("%d %q %s; want 401 with invalid_token", status, hdr.Get("WWW-Authenticate"), answer)
			}
			if strings.Contains(answer, tok) {
				t.Errorf("the answer repeats the token")
			}
			before.check(t)
			// Nor does the API take it: no session is created.
			if r := g.api(t, http.MethodPost, "/v1/sessions", tok, []byte(`{"services":["svc"]}`)); r.StatusCode != http.StatusUnauthorized {
				t.Errorf("POST /v1/sessions: %d %s", r.StatusCode, r.Body)
			}
			before.check(t)
		})
	}
}

// A browser page of another origin, or a DNS-rebinding page that names
// its own host for the gateway's loopback address, gets 403 before
// anything is read.
func TestAdversarialOriginAndHost(t *testing.T) {
	// A site for any host, as `:8080` is: toolgate's own check is all
	// that stands between a rebinding page and the gateway.
	up, g, m := aliceSession(t, gatewayConfig{AnyHost: true})
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`
	for name, header := range map[string]map[string]string{
		"foreign origin":           {"Origin": "https://evil.example.test"},
		"null origin":              {"Origin": "null"},
		"origin with another port": {"Origin": strings.Replace(g.URL, "127.0.0.1:", "127.0.0.1:1", 1)},
		"rebinding host":           {"Host": "evil.example.test"},
		"rebinding host with port": {"Host": "evil.example.test:" + g.URL[strings.LastIndexByte(g.URL, ':')+1:]},
	} {
		t.Run(name, func(t *testing.T) {
			before := snapshot(t, up, g)
			req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(call))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range m.headers {
				req.Header.Set(k, v)
			}
			req.Header.Set("Mcp-Session-Id", m.sessionID)
			for k, v := range header {
				if k == "Host" {
					req.Host = v
				} else {
					req.Header.Set(k, v)
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := make([]byte, 4096)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body[:n]), "DNS-rebinding") {
				t.Errorf("%d %s; want 403 naming DNS-rebinding protection", resp.StatusCode, body[:n])
			}
			before.check(t)
		})
	}
	// The gateway's own origin is fine.
	if status, _, answer := m.rawRequest(http.MethodPost, map[string]string{"Origin": g.URL}, strings.NewReader(call)); status != http.StatusOK {
		t.Errorf("the gateway's own origin: %d %s", status, answer)
	}
}

// Only what toolgate itself sets reaches an upstream: none of the runner's
// credentials, cookies, forwarding or proxy headers, whatever they claim.
func TestAdversarialHeadersNeverUpstream(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	hostile := map[string]string{
		"Cookie":               "runner-cookie=secret",
		"Proxy-Authorization":  "Basic c2VjcmV0OnNlY3JldA==",
		"X-Forwarded-For":      "10.0.0.1",
		"X-Forwarded-Host":     "evil.example.test",
		"X-Forwarded-Proto":    "https",
		"Forwarded":            "for=10.0.0.1;host=evil.example.test",
		"X-Real-Ip":            "10.0.0.1",
		"True-Client-Ip":       "10.0.0.1",
		"Via":                  "1.1 evil",
		"X-Api-Key":            "runner-api-key",
		"Last-Event-Id":        "runner-event",
		"Mcp-Protocol-Version": "2025-11-25",
		"X-Custom":             "anything",
	}
	from := len(up.requestLog())
	status, _, answer := m.rawRequest(http.MethodPost, hostile,
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"h"}}}`))
	if status != http.StatusOK || !strings.Contains(answer, `\"text\":\"h\"`) {
		t.Fatalf("the call: %d %s", status, answer)
	}
	// What toolgate sends, and nothing else (Go's client adds the length
	// and its own compression offer).
	sent := map[string]bool{"User-Agent": true, "Content-Type": true, "Accept": true, "Mcp-Session-Id": true,
		"Mcp-Protocol-Version": true, "Content-Length": true, "Accept-Encoding": true}
	log := up.requestLog()[from:]
	if len(log) == 0 {
		t.Fatal("the call did not reach the upstream")
	}
	for _, r := range log {
		for name, values := range r.Header {
			if !sent[name] {
				t.Errorf("the upstream got %s: %q", name, values)
			}
			if containsAny(values, aliceKey, m.sessionID, m.headers["X-Toolgate-Session"], "secret", "10.0.0.1", "evil") {
				t.Errorf("the upstream got a runner value in %s: %q", name, values)
			}
		}
	}
}
