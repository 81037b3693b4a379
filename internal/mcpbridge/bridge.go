// Package mcpbridge lets toolgate_proxy reach MCP servers that do not
// speak Streamable HTTP — a program toolgate runs, speaking over its stdin
// and stdout, or a server of the 2024-11-05 HTTP+SSE transport — without
// the proxy knowing: a Bridge is the http.RoundTripper of such a service,
// and answers the proxy's Streamable HTTP requests as a Streamable HTTP
// server would, over a JSON-RPC connection of the other kind (a Link).
//
// A link may carry the MCP sessions of several runners: a program speaks
// one MCP session over its stdin and stdout, and toolgate shares it. The
// bridge keeps the sessions apart. Each request gets an id and a progress
// token of the link's own, and the runner's are restored on the way back,
// so answers and progress reach the request they belong to; what the server
// sends naming no request (a server→client request, a log message) goes to
// a runner only while its person is the only one connected to the server,
// and a request only to a runner that declared the capability it needs;
// and a request that may have reached the server is never sent twice —
// when the connection ends under it, its runner is told so with a
// retryable error.
package mcpbridge

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// An Opener makes the server side of new MCP sessions for a Bridge.
type Opener interface {
	// Open starts the MCP session a runner's initialize asks for: on a
	// connection toolgate shares (an owned Link it initialized already),
	// or on a new one, forwarding init. r is toolgate_proxy's request: its
	// context names the caller (gateway.UpstreamUser), its header carries
	// the caller's credential. It returns the session and the initialize
	// response to give the runner; an error is an *Unavailable, a
	// *StatusError or a failure to reach the server.
	Open(r *http.Request, init mcpmsg.Message) (*Session, []byte, error)

	// Down reports why a session whose connection ended cannot be made
	// again now (an *Unavailable), or nil when it can: the bridge then
	// answers 404, and toolgate_proxy initializes a new session.
	Down(r *http.Request) error
}

// Unavailable is a server toolgate cannot reach now: runners get a
// retryable JSON-RPC error with Reason, which is safe to show them.
type Unavailable struct{ Reason string }

func (e *Unavailable) Error() string { return e.Reason }

// StatusError is an HTTP status the bridge answers toolgate_proxy with, as
// an upstream would (401 when the server refused the caller's credential).
type StatusError struct {
	Status int
	Reason string
}

func (e *StatusError) Error() string { return e.Reason }

// errSessionGone is a session whose link ended or was retired.
var errSessionGone = errors.New("the MCP session is gone")

// Bridge answers toolgate_proxy's requests for one service. It lives as
// long as the links and sessions it holds, across config reloads.
type Bridge struct {
	opener   Opener
	service  string
	limits   mcpmsg.Limits
	maxBody  int64
	maxQueue int64
	logger   atomic.Pointer[zap.Logger]
	// nonce and links name each link's server requests apart (Link.tag):
	// nonce is random, so that no two bridges — of two replicas, which
	// share the MCP sessions whose answers come back, or one a reload made
	// anew — name theirs alike; links counts the links made.
	nonce string
	links atomic.Uint64

	mu       sync.Mutex
	sessions map[string]*Session
	// winding holds, by id, sessions that were winding down (their
	// runner's credential changed: see RoundTrip) when toolgate_proxy
	// initialized their MCP session again under the same name: until they
	// end, they take what their calls in progress wait for (ownerOf).
	winding map[string][]*Session

	idle      atomic.Int64 // nanoseconds; 0: sessions do not expire here
	sweeping  sync.Once
	stopSweep chan struct{}
	closeOnce sync.Once
}

// Config sets a Bridge up.
type Config struct {
	Service    string        // the service id, for logs
	MaxMessage int64         // bound of one message in either direction
	Limits     mcpmsg.Limits // how deeply messages may nest
	Logger     *zap.Logger
}

// New returns a bridge whose sessions opener makes.
func New(cfg Config, opener Opener) *Bridge {
	b := &Bridge{opener: opener, service: cfg.Service, nonce: gateway.NewID()[:12], limits: cfg.Limits, maxBody: cfg.MaxMessage,
		maxQueue: max(2*cfg.MaxMessage, 4<<20), sessions: map[string]*Session{}, winding: map[string][]*Session{}, stopSweep: make(chan struct{})}
	b.SetLogger(cfg.Logger)
	return b
}

