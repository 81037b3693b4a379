package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func provisioned(t *testing.T, s *Service) *Service {
	t.Helper()
	if err := s.provision(caddy.NewReplacer()); err != nil {
		t.Fatalf("provision: %v", err)
	}
	return s
}

func TestServiceProvisionDefaults(t *testing.T) {
	t.Setenv("TG_TEST_UPSTREAM", "https://tracker.example.com/mcp")
	t.Setenv("TG_TEST_SECRET", "s3cret")
	t.Setenv("TG_TEST_CLIENT", "client-1")
	s := provisioned(t, &Service{
		ID:           "tracker",
		URL:          "{env.TG_TEST_UPSTREAM}",
		Tools:        []string{"whoami", "read_ticket"},
		AllowedUsers: []string{"alice"},
		Auth: &UpstreamAuth{Kind: AuthOAuth, OAuth: &OAuthClient{
			AuthorizationURL: "https://auth.example.com/authorize",
			TokenURL:         "https://auth.example.com/token",
			ClientID:         "{env.TG_TEST_CLIENT}",
			ClientSecret:     "{env.TG_TEST_SECRET}",
		}},
	})
	if err := s.validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if time.Duration(s.Timeout) != 60*time.Second {
		t.Errorf("default timeout = %v, want 60s", time.Duration(s.Timeout))
	}
	if time.Duration(s.DialTimeout) != 3*time.Second || s.ResponseHeaderTimeout != 0 || s.ResumeAttempts != 5 ||
		time.Duration(s.MaxResumeDelay) != 30*time.Second || time.Duration(s.SSEKeepAlive) != 15*time.Second {
		t.Errorf("relay defaults = dial %v, headers %v, resumes %d, resume delay %v, keep-alive %v",
			time.Duration(s.DialTimeout), time.Duration(s.ResponseHeaderTimeout), s.ResumeAttempts,
			time.Duration(s.MaxResumeDelay), time.Duration(s.SSEKeepAlive))
	}
	if s.URL != "https://tracker.example.com/mcp" {
		t.Errorf("URL placeholder not expanded: %q", s.URL)
	}
	if o := s.Auth.OAuth; o.ClientID != "client-1" || o.ClientSecret != "s3cret" {
		t.Errorf("oauth placeholders not expanded: %q %q", o.ClientID, o.ClientSecret)
	}
	if s.Auth.OAuth.Resource != s.URL {
		t.Errorf("resource defaults to %q, want the service URL", s.Auth.OAuth.Resource)
	}
	if !s.AllowsTool("read_ticket") || s.AllowsTool("delete_ticket") || s.AllowsTool("") || s.AllowsTool("Read_Ticket") {
		t.Error("AllowsTool does not match the allowlist exactly")
	}
	if !s.AllowsUser("alice") || s.AllowsUser("bob") || s.AllowsUser("Alice") {
		t.Error("AllowsUser does not match allowed_users exactly")
	}

	open := provisioned(t, &Service{ID: "open", URL: "https://x.example.com", Tools: []string{"t"}})
	if open.Auth == nil || open.Auth.Kind != AuthNone {
		t.Errorf("default auth = %+v, want none", open.Auth)
	}
	if !open.AllowsUser("anyone") {
		t.Error("a service without allowed_users must allow every caller")
	}
	empty := provisioned(t, &Service{ID: "e", URL: "https://x.example.com", Tools: []string{"t"}, Auth: &UpstreamAuth{}})
	if empty.Auth.Kind != AuthNone {
		t.Errorf("empty auth kind = %q, want none", empty.Auth.Kind)
	}
}

