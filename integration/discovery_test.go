package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// An MCP client that follows the MCP authorization spec reaches the tools
// with nothing configured but the endpoint's URL: its first request gets
// 401 with a challenge naming the endpoint's protected-resource metadata,
// which names the authorization server (a real OpenID provider, zitadel's
// certified library) and the scopes; the client registers nothing (it is
// preregistered there), signs alice in with the authorization code flow
// and PKCE, sends the endpoint as the resource, and calls a tool with the
// access token, in a session toolgate implies.
func TestMCPAuthorizationFlow(t *testing.T) {
	gwPort := freePort(t)
	gwURL := fmt.Sprintf("http://127.0.0.1:%d", gwPort)
	redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", freePort(t))
	issuer, password := startJWTAccessTokenProvider(t)
	storage.RegisterClients(storage.WebClient("mcp-client", "mcp-client-secret", redirect))
	up := startUpstream(t)
	g := startGatewayOnPort(t, gwPort, gatewayConfig{Upstream: up.URL, AuthExtra: `jwt {
				issuer   ` + issuer + `
				audience mcp-client
				jwks_url ` + issuer + `/keys
			}
			scopes openid`})

	// What the client will find.
	r := g.api(t, http.MethodGet, "/.well-known/oauth-protected-resource/v1/mcp/svc", "", nil)
	var meta struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
		ScopesSupported      []string `json:"scopes_supported"`
	}
	if err := json.Unmarshal(r.Body, &meta); err != nil || meta.Resource != gwURL+"/v1/mcp/svc" ||
		len(meta.AuthorizationServers) != 1 || meta.AuthorizationServers[0] != issuer || len(meta.ScopesSupported) != 1 {
		t.Fatalf("the endpoint's metadata: %d %s", r.StatusCode, r.Body)
	}
	m := g.raw(t, "", "", "svc")
	m.headers = map[string]string{}
	status, hdr, _ := m.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	if want := `Bearer resource_metadata="` + gwURL + `/.well-known/oauth-protected-resource/v1/mcp/svc", scope="openid"`; status != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") != want {
		t.Fatalf("without a token: %d %q, want 401 %q", status, hdr.Get("WWW-Authenticate"), want)
	}

	var authorizations []string
	handler, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		PreregisteredClient: &oauthex.ClientCredentials{ClientID: "mcp-client",
			ClientSecretAuth: &oauthex.ClientSecretAuth{ClientSecret: "mcp-client-secret"}},
		RedirectURL: redirect,
		AuthorizationCodeFetcher: func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			authorizations = append(authorizations, args.URL)
			return signInAtProvider(ctx, args.URL, redirect, "alice", password)
		},
		AcceptUnadvertisedIss: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "spec-client", Version: "1.0.0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: gwURL + "/v1/mcp/svc", OAuthHandler: handler, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connecting with the MCP authorization flow: %v", err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "authorized"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, res); got != `{"text":"authorized"}` {
		t.Fatalf("echo = %q", got)
	}
	if len(authorizations) != 1 {
		t.Fatalf("the client signed in %d times, want once", len(authorizations))
	}
	// It asked for the endpoint as the resource (RFC 8707), the scope the
	// challenge named, with PKCE S256.
	q, _ := url.Parse(authorizations[0])
	if q.Query().Get("resource") != gwURL+"/v1/mcp/svc" || q.Query().Get("scope") != "openid" || q.Query().Get("code_challenge_method") != "S256" {
		t.Errorf("the authorization request: %s", authorizations[0])
	}
	// The runner's token never reaches the upstream.
	for _, h := range up.headers() {
		if h.Get("Authorization") != "" {
			t.Fatalf("the upstream got an Authorization header: %v", h)
		}
	}
}

// startJWTAccessTokenProvider runs zitadel's example OpenID provider with
// one user, alice, issuing access tokens as signed JWTs (a resource server
// verifies them with the provider's keys) for every client, and returns
// its issuer and alice's password.
func startJWTAccessTokenProvider(t *testing.T) (string, string) {
	return startExampleProvider(t, func(s *storage.Storage) exampleop.Storage { return jwtAccessTokens{s} })
}

// jwtAccessTokens is the example provider's storage with every client
// given JWT access tokens (the example's own clients have opaque ones).
type jwtAccessTokens struct{ *storage.Storage }

func (s jwtAccessTokens) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return jwtClient{c}, nil
}

type jwtClient struct{ op.Client }

func (jwtClient) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }

// signInAtProvider is the person in the browser: it opens the authorization
// URL, signs in on the provider's login page, and returns what the
// provider sends to the redirect URI.
func signInAtProvider(ctx context.Context, authorizeURL, redirect, user, password string) (*auth.AuthorizationResult, error) {
	arrived, err := signInAt(ctx, authorizeURL, redirect, user, password)
	if err != nil {
		return nil, err
	}
	q := arrived.Query()
	return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
}

// signInAt is signInAtProvider returning the URL the provider sends the
// browser back to, unopened.
func signInAt(ctx context.Context, authorizeURL, redirect, user, password string) (*url.URL, error) {
	jar, _ := cookiejar.New(nil)
	var arrived *url.URL
	client := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), redirect) {
			arrived = req.URL
			return http.ErrUseLastResponse
		}
		return nil
	}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, authorizeURL, nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	id := resp.Request.URL.Query().Get("authRequestID")
	if id == "" {
		return nil, fmt.Errorf("the provider did not show its login page (at %s, %s)", resp.Request.URL, resp.Status)
	}
	form := url.Values{"id": {id}, "username": {user}, "password": {password}}
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, resp.Request.URL.Scheme+"://"+resp.Request.URL.Host+"/login/username",
		strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = client.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if arrived == nil {
		return nil, errors.New("the provider did not send the browser back: " + resp.Status)
	}
	return arrived, nil
}

// The HTTP API answers a request without a valid token with its own
// error body (not the MCP endpoint's JSON-RPC error) and the challenge
// that names the gateway's protected-resource metadata.
func TestAPIUnauthorizedAnswer(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: startUpstream(t).URL})
	for _, key := range []string{"", "not-a-key"} {
		r := g.api(t, http.MethodGet, "/v1/catalog", key, nil)
		var body struct {
			Error struct{ Code, Message string }
		}
		if r.StatusCode != http.StatusUnauthorized || json.Unmarshal(r.Body, &body) != nil || body.Error.Code != "unauthorized" ||
			body.Error.Message == "" || strings.Contains(string(r.Body), "jsonrpc") ||
			!strings.Contains(r.Header.Get("WWW-Authenticate"), `resource_metadata="`+g.URL+"/.well-known/oauth-protected-resource") {
			t.Errorf("GET /v1/catalog with key %q: %d %s, WWW-Authenticate %q", key, r.StatusCode, r.Body, r.Header.Get("WWW-Authenticate"))
		}
	}
}
