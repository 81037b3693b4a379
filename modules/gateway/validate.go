package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

// Validate checks the configuration. It changes nothing.
func (a *App) Validate() error {
	if a.PublicURL != "" {
		// Redirect URIs and metadata URLs are public_url with a path
		// appended, and the metadata shows it to anyone.
		u, err := url.Parse(a.PublicURL)
		if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") ||
			u.User != nil || u.RawQuery != "" || u.ForceQuery || strings.Contains(a.PublicURL, "#") {
			return fmt.Errorf("public_url %q: must be an absolute http(s) URL, scheme://host[:port][/path] only: no user or password, query or fragment",
				caddyopt.RedactURL(a.PublicURL))
		}
	}
	for _, o := range a.AllowedOrigins {
		if err := checkOrigin(o); err != nil {
			return err
		}
	}
	if a.SessionHeader != "" { // "" until Provision gives the default
		if err := checkSessionHeader(a.SessionHeader); err != nil {
			return err
		}
	}
	if err := a.checkExtensions(); err != nil {
		return err
	}
	needsCipher, needsOAuth := "", ""
	for _, s := range a.Services {
		if err := s.validate(); err != nil {
			return err
		}
		switch s.Auth.Kind {
		case AuthBearer:
			needsCipher = s.ID
		case AuthOAuth:
			needsCipher, needsOAuth = s.ID, s.ID
		}
	}
	if needsCipher != "" && a.cipher == nil {
		return fmt.Errorf("service %q stores user credentials: configure a cipher (local, vault_transit or kms); there is no plaintext storage", needsCipher)
	}
	if needsOAuth != "" {
		if a.PublicURL == "" {
			return fmt.Errorf("service %q uses oauth: public_url is required (it forms the redirect URI)", needsOAuth)
		}
		if len(a.StateSecret) < minStateSecretBytes {
			return fmt.Errorf("service %q uses oauth: state_secret must be at least %d bytes (is its environment variable set?)", needsOAuth, minStateSecretBytes)
		}
	}
	if a.StateSecret != "" && len(a.StateSecret) < minStateSecretBytes {
		// It keys the seals of Mcp-Session-Ids, tasks and OAuth states: a
		// short one can be guessed offline and those forged.
		return fmt.Errorf("state_secret: must be at least %d bytes (make one with: openssl rand -base64 32)", minStateSecretBytes)
	}
	for _, p := range a.PreviousStateSecrets {
		switch {
		case a.StateSecret == "":
			return errors.New("state_secret: previous secrets are given, but no current one")
		case len(p) < minStateSecretBytes:
			return fmt.Errorf("state_secret: a previous secret is shorter than %d bytes (is its environment variable set?)", minStateSecretBytes)
		}
	}
	if a.SessionTTL < 0 || a.MCPSessionIdleTimeout < 0 || a.MCPSessionSweepInterval < 0 || a.CacheTTL < 0 {
		return errors.New("session_ttl, mcp_session_idle_timeout, mcp_session_sweep_interval and cache_ttl must be positive")
	}
	if d := time.Duration(a.MCPSessionSweepInterval); d != 0 && d < minMCPSessionSweep {
		// Below it the housekeeping loop spins. Above it a sweep costs
		// little (a session's use is written once per window, not per
		// sweep), and the integration tests sweep every 50ms.
		return fmt.Errorf("mcp_session_sweep_interval: %s is too short: at least %s (default %s)",
			caddyopt.DurationText(d), caddyopt.DurationText(minMCPSessionSweep), caddyopt.DurationText(defaultMCPSessionSweep))
	}
	if d := time.Duration(a.CacheTTL); d > maxCacheTTL {
		return fmt.Errorf("cache_ttl: %s is too long: at most %s (default %s); a session ended or a credential removed through another replica keeps working here for that long",
			caddyopt.DurationText(d), caddyopt.DurationText(maxCacheTTL), caddyopt.DurationText(defaultCacheTTL))
	}
	if a.MaxMCPSessions < 0 || a.MaxMCPSessionsPerCaller < 0 {
		return errors.New("max_mcp_sessions and max_mcp_sessions_per_caller must be positive")
	}
	if a.MaxStreams < 0 || a.MaxStreamsPerCaller < 0 {
		return errors.New("max_streams and max_streams_per_caller must be positive")
	}
	if a.MaxSessionsPerUser < 0 {
		return errors.New("max_sessions_per_user must be positive")
	}
	if a.MaxRequestBytes < 0 || a.MaxResponseBytes < 0 || a.MaxJSONDepth < 0 || a.MaxRequestValues < 0 || a.MaxResponseValues < 0 {
		return errors.New("max_request_bytes, max_response_bytes, max_json_depth, max_request_values and max_response_values must not be negative")
	}
	switch size := func(n int64) string { return humanize.IBytes(uint64(n)) }; {
	case a.MaxRequestBytesInFlightPerCaller < a.MaxRequestBytes:
		return fmt.Errorf("max_request_bytes_in_flight_per_caller (%s) must be at least max_request_size (%s): a request of the allowed size could never be read (set both, or max_request_bytes_in_flight_per_caller, which is at most max_request_bytes_in_flight)",
			size(a.MaxRequestBytesInFlightPerCaller), size(a.MaxRequestBytes))
	case a.MaxRequestBytesInFlight < a.MaxRequestBytesInFlightPerCaller:
		return fmt.Errorf("max_request_bytes_in_flight (%s) must be at least max_request_bytes_in_flight_per_caller (%s)",
			size(a.MaxRequestBytesInFlight), size(a.MaxRequestBytesInFlightPerCaller))
	}
	return nil
}

