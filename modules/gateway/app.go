// Package gateway is the toolgate Caddy app: the state that outlives one
// request — the service registry, caller authentication, toolgate sessions,
// stored credentials with their cipher, and the runners' MCP sessions — plus
// the per-request Call that the pipeline's handlers share.
//
// Handlers reach the app with AppFor.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/mcpsession"
	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/storecache"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the toolgate app, configured by the `toolgate` global option.
type App struct {
	// PublicURL is the gateway's external base URL, such as
	// https://gateway.example.com. It is used for OAuth redirect URIs and
	// RFC 9728 metadata, and its origin is allowed to call the MCP
	// endpoint from a browser: scheme://host[:port][/path] only, without
	// user, password, query or fragment. Required when a service uses
	// oauth.
	PublicURL string `json:"public_url,omitempty"`

	// StateSecret is the secret toolgate derives the keys of what it hands
	// out and reads back from: it signs OAuth state parameters, seals the
	// console's sign-in cookie, and seals Mcp-Session-Ids, so that every
	// replica configured with it continues any MCP session. At least 32
	// bytes. Required when a service uses oauth, and to run several
	// replicas; without it, MCP session ids are sealed with a key of the
	// process, which no other replica holds and a restart forgets. Use a
	// placeholder such as {env.TOOLGATE_STATE_SECRET}; never commit it. One
	// that is empty once placeholders are replaced is an error, not "none".
	StateSecret string `json:"state_secret,omitempty"`

	// PreviousStateSecrets are secrets StateSecret replaced: what was
	// signed or sealed with them is still accepted (OAuth states and MCP
	// session ids), nothing new is. Keep one for as long as what it sealed
	// lives (session_ttl for MCP session ids), then remove it. Caddyfile:
	// further arguments of state_secret.
	PreviousStateSecrets []string `json:"previous_state_secrets,omitempty"`

	// StorageRaw is where sessions and connections are kept: any
	// caddy.storage module. Default: Caddy's configured storage. Give
	// several replicas one shared storage (Redis, Postgres, Consul, S3
	// plugins) to let them share sessions and credentials.
	StorageRaw json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`

	// CipherRaw encrypts stored credentials: a module in the
	// toolgate.ciphers namespace (local or vault_transit). Required when a
	// service uses bearer or oauth; there is no plaintext fallback.
	CipherRaw json.RawMessage `json:"cipher,omitempty" caddy:"namespace=toolgate.ciphers inline_key=cipher"`

	// Auth says how callers authenticate.
	Auth *AuthConfig `json:"auth,omitempty"`

	// Extensions holds the configuration of capabilities outside the kernel,
	// by option name (see RegisterOption): "approvals", for instance. A
	// name no capability of this build registers is refused.
	Extensions map[string]json.RawMessage `json:"extensions,omitempty"`

	// Services is the registry of upstream MCP servers.
	Services []*Service `json:"services,omitempty"`

	// SessionHeader is the request header carrying the toolgate session id.
	// Default "X-Toolgate-Session". It must be a header name that HTTP,
	// MCP and toolgate do not use already (not Authorization, Cookie,
	// Origin, Accept, Mcp-…, Sec-…, say).
	SessionHeader string `json:"session_header,omitempty"`

	// SessionTTL is how long a toolgate session lasts. Default 12h.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`

	// MaxSessionsPerUser bounds how many live toolgate sessions one caller
	// may hold; creating another fails until one ends or expires. Default
	// 100. (Callers themselves are bounded by the authenticator: API keys
	// an administrator issued, or the identity provider's users.)
	MaxSessionsPerUser int `json:"max_sessions_per_user,omitempty"`

	// MCPSessionIdleTimeout ends a runner's MCP session unused for this
	// long: toolgate forgets it and ends the upstream session with DELETE.
	// A session with a request in progress or an open stream is in use.
	// Default 1h.
	MCPSessionIdleTimeout caddy.Duration `json:"mcp_session_idle_timeout,omitempty"`

	// MCPSessionSweepInterval is how often idle MCP sessions are looked
	// for; a session ends at most this long after its idle timeout.
	// Default 1m, at least 10ms.
	MCPSessionSweepInterval caddy.Duration `json:"mcp_session_sweep_interval,omitempty"`

	// MaxMCPSessions bounds the MCP sessions initialized through this
	// gateway process and still held by it (a session this process has not
	// served for mcp_session_idle_timeout no longer counts here), all
	// callers together. An initialize over the bound is refused with a
	// JSON-RPC error that says so. Default 10000.
	MaxMCPSessions int `json:"max_mcp_sessions,omitempty"`

	// MaxMCPSessionsPerCaller bounds the open MCP sessions of one caller
	// (all their toolgate sessions and services together, on every replica
	// sharing the storage; replicas initializing at the same moment may
	// each let one more through). Default 100.
	MaxMCPSessionsPerCaller int `json:"max_mcp_sessions_per_caller,omitempty"`

	// MaxStreams bounds the responses this gateway process relays at once,
	// all callers together: calls waiting for their answer and open SSE
	// streams. A request over the bound is answered with HTTP 503 and a
	// retryable JSON-RPC error that names the option. Default 10000.
	MaxStreams int `json:"max_streams,omitempty"`

	// MaxStreamsPerCaller bounds the responses relayed at once for one
	// caller (all their sessions together), like MaxStreams. Default 1000.
	MaxStreamsPerCaller int `json:"max_streams_per_caller,omitempty"`

	// CacheTTL is how long sessions, decrypted credentials and MCP session
	// state read from storage are reused before storage is read again, when
	// the storage does not announce changes (file_system and most storage
	// plugins): a session ended or a credential removed through another
	// replica stops working here within this time. With a storage that
	// announces changes (postgres) what was read is reused until it
	// changes, whatever this is. Default 10s, at most 1h.
	CacheTTL caddy.Duration `json:"cache_ttl,omitempty"`

	// AllowedOrigins are browser origins allowed to call the MCP endpoint
	// and the API, besides PublicURL's own: their pages' CORS preflights
	// are answered and their answers readable. Each is written as browsers
	// send it in the Origin header: scheme://host[:port] in lower case,
	// scheme http or https, no path, no port when it is the scheme's
	// default; null and * are refused. Requests with any other Origin
	// header are refused (DNS-rebinding protection); requests without one
	// (non-browser clients) are allowed.
	AllowedOrigins []string `json:"allowed_origins,omitempty"`

	// MaxRequestBytes bounds a runner's request body. Default 4 MiB.
	MaxRequestBytes int64 `json:"max_request_bytes,omitempty"`

	// MaxRequestBytesInFlight bounds the bytes of runners' request bodies
	// this process holds at once (read, and not yet answered), all callers
	// together; MaxRequestBytesInFlightPerCaller those of one caller. A
	// request past either is answered with HTTP 503 and a retryable
	// JSON-RPC error that names the option, before its body is read. A
	// body without a Content-Length counts as max_request_size while it is
	// read. Defaults: 256 MiB in all (at least 4 × max_request_size), and
	// 64 MiB per caller (at least 4 × max_request_size, at most the total).
	// The share must be at least max_request_size, the total at least the
	// share.
	MaxRequestBytesInFlight          int64 `json:"max_request_bytes_in_flight,omitempty"`
	MaxRequestBytesInFlightPerCaller int64 `json:"max_request_bytes_in_flight_per_caller,omitempty"`

	// MaxResponseBytes bounds one upstream message (a JSON response or one
	// SSE event). Default 16 MiB.
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`

	// MaxJSONDepth bounds the nesting of a runner's message. Default 64.
	MaxJSONDepth int `json:"max_json_depth,omitempty"`
	// MaxRequestValues bounds the JSON values (objects, arrays, strings,
	// numbers, literals) of a runner's message: the policy's input is
	// built from each, at tens of bytes of memory apiece. Default 100000.
	MaxRequestValues int `json:"max_request_values,omitempty"`
	// MaxResponseValues bounds the JSON values of an upstream's message,
	// for the same reason (the result policy's input). Default 1000000.
	MaxResponseValues int `json:"max_response_values,omitempty"`

	registry     *Registry
	storage      certmagic.Storage
	cipher       Cipher
	sessions     *SessionStore
	connections  *ConnectionStore
	mcpSessions  *MCPSessions
	mcpConfig    *mcpsession.Config
	endMCP       func(EndedMCPSession)
	pipeline     *pipelineTrail
	httpClient   *http.Client
	origins      map[string]struct{}
	publicHost   string
	publicOrigin string // public_url's scheme://host[:port]
	logger       *zap.Logger
	stop         chan struct{}
	stopOnce     *sync.Once
	stopped      *atomic.Bool  // Stop ran (see InForce)
	stopping     *sync.RWMutex // write-held while stopped is set (WhileInForce)
	stopCtx      context.Context
	stopCancel   context.CancelFunc // at Stop, after stopped is set
	starting     *startGate         // Start finished (Started)
	follows      *App               // the App in force when this one started
	releasePools []func()
	startHooks   []func()
	stopHooks    []func()
	// Set while handlers are provisioned, read once serving: a
	// toolgate_console serves this config, and who records decisions.
	console bool
	api     bool
	// witnesses are the records checkCipherKey may open on a storage
	// without a canary (AddSealedWitness).
	witnesses []sealedWitness
	recorder  DecisionRecorder
	sharedMu  *sync.Mutex
	shared    map[string]any
	answers   map[string]ClientAnswerFunc // by id prefix
	// answerSearch is SearchAnswer's (SetAnswerSearch), set while
	// handlers are provisioned.
	answerSearch AnswerSearch
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "toolgate",
		New: func() caddy.Module { return new(App) },
	}
}

// Defaults.
const (
	DefaultSessionHeader           = "X-Toolgate-Session"
	defaultSessionTTL              = 12 * time.Hour
	defaultSessionsPerUser         = 100
	defaultMCPSessionIdle          = time.Hour
	defaultMCPSessionSweep         = time.Minute
	minMCPSessionSweep             = 10 * time.Millisecond
	defaultMaxMCPSessions          = 10000
	defaultMaxMCPSessionsPerCaller = 100
	defaultMaxStreams              = 10000
	defaultMaxStreamsPerCaller     = 1000
	defaultCacheTTL                = 10 * time.Second
	maxCacheTTL                    = time.Hour
	defaultMaxRequestBytes         = 4 << 20

	defaultMaxRequestBytesInFlight          = 256 << 20
	defaultMaxRequestBytesInFlightPerCaller = 64 << 20
	defaultMaxResponseBytes                 = 16 << 20
	defaultMaxJSONDepth                     = 64
	defaultMaxRequestValues                 = 100_000
	defaultMaxResponseValues                = 1_000_000
	minStateSecretBytes                     = 32
)

// AppFor returns the toolgate app of the configuration ctx provisions,
// loading it first if no module asked for it yet.
func AppFor(ctx caddy.Context) (*App, error) {
	app, err := ctx.App("toolgate")
	if err != nil {
		return nil, err
	}
	return app.(*App), nil
}

// Provision sets the app up. It does no network I/O.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	repl := caddy.NewReplacer()
	a.stop = make(chan struct{})
	a.stopOnce = new(sync.Once)
	a.stopped = new(atomic.Bool)
	a.stopping = new(sync.RWMutex)
	a.stopCtx, a.stopCancel = context.WithCancel(context.Background())
	a.starting = newStartGate()
	a.sharedMu = new(sync.Mutex)
	a.pipeline = new(pipelineTrail)

	// Guest modules.
	if a.StorageRaw != nil {
		mod, err := ctx.LoadModule(a, "StorageRaw")
		if err != nil {
			return fmt.Errorf("loading storage module: %v", err)
		}
		a.storage, err = mod.(caddy.StorageConverter).CertMagicStorage()
		if err != nil {
			return fmt.Errorf("creating storage: %v", err)
		}
	} else {
		a.storage = ctx.Storage()
	}
	a.storage = SafeListing(a.storage)
	if a.CipherRaw != nil {
		mod, err := ctx.LoadModule(a, "CipherRaw")
		if err != nil {
			return fmt.Errorf("loading cipher module: %v", err)
		}
		a.cipher = mod.(Cipher)
	}

	// Defaults.
	a.PublicURL = strings.TrimSuffix(repl.ReplaceKnown(a.PublicURL, ""), "/")
	if given := a.StateSecret; given != "" {
		// Going on without it would seal MCP session ids with a key of
		// this process alone, which replicas and a restart do not share.
		var err error
		if a.StateSecret, err = caddyopt.Secret(repl, given); err != nil {
			return fmt.Errorf("state_secret: %w", err)
		}
		if a.StateSecret == "" {
			return errors.New("state_secret is empty once placeholders are replaced (is its environment variable set?)")
		}
	}
	for i, p := range a.PreviousStateSecrets {
		var err error
		if a.PreviousStateSecrets[i], err = caddyopt.Secret(repl, p); err != nil {
			return fmt.Errorf("state_secret (a previous one): %w", err)
		}
	}
	if a.SessionHeader == "" {
		a.SessionHeader = DefaultSessionHeader
	}
	if a.SessionTTL == 0 {
		a.SessionTTL = caddy.Duration(defaultSessionTTL)
	}
	if a.MaxSessionsPerUser == 0 {
		a.MaxSessionsPerUser = defaultSessionsPerUser
	}
	if a.MCPSessionIdleTimeout == 0 {
		a.MCPSessionIdleTimeout = caddy.Duration(defaultMCPSessionIdle)
	}
	if a.MCPSessionSweepInterval == 0 {
		a.MCPSessionSweepInterval = caddy.Duration(defaultMCPSessionSweep)
	}
	if a.MaxMCPSessions == 0 {
		a.MaxMCPSessions = defaultMaxMCPSessions
	}
	if a.MaxMCPSessionsPerCaller == 0 {
		a.MaxMCPSessionsPerCaller = defaultMaxMCPSessionsPerCaller
	}
	if a.MaxStreams == 0 {
		a.MaxStreams = defaultMaxStreams
	}
	if a.MaxStreamsPerCaller == 0 {
		a.MaxStreamsPerCaller = defaultMaxStreamsPerCaller
	}
	if a.CacheTTL == 0 {
		a.CacheTTL = caddy.Duration(defaultCacheTTL)
	}
	if a.MaxRequestBytes == 0 {
		a.MaxRequestBytes = defaultMaxRequestBytes
	}
	if a.MaxRequestBytesInFlight == 0 {
		a.MaxRequestBytesInFlight = max(defaultMaxRequestBytesInFlight, 4*a.MaxRequestBytes)
	}
	if a.MaxRequestBytesInFlightPerCaller == 0 {
		a.MaxRequestBytesInFlightPerCaller = min(max(defaultMaxRequestBytesInFlightPerCaller, 4*a.MaxRequestBytes), a.MaxRequestBytesInFlight)
	}
	if a.MaxResponseBytes == 0 {
		a.MaxResponseBytes = defaultMaxResponseBytes
	}
	if a.MaxJSONDepth == 0 {
		a.MaxJSONDepth = defaultMaxJSONDepth
	}
	if a.MaxRequestValues == 0 {
		a.MaxRequestValues = defaultMaxRequestValues
	}
	if a.MaxResponseValues == 0 {
		a.MaxResponseValues = defaultMaxResponseValues
	}
	if a.Auth == nil {
		a.Auth = new(AuthConfig)
	}

	// Derived state.
	if err := a.Auth.provision(repl); err != nil {
		return err
	}
	for _, s := range a.Services {
		if err := s.provision(repl); err != nil {
			return err
		}
	}
	var err error
	if a.registry, err = newRegistry(a.Services); err != nil {
		return err
	}
	a.origins = make(map[string]struct{})
	for _, o := range a.AllowedOrigins {
		a.origins[strings.TrimSuffix(o, "/")] = struct{}{}
	}
	if u, err := url.Parse(a.PublicURL); err == nil && u.Host != "" {
		a.publicOrigin = browserOrigin(u)
		a.origins[a.publicOrigin] = struct{}{}
		a.publicHost = strings.ToLower(u.Hostname())
	}
	a.sessions = newSessionStore(a.storage, time.Duration(a.SessionTTL), time.Duration(a.CacheTTL), a.MaxSessionsPerUser)
	if a.cipher != nil {
		a.connections = newConnectionStore(a.storage, a.cipher, time.Duration(a.CacheTTL))
	}
	for _, s := range a.Services {
		if s.Auth.Kind == AuthOAuth && s.Auth.OAuth != nil {
			a.buildOAuthConfig(s)
		}
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}

	// State that outlives this config.
	v, _, err := mcpSessionPool.LoadOrNew(mcpSessionPoolKey, func() (caddy.Destructor, error) {
		return mcpsession.New(), nil
	})
	if err != nil {
		return err
	}
	a.mcpSessions = v.(*MCPSessions)
	a.releasePools = append(a.releasePools, func() { _, _ = mcpSessionPool.Delete(mcpSessionPoolKey) })
	a.mcpConfig = &mcpsession.Config{
		State:     mcpstate.New(a.storage, time.Duration(a.MCPSessionIdleTimeout), time.Duration(a.SessionTTL), func() time.Time { return now() }),
		Max:       a.MaxMCPSessions,
		PerCaller: a.MaxMCPSessionsPerCaller,
		CacheTTL:  time.Duration(a.CacheTTL),
		Idle:      time.Duration(a.MCPSessionIdleTimeout),
		Sweep:     time.Duration(a.MCPSessionSweepInterval),
		Logger:    a.logger,
		OnEnd:     a.EndUpstream,
		Endpoint: func(service string) (string, bool) {
			if svc := a.registry.Lookup(service); svc != nil {
				return svc.Endpoint(), true
			}
			return "", false
		},
		Allows: func(service, user string) bool {
			svc := a.registry.Lookup(service)
			return svc == nil || svc.AllowsUser(user)
		},
	}
	if a.StateSecret != "" {
		secrets := [][]byte{[]byte(a.StateSecret)}
		for _, p := range a.PreviousStateSecrets {
			secrets = append(secrets, []byte(p))
		}
		if a.mcpConfig.Keys, err = seal.New(mcpstate.Purpose, secrets...); err != nil {
			return fmt.Errorf("state_secret: %v", err)
		}
	}
	if a.httpClient, err = sharedUpstreamClient(); err != nil {
		return err
	}
	a.releasePools = append(a.releasePools, releaseUpstreamClient)
	for _, s := range a.Services {
		if err := s.attachTransport(ctx, a); err != nil {
			return err
		}
	}
	return nil
}

var mcpSessionPool = caddy.NewUsagePool()

const mcpSessionPoolKey = "mcp-sessions"

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

// Start starts the app's background work and the I/O Provision must not
// do. Requests taken meanwhile wait for it (Started).
func (a *App) Start() error {
	err := a.start()
	if a.starting != nil {
		a.starting.end(err == nil)
	}
	return err
}

func (a *App) start() error {
	ctx := context.Background()
	for _, s := range a.Services {
		if s.Auth.Kind == AuthOAuth && !a.console {
			// Only now is every handler provisioned: people connect oauth
			// services in a browser signed in to the console.
			return fmt.Errorf("service %q uses oauth: its users connect their accounts in the console; add toolgate_console to the site that serves public_url", s.ID)
		}
		if s.Auth.Kind == AuthOAuth && !a.api {
			return fmt.Errorf("service %q uses oauth: its provider sends people back to %s/v1/connections/%s/callback, which toolgate_api serves; add toolgate_api to the site that serves public_url", s.ID, a.PublicURL, s.ID)
		}
	}
	for _, s := range a.Services {
		if s.Auth.Kind == AuthHeader {
			serviceHeaders.serve(s.ID, &Credential{Header: s.Auth.Header, Value: s.Auth.Value})
		}
		if u, err := url.Parse(s.URL); err == nil && u.Scheme == "http" && !caddyopt.LoopbackHost(u.Hostname()) {
			a.logger.Warn("a service is reached over plain http across the network (allow_http): whoever is on the path reads and changes its calls and results, and its credential; use https, and keep allow_http for an upstream on this machine",
				zap.String("service", s.ID), zap.String("host", u.Hostname()), zap.String("auth", s.Auth.Kind))
		}
	}
	if s, ok := a.cipher.(CipherStarter); ok {
		if err := s.Start(ctx); err != nil {
			return fmt.Errorf("starting cipher: %w", err)
		}
	}
	if fsys, ok := a.storage.(*fileSystemStorage); ok {
		if err := fsys.checkWritable(); err != nil {
			return err
		}
	}
	if sc, ok := a.storage.(StorageChecker); ok {
		if err := sc.CheckAtStart(ctx); err != nil {
			return err
		}
	}
	if err := a.checkCipherKey(ctx); err != nil {
		return err
	}
	if err := a.sessions.start(a.logger); err != nil {
		return fmt.Errorf("following session changes in storage: %w", err)
	}
	if a.connections != nil {
		if err := a.connections.start(a.logger); err != nil {
			return fmt.Errorf("following credential changes in storage: %w", err)
		}
	}
	a.Auth.start(ctx, a.httpClient, a.logger)
	if a.Auth.Anonymous != "" {
		a.logger.Warn("ANONYMOUS CALLERS ENABLED: requests from loopback addresses without a bearer token act as this user and may use every service without a session; never use this on a shared gateway",
			zap.String("user", a.Auth.Anonymous))
	}
	for _, hook := range a.startHooks {
		hook()
	}
	if err := a.mcpSessions.Attach(a.mcpConfig); err != nil {
		return fmt.Errorf("following MCP session changes in storage: %w", err)
	}
	if a.StateSecret == "" {
		if _, ok := a.storage.(storecache.Notifier); ok {
			a.logger.Warn("no state_secret: MCP session ids are sealed with a key of this process only; replicas sharing the storage cannot continue each other's sessions, and a restart ends them. Give every replica the same state_secret")
		}
	}
	go a.housekeeping()
	a.startedNow()
	return nil
}

// OnMCPSessionEnd registers fn to end the upstream session of an MCP
// session that ended without its runner's DELETE: it expired, its
// toolgate session ended, or it was over (see EndUpstream). The proxy
// sends DELETE upstream where that hands nothing to an upstream that is
// not the session's, and no credential but the one the session was
// opened with. It runs in the background, never under a request.
func (a *App) OnMCPSessionEnd(fn func(EndedMCPSession)) { a.endMCP = fn }

// OnConnectionGone registers fn, called with the storage key of a
// caller's connection to a service (ConnectionKey) when it may be gone:
// deleted through this replica (the caller disconnected, or the provider
// refused the grant), or changed through another (with a storage that
// announces changes; GrantFor with fresh tells whether it is gone), or
// with "" when any may be gone (the listening connection to the storage
// was lost, and changes announced meanwhile with it). What
// holds a caller's credential itself — a program per user that got it in
// its environment — lets go of it then, not at its idle timeout. fn must
// return quickly (it runs on the storage's listener goroutine). Register
// it while provisioning; services without per-user credentials have no
// connections to lose.
func (a *App) OnConnectionGone(fn func(key string)) {
	if a.connections != nil {
		a.connections.onGone(fn)
	}
}

// endingConcurrency bounds the upstream DELETEs of ended sessions in
// flight at once.
const endingConcurrency = 16

var endingSlots = make(chan struct{}, endingConcurrency)

// EndUpstream ends, in the background, the upstream session of e, an MCP
// session ended without its runner's DELETE (see OnMCPSessionEnd).
func (a *App) EndUpstream(e EndedMCPSession) {
	if a.endMCP == nil {
		return
	}
	go func() {
		endingSlots <- struct{}{}
		defer func() { <-endingSlots }()
		a.endMCP(e)
	}()
}

// OnStart registers fn to run when the app starts, after every module is
// provisioned: the place for a guest part's network I/O and background
// work, which Provision must not start (`caddy validate` runs Provision).
func (a *App) OnStart(fn func()) { a.startHooks = append(a.startHooks, fn) }

// OnStop registers fn to run when the app stops: after a newer config
// started, or when Caddy abandons this config's load because another app
// failed to start (then the config before it goes on running, and what
// an OnStart hook made process-wide must be given back to it).
func (a *App) OnStop(fn func()) { a.stopHooks = append(a.stopHooks, fn) }

// housekeeping expires idle MCP sessions and sweeps expired sessions and
// unfinished OAuth sign-ins from storage until the app stops.
func (a *App) housekeeping() {
	mcpTick := time.NewTicker(time.Duration(a.MCPSessionSweepInterval))
	sweepTick := time.NewTicker(15 * time.Minute)
	orphanTick := time.NewTicker(SessionCheckEvery)
	defer mcpTick.Stop()
	defer sweepTick.Stop()
	defer orphanTick.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-orphanTick.C:
			a.mcpSessions.EndOrphans(context.Background(), a.sessions.Ended)
		case <-mcpTick.C:
			a.mcpSessions.Housekeep(context.Background())
		case <-sweepTick.C:
			n, err := a.sessions.sweep(context.Background())
			if err != nil {
				a.logger.Warn("sweeping expired sessions", zap.Error(err))
			} else if n > 0 {
				a.logger.Debug("removed expired sessions", zap.Int("count", n))
			}
			n, err = a.sweepPending(context.Background())
			if err != nil {
				a.logger.Warn("sweeping expired oauth sign-ins", zap.Error(err))
			} else if n > 0 {
				a.logger.Debug("removed expired oauth sign-ins", zap.Int("count", n))
			}
		}
	}
}

// Stop stops background work.
func (a *App) Stop() error {
	a.stopOnce.Do(func() { close(a.stop) })
	a.stoppedNow()
	for i := len(a.stopHooks) - 1; i >= 0; i-- {
		a.stopHooks[i]()
	}
	if caddy.Exiting() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a.mcpSessions.Leaving(ctx)
		cancel()
	}
	a.mcpSessions.Detach(a.mcpConfig)
	a.sessions.stop()
	if a.connections != nil {
		a.connections.stop()
	}
	return nil
}

// Cleanup releases state shared across config reloads.
func (a *App) Cleanup() error {
	if a.starting != nil {
		a.starting.end(false) // unloaded before Start: requests waiting for it are refused
	}
	for _, release := range a.releasePools {
		release()
	}
	if a.Auth != nil {
		for _, j := range a.Auth.JWT {
			j.cleanup()
		}
	}
	return nil
}

// Registry returns the service registry.
func (a *App) Registry() *Registry { return a.registry }

// Cipher is the cipher that seals what the gateway stores; nil when none
// is configured.
func (a *App) Cipher() Cipher { return a.cipher }

// Storage is the storage every record of the gateway lives in.
func (a *App) Storage() certmagic.Storage { return a.storage }

// Done is closed when the app stops: background work of handlers ends then.
func (a *App) Done() <-chan struct{} { return a.stop }

// Sessions returns the toolgate session store.
func (a *App) Sessions() *SessionStore { return a.sessions }

// Connections returns the credential store, nil when no cipher is configured.
func (a *App) Connections() *ConnectionStore { return a.connections }

// MCPSessions returns the runners' MCP sessions.
func (a *App) MCPSessions() *MCPSessions { return a.mcpSessions }

// HTTPClient is the client for upstreams and providers: it never follows
// redirects, so no response can send a credential to another host.
func (a *App) HTTPClient() *http.Client { return a.httpClient }

// Authenticate identifies the caller of r.
func (a *App) Authenticate(r *http.Request) (*Caller, error) {
	return a.Auth.Authenticate(r.Context(), r, isLoopback(r.RemoteAddr))
}

// AuthenticateEndpoint identifies the caller of r, a request to an MCP
// endpoint. Besides the audiences of its issuer, a JWT may name the
// endpoint itself (public_url plus the request's path, such as
// https://gateway.example.com/v1/mcp/tracker) as its audience: what an
// MCP client that follows the MCP authorization spec asks the
// authorization server for (the resource parameter of RFC 8707, from the
// endpoint's protected-resource metadata). Without public_url no such
// audience is accepted: the request's Host header would choose it.
func (a *App) AuthenticateEndpoint(r *http.Request) (*Caller, error) {
	return a.authenticateEndpoint(r, false)
}

// authenticateEndpoint is AuthenticateEndpoint; with underway, for a
// request whose call or stream is under way since an earlier
// configuration authenticated it (see AuthConfig.authenticate).
func (a *App) authenticateEndpoint(r *http.Request, underway bool) (*Caller, error) {
	resource := ""
	if a.PublicURL != "" {
		resource = a.PublicURL + strings.TrimSuffix(r.URL.EscapedPath(), "/")
	}
	return a.Auth.authenticate(r.Context(), r, isLoopback(r.RemoteAddr), resource, underway)
}

// AnonymousSession returns the implicit session of an anonymous caller: every
// service, for as long as the request lasts (its expiry, session_ttl from
// now, bounds the MCP sessions initialized in it).
func (a *App) AnonymousSession(caller *Caller) *Session {
	ids := make([]string, 0, len(a.Services))
	for _, s := range a.Services {
		if s.AllowsUser(caller.User) {
			ids = append(ids, s.ID)
		}
	}
	t := now()
	return &Session{ID: anonymousSessionID, User: caller.User, Services: ids, CreatedAt: t, ExpiresAt: t.Add(time.Duration(a.SessionTTL))}
}

// SessionHeaderName is the header runners send their session id in.
func (a *App) SessionHeaderName() string { return a.SessionHeader }

// CheckOrigin is the gateway's DNS-rebinding protection. It reports
// whether a request's Origin header, when present, is allowed (public_url's
// origin, or without public_url the request's own: OwnOrigin; or
// allowed_origins), and whether a request that arrived on a loopback
// address names a loopback host or public_url's host — a browser tricked
// into sending a request to a local gateway names another host.
func (a *App) CheckOrigin(r *http.Request) bool {
	if origin := r.Header.Get("Origin"); origin != "" {
		if _, ok := a.origins[origin]; !ok && !a.OwnOrigin(r, origin) {
			return false
		}
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if local == nil || !isLoopback(local.String()) {
		return true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || host == a.publicHost {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// OwnOrigin reports whether origin is the gateway's own for r: public_url's
// origin (as browsers spell it), or without public_url the request's Host
// under https when it is a name — one TLS vouches for, which a page
// rebinding another name to the gateway cannot present, even where a proxy
// in front terminates it — and when it is an IP address or localhost,
// which no DNS answer rebinds, under the connection's own scheme. A plain-http gateway reached by a name needs public_url (or
// allowed_origins) for browsers to post to it.
func (a *App) OwnOrigin(r *http.Request, origin string) bool {
	if a.PublicURL != "" {
		return origin == a.publicOrigin // as browsers send it: lower case
	}
	scheme, host, ok := strings.Cut(origin, "://")
	if !ok || host == "" || !strings.EqualFold(host, r.Host) {
		return false
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.Trim(name, "[]")
	// An address or localhost: no certificate vouches for it, and a page
	// of it on another port (https's 443 against http's 80, both
	// unwritten) is another origin: the scheme must be the connection's.
	address := strings.EqualFold(name, "localhost") || net.ParseIP(name) != nil
	switch scheme {
	case "https":
		return !address || r.TLS != nil
	case "http":
		return address && r.TLS == nil
	}
	return false
}

// browserOrigin is u's origin as browsers send it in Origin: lower-case
// scheme and host, without the scheme's default port.
func browserOrigin(u *url.URL) string {
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if scheme == "https" && port == "443" || scheme == "http" && port == "80" {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host
}

// Keyring returns the keys that seal or sign what toolgate keeps or hands
// out for purpose: derived from state_secret (the previous ones open what
// they sealed), or, without one, keys of this process, the same across
// reloads — what they sealed opens on no other replica, and not after a
// restart.
func (a *App) Keyring(purpose string) (*seal.Keyring, error) {
	if a.StateSecret == "" {
		r, _ := processKeyrings.LoadOrStore(purpose, seal.Random(purpose))
		return r.(*seal.Keyring), nil
	}
	secrets := [][]byte{[]byte(a.StateSecret)}
	for _, p := range a.PreviousStateSecrets {
		secrets = append(secrets, []byte(p))
	}
	return seal.New(purpose, secrets...)
}

// processKeyrings are the keyrings of this process, by purpose (Keyring).
var processKeyrings sync.Map

// BaseURL is PublicURL, or the URL the request arrived at.
func (a *App) BaseURL(r *http.Request) string {
	if a.PublicURL != "" {
		return a.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// ResourceMetadataURL is the RFC 9728 metadata URL for WWW-Authenticate.
func (a *App) ResourceMetadataURL(r *http.Request) string {
	return a.BaseURL(r) + "/.well-known/oauth-protected-resource"
}

// NeedsSignIn is the error data telling a runner where its user connects
// svc, for the caller of the call r carries. See [App.NeedsSignInFor].
func (a *App) NeedsSignIn(r *http.Request, svc *Service) map[string]any {
	user := ""
	if c := CallFrom(r); c != nil && c.Caller != nil {
		user = c.Caller.User
	}
	return a.NeedsSignInFor(r, svc, user)
}

// NeedsSignInFor is the error data telling a runner where user connects
// svc: connect_url (see [App.ConnectURL]), to open in a browser; when no
// console serves the gateway, a bearer service's connect_url is the API
// endpoint a personal token is PUT to (connect_method PUT). Building it
// stores nothing.
func (a *App) NeedsSignInFor(r *http.Request, svc *Service, user string) map[string]any {
	data := map[string]any{"needs_sign_in": true, "service": svc.ID, "connect_url": a.ConnectURL(r, svc, user)}
	if !a.console {
		data["connect_method"] = "PUT"
	}
	return data
}

// ConnectHint is where and how to connect, as the message of a
// needs_sign_in error says it (data is NeedsSignInFor's): many clients show
// a JSON-RPC error's message only, not its data.
func ConnectHint(data map[string]any) string {
	u, _ := data["connect_url"].(string)
	if data["connect_method"] == "PUT" {
		return "(PUT your token to " + u + ")"
	}
	return "at " + u
}

// ConnectURL is where user connects svc: the console's connect page, which
// a browser signed in to toolgate as user opens (a browser signed in as
// someone else is refused, and one not signed in is asked to sign in
// first). Without a console it is the API endpoint a bearer service's
// personal token is PUT to.
func (a *App) ConnectURL(r *http.Request, svc *Service, user string) string {
	if !a.console {
		return a.BaseURL(r) + "/v1/connections/" + url.PathEscape(svc.ID)
	}
	u := a.BaseURL(r) + ConsolePath + "connect/" + url.PathEscape(svc.ID)
	if user != "" {
		u += "?" + url.Values{"for": {user}}.Encode()
	}
	return u
}

// ConsolePath is where toolgate_console serves its pages.
const ConsolePath = "/console/"

// RegisterConsole records that toolgate_console serves this gateway's
// pages, so that connect URLs point at it. Handlers call it in Provision.
func (a *App) RegisterConsole() { a.console = true }

// RegisterAPI records that toolgate_api serves this gateway's API, with the
// OAuth callback providers send people back to. Handlers call it in
// Provision.
func (a *App) RegisterAPI() { a.api = true }

// Logger returns the app's logger.
func (a *App) Logger() *zap.Logger { return a.logger }

func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
