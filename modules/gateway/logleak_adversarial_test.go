package gateway

// Adversarial review: no secret reaches toolgate's logs. Attackers: a
// hostile OAuth provider (its token endpoint's answers, error bodies and
// error_description), a hostile runner (its bearer token), and an
// endpoint toolgate fetches from failing (a JWKS endpoint down).

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/logtest"
)

const (
	leakRefreshToken = "rt_LogLeak9aB3d7E1f0c4A8b2D6e5F9a1C3b"
	leakCode         = "code_LogLeak4c1F0e9D8b7A6f5E4d3C2b1A0"
	leakClientSecret = "cs_LogLeak0a9B8c7D6e5F4a3B2c1D0e9F8a7"
	leakJWKSPassword = "jwks-Pass-LogLeak-5e4D3c2B1a0F9e8D"
)

// leakLogger is a logger whose lines are kept, at every level.
func leakLogger() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(core), logs
}

// reflectingProvider is a token endpoint that answers status with body,
// made by answer from the form of the token request it received.
func reflectingProvider(t *testing.T, status int, answer func(form url.Values) map[string]any) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(answer(r.PostForm))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// leakOAuthApp is oauthApp with the client secret leakClientSecret and
// its log lines kept.
func leakOAuthApp(t *testing.T, providerURL string) (*App, *Service, *observer.ObservedLogs) {
	a, svc := oauthApp(t, providerURL)
	svc.Auth.OAuth.ClientSecret = leakClientSecret
	a.buildOAuthConfig(svc)
	var logs *observer.ObservedLogs
	a.logger, logs = leakLogger()
	return a, svc, logs
}

// leakExpiredGrant stores an expired grant of alice's for svc whose
// refresh token is leakRefreshToken.
func leakExpiredGrant(t *testing.T, a *App) {
	t.Helper()
	conn := &Connection{Kind: AuthOAuth, AccessToken: "at_old_LogLeak", RefreshToken: leakRefreshToken,
		ConnectedAt: now().Add(-time.Hour), Expiry: now().Add(-time.Second)}
	if err := a.connections.Save(context.Background(), "svc", "alice", conn); err != nil {
		t.Fatal(err)
	}
}

// Attack (fixed): the OAuth provider answers a refresh with 200 and a token_type
// that is not Bearer, and writes into it what toolgate sent it: the
// refresh token and the client secret (RFC 6749 token request
// parameters). checkBearer quotes token_type in its error
// (oauth.go:75, "token_type %q"), and refresh logs that error with
// zap.Error ("oauth token refresh gave a token toolgate cannot present",
// grants.go:211-212), which the provider's other answers never reach
// (classifyTokenError keeps only the status and a checked error code).
// The grant is kept: the logged refresh token still works.
// Fixed: a token_type is named only when it is one of the known types
// (tokenTypeName).
func TestLogLeakAttackRefreshTokenTypeReflected(t *testing.T) {
	srv := reflectingProvider(t, http.StatusOK, func(form url.Values) map[string]any {
		return map[string]any{"access_token": "at_new_LogLeak", "expires_in": 3600,
			"token_type": "x " + form.Get("refresh_token") + " " + form.Get("client_secret")}
	})
	a, svc, logs := leakOAuthApp(t, srv.URL)
	leakExpiredGrant(t, a)
	_, err := a.OAuthConnection(context.Background(), svc, "alice")
	if err == nil {
		t.Fatal("control: the refresh with a token_type other than Bearer succeeded")
	}
	if leaked := logtest.Leaked(t, logs, leakRefreshToken, leakClientSecret); len(leaked) > 0 {
		t.Errorf("the log holds the refresh token or the client secret the provider wrote back:\n%s", strings.Join(leaked, "\n"))
	}
}