// checkOrigin refuses o, an allowed_origins entry, unless it is an origin
// as browsers send it in the Origin header (CheckOrigin compares the two
// as they are): lower-case http(s)://host[:port], the port only when it
// is not the scheme's default. An entry no browser sends would lock out
// the page it was meant for without a word; null (sandboxed frames,
// file: and data: pages, which anyone can make) and * would let every
// page in.
func checkOrigin(o string) error {
	if o == "null" || o == "*" {
		return fmt.Errorf("allowed_origins: %s would let in pages of any site; list each origin as scheme://host[:port]", o)
	}
	trimmed := strings.TrimSuffix(o, "/") // as Provision reads it
	u, err := url.Parse(trimmed)
	ok := err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" &&
		trimmed == u.Scheme+"://"+u.Host && u.Host == strings.ToLower(u.Host) && isASCII(u.Host)
	if ok {
		switch port := u.Port(); {
		case strings.HasSuffix(u.Host, ":"):
			ok = false
		case port == "":
		case u.Scheme == "https" && port == "443", u.Scheme == "http" && port == "80":
			ok = false
		default:
			n, err := strconv.Atoi(port)
			ok = err == nil && n > 0 && n < 1<<16 && strconv.Itoa(n) == port
		}
	}
	if !ok {
		return fmt.Errorf("allowed_origins: %q is not an origin as browsers send it: write scheme://host[:port] in lower case, scheme http or https, "+
			"without path, query or user, and without the port when it is the scheme's default (443, 80); an international name in its xn-- form",
			caddyopt.RedactURL(o))
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// protocolHeaders are the request headers toolgate, MCP, HTTP or browsers
// already give a meaning, by lower-case name: a session header among them
// would be read as both.
var protocolHeaders = map[string]bool{
	"authorization": true, "proxy-authorization": true, "cookie": true, "origin": true, "host": true,
	"content-type": true, "content-length": true, "content-encoding": true, "transfer-encoding": true,
	"accept": true, "accept-encoding": true, "last-event-id": true, "connection": true, "upgrade": true,
	"te": true, "trailer": true, "keep-alive": true, "expect": true, "referer": true, "user-agent": true,
	"if-none-match": true, "forwarded": true, "x-forwarded-for": true, "x-forwarded-host": true,
	"x-forwarded-proto": true, "traceparent": true, "tracestate": true, "baggage": true,
}

// protocolHeaderPrefixes start the names of whole families of such
// headers: MCP's own (Mcp-Session-Id, Mcp-Protocol-Version, Mcp-Method,
// Mcp-Param-…), and those a browser's script may not set.
var protocolHeaderPrefixes = []string{"mcp-", "sec-", "proxy-", "access-control-"}

// checkSessionHeader refuses a session_header a client cannot send, or
// one that already means something else.
func checkSessionHeader(h string) error {
	if !caddyopt.HeaderName(h) {
		return fmt.Errorf("session_header %q is not a header name: letters, digits and !#$%%&'*+-.^_`|~ only (default %s)", h, DefaultSessionHeader)
	}
	lower := strings.ToLower(h)
	used := protocolHeaders[lower]
	for _, p := range protocolHeaderPrefixes {
		used = used || strings.HasPrefix(lower, p)
	}
	if used {
		return fmt.Errorf("session_header %s: HTTP, MCP or toolgate uses this header already; choose another name (default %s)", h, DefaultSessionHeader)
	}
	return nil
}
