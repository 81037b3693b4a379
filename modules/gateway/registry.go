package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/oauth2"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// Service is one upstream MCP server in the registry. Only administrators
// define services; nothing a runner sends can add one or change where a
// service points.
type Service struct {
	// ID names the service in URLs (/v1/mcp/{id}) and in policy input.
	// Letters, digits, '-' and '_' only.
	ID string `json:"id"`

	// Title is a human-readable name shown in the catalog.
	Title string `json:"title,omitempty"`

	// URL is the upstream's Streamable HTTP MCP endpoint (or, with
	// transport sse, its 2024-11-05 SSE endpoint). It must be https unless
	// AllowHTTP is set, and has no fragment (#…), which is never sent. A
	// service whose transport runs a program (stdio) has none. It is kept,
	// and sent, as CanonicalURL writes it: scheme and host in lower case,
	// without the scheme's default port.
	URL string `json:"url,omitempty"`

	// AllowHTTP permits a plain http URL. Meant for local development only:
	// credentials cross the network unencrypted.
	AllowHTTP bool `json:"allow_http,omitempty"`

	// Tools is the allowlist: the only tools runners can see and call.
	// Required and non-empty.
	Tools []string `json:"tools"`

	// ToolEffects declares what tools of the allowlist do, by name:
	// "read_only" (changes nothing), "additive" (may add or change things
	// but never destroys them) or "destructive". The declaration replaces
	// the upstream's readOnlyHint and destructiveHint, which are only the
	// upstream's claims about itself; the policy input says where the
	// hints came from (tool.annotations_source). Caddyfile, in the service
	// block, once per tool: tool <name> read_only|additive|destructive.
	ToolEffects map[string]string `json:"tool_effects,omitempty"`

	// Pins fixes the definitions of tools of the allowlist, by name: the
	// digest ("sha256:" and 64 hex digits, as the tool-pins API shows it)
	// of the only definition (name, title, description, input and output
	// schema, annotations) runners may see and call. A tool whose upstream
	// definition differs is hidden and its calls are refused; only a new
	// pin accepts it. Tools without a pin are pinned at first sight
	// (package toolpin). Caddyfile, in the service block, once per tool:
	// pin <name> sha256:<hex>.
	Pins map[string]string `json:"pins,omitempty"`

	// AllowedUsers, when set, limits the service to these callers (user
	// identifiers as the authenticator reports them). Empty means every
	// authenticated caller.
	AllowedUsers []string `json:"allowed_users,omitempty"`

	// Timeout bounds one whole upstream exchange: a request, its response
	// stream and any resumption of it, toolgate's own re-initialization of
	// a session the upstream forgot, and the DELETE that ends a session.
	// A runner's standalone GET stream has no such bound. Default 60s, at
	// most 300s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// DialTimeout bounds opening a TCP connection to the upstream (as
	// reverse_proxy's dial_timeout does). Default 3s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ResponseHeaderTimeout bounds the wait for the upstream's response
	// headers once a request is sent (as reverse_proxy's
	// response_header_timeout does); the body, such as a long SSE stream,
	// is bounded by Timeout only. Default: only Timeout bounds it.
	ResponseHeaderTimeout caddy.Duration `json:"response_header_timeout,omitempty"`

	// ResumeAttempts is how many times in a row toolgate resumes an
	// upstream SSE stream (GET with Last-Event-ID) that ended without an
	// answer and brought nothing new since the last resumption. A stream
	// that keeps bringing events is resumed for as long as Timeout allows
	// (the SEP-1699 polling pattern). Default 5.
	ResumeAttempts int `json:"resume_attempts,omitempty"`

	// MaxResumeDelay caps the delay an upstream may ask for (the SSE retry
	// field) before toolgate resumes its stream. Default 30s.
	MaxResumeDelay caddy.Duration `json:"max_resume_delay,omitempty"`

	// SSEKeepAlive is how long an SSE stream toolgate writes to a runner
	// may stay silent before toolgate sends a comment line, so that
	// intermediaries do not cut an idle stream and the runner notices a
	// dead one. Default 15s; a negative value sends none.
	SSEKeepAlive caddy.Duration `json:"sse_keepalive,omitempty"`

	// Auth says which credential toolgate attaches to upstream requests.
	// Default: none.
	Auth *UpstreamAuth `json:"auth,omitempty"`

	// TransportRaw is how toolgate reaches an upstream that does not speak
	// Streamable HTTP: a module in the toolgate.upstreams namespace, named
	// by its "kind" — "stdio" (a program toolgate runs, speaking MCP over
	// its stdin and stdout; see that module for its options, which go in
	// the service block: command, env, per_user, …) or "sse" (the
	// 2024-11-05 HTTP+SSE transport at url). Default: Streamable HTTP at
	// url. Caddyfile: transport sse | stdio | http, or just the options of
	// the transport (command implies stdio).
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=toolgate.upstreams inline_key=kind"`

	tools         map[string]struct{}
	allowedUsers  map[string]struct{}
	url           *url.URL
	written       string // URL as configured, placeholders expanded (URL is canonical)
	transport     UpstreamTransport
	transportName string
	endpoint      string
	loaded        time.Time // when this configuration was provisioned
}

