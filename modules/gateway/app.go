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
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/mcpsession"
	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/seal"
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

// RegisterConsole records that toolgate_console serves this gateway's
// pages, so that connect URLs point at it. Handlers call it in Provision.
func (a *App) RegisterConsole() { a.console = true }

// RegisterAPI records that toolgate_api serves this gateway's API, with the
// OAuth callback providers send people back to. Handlers call it in
// Provision.
func (a *App) RegisterAPI() { a.api = true }

// Logger returns the app's logger.
func (a *App) Logger() *zap.Logger { return a.logger }

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