// SetLogger replaces the logger (a reloaded config's).
func (b *Bridge) SetLogger(l *zap.Logger) {
	if l == nil {
		l = zap.NewNop()
	}
	b.logger.Store(l)
}

func (b *Bridge) log() *zap.Logger { return b.logger.Load() }

// Logger is the logger the bridge logs with now (its config's, see Use).
func (b *Bridge) Logger() *zap.Logger { return b.log() }

// Use makes l and idle (see SetIdle) the bridge's, for a config that
// starts, and returns what gives the bridge back the ones it had — unless
// a newer config's were set since — for when Caddy abandons that config's
// load after it started.
func (b *Bridge) Use(l *zap.Logger, idle time.Duration) (restore func()) {
	if l == nil {
		l = zap.NewNop()
	}
	prevLogger, prevIdle := b.logger.Swap(l), b.idle.Load()
	b.SetIdle(idle)
	return func() {
		if b.logger.CompareAndSwap(l, prevLogger) {
			b.idle.CompareAndSwap(int64(idle), prevIdle)
		}
	}
}

// now is the clock; tests replace it.
var now = time.Now

// Sessions returns how many runner sessions the bridge holds.
func (b *Bridge) Sessions() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sessions)
}

// SetIdle ends sessions unused (no request, no stream) for d, checked
// about every d/4: those whose MCP session ended on another replica, or
// moved to one, which nobody here would end. The MCP session's idle
// timeout ends the rest first.
func (b *Bridge) SetIdle(d time.Duration) {
	b.idle.Store(int64(d))
	if d <= 0 {
		return
	}
	b.sweeping.Do(func() { go b.sweepLoop() })
}

func (b *Bridge) sweepLoop() {
	for {
		every := min(max(time.Duration(b.idle.Load())/4, time.Second), time.Minute)
		select {
		case <-b.stopSweep:
			return
		case <-time.After(every):
			b.sweepIdle()
		}
	}
}

// sweepIdle ends the sessions unused for the idle time.
func (b *Bridge) sweepIdle() {
	idle := time.Duration(b.idle.Load())
	if idle <= 0 {
		return
	}
	cutoff := now().Add(-idle).UnixNano()
	var old []*Session
	b.mu.Lock()
	for _, s := range b.sessions {
		if s.lastUsed.Load() < cutoff {
			old = append(old, s)
		}
	}
	b.pruneWindingLocked("")
	b.mu.Unlock()
	for _, s := range old {
		if !s.busy() && s.lastUsed.Load() < cutoff {
			b.forgetSession(s)
			s.end("unused for " + idle.String())
		}
	}
}

// Close ends every session the bridge holds.
func (b *Bridge) Close() {
	b.closeOnce.Do(func() { close(b.stopSweep) })
	b.mu.Lock()
	sessions := make([]*Session, 0, len(b.sessions))
	for _, s := range b.sessions {
		sessions = append(sessions, s)
	}
	for _, ws := range b.winding {
		sessions = append(sessions, ws...)
	}
	clear(b.sessions)
	clear(b.winding)
	b.mu.Unlock()
	for _, s := range sessions {
		s.end("toolgate stopped")
	}
}

func (b *Bridge) forgetSession(s *Session) {
	b.mu.Lock()
	if b.sessions[s.ID] == s {
		delete(b.sessions, s.ID)
	}
	b.mu.Unlock()
}

