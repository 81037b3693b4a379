package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// revokingProvider is zitadel's example OpenID provider (a certified
// implementation with an RFC 7009 revocation endpoint) as a service's OAuth
// provider, with what toolgate sent to its token and revocation endpoints
// and the tokens it issued recorded. failRevocations makes its revocation
// endpoint answer 503, as a provider in trouble does.
type revokingProvider struct {
	Issuer   string
	Password string // alice's

	failRevocations atomic.Bool

	mu          sync.Mutex
	issued      []issuedTokens
	revocations []url.Values
}

type issuedTokens struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
}

func startRevokingProvider(t *testing.T) *revokingProvider {
	t.Helper()
	p := &revokingProvider{}
	p.Issuer, p.Password = startExampleProviderBehind(t, func(s *storage.Storage) exampleop.Storage { return postClients{s} },
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/revoke":
					_ = r.ParseForm()
					p.mu.Lock()
					p.revocations = append(p.revocations, r.PostForm)
					p.mu.Unlock()
					if p.failRevocations.Load() {
						w.Header().Set("Content-Type", "application/json")
						w.WriteHeader(http.StatusServiceUnavailable)
						_, _ = io.WriteString(w, `{"error":"temporarily_unavailable","error_description":"`+r.PostForm.Get("token")+`"}`)
						return
					}
				case "/oauth/token":
					rec := &recordingWriter{ResponseWriter: w}
					next.ServeHTTP(rec, r)
					var tok issuedTokens
					if json.Unmarshal(rec.body.Bytes(), &tok) == nil && tok.AccessToken != "" {
						p.mu.Lock()
						p.issued = append(p.issued, tok)
						p.mu.Unlock()
					}
					return
				}
				next.ServeHTTP(w, r)
			})
		})
	return p
}

// postClients is the example provider's storage with every client
// authenticating with its secret in the request body, as toolgate does
// (client_secret_post).
type postClients struct{ *storage.Storage }

func (s postClients) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return postClient{c}, nil
}

type postClient struct{ op.Client }

func (postClient) AuthMethod() oidc.AuthMethod { return oidc.AuthMethodPost }

func (p *revokingProvider) lastIssued(t *testing.T) issuedTokens {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.issued) == 0 || p.issued[len(p.issued)-1].RefreshToken == "" {
		t.Fatalf("the provider issued %d token sets, the last without a refresh token", len(p.issued))
	}
	return p.issued[len(p.issued)-1]
}

func (p *revokingProvider) revocationRequests() []url.Values {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]url.Values(nil), p.revocations...)
}

// userinfo is what the provider answers to the access token.
func (p *revokingProvider) userinfo(t *testing.T, access string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.Issuer+"/userinfo", nil)
	req.Header.Set("Authorization", "Bearer "+access)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// refresh is what the provider answers to a refresh with the token, as
// toolgate's client.
func (p *revokingProvider) refresh(t *testing.T, refreshToken string) (int, string) {
	t.Helper()
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refreshToken},
		"client_id": {"toolgate"}, "client_secret": {"toolgate-secret"}}
	resp, err := http.PostForm(p.Issuer+"/oauth/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// connectAt connects alice's account at the provider through the console,
// as alice in her browser.
func (p *revokingProvider) connectAt(t *testing.T, g *gateway) {
	t.Helper()
	browser := g.signedIn(t, aliceKey)
	authURL := browser.startConnect("svc")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	back, err := signInAt(ctx, authURL, g.URL+"/v1/connections/svc/callback", "alice", p.Password)
	if err != nil {
		t.Fatal(err)
	}
	if status, page := browser.get(back.String()); status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("the callback page: %d %s", status, page)
	}
}

func revokingGateway(t *testing.T, p *revokingProvider, revocationURL string) *gateway {
	t.Helper()
	port := freePort(t)
	storage.RegisterClients(storage.WebClient("toolgate", "toolgate-secret", fmt.Sprintf("http://127.0.0.1:%d/v1/connections/svc/callback", port)))
	up := startUpstream(t)
	revocation := ""
	if revocationURL != "" {
		revocation = "revocation_url " + revocationURL
	}
	return startGatewayOnPort(t, port, gatewayConfig{Upstream: up.URL,
		Extra: "state_secret " + testStateSecret,
		Auth: fmt.Sprintf(`oauth {
				authorization_url %[1]s/auth
				token_url %[1]s/oauth/token
				%[2]s
				client_id toolgate
				client_secret toolgate-secret
				scopes openid offline_access
			}`, p.Issuer, revocation)})
}