// Attack (fixed): the same at the callback of a connect: the provider answers the
// code exchange with a token_type holding the authorization code and the
// client secret it was sent; CompleteAuthorization logs checkBearer's
// error, which quotes it ("oauth code exchange gave a token toolgate
// cannot present", oauth.go:435; the quote at oauth.go:75).
// Fixed: as above.
func TestLogLeakAttackCodeExchangeTokenTypeReflected(t *testing.T) {
	ctx := context.Background()
	srv := reflectingProvider(t, http.StatusOK, func(form url.Values) map[string]any {
		return map[string]any{"access_token": "at_new_LogLeak", "expires_in": 3600,
			"token_type": "x " + form.Get("code") + " " + form.Get("client_secret")}
	})
	a, svc, logs := leakOAuthApp(t, srv.URL)
	browser := Browser{User: "alice", Ref: "alice-browser"}
	raw, err := a.AuthorizeURL(ctx, svc, browser)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(raw)
	if _, err := a.CompleteAuthorization(ctx, svc, u.Query().Get("state"), leakCode, browser); err == nil {
		t.Fatal("control: the code exchange with a token_type other than Bearer connected")
	}
	if leaked := logtest.Leaked(t, logs, leakCode, leakClientSecret); len(leaked) > 0 {
		t.Errorf("the log holds the authorization code or the client secret the provider wrote back:\n%s", strings.Join(leaked, "\n"))
	}
}

// Holds: the provider refuses the refresh (400) or fails (500) with an
// error body that quotes the refresh token and client secret in
// error_description, error_uri and in the error code itself; and a code
// exchange likewise. classifyTokenError keeps only the HTTP status and
// an error code of lower-case letters (safeErrorCode), so nothing of it
// is logged.
func TestLogLeakHoldsProviderErrorBodies(t *testing.T) {
	ctx := context.Background()
	for _, status := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusInternalServerError} {
		for _, code := range []string{"invalid_grant", "invalid_request " + leakRefreshToken, leakRefreshToken} {
			srv := reflectingProvider(t, status, func(form url.Values) map[string]any {
				echo := form.Get("refresh_token") + " " + form.Get("code") + " " + form.Get("client_secret")
				return map[string]any{"error": strings.ReplaceAll(code, leakRefreshToken, echo),
					"error_description": "you sent " + echo, "error_uri": "https://p.example.com/?t=" + echo}
			})
			a, svc, logs := leakOAuthApp(t, srv.URL)
			leakExpiredGrant(t, a)
			if _, err := a.OAuthConnection(ctx, svc, "alice"); err == nil {
				t.Fatal("control: the refresh succeeded")
			} else if strings.Contains(err.Error(), leakRefreshToken) || strings.Contains(err.Error(), leakClientSecret) {
				t.Errorf("HTTP %d, error %q: the refresh error quotes a secret: %v", status, code, err)
			}
			browser := Browser{User: "bob", Ref: "bob-browser"}
			raw, err := a.AuthorizeURL(ctx, svc, browser)
			if err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(raw)
			if _, err := a.CompleteAuthorization(ctx, svc, u.Query().Get("state"), leakCode, browser); err == nil {
				t.Fatal("control: the code exchange succeeded")
			}
			if leaked := logtest.Leaked(t, logs, leakRefreshToken, leakClientSecret, leakCode); len(leaked) > 0 {
				t.Errorf("HTTP %d, error %q: the log holds a secret:\n%s", status, code, strings.Join(leaked, "\n"))
			}
		}
	}
}

// Holds: a revocation (Disconnect) refused with an error body quoting the
// token and client secret: the error logged keeps only the status and a
// checked error code.
func TestLogLeakHoldsRevocationErrorBody(t *testing.T) {
	srv := reflectingProvider(t, http.StatusBadRequest, func(form url.Values) map[string]any {
		return map[string]any{"error": "bad " + form.Get("token"), "error_description": form.Get("token") + " " + form.Get("client_secret")}
	})
	a, svc, logs := leakOAuthApp(t, srv.URL)
	svc.Auth.OAuth.RevocationURL = srv.URL + "/revoke"
	leakExpiredGrant(t, a)
	if err := a.Disconnect(context.Background(), svc, "alice"); err == nil {
		t.Fatal("control: the revocation was confirmed")
	}
	if leaked := logtest.Leaked(t, logs, leakRefreshToken, leakClientSecret); len(leaked) > 0 {
		t.Errorf("the log holds a secret:\n%s", strings.Join(leaked, "\n"))
	}
}