func TestServiceValidate(t *testing.T) {
	base := func() *Service {
		return &Service{ID: "svc", URL: "https://svc.example.com/mcp", Tools: []string{"t"}}
	}
	oauthSvc := func(mod func(o *OAuthClient)) func(s *Service) {
		return func(s *Service) {
			o := &OAuthClient{AuthorizationURL: "https://a.example.com/auth", TokenURL: "https://a.example.com/token", ClientID: "c"}
			mod(o)
			s.Auth = &UpstreamAuth{Kind: AuthOAuth, OAuth: o}
		}
	}
	tests := []struct {
		name  string
		mod   func(s *Service)
		field string // "" means valid; otherwise the error names this field
		want  string // further substring of the error
	}{
		{"valid https", func(*Service) {}, "", ""},
		{"valid http with allow_http", func(s *Service) { s.URL, s.AllowHTTP = "http://127.0.0.1:9000/mcp", true }, "", ""},
		{"valid timeout at the maximum", func(s *Service) { s.Timeout = caddy.Duration(300 * time.Second) }, "", ""},
		{"valid header auth", func(s *Service) { s.Auth = &UpstreamAuth{Kind: AuthHeader, Header: "X-Key", Value: "v"} }, "", ""},
		{"valid bearer", func(s *Service) { s.Auth = &UpstreamAuth{Kind: AuthBearer} }, "", ""},
		{"valid oauth", oauthSvc(func(*OAuthClient) {}), "", ""},
		{"valid oauth over http with allow_http", func(s *Service) {
			s.AllowHTTP = true
			oauthSvc(func(o *OAuthClient) { o.TokenURL = "http://127.0.0.1:9999/token" })(s)
		}, "", ""},

		{"negative dial_timeout", func(s *Service) { s.DialTimeout = -1 }, "dial_timeout", "positive"},
		{"negative response_header_timeout", func(s *Service) { s.ResponseHeaderTimeout = -1 }, "response_header_timeout", "positive"},
		{"negative resume_attempts", func(s *Service) { s.ResumeAttempts = -1 }, "resume_attempts", "positive"},
		{"id empty", func(s *Service) { s.ID = "" }, "id", "letters, digits"},
		{"id with a slash", func(s *Service) { s.ID = "a/b" }, "id", ""},
		{"id with a dot", func(s *Service) { s.ID = "a.b" }, "id", ""},
		{"id starting with a dash", func(s *Service) { s.ID = "-a" }, "id", ""},
		{"id too long", func(s *Service) { s.ID = strings.Repeat("a", 65) }, "id", ""},
		{"url missing", func(s *Service) { s.URL = "" }, "url", "required"},
		{"url plain http", func(s *Service) { s.URL = "http://svc.example.com/mcp" }, "url", "allow_http"},
		{"url without host", func(s *Service) { s.URL = "https:///mcp" }, "url", "no host"},
		{"url relative", func(s *Service) { s.URL = "/mcp" }, "url", "no host"},
		{"url with credentials", func(s *Service) { s.URL = "https://user:pw@svc.example.com/mcp" }, "url", "credentials"},
		{"url other scheme", func(s *Service) { s.URL = "ftp://svc.example.com/mcp" }, "url", `scheme "ftp"`},
		{"url other scheme even with allow_http", func(s *Service) { s.URL, s.AllowHTTP = "ws://svc.example.com/mcp", true }, "url", `scheme "ws"`},
		{"url unparsable", func(s *Service) { s.URL = "https://svc.example.com:port/mcp" }, "url", ""},
		{"tools missing", func(s *Service) { s.Tools = nil }, "tools", "required"},
		{"tools empty name", func(s *Service) { s.Tools = []string{"a", ""} }, "tools", "invalid tool name"},
		{"tools name with a space", func(s *Service) { s.Tools = []string{"read ticket"} }, "tools", `"read ticket"`},
		{"valid tool effects", func(s *Service) {
			s.Tools = []string{"a", "b", "c"}
			s.ToolEffects = map[string]string{"a": EffectReadOnly, "b": EffectAdditive, "c": EffectDestructive}
		}, "", ""},
		{"tool effect off the allowlist", func(s *Service) { s.ToolEffects = map[string]string{"u": EffectReadOnly} }, "tool u", "not on the tools allowlist"},
		{"unknown tool effect", func(s *Service) { s.ToolEffects = map[string]string{"t": "harmless"} }, "tool t", `unknown effect "harmless"`},
		{"timeout over 300s", func(s *Service) { s.Timeout = caddy.Duration(301 * time.Second) }, "timeout", "out of range"},
		{"timeout negative", func(s *Service) { s.Timeout = caddy.Duration(-time.Second) }, "timeout", "out of range"},
		{"header without name", func(s *Service) { s.Auth = &UpstreamAuth{Kind: AuthHeader, Value: "v"} }, "auth", "header name"},
		{"header without value", func(s *Service) { s.Auth = &UpstreamAuth{Kind: AuthHeader, Header: "X-Key"} }, "auth", "environment variable"},
		{"unknown auth kind", func(s *Service) { s.Auth = &UpstreamAuth{Kind: "basic"} }, "auth", `unknown kind "basic"`},
		{"oauth without block", func(s *Service) { s.Auth = &UpstreamAuth{Kind: AuthOAuth} }, "auth", "authorization_url, token_url and client_id"},
		{"oauth authorization_url missing", oauthSvc(func(o *OAuthClient) { o.AuthorizationURL = "" }), "auth oauth authorization_url", "absolute URL"},
		{"oauth token_url relative", oauthSvc(func(o *OAuthClient) { o.TokenURL = "/token" }), "auth oauth token_url", "must be an absolute https URL"},
		{"oauth token_url over http", oauthSvc(func(o *OAuthClient) { o.TokenURL = "http://a.example.com/token" }), "auth oauth token_url", "must be https"},
		{"oauth authorization_url over http", oauthSvc(func(o *OAuthClient) { o.AuthorizationURL = "http://a.example.com/auth" }), "auth oauth authorization_url", "must be https"},
		{"oauth revocation_url over http", oauthSvc(func(o *OAuthClient) { o.RevocationURL = "http://a.example.com/revoke" }), "auth oauth revocation_url", "must be https"},
		{"oauth revocation_url not absolute", oauthSvc(func(o *OAuthClient) { o.RevocationURL = "/revoke" }), "auth oauth revocation_url", "must be an absolute https URL"},
		{"oauth token_url with another scheme, even with allow_http", func(s *Service) {
			s.AllowHTTP = true
			oauthSvc(func(o *OAuthClient) { o.TokenURL = "ftp://a.example.com/token" })(s)
		}, "auth oauth token_url", "must be an absolute https URL"},
		{"oauth client_id missing", oauthSvc(func(o *OAuthClient) { o.ClientID = "" }), "auth oauth client_id", "required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base()
			tt.mod(s)
			provisioned(t, s)
			err := s.validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate accepted %+v", s)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, `service "`+s.ID+`": `+tt.field+":") {
				t.Errorf("error %q does not start by naming the service and the field %q", msg, tt.field)
			}
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not contain %q", msg, tt.want)
			}
		})
	}
}