// The effects an administrator can declare for a tool (Service.ToolEffects).
const (
	EffectReadOnly    = "read_only"
	EffectAdditive    = "additive"
	EffectDestructive = "destructive"
)

// The kinds of upstream credentials.
const (
	AuthNone   = "none"   // no credential
	AuthHeader = "header" // one service-wide header, from the config
	AuthBearer = "bearer" // a personal token each user stores
	AuthOAuth  = "oauth"  // a personal OAuth grant each user connects
)

// UpstreamAuth is the credential a service needs.
type UpstreamAuth struct {
	// Kind is one of "none", "header", "bearer" or "oauth".
	Kind string `json:"kind"`

	// Header is the header name, for kind "header": a valid HTTP header
	// name (no spaces or colons).
	Header string `json:"header,omitempty"`

	// Value is the header value, for kind "header". Placeholders such as
	// {env.WEATHER_KEY} are expanded when the config loads; the value must
	// hold no line break or other control character.
	Value string `json:"value,omitempty"`

	// OAuth configures kind "oauth".
	OAuth *OAuthClient `json:"oauth,omitempty"`
}

// OAuthClient is toolgate's OAuth 2 client registration at a service's
// authorization server.
type OAuthClient struct {
	// AuthorizationURL is the provider's authorization endpoint.
	AuthorizationURL string `json:"authorization_url"`
	// TokenURL is the provider's token endpoint.
	TokenURL string `json:"token_url"`
	// RevocationURL is the provider's RFC 7009 revocation endpoint. When
	// set, a person disconnecting has their grant revoked there too (its
	// refresh token, or its access token when there is none); without
	// it, disconnecting only forgets the grant, which stays valid at the
	// provider until it expires or the person revokes it there.
	RevocationURL string `json:"revocation_url,omitempty"`
	// ClientID is toolgate's client id at the provider.
	ClientID string `json:"client_id"`
	// ClientSecret is toolgate's client secret; empty for a public client.
	ClientSecret string `json:"client_secret,omitempty"`
	// Scopes are requested when a user connects.
	Scopes []string `json:"scopes,omitempty"`
	// Resource is the RFC 8707 resource indicator sent on the
	// authorization request and on every token request (code exchange and
	// refresh). Defaults to the service URL.
	Resource string `json:"resource,omitempty"`
	// RefreshSkew is how long before its expiry an access token is
	// refreshed. Default 60s. It never exceeds half the lifetime the
	// provider gave the token, so short-lived tokens are not refreshed on
	// every call.
	RefreshSkew caddy.Duration `json:"refresh_skew,omitempty"`
	// LoginHint makes toolgate send the caller's user identifier as the
	// OpenID Connect login_hint parameter of the authorization request, so
	// the provider can preselect (or, in the demo, pick) the account.
	LoginHint bool `json:"login_hint,omitempty"`

	// Built by App.Provision (the redirect URI needs public_url).
	issued        string         // see issuer
	config        *oauth2.Config // authorization and code exchange
	refreshConfig *oauth2.Config // refresh: the same client, no redirect URI
}

// DefaultRefreshSkew is how long before expiry an OAuth access token is
// refreshed when a service does not set refresh_skew.
const DefaultRefreshSkew = 60 * time.Second

const (
	defaultServiceTimeout = 60 * time.Second
	maxServiceTimeout     = 300 * time.Second
	defaultDialTimeout    = 3 * time.Second
	defaultResumeAttempts = 5
	defaultMaxResumeDelay = 30 * time.Second
	defaultSSEKeepAlive   = 15 * time.Second
)

var serviceIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// provision expands placeholders, applies defaults and indexes the service.
func (s *Service) provision(repl *caddy.Replacer) error {
	s.loaded = time.Now().UTC()
	s.URL = repl.ReplaceKnown(s.URL, "")
	if s.Timeout == 0 {
		s.Timeout = caddy.Duration(defaultServiceTimeout)
	}
	if s.DialTimeout == 0 {
		s.DialTimeout = caddy.Duration(defaultDialTimeout)
	}
	if s.ResumeAttempts == 0 {
		s.ResumeAttempts = defaultResumeAttempts
	}
	if s.MaxResumeDelay == 0 {
		s.MaxResumeDelay = caddy.Duration(defaultMaxResumeDelay)
	}
	if s.SSEKeepAlive == 0 {
		s.SSEKeepAlive = caddy.Duration(defaultSSEKeepAlive)
	}
	if s.Auth == nil {
		s.Auth = &UpstreamAuth{Kind: AuthNone}
	}
	if s.Auth.Kind == "" {
		s.Auth.Kind = AuthNone
	}
	var err error
	if s.Auth.Value, err = caddyopt.Secret(repl, s.Auth.Value); err != nil {
		return fmt.Errorf("service %q: auth header value %w", s.ID, err)
	}
	if o := s.Auth.OAuth; o != nil {
		o.ClientID = repl.ReplaceKnown(o.ClientID, "")
		if o.ClientSecret, err = caddyopt.Secret(repl, o.ClientSecret); err != nil {
			return fmt.Errorf("service %q: oauth client_secret %w", s.ID, err)
		}
		if o.Resource == "" {
			o.Resource = s.URL
		}
		if o.RefreshSkew == 0 {
			o.RefreshSkew = caddy.Duration(DefaultRefreshSkew)
		}
	}
	s.tools = make(map[string]struct{}, len(s.Tools))
	for _, t := range s.Tools {
		s.tools[t] = struct{}{}
	}
	if len(s.AllowedUsers) > 0 {
		s.allowedUsers = make(map[string]struct{}, len(s.AllowedUsers))
		for _, u := range s.AllowedUsers {
			s.allowedUsers[u] = struct{}{}
		}
	}
	// The OAuth resource above stays as written: an authorization server
	// compares it as a string; validate quotes the url as written.
	s.written = s.URL
	s.URL = CanonicalURL(s.URL)
	if u, err := url.Parse(s.URL); err == nil {
		s.url = u
	}
	s.endpoint = endpointOf(s.URL, "") // a transport module's own upstream name is added when it is attached
	return nil
}

// endpointOf is the Endpoint of an upstream at url (as provision keeps it:
// CanonicalURL), reached through the transport named ("" for Streamable
// HTTP) as its UpstreamName says.
func endpointOf(url, transport string) string {
	sum := sha256.Sum256([]byte(url + "\x00" + transport))
	return hex.EncodeToString(sum[:16])
}

// CanonicalURL is raw with its scheme and host in lower case and without
// the scheme's default port, which name the same server however they are
// written (RFC 3986, 6.2.2.1 and 6.2.3). A service's url is kept so
// (provision): what toolgate sends — the request target, the Host header,
// the TLS server name, the proxy it picks — and the Endpoint it digests
// are one and the same for every spelling, so that a reload that only
// respells the url ends no MCP session, and two urls of one Endpoint
// never reach two places (Go's own ServeMux tells hosts apart by case, and
// its proxy settings exempt "localhost" but not "LOCALHOST"). The rest
// stays as written: a path differing in case, or an empty path against
// "/", may be another endpoint. A url written so already is returned as it
// is (its Endpoint is the one earlier versions stored with their
// sessions); so is one that does not parse, or carries credentials (both
// refused by validate).
func CanonicalURL(raw string) string {
	u, err := url.Parse(raw)
	scheme, rest, ok := strings.Cut(raw, "://")
	if err != nil || !ok || u.Host == "" || !strings.EqualFold(scheme, u.Scheme) {
		return raw
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	host, ok := canonicalHost(u.Scheme, rest[:end])
	if !ok {
		return raw
	}
	return u.Scheme + "://" + host + rest[end:]
}

// CanonicalOrigin is the scheme://host of u as CanonicalURL writes it: the
// legacy SSE transport's origin check, made on each request it sends.
func CanonicalOrigin(u *url.URL) string {
	host, ok := canonicalHost(u.Scheme, u.Host)
	if !ok {
		host = u.Host
	}
	return u.Scheme + "://" + host
}

// canonicalHost is host (an authority's host and port) as CanonicalURL
// writes it, for a url of scheme (lower case); false when it is left as
// written: credentials in it, or no host name (a port alone would go).
func canonicalHost(scheme, host string) (string, bool) {
	parts := url.URL{Host: host}
	if strings.Contains(host, "@") || parts.Hostname() == "" {
		return host, false
	}
	if !strings.Contains(host, "%") { // an IPv6 zone (or an escape) is left as written
		host = asciiLower(host)
	}
	switch port := parts.Port(); {
	case port == "":
		host = strings.TrimSuffix(host, ":") // an empty port is the default
	case scheme == "https" && port == "443", scheme == "http" && port == "80":
		host = strings.TrimSuffix(host, ":"+port)
	}
	return host, true
}

// asciiLower is s with its ASCII letters in lower case (a host's other
// characters are left as written: two spellings differing in them stay
// two endpoints).
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}, s)
}