// Disconnecting revokes the grant at the provider (RFC 7009): its refresh
// token, and with it the access tokens of the grant, stop working there,
// not only in toolgate.
func TestOAuthDisconnectRevokesTheGrant(t *testing.T) {
	p := startRevokingProvider(t)
	g := revokingGateway(t, p, p.Issuer+"/revoke")
	p.connectAt(t, g)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	m.mustEcho(t, "connected")
	tok := p.lastIssued(t)
	if status := p.userinfo(t, tok.AccessToken); status != http.StatusOK {
		t.Fatalf("before disconnecting, the provider answered %d to the grant's access token", status)
	}

	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", r.StatusCode, r.Body)
	}
	revs := p.revocationRequests()
	if len(revs) != 1 || revs[0].Get("token") != tok.RefreshToken || revs[0].Get("token_type_hint") != "refresh_token" ||
		revs[0].Get("client_id") != "toolgate" || revs[0].Get("client_secret") != "toolgate-secret" {
		t.Fatalf("the provider got %d revocation requests (%v), want one of the refresh token with the client's credentials", len(revs), redactForm(firstOr(revs)))
	}
	if status, body := p.refresh(t, tok.RefreshToken); status == http.StatusOK || !strings.Contains(body, "invalid_grant") {
		t.Fatalf("after disconnecting, a refresh with the grant's refresh token got %d %s, want invalid_grant", status, body)
	}
	if status := p.userinfo(t, tok.AccessToken); status == http.StatusOK {
		t.Fatalf("after disconnecting, the provider still accepts the grant's access token")
	}
	if files := g.connectionFiles(t, "svc"); len(files) != 0 {
		t.Fatalf("DELETE left %d connection records", len(files))
	}
	requireMetricLine(t, g, `toolgate_oauth_revocations_total{outcome="revoked",service="svc"}`)

	// Without a stored grant there is nothing to revoke, and nothing is sent.
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("a second DELETE: %d %s", r.StatusCode, r.Body)
	}
	if n := len(p.revocationRequests()); n != 1 {
		t.Fatalf("a DELETE without a grant sent %d more revocation requests", n-1)
	}
}

// A provider that does not confirm the revocation leaves the credential
// forgotten all the same, and the person is told to revoke it at the
// provider, in the API's answer and on the console's page; neither holds
// the token the provider's error reflected.
func TestOAuthDisconnectWithoutRevocationSaysSo(t *testing.T) {
	p := startRevokingProvider(t)
	g := revokingGateway(t, p, p.Issuer+"/revoke")
	p.failRevocations.Store(true)

	p.connectAt(t, g)
	tok := p.lastIssued(t)
	if msg := disconnectNotRevoked(t, g, tok); !strings.Contains(msg, "HTTP 503, temporarily_unavailable") {
		t.Fatalf("DELETE with the provider refusing the revocation: %s", msg)
	}
	if files := g.connectionFiles(t, "svc"); len(files) != 0 {
		t.Fatalf("the credential was kept: %d connection records", len(files))
	}
	requireMetricLine(t, g, `toolgate_oauth_revocations_total{outcome="failed",service="svc"}`)

	// The console says the same.
	p.connectAt(t, g)
	browser := g.signedIn(t, aliceKey)
	_, page := browser.get(g.URL + "/console/services")
	status, page := browser.post(g.URL+"/console/services/svc/disconnect", url.Values{"csrf": {browser.csrf(page)}})
	if status != http.StatusOK || !strings.Contains(page, `class="notice warn"`) || !strings.Contains(page, "is disconnected") ||
		!strings.Contains(page, "revoke toolgate&#39;s access in your account at the provider") {
		t.Fatalf("disconnecting in the console: %d %s", status, page)
	}
	if tok := p.lastIssued(t); strings.Contains(page, tok.RefreshToken) || strings.Contains(page, tok.AccessToken) {
		t.Fatal("the console's page holds a token")
	}
	if files := g.connectionFiles(t, "svc"); len(files) != 0 {
		t.Fatalf("the credential was kept: %d connection records", len(files))
	}
}

// Without a revocation_url, disconnecting forgets the grant and sends the
// provider nothing (as the README says: revoke a leaked one there).
func TestOAuthDisconnectWithoutRevocationURLSendsNothing(t *testing.T) {
	p := startRevokingProvider(t)
	g := revokingGateway(t, p, "")
	p.connectAt(t, g)
	tok := p.lastIssued(t)
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", r.StatusCode, r.Body)
	}
	if n := len(p.revocationRequests()); n != 0 {
		t.Fatalf("the provider got %d revocation requests", n)
	}
	if status := p.userinfo(t, tok.AccessToken); status != http.StatusOK {
		t.Fatalf("without revocation_url the grant is left at the provider, yet it answered %d", status)
	}
}

// disconnectNotRevoked disconnects alice, expects the answer that the
// credential is forgotten but not revoked (telling her what to do, and
// holding neither of tok's tokens), and returns its message.
func disconnectNotRevoked(t *testing.T, g *gateway, tok issuedTokens) string {
	t.Helper()
	r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil)
	var answer struct {
		Forgotten bool   `json:"forgotten"`
		Revoked   *bool  `json:"revoked"`
		Message   string `json:"message"`
	}
	if r.StatusCode != http.StatusOK || json.Unmarshal(r.Body, &answer) != nil || !answer.Forgotten || answer.Revoked == nil || *answer.Revoked ||
		!strings.Contains(answer.Message, "revoke toolgate's access in your account at the provider") {
		t.Fatalf("DELETE without a confirmed revocation: %d %s", r.StatusCode, r.Body)
	}
	if bytes.Contains(r.Body, []byte(tok.RefreshToken)) || bytes.Contains(r.Body, []byte(tok.AccessToken)) {
		t.Fatalf("the answer holds a token: %s", r.Body)
	}
	return answer.Message
}

func firstOr(v []url.Values) url.Values {
	if len(v) == 0 {
		return nil
	}
	return v[0]
}

// requireMetricLine fails unless g's metrics hold a sample named series
// (name and labels as Prometheus prints them).
func requireMetricLine(t *testing.T, g *gateway, series string) {
	t.Helper()
	resp, err := http.Get(g.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, series+" ") {
			return
		}
	}
	t.Errorf("the gateway's metrics hold no %s", series)
}