func TestServiceValidateDoesNotLeakHeaderValue(t *testing.T) {
	s := provisioned(t, &Service{ID: "w", URL: "http://w.example.com", Tools: []string{"t"},
		Auth: &UpstreamAuth{Kind: AuthHeader, Header: "X-Key", Value: "topsecret"}})
	err := s.validate()
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Errorf("validate error = %v; want a url error that never shows the credential", err)
	}
}

func TestNewRegistry(t *testing.T) {
	a := &Service{ID: "a"}
	b := &Service{ID: "b"}
	r, err := newRegistry([]*Service{b, a})
	if err != nil {
		t.Fatal(err)
	}
	if r.Lookup("a") != a || r.Lookup("b") != b || r.Lookup("c") != nil || r.Lookup("A") != nil {
		t.Error("Lookup does not find services by exact id")
	}
	got := r.Services()
	if len(got) != 2 || got[0] != b || got[1] != a {
		t.Errorf("Services() = %v, want configuration order", got)
	}
	got[0] = nil
	if r.Services()[0] != b {
		t.Error("Services() exposes the registry's own slice")
	}
	if _, err := newRegistry([]*Service{{ID: "x"}, {ID: "x"}}); err == nil || !strings.Contains(err.Error(), `service "x": defined twice`) {
		t.Errorf("duplicate ids: err = %v", err)
	}
}

