// Package sse is the upstream transport toolgate.upstreams.sse: it reaches
// MCP servers that still speak the HTTP+SSE transport of protocol revision
// 2024-11-05 — a GET stream whose first event, "endpoint", names where to
// POST messages, and whose later events carry the server's messages — and
// presents them to runners as Streamable HTTP servers, through mcpbridge.
//
// Each runner's MCP session gets a stream of its own, opened when the runner
// initializes and closed when its session ends, so the server sees one
// client per runner, as with Streamable HTTP. toolgate reads the stream
// itself (package eventstream), as the stdio transport reads a program's
// lines: each message event's data goes to the bridge as the server wrote
// it, and one the bridge cannot relay still fails the call it names. Messages are POSTed only to
// the host the service's url names: an endpoint event that points anywhere
// else gets nothing, and certainly not the caller's credential.
package sse

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/internal/mcpbridge"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Transport{})
}

// Transport reaches a service's upstream over the 2024-11-05 HTTP+SSE
// transport; the service's url is the server's SSE endpoint (often …/sse).
// It has no options of its own: the service's url, allow_http, timeout,
// dial_timeout and auth apply as for Streamable HTTP.
//
//	service legacy {
//		url       https://legacy.example.com/sse
//		transport sse
//		tools     search
//	}
type Transport struct {
	key    string
	rt     *runtime
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  gateway.UpstreamsNamespace + ".sse",
		New: func() caddy.Module { return new(Transport) },
	}
}

// Provision sets up logging.
func (t *Transport) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	return nil
}

// UsesURL reports true: url is the server's SSE endpoint.
func (*Transport) UsesURL() bool { return true }

// Attach binds the transport to its service. Runner sessions and their
// streams outlive a config reload that keeps the service as it was.
func (t *Transport) Attach(app *gateway.App, svc *gateway.Service) error {
	header := "Authorization"
	if svc.Auth.Kind == gateway.AuthHeader {
		header = svc.Auth.Header
	}
	u, err := url.Parse(svc.URL)
	if err != nil {
		return fmt.Errorf("url: %v", caddyopt.URLError(err))
	}
	cfg := config{Service: svc.ID, URL: svc.URL, Header: header, MaxMessage: app.MaxResponseBytes,
		Depth: app.MaxJSONDepth, Values: app.MaxResponseValues, DialTimeout: time.Duration(svc.DialTimeout), Timeout: time.Duration(svc.Timeout)}
	t.key = fmt.Sprintf("sse/%+v", cfg)
	v, _, err := runtimes.LoadOrNew(t.key, func() (caddy.Destructor, error) {
		rt := &runtime{cfg: cfg, origin: gateway.CanonicalOrigin(u), base: app.HTTPClient().Transport}
		rt.bridge = mcpbridge.New(mcpbridge.Config{Service: svc.ID, MaxMessage: cfg.MaxMessage,
			Limits: mcpmsg.Limits{MaxDepth: cfg.Depth, MaxValues: cfg.Values}, Logger: t.logger}, rt)
		return rt, nil
	})
	if err != nil {
		return err
	}
	t.rt = v.(*runtime)
	// The runtime outlives reloads: a config gives it its logger and idle
	// time when it starts (not when it is provisioned, perhaps to be
	// refused), and takes them back if its load is abandoned.
	app.OnStart(func() { app.OnStop(t.rt.bridge.Use(t.logger, time.Duration(app.MCPSessionIdleTimeout))) })
	if svc.PerUserCredentials() {
		// A session's stream and POSTs carry its caller's credential: when
		// they disconnect, it is let go of then, not at the session's idle
		// timeout.
		rt := t.rt
		app.OnConnectionGone(func(key string) { rt.connectionGone(app, svc, key) })
	}
	return nil
}

// RoundTrip answers toolgate_proxy's request (gateway.UpstreamTransport).
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.rt.bridge.RoundTrip(r)
}

// Cleanup releases the service's streams; they end unless the next config
// keeps the service unchanged.
func (t *Transport) Cleanup() error {
	if t.rt != nil {
		_, _ = runtimes.Delete(t.key)
	}
	return nil
}

var runtimes = caddy.NewUsagePool()