// RoundTrip answers one of toolgate_proxy's Streamable HTTP requests.
func (b *Bridge) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		defer r.Body.Close()
	}
	user := gateway.UpstreamUser(r.Context())
	var s *Session
	if id := r.Header.Get("Mcp-Session-Id"); id != "" {
		b.mu.Lock()
		s = b.sessions[id]
		b.mu.Unlock()
		if s == nil || s.User != user {
			return b.gone(r, nil)
		}
		s.used()
	}
	if s != nil && s.link.cfg.OnRequest != nil && !s.link.cfg.OnRequest(r) {
		// The runner's next requests go to a session of a process holding
		// the new credential. This one ends once its calls in progress are
		// answered (the old process stops once they are); until then it
		// takes what those calls wait for — the runner's answers to their
		// requests, and cancellations — and refuses the rest as gone.
		s.retire("the caller's credential changed")
		if r.Method != http.MethodPost {
			if r.Method == http.MethodDelete || !s.winding() { // a GET opening the stream again keeps it
				b.forgetSession(s)
			}
			return b.gone(r, nil)
		}
	}
	switch r.Method {
	case http.MethodPost:
	case http.MethodGet:
		if s == nil {
			return statusResponse(r, http.StatusBadRequest), nil
		}
		return b.answered(r, nil, nil)(s.openStream(r))
	case http.MethodDelete:
		if s != nil {
			b.forgetSession(s)
			s.end("the client ended its session")
		}
		return statusResponse(r, http.StatusNoContent), nil
	default:
		return statusResponse(r, http.StatusMethodNotAllowed), nil
	}
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, b.maxBody+1)); err != nil {
			return nil, err
		}
	}
	if int64(len(body)) > b.maxBody {
		return statusResponse(r, http.StatusRequestEntityTooLarge), nil
	}
	msg, err := mcpmsg.Parse(body, b.limits)
	if err != nil {
		return rpcResponse(r, http.StatusBadRequest, gateway.RPCError(nil, gateway.CodeParseError, err.Error(), nil), nil), nil
	}
	if s == nil {
		if msg.Kind != mcpmsg.Request || msg.Method != "initialize" {
			return rpcResponse(r, http.StatusBadRequest, gateway.RPCError(msg.ID, gateway.CodeInvalidRequest,
				"missing Mcp-Session-Id: initialize first", nil), nil), nil
		}
		return b.open(r, msg)
	}
	switch msg.Kind {
	case mcpmsg.Request:
		return b.answered(r, s, &msg)(s.request(r, msg))
	case mcpmsg.Notification:
		o := b.ownerOf(s, msg)
		return b.answered(r, o, nil)(o.notify(r, msg))
	default:
		o := b.ownerOf(s, msg)
		return b.answered(r, o, nil)(o.answer(r, msg))
	}
}

// ownerOf is the session a runner's answer or cancellation on s is for:
// s, or a session of the same MCP session winding down beside it (see
// winding) that has the server request it answers, or the request it
// cancels.
func (b *Bridge) ownerOf(s *Session, msg mcpmsg.Message) *Session {
	if s.awaits(msg) {
		return s
	}
	b.mu.Lock()
	ws := slices.Clone(b.winding[s.ID])
	b.mu.Unlock()
	for _, w := range ws {
		if w.User == s.User && w.awaits(msg) {
			return w
		}
	}
	return s
}

// pruneWindingLocked forgets the winding sessions that ended, of id (""
// for every id).
func (b *Bridge) pruneWindingLocked(id string) {
	for key, ws := range b.winding {
		if id != "" && key != id {
			continue
		}
		ws = slices.DeleteFunc(ws, (*Session).ended)
		if len(ws) == 0 {
			delete(b.winding, key)
		} else {
			b.winding[key] = ws
		}
	}
}

// answered turns a session's outcome into the proxy's answer: a session
// that turned out gone is answered as gone, and a connection that failed
// to take the message as unavailable.
func (b *Bridge) answered(r *http.Request, s *Session, msg *mcpmsg.Message) func(*http.Response, error) (*http.Response, error) {
	return func(resp *http.Response, err error) (*http.Response, error) {
		switch {
		case err == nil:
			return resp, nil
		case errors.Is(err, errSessionGone):
			if s != nil && !s.winding() { // a winding session is still reachable for answers
				b.forgetSession(s)
			}
			return b.gone(r, msg)
		case r.Context().Err() != nil:
			return nil, err
		}
		var status *StatusError
		if errors.As(err, &status) {
			return statusResponse(r, status.Status), nil
		}
		b.log().Warn("sending to the server failed", zap.String("service", b.service), zap.Error(err))
		reason := "toolgate could not send the message to the server of service " + b.service
		var down *Unavailable
		if errors.As(err, &down) {
			reason = down.Reason
		}
		if msg != nil {
			return rpcResponse(r, http.StatusOK, gateway.RPCError(msg.ID, gateway.CodeUnavailable,
				reason+"; it may not have reached the server", gateway.Retryable), nil), nil
		}
		return statusResponse(r, http.StatusServiceUnavailable), nil
	}
}