// PerUserCredentials reports whether each caller reaches the upstream with
// a credential of their own (auth bearer or oauth), so that the upstream
// may answer each according to their account.
func (s *Service) PerUserCredentials() bool {
	return s.Auth != nil && (s.Auth.Kind == AuthBearer || s.Auth.Kind == AuthOAuth)
}

// Endpoint names the service's upstream: a digest of its url and transport
// (a program's command, say: see UpstreamNamer), placeholders expanded. An MCP session records it when it
// initializes, and ends when a reload makes its service name another
// upstream (see mcpsession.Upstream.Endpoint): what one upstream said and
// the session ids it issued are never taken for another's.
func (s *Service) Endpoint() string { return s.endpoint }

// validate reports the first problem with the service, naming the field.
func (s *Service) validate() error {
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("service %q: %s: %s", s.ID, field, fmt.Sprintf(format, args...))
	}
	if !serviceIDPattern.MatchString(s.ID) {
		return fmt.Errorf("service %q: id: use 1-64 letters, digits, '-' or '_', starting with a letter or digit", s.ID)
	}
	if s.transport != nil && !s.transport.UsesURL() {
		if s.URL != "" {
			return fail("url", "a service with transport %s takes no url", s.transportName)
		}
	} else if err := s.validateURL(fail); err != nil {
		return err
	}
	if len(s.Tools) == 0 {
		return fail("tools", "required: list the tools runners may use")
	}
	return s.validateRest(fail)
}

func (s *Service) validateURL(fail func(field, format string, args ...any) error) error {
	written := s.URL
	if s.written != "" {
		written = s.written
	}
	u, err := url.Parse(written)
	switch {
	case written == "":
		return fail("url", "required")
	case err != nil:
		return fail("url", "%q: %v", caddyopt.RedactURL(written), caddyopt.URLError(err))
	case u.Hostname() == "": // a port alone (http://:80/) would reach this machine
		return fail("url", "%q has no host", caddyopt.RedactURL(written))
	case u.User != nil:
		return fail("url", "must not carry credentials; use auth instead")
	case strings.Contains(written, "#"):
		// The fragment is never sent, and would make the Endpoint differ
		// from the same URL without it (ending MCP sessions).
		return fail("url", "must not have a fragment (#…): it is never sent to the upstream")
	case u.Scheme == "http" && !s.AllowHTTP:
		return fail("url", "%q is plain http; use https, or add allow_http for local development", written)
	case u.Scheme != "https" && u.Scheme != "http":
		return fail("url", "scheme %q is not supported; use https", u.Scheme)
	}
	return nil
}