// config is what shapes a service's connections.
type config struct {
	Service, URL, Header string
	MaxMessage           int64
	Depth, Values        int
	DialTimeout, Timeout time.Duration
}

// runtime opens the service's sessions (mcpbridge.Opener).
type runtime struct {
	cfg    config
	origin string // scheme://host of url: the only place messages go
	base   http.RoundTripper
	bridge *mcpbridge.Bridge

	// Every stream open: Destruct closes those of sessions still opening
	// too, which the bridge does not hold yet (a reload does not wait for
	// the old config's requests).
	mu      sync.Mutex
	closed  bool
	streams map[*stream]tracked
}

// tracked is an open stream's caller, guard, and how to close it.
type tracked struct {
	user  string
	guard *guard
	close func()
}

// Destruct ends every session's stream (caddy.Destructor).
func (rt *runtime) Destruct() error {
	rt.mu.Lock()
	rt.closed = true
	streams := rt.streams
	rt.streams = nil
	rt.mu.Unlock()
	rt.bridge.Close()
	for _, tr := range streams {
		tr.close()
	}
	return nil
}

// track keeps st until untrack; false: the runtime was destructed.
func (rt *runtime) track(st *stream, tr tracked) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return false
	}
	if rt.streams == nil {
		rt.streams = map[*stream]tracked{}
	}
	rt.streams[st] = tr
	return true
}

// connectionGone closes the streams of the caller whose connection to svc
// key names (gateway.ConnectionKey; "" names every caller's), once storage
// confirms that it is gone, and forgets the credential they carried, so
// that nothing toolgate sends carries it any more. A stream that took
// another credential since (its caller connected again, and a request of
// theirs came in meanwhile) goes on; one whose caller's connection cannot
// be read goes on until their next request or the idle timeout.
func (rt *runtime) connectionGone(app *gateway.App, svc *gateway.Service, key string) {
	type held struct {
		tracked
		cred *string
	}
	var gone []held
	rt.mu.Lock()
	for _, tr := range rt.streams {
		if key == "" || gateway.ConnectionKey(svc.ID, tr.user) == key {
			gone = append(gone, held{tr, tr.guard.cred.Load()})
		}
	}
	rt.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	go func() {
		connected := map[string]bool{}
		for _, h := range gone {
			still, known := connected[h.user]
			if !known {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(svc.Timeout))
				grant, err := app.GrantFor(ctx, svc, h.user, true)
				cancel()
				still = err != nil || grant != ""
				connected[h.user] = still
			}
			if !still && h.cred != nil && h.guard.cred.CompareAndSwap(h.cred, new(string)) {
				h.close()
			}
		}
	}()
}

func (rt *runtime) untrack(st *stream) {
	rt.mu.Lock()
	delete(rt.streams, st)
	rt.mu.Unlock()
}

// Down reports nil: a new stream can always be tried.
func (*runtime) Down(*http.Request) error { return nil }