// App.Validate checks what spans services: a cipher for stored credentials,
// and public_url plus a long enough state_secret for oauth.
func TestAppValidateCrossServiceRules(t *testing.T) {
	oauth := &Service{ID: "gh", URL: "https://gh.example.com/mcp", Tools: []string{"t"}, Auth: &UpstreamAuth{Kind: AuthOAuth,
		OAuth: &OAuthClient{AuthorizationURL: "https://gh.example.com/a", TokenURL: "https://gh.example.com/t", ClientID: "c"}}}
	bearer := &Service{ID: "tok", URL: "https://tok.example.com/mcp", Tools: []string{"t"}, Auth: &UpstreamAuth{Kind: AuthBearer}}
	for _, s := range []*Service{oauth, bearer} {
		provisioned(t, s)
	}
	secret := strings.Repeat("s", minStateSecretBytes)
	tests := []struct {
		name string
		app  App
		want string
	}{
		{"bearer without cipher", App{Services: []*Service{bearer}}, `service "tok" stores user credentials: configure a cipher`},
		{"oauth without cipher", App{Services: []*Service{oauth}, PublicURL: "https://gw", StateSecret: secret}, `service "gh" stores user credentials`},
		{"oauth without public_url", App{Services: []*Service{oauth}, cipher: testCipher(t), StateSecret: secret}, `service "gh" uses oauth: public_url is required`},
		{"oauth with a short state_secret", App{Services: []*Service{oauth}, cipher: testCipher(t), PublicURL: "https://gw", StateSecret: secret[1:]}, "state_secret must be at least 32 bytes"},
		{"bad public_url", App{PublicURL: "gw.example.com"}, `public_url "gw.example.com": must be an absolute http(s) URL`},
		{"negative ttl", App{SessionTTL: -1}, "must be positive"},
		{"negative depth", App{MaxJSONDepth: -1}, "max_json_depth, max_request_values and max_response_values must not be negative"},
		{"negative values", App{MaxResponseValues: -1}, "max_response_values must not be negative"},
		{"room per caller under max_request_size", App{MaxRequestBytes: 4 << 20, MaxRequestBytesInFlightPerCaller: 1 << 20, MaxRequestBytesInFlight: 8 << 20},
			"max_request_bytes_in_flight_per_caller (1.0 MiB) must be at least max_request_size (4.0 MiB)"},
		{"room in all under the caller's", App{MaxRequestBytes: 1, MaxRequestBytesInFlightPerCaller: 8 << 20, MaxRequestBytesInFlight: 4 << 20},
			"max_request_bytes_in_flight (4.0 MiB) must be at least max_request_bytes_in_flight_per_caller (8.0 MiB)"},
		{"previous state secrets without a current one", App{PreviousStateSecrets: []string{secret}}, "previous secrets are given, but no current one"},
		{"a short previous state secret", App{StateSecret: secret, PreviousStateSecrets: []string{secret, "short"}}, "a previous secret is shorter than 32 bytes"},
		{"valid", App{Services: []*Service{oauth, bearer}, cipher: testCipher(t), PublicURL: "https://gw", StateSecret: secret, PreviousStateSecrets: []string{strings.ToUpper(secret)}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.app.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}

// What browsers send as Origin is accepted in allowed_origins (with the
// trailing slash Provision strips), and session_header takes a header of
// its own in any case.
func TestOriginAndSessionHeaderAccepted(t *testing.T) {
	for _, o := range []string{"https://app.example.com", "http://localhost:6274", "https://b.example.com:8443",
		"http://127.0.0.1:8080", "http://[::1]:3000", "https://app.example.com/", "https://xn--bcher-kva.example"} {
		if err := checkOrigin(o); err != nil {
			t.Errorf("checkOrigin(%q) = %v", o, err)
		}
	}
	for _, o := range []string{"https://app.example.com:", "https://app.example.com:0443", "http://app.example.com:80",
		"https://bücher.example", "https://app.example.com?x=1", "https://app.example.com#x", "https://u@app.example.com"} {
		if err := checkOrigin(o); err == nil {
			t.Errorf("checkOrigin(%q) accepted", o)
		}
	}
	for _, h := range []string{DefaultSessionHeader, "X-Run-Session", "x-toolgate-session"} {
		if err := checkSessionHeader(h); err != nil {
			t.Errorf("checkSessionHeader(%q) = %v", h, err)
		}
	}
	for _, h := range []string{"authorization", "Mcp-Method", "Sec-Fetch-Site", "Last-Event-ID", "Cookie"} {
		if err := checkSessionHeader(h); err == nil {
			t.Errorf("checkSessionHeader(%q) accepted", h)
		}
	}
}

// A reload that only respells a service's url — the scheme or host in
// another case, the scheme's default port written out — names the same
// upstream: its Endpoint is the same, so its MCP sessions go on. What can
// name another server or endpoint stays another Endpoint.
func TestEndpointOfRespelledURL(t *testing.T) {
	endpoint := func(url string) string {
		return provisioned(t, &Service{ID: "s", URL: url, Tools: []string{"t"}}).Endpoint()
	}
	for _, c := range []struct{ written, respelled string }{
		{"https://tracker.example.com/mcp", "HTTPS://Tracker.Example.COM/mcp"},
		{"https://tracker.example.com/mcp", "https://tracker.example.com:443/mcp"},
		{"https://tracker.example.com/mcp?team=a", "https://TRACKER.example.com:443/mcp?team=a"},
		{"https://tracker.example.com", "https://tracker.example.com:443"},
		{"https://tracker.example.com/mcp", "https://tracker.example.com:/mcp"},
		{"http://127.0.0.1:8080/mcp", "HTTP://127.0.0.1:8080/mcp"},
		{"http://localhost/mcp", "http://LocalHost:80/mcp"},
		{"https://[2001:db8::1]/mcp", "https://[2001:DB8::1]:443/mcp"},
	} {
		if a, b := endpoint(c.written), endpoint(c.respelled); a != b {
			t.Errorf("%s and %s name one upstream, but their Endpoints differ (%s, %s): a reload respelling it would end its MCP sessions", c.written, c.respelled, a, b)
		}
	}
	for _, c := range []struct{ a, b string }{
		{"https://tracker.example.com/mcp", "https://tracker.example.com/MCP"},      // paths are case-sensitive
		{"https://tracker.example.com/mcp", "https://tracker.example.com/mcp/"},     // another path
		{"https://tracker.example.com", "https://tracker.example.com/"},             // kept apart: written differently
		{"https://tracker.example.com/mcp", "https://tracker.example.com:8443/mcp"}, // another port
		{"https://tracker.example.com/mcp", "http://tracker.example.com:443/mcp"},   // another scheme
		{"http://tracker.example.com/mcp", "http://tracker.example.com:443/mcp"},    // 443 is not http's default
		{"https://tracker.example.com/mcp?team=a", "https://tracker.example.com/mcp?Team=a"},
		{"https://[fe80::1%25eth0]/mcp", "https://[fe80::1%25ETH0]/mcp"}, // interface names are case-sensitive
	} {
		if endpoint(c.a) == endpoint(c.b) {
			t.Errorf("%s and %s may be different upstreams, but their Endpoints are the same: one's MCP sessions would go on with the other", c.a, c.b)
		}
	}
	// (Urls written as they are digested keep the Endpoint earlier versions
	// stored: TestEndpointAdvCanonicalDigestsUnchanged.)
}

// A secret given through a placeholder that is empty once replaced (an
// environment variable not set) is refused when the service is
// provisioned: a header without its value, or an OAuth client quietly made
// public.
func TestServiceSecretEmptyOncePlaceholdersAreReplaced(t *testing.T) {
	for name, auth := range map[string]*UpstreamAuth{
		"auth header value": {Kind: AuthHeader, Header: "X-Key", Value: "{env.TG_TEST_SURELY_UNSET}"},
		"oauth client_secret": {Kind: AuthOAuth, OAuth: &OAuthClient{AuthorizationURL: "https://a.example.com/auth",
			TokenURL: "https://a.example.com/token", ClientID: "c", ClientSecret: "{env.TG_TEST_SURELY_UNSET}"}},
	} {
		s := &Service{ID: "svc", URL: "https://svc.example.com/mcp", Tools: []string{"t"}, Auth: auth}
		err := s.provision(caddy.NewReplacer())
		if err == nil || !strings.Contains(err.Error(), name+" is empty once placeholders are replaced") {
			t.Errorf("%s from an unset variable: %v; want it refused as empty", name, err)
		}
	}
}