func (s *Service) validateRest(fail func(field, format string, args ...any) error) error {
	for _, t := range s.Tools {
		if t == "" || strings.ContainsAny(t, " \t\r\n") {
			return fail("tools", "invalid tool name %q", t)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(s.ToolEffects)) {
		switch e := s.ToolEffects[t]; {
		case !s.AllowsTool(t):
			return fail("tool "+t, "%q is not on the tools allowlist", t)
		case e != EffectReadOnly && e != EffectAdditive && e != EffectDestructive:
			return fail("tool "+t, "unknown effect %q (use read_only, additive or destructive)", e)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(s.Pins)) {
		switch d := s.Pins[t]; {
		case !s.AllowsTool(t):
			return fail("pin "+t, "%q is not on the tools allowlist", t)
		case !pinPattern.MatchString(d):
			return fail("pin "+t, "%q is not a digest: want sha256: and 64 lower-case hex digits", d)
		}
	}
	if d := time.Duration(s.Timeout); d < 0 || d > maxServiceTimeout {
		return fail("timeout", "%s is out of range (0 < timeout <= %s)", d, maxServiceTimeout)
	}
	for field, d := range map[string]caddy.Duration{"dial_timeout": s.DialTimeout,
		"response_header_timeout": s.ResponseHeaderTimeout, "max_resume_delay": s.MaxResumeDelay} {
		if d < 0 {
			return fail(field, "must be positive")
		}
	}
	if s.ResumeAttempts < 0 {
		return fail("resume_attempts", "must be a positive number")
	}
	switch a := s.Auth; a.Kind {
	case AuthNone, AuthBearer:
	case AuthHeader:
		switch {
		case a.Header == "":
			return fail("auth", "header needs a header name and a value")
		case !caddyopt.HeaderName(a.Header):
			// Not quoted: a name like "X-Key: <key>" holds the credential.
			return fail("auth", "header: the name is not a header name (letters, digits and !#$%%&'*+-.^_`|~ only: no spaces or colons)")
		case a.Value == "":
			return fail("auth", "header %s has an empty value (is its environment variable set?)", a.Header)
		case !caddyopt.HeaderValue(a.Value):
			// Never quoted: it is a credential.
			return fail("auth", "header %s: the value holds a line break or another control character (check its environment variable)", a.Header)
		}
	case AuthOAuth:
		o := a.OAuth
		if o == nil {
			return fail("auth", "oauth needs authorization_url, token_url and client_id")
		}
		for field, v := range map[string]string{"authorization_url": o.AuthorizationURL, "token_url": o.TokenURL, "revocation_url": o.RevocationURL} {
			if v == "" && field == "revocation_url" {
				continue // optional
			}
			pu, err := url.Parse(v)
			switch {
			case v == "":
				return fail("auth oauth "+field, "required: an absolute URL")
			case err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http"):
				return fail("auth oauth "+field, "%q must be an absolute https URL", caddyopt.RedactURL(v))
			case pu.Scheme == "http" && !s.AllowHTTP:
				return fail("auth oauth "+field, "%q must be https (or the service needs allow_http)", caddyopt.RedactURL(v))
			}
		}
		if o.ClientID == "" {
			return fail("auth oauth client_id", "required")
		}
		if o.RefreshSkew < 0 {
			return fail("auth oauth refresh_skew", "must be positive")
		}
	default:
		return fail("auth", "unknown kind %q (use none, header, bearer or oauth)", a.Kind)
	}
	return nil
}

// AllowsTool reports whether name is on the service's allowlist.
func (s *Service) AllowsTool(name string) bool {
	_, ok := s.tools[name]
	return ok
}

// ToolEffect returns what the administrator declared tool does
// (EffectReadOnly, EffectAdditive or EffectDestructive), or "" when the
// registry says nothing about it.
func (s *Service) ToolEffect(tool string) string { return s.ToolEffects[tool] }

// pinPattern is the form of a pinned digest.
var pinPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Pin returns the digest the registry pins tool's definition to, or "".
func (s *Service) Pin(tool string) string { return s.Pins[tool] }

// Loaded is when the service's configuration was provisioned (zero for a
// Service not provisioned): a pin line took effect then.
func (s *Service) Loaded() time.Time { return s.loaded }

// AllowsUser reports whether user may use the service.
func (s *Service) AllowsUser(user string) bool {
	if s.allowedUsers == nil {
		return true
	}
	_, ok := s.allowedUsers[user]
	return ok
}

// Registry is the set of services, indexed by id.
type Registry struct {
	services map[string]*Service
	order    []*Service
}

func newRegistry(services []*Service) (*Registry, error) {
	r := &Registry{services: make(map[string]*Service, len(services)), order: services}
	for _, s := range services {
		if _, dup := r.services[s.ID]; dup {
			return nil, fmt.Errorf("service %q: defined twice", s.ID)
		}
		r.services[s.ID] = s
	}
	return r, nil
}

// Lookup returns the service with id, or nil.
func (r *Registry) Lookup(id string) *Service { return r.services[id] }

// Services returns every service in configuration order.
func (r *Registry) Services() []*Service { return slices.Clone(r.order) }