// Attack (fixed): a jwks_url with a password (https://user:password@idp/jwks, an
// IdP behind basic auth; jwks_url is the only URL option toolgate checks
// for neither user nor password, and takes from a placeholder such as
// {env.JWKS_URL}) is logged as it is whenever a fetch fails: at start
// ("cannot fetch JWKS", auth.go:257-258), and on every refetch, which a
// hostile runner triggers once a minute by sending a JWT naming an
// unknown key id ("cannot refetch JWKS", auth.go:530). Elsewhere URLs go
// through caddyopt.RedactURL, or are refused with a user or password.
// Fixed: the log lines carry caddyopt.RedactURL(jwks_url); a request that
// cannot be made says why without the URL, and a refusal gives the
// status's number, not the server's text.
func TestLogLeakAttackJWKSURLPasswordLogged(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	srv := newJWKSServer(t)
	srv.status = http.StatusServiceUnavailable // the IdP is down
	jwks := strings.Replace(srv.URL, "http://", "http://toolgate:"+leakJWKSPassword+"@", 1) + "/jwks"
	a := provisionAuth(t, &AuthConfig{JWT: []*JWTIssuer{{Issuer: testIssuer, Audience: []string{"gw"}, JWKSURL: jwks}}})
	logger, logs := leakLogger()
	a.start(ctx, srv.Client(), logger)
	awaitFetches(t, a)

	// A runner's JWT naming a key id nobody published, a minute later.
	*clock = clock.Add(61 * time.Second)
	k := newSigningKey(t, "unknown-kid")
	_, _ = a.Authenticate(ctx, bearer(k.sign(t, map[string]any{"iss": testIssuer, "aud": "gw", "sub": "mallory",
		"exp": clock.Add(time.Hour).Unix()})), false)
	for deadline := time.Now().Add(2 * time.Second); len(logs.All()) < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := srv.fetches.Load(); n != 2 || len(logs.All()) != 2 {
		t.Fatalf("control: %d fetches and %d log lines, want 2 of each", n, len(logs.All()))
	}
	if leaked := logtest.Leaked(t, logs, leakJWKSPassword); len(leaked) > 0 {
		t.Errorf("the log holds the password of jwks_url:\n%s", strings.Join(leaked, "\n"))
	}
}

// EachSecret gives every part of a credential an upstream may quote on
// its own: the token after an Authorization scheme and the password a
// Basic one encodes, and each piece of another header's value (a
// cookie's value without its name), none shorter than MinSecret.
func TestEachSecret(t *testing.T) {
	basic := func(pair string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(pair)) }
	for _, c := range []struct {
		header, value string
		want          []string
	}{
		{"Authorization", "Bearer gho_16C7e42F292c6912E7710c838347Ae178B4a", []string{"gho_16C7e42F292c6912E7710c838347Ae178B4a"}},
		{"authorization", "  Bearer   gho_16C7e42F292c6912  ", []string{"gho_16C7e42F292c6912"}},
		{"Authorization", basic("robot:s3cr3t-pw!"), []string{base64.StdEncoding.EncodeToString([]byte("robot:s3cr3t-pw!")), "s3cr3t-pw!"}},
		{"Authorization", basic("robot:short"), []string{base64.StdEncoding.EncodeToString([]byte("robot:short"))}},
		{"Authorization", "Basic not-base64-at-all", []string{"not-base64-at-all"}},
		{"Proxy-Authorization", "Bearer proxy-token-123", []string{"proxy-token-123"}},
		{"Authorization", "\"quoted\" value-12345", []string{"\"quoted\" value-12345"}},
		{"Authorization", "Bearer short", nil},
		{"X-Api-Key", "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T", []string{"tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"}},
		{"X-Api-Key", "tgcred-9Kp4Vx2Qm7 v2", []string{"tgcred-9Kp4Vx2Qm7"}},
		{"X-Api-Key", "Token tgcred-9Kp4Vx2Qm7", []string{"tgcred-9Kp4Vx2Qm7"}},
		{"Cookie", "sid=0123456789abcdef; lang=en; theme=dark-high-contrast", []string{"0123456789abcdef", "dark-high-contrast"}},
		{"Cookie", "sid=short; session=whole-piece", []string{"sid=short", "whole-piece"}},
		{"X-Key", "abc", nil},
	} {
		var got []string
		(&Credential{Header: c.header, Value: c.value}).EachSecret(func(s string) bool { got = append(got, s); return true })
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %q: secrets %q, want %q", c.header, c.value, got, c.want)
		}
		first := ""
		if len(c.want) > 0 {
			first = c.want[0]
		}
		if s := (&Credential{Header: c.header, Value: c.value}).Secret(); s != first {
			t.Errorf("%s: %q: Secret %q, want %q", c.header, c.value, s, first)
		}
	}
	var none *Credential
	if none.Secret() != "" {
		t.Error("no credential has a secret")
	}
}