// gone answers a request of a session that no longer exists: 404, so that
// toolgate_proxy initializes a new one, unless no new one can be made now
// — then a request gets a retryable error saying why.
func (b *Bridge) gone(r *http.Request, msg *mcpmsg.Message) (*http.Response, error) {
	var down *Unavailable
	if err := b.opener.Down(r); errors.As(err, &down) {
		if msg == nil && r.Method == http.MethodPost && r.Body != nil {
			if body, rerr := io.ReadAll(io.LimitReader(r.Body, b.maxBody+1)); rerr == nil {
				if m, perr := mcpmsg.Parse(body, b.limits); perr == nil && m.Kind == mcpmsg.Request {
					msg = &m
				}
			}
		}
		if msg != nil {
			return rpcResponse(r, http.StatusOK, gateway.RPCError(msg.ID, gateway.CodeUnavailable,
				down.Reason+"; the request did not reach it", gateway.Retryable), nil), nil
		}
		return statusResponse(r, http.StatusServiceUnavailable), nil
	}
	return statusResponse(r, http.StatusNotFound), nil
}

// open starts a session for a runner's initialize.
func (b *Bridge) open(r *http.Request, msg mcpmsg.Message) (*http.Response, error) {
	s, answer, err := b.opener.Open(r, msg)
	var down *Unavailable
	var status *StatusError
	switch {
	case errors.As(err, &down):
		return rpcResponse(r, http.StatusOK, gateway.RPCError(msg.ID, gateway.CodeUnavailable, down.Reason, gateway.Retryable), nil), nil
	case errors.As(err, &status):
		return statusResponse(r, status.Status), nil
	case err != nil:
		return nil, err
	case s == nil: // the server refused: its answer says why
		return rpcResponse(r, http.StatusOK, answer, nil), nil
	}
	b.mu.Lock()
	old := b.sessions[s.ID] // the same MCP session's, initialized again here
	b.sessions[s.ID] = s
	b.mu.Unlock()
	switch {
	case old == nil || old == s:
	case old.winding(): // its calls in progress still finish
		b.mu.Lock()
		b.pruneWindingLocked(old.ID)
		b.winding[old.ID] = append(b.winding[old.ID], old)
		b.mu.Unlock()
	default:
		old.end("the client initialized its session again")
	}
	return rpcResponse(r, http.StatusOK, answer, http.Header{"Mcp-Session-Id": {s.ID}}), nil
}

func rpcResponse(r *http.Request, status int, body []byte, header http.Header) *http.Response {
	if header == nil {
		header = http.Header{}
	}
	header.Set("Content-Type", "application/json")
	return &http.Response{Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: header, Request: r,
		Body: io.NopCloser(strings.NewReader(string(body))), ContentLength: int64(len(body))}
}

func sseResponse(r *http.Request, out *stream) *http.Response {
	return &http.Response{Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"text/event-stream"}}, Request: r, Body: out, ContentLength: -1}
}

func statusResponse(r *http.Request, status int) *http.Response {
	return &http.Response{Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}, Request: r, Body: http.NoBody}
}

// Open starts a session with its runner's initialize on a link of its own (a connection
// made for one runner) and returns the session and the server's answer,
// with the runner's id; the session is nil when the server refused.
func (l *Link) Open(ctx context.Context, user string, init mcpmsg.Message) (*Session, []byte, error) {
	s := l.NewSession(ctx, user, init)
	if s == nil {
		return nil, nil, l.Err()
	}
	msg, err := l.call(ctx, "initialize", init.Params)
	if err != nil {
		s.end("initialize failed")
		return nil, nil, err
	}
	if msg.Result == nil {
		s.end("initialize refused")
		raw := msg.Raw
		if recoded, ok := gateway.OwnCodeRecoded(msg.Error); ok && msg.Error != nil {
			raw = mcpmsg.ReplaceMember(raw, "error", recoded) // the server's, not toolgate's
		}
		return nil, mcpmsg.ReplaceMember(raw, "id", init.ID), nil
	}
	result, _ := presentedResult(msg.Result)
	return s, gateway.RPCResult(init.ID, result), nil
}