// Open opens a stream for a runner's session and relays its initialize.
func (rt *runtime) Open(r *http.Request, init mcpmsg.Message) (*mcpbridge.Session, []byte, error) {
	sseURL, err := url.Parse(rt.cfg.URL) // Attach checked it
	if err != nil {
		return nil, nil, &mcpbridge.Unavailable{Reason: "the service's url does not parse"}
	}
	g := &guard{base: rt.base, origin: rt.origin, header: rt.cfg.Header, dial: rt.cfg.DialTimeout}
	g.setCredential(r)
	client := &http.Client{Transport: g, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	// The stream lives as long as the session; opening it, as long as the
	// runner's initialize may take.
	streamCtx, endStream := context.WithCancel(context.Background())
	stopWaiting := context.AfterFunc(r.Context(), endStream)
	st, err := openStream(streamCtx, client, sseURL, rt.cfg.MaxMessage)
	if !stopWaiting() || err != nil {
		endStream()
		if st != nil {
			st.close()
			st.events.Release()
		}
		if down, ok := errors.AsType[*mcpbridge.Unavailable](err); ok {
			return nil, nil, down
		}
		return nil, nil, g.failure("opening the server's SSE stream", err)
	}
	st.service, st.logger = rt.cfg.Service, rt.bridge.Logger
	var once sync.Once
	closeStream := func() { once.Do(func() { st.close(); endStream() }) }
	if !rt.track(st, tracked{user: gateway.UpstreamUser(r.Context()), guard: g, close: closeStream}) {
		closeStream()
		st.events.Release()
		return nil, nil, &mcpbridge.Unavailable{Reason: "toolgate stopped the service " + rt.cfg.Service}
	}
	link := rt.bridge.NewLink(mcpbridge.LinkConfig{OnRequest: g.setCredential, Release: closeStream, MayLog: st.mayLog,
		Send: func(ctx context.Context, msg []byte) error {
			if err := st.send(ctx, msg); err != nil {
				return g.failure("posting a message to the server", err)
			}
			return nil
		}})
	go func() {
		defer rt.untrack(st)
		st.read(link, &mcpbridge.Unavailable{Reason: "the SSE stream of service " + rt.cfg.Service + " ended"})
	}()
	s, answer, err := link.Open(r.Context(), gateway.UpstreamUser(r.Context()), init)
	if err != nil || s == nil {
		closeStream()
	}
	var down *mcpbridge.Unavailable
	var status *mcpbridge.StatusError
	if err != nil && !errors.As(err, &down) && !errors.As(err, &status) {
		err = g.failure("initializing", err)
	}
	return s, answer, err
}

// guard is the HTTP client transport of one session's stream and POSTs: it
// sends only to the service's origin, attaches the caller's current
// credential, and remembers the last refusal.
type guard struct {
	base   http.RoundTripper
	origin string
	header string
	dial   time.Duration
	cred   atomic.Pointer[string]
	status atomic.Int32 // the last 4xx/5xx status
	other  atomic.Bool  // a request for another host was refused
}

// setCredential takes the caller's credential from a toolgate_proxy
// request, so that a refreshed token is used from then on.
func (g *guard) setCredential(r *http.Request) bool {
	v := r.Header.Get(g.header)
	g.cred.Store(&v)
	return true
}

func (g *guard) RoundTrip(req *http.Request) (*http.Response, error) {
	// The origin as gateway.CanonicalOrigin writes it (the service's url
	// is kept so): an endpoint the server names absolutely, in the spelling
	// the service's url had, is still its own — and is sent in the
	// service's spelling, since Go's proxy settings tell "LOCALHOST" from
	// "localhost" (only the latter is never proxied).
	if gateway.CanonicalOrigin(req.URL) != g.origin {
		g.other.Store(true)
		return nil, errOtherHost
	}
	req = req.Clone(gateway.WithDialTimeout(req.Context(), g.dial))
	req.URL.Scheme, req.URL.Host, _ = strings.Cut(g.origin, "://")
	req.Host = ""
	req.Header.Set("User-Agent", "toolgate")
	if v := g.cred.Load(); v != nil && *v != "" {
		req.Header.Set(g.header, *v)
	}
	resp, err := g.base.RoundTrip(req)
	if err == nil && resp.StatusCode >= 400 {
		g.status.Store(int32(resp.StatusCode))
	}
	return resp, err
}

var errOtherHost = errors.New("the server named a message endpoint on another host; toolgate sends messages only to the host of the service's url")

// failure turns what went wrong into what the bridge answers: a refused
// credential as the upstream's status (toolgate_proxy then asks the user
// to connect again), anything else as unavailable.
func (g *guard) failure(doing string, err error) error {
	switch s := int(g.status.Swap(0)); {
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return &mcpbridge.StatusError{Status: s, Reason: "the server refused the credential"}
	case g.other.Swap(false):
		return &mcpbridge.Unavailable{Reason: errOtherHost.Error()}
	case s != 0:
		return &mcpbridge.Unavailable{Reason: fmt.Sprintf("%s failed: the server answered HTTP %d", doing, s)}
	case err != nil && errors.Is(err, context.DeadlineExceeded):
		return &mcpbridge.Unavailable{Reason: doing + " timed out"}
	}
	return &mcpbridge.Unavailable{Reason: doing + " failed: the server is unreachable"}
}

// Interface guards
var (
	_ caddy.Provisioner         = (*Transport)(nil)
	_ caddy.CleanerUpper        = (*Transport)(nil)
	_ gateway.UpstreamTransport = (*Transport)(nil)
	_ mcpbridge.Opener          = (*runtime)(nil)
)
