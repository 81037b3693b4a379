package mcpbridge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// LinkConfig says how a Link reaches its server.
type LinkConfig struct {
	// Send writes one JSON-RPC message (one line of JSON) to the server.
	// It may block until ctx ends; it is never called with the link's
	// lock held.
	Send func(ctx context.Context, msg []byte) error

	// Owned marks a connection toolgate initialized itself (Initialize),
	// which several runners' sessions share: a runner's initialize and
	// notifications/initialized stay with toolgate, and so do roots, which
	// toolgate does not offer such a server (what a program may touch is
	// its operator's choice, not a runner's).
	Owned bool

	// Release, when set, is called once after the last session on the
	// link ended: a connection made for one session is closed then.
	Release func()

	// OnRequest, when set, sees each of toolgate_proxy's requests for the
	// link's sessions before anything is sent: to pick up the caller's
	// current credential, or to refuse a request whose credential is not
	// the one the link was made with (false: the session is treated as
	// gone, and toolgate_proxy initializes a new one).
	OnRequest func(r *http.Request) bool

	// MayLog, when set, says whether one more thing the server sent may be
	// logged: a malformed message, or a request toolgate refused to relay
	// (the transport's budget for what a server puts in the log; it is
	// called from the goroutine that calls Receive). Unset: each one is.
	MayLog func() bool
}

// Link is one JSON-RPC connection to an MCP server and the runners' MCP
// sessions that use it. The connection's reader hands each message it
// reads to Receive, and calls Close when the connection ends.
type Link struct {
	bridge *Bridge
	cfg    LinkConfig
	done   chan struct{}
	// tag names the link's server requests to runners (relayedID).
	tag string

	mu             sync.Mutex
	err            error // why the link ended; nil while it is up
	retired        bool  // takes no new requests (see Retire)
	onIdle         func()
	seq            uint64
	pending        map[string]*pending // requests sent on the link, by the link's id
	tokens         map[string]*pending // by the link's progress token
	serverRequests map[string]*serverRequest
	sessions       map[*Session]struct{}
	served         map[string]struct{} // every user who had a session on the link (routeLocked)
	ownSends       chan struct{}       // bounds sendLater
	droppedOwn     atomic.Int64        // what sendLater dropped
	subscriptions  map[string]int      // resource URI → sessions subscribed
	initResult     []byte
	lastUsed       time.Time
}

// pending is a request sent on the link.
type pending struct {
	session  *Session // nil for toolgate's own requests
	runnerID []byte   // the runner's id (JSON text)
	token    []byte   // the runner's progress token, nil when none
	linkID   []byte
	key      string              // mcpmsg.IDKey of linkID
	out      *stream             // where its messages go; nil for toolgate's own
	reply    chan mcpmsg.Message // toolgate's own requests: gets the response
	seq      uint64              // the order requests were sent in
	onResult func(ok bool)       // called with the outcome, under the link's lock
	subURI   string              // the URI of a resources/subscribe, "" for other requests
	started  time.Time
	answered bool // its answer (or the link's end) went to out, under the link's lock
}

// serverRequest is a server→client request relayed to a runner, kept by
// the key of the id it was relayed under (relayedID).
type serverRequest struct {
	session *Session
	out     *stream
	id      []byte // the server's own id
}

// Session is one runner's MCP session on a link.
type Session struct {
	ID   string // the Mcp-Session-Id toolgate_proxy knows it by
	User string
	link *Link
	caps capabilities

	// Guarded by the link's lock.
	requests      map[string]*pending // by the runner's id
	get           *stream             // the standalone GET stream
	getSeq        uint64
	subscriptions map[string]bool
	closed        bool
	retiring      string // why it ends once its requests are answered (see retire)

	lastUsed atomic.Int64 // unix nanoseconds of the last request, stream or message of its runner
}

// used marks the session used now.
func (s *Session) used() { s.lastUsed.Store(now().UnixNano()) }

// busy reports whether the session has a request in progress or a stream
// open.
func (s *Session) busy() bool {
	s.link.mu.Lock()
	defer s.link.mu.Unlock()
	return len(s.requests) > 0 || s.get != nil
}

// capabilities are what a runner declared it can do for a server.
type capabilities struct {
	sampling, elicitationForm, elicitationURL, roots bool
}

func readCapabilities(params []byte) capabilities {
	c := gjson.GetBytes(params, "capabilities")
	el := c.Get("elicitation")
	form := el.Get("form").Exists() || el.IsObject() && !el.Get("url").Exists()
	return capabilities{
		sampling:        c.Get("sampling").IsObject(),
		elicitationForm: el.IsObject() && form,
		elicitationURL:  el.Get("url").IsObject(),
		roots:           c.Get("roots").IsObject(),
	}
}

// allows reports whether the runner declared what a server→client request
// of method needs.
func (c capabilities) allows(method string, params []byte) bool {
	switch method {
	case "sampling/createMessage":
		return c.sampling
	case "elicitation/create":
		if gjson.GetBytes(params, "mode").String() == "url" {
			return c.elicitationURL
		}
		return c.elicitationForm
	case "roots/list":
		return c.roots
	}
	return true
}

// NewLink starts a link over a connection.
func (b *Bridge) NewLink(cfg LinkConfig) *Link {
	return &Link{bridge: b, cfg: cfg, done: make(chan struct{}), tag: b.nonce + "." + strconv.FormatUint(b.links.Add(1), 36), ownSends: make(chan struct{}, maxOwnSends),
		pending: map[string]*pending{}, tokens: map[string]*pending{}, serverRequests: map[string]*serverRequest{},
		sessions: map[*Session]struct{}{}, served: map[string]struct{}{}, subscriptions: map[string]int{}, lastUsed: now()}
}

// Done is closed when the link ended.
func (l *Link) Done() <-chan struct{} { return l.done }

// Err is why the link ended, or nil.
func (l *Link) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// InitializeResult is the server's answer to toolgate's initialize on an
// owned link (see Initialize).
func (l *Link) InitializeResult() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.initResult
}

// Busy reports whether a runner request is in progress on the link or a
// runner holds a stream open on it, and when it was last used.
func (l *Link) Busy() (busy bool, lastUsed time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.pending {
		if p.session != nil {
			return true, l.lastUsed
		}
	}
	for s := range l.sessions {
		if s.get != nil {
			return true, l.lastUsed
		}
	}
	return false, l.lastUsed
}

// Retire stops the link taking new requests: its sessions are answered as
// gone, so toolgate_proxy re-creates them elsewhere. idle is called once
// no request of a runner is in progress on it any more (at once when none
// is).
func (l *Link) Retire(idle func()) {
	l.mu.Lock()
	l.retired = true
	busy := false
	for _, p := range l.pending {
		busy = busy || p.session != nil
	}
	if busy {
		l.onIdle = idle
		idle = nil
	}
	l.mu.Unlock()
	if idle != nil {
		idle()
	}
}

// Initialize sends toolgate's own initialize on an owned link, offering
// params, then notifications/initialized, and keeps the server's answer
// for the runners' sessions. The result's protocolVersion is what
// Initialize returns.
func (l *Link) Initialize(ctx context.Context, params []byte) (string, error) {
	msg, err := l.call(ctx, "initialize", params)
	if err != nil {
		return "", err
	}
	if msg.Result == nil {
		// Its code only: the server's words may quote a credential it was
		// started with (an API key it calls invalid), and this reason is
		// logged and shown to every runner of the service.
		return "", fmt.Errorf("the server refused to initialize (%s); its own log may say why", errorCode(msg.Error))
	}
	result, version := presentedResult(msg.Result)
	if version == "" {
		return "", errors.New("the server's initialize result has no protocolVersion")
	}
	if err := l.cfg.Send(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil {
		return "", err
	}
	l.mu.Lock()
	l.initResult = result
	l.mu.Unlock()
	return version, nil
}

// presentedResult is an initialize result as runners get it: a server of
// the 2024-11-05 revision is presented as 2025-03-26, whose messages are a
// superset of its own (the revisions differ in transport, batching, which
// toolgate does not relay, and additions only).
func presentedResult(result []byte) ([]byte, string) {
	version := gjson.GetBytes(result, "protocolVersion")
	if version.Type != gjson.String {
		return result, ""
	}
	if version.Str == "2024-11-05" {
		return mcpmsg.ReplaceMember(result, "protocolVersion", mcpmsg.Quote("2025-03-26")), "2025-03-26"
	}
	return result, version.Str
}

// call sends a request of toolgate's own and waits for its response.
func (l *Link) call(ctx context.Context, method string, params []byte) (mcpmsg.Message, error) {
	p := &pending{reply: make(chan mcpmsg.Message, 1)}
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return mcpmsg.Message{}, err
	}
	body := l.registerLocked(p, method, params)
	l.mu.Unlock()
	if err := l.cfg.Send(ctx, body); err != nil {
		l.forget(p)
		return mcpmsg.Message{}, err
	}
	select {
	case msg, ok := <-p.reply:
		if !ok {
			return mcpmsg.Message{}, l.Err()
		}
		return msg, nil
	case <-ctx.Done():
		l.forget(p)
		return mcpmsg.Message{}, fmt.Errorf("no answer to %s: %w", method, ctx.Err())
	}
}

// registerLocked gives p the link's next id and returns the request to
// send.
func (l *Link) registerLocked(p *pending, method string, params []byte) []byte {
	l.seq++
	p.seq = l.seq
	p.linkID = strconv.AppendUint(nil, l.seq, 10)
	p.key = mcpmsg.IDKey(p.linkID)
	p.started = now()
	l.pending[p.key] = p
	body := make([]byte, 0, 64+len(method)+len(params))
	body = append(body, `{"jsonrpc":"2.0","id":`...)
	body = append(body, p.linkID...)
	body = append(body, `,"method":`...)
	body = mcpmsg.AppendQuote(body, method)
	if params != nil {
		body = append(body, `,"params":`...)
		body = append(body, params...)
	}
	return append(body, '}')
}

// forget drops a request nobody waits for any more; a late answer to it is
// dropped.
func (l *Link) forget(p *pending) {
	l.mu.Lock()
	l.dropLocked(p)
	idle := l.idleLocked()
	l.mu.Unlock()
	if idle != nil {
		idle()
	}
}

func (l *Link) dropLocked(p *pending) {
	if l.pending[p.key] != p {
		return
	}
	delete(l.pending, p.key)
	if p.token != nil {
		delete(l.tokens, p.key)
	}
	if s := p.session; s != nil && s.requests[mcpmsg.IDKey(p.runnerID)] == p {
		delete(s.requests, mcpmsg.IDKey(p.runnerID))
		if s.retiring != "" && len(s.requests) == 0 {
			go s.end(s.retiring) // it takes the lock held here
		}
	}
}

// abandonGrace is how long a call whose runner stopped waiting still
// counts as its user's call in progress (see abandon).
const abandonGrace = time.Minute

// abandon handles a request whose runner stopped waiting for its answer
// (its stream went away): the server is told to cancel it, and until it
// answers, or abandonGrace passes, the call still counts as its user's
// call in progress, so that a request the server sends about it (sampling,
// elicitation) is not taken for another user's call.
func (l *Link) abandon(p *pending) {
	l.mu.Lock()
	if l.pending[p.key] != p {
		l.mu.Unlock()
		return
	}
	if p.session != nil && p.session.requests[mcpmsg.IDKey(p.runnerID)] == p {
		delete(p.session.requests, mcpmsg.IDKey(p.runnerID)) // the runner may use the id again
	}
	l.mu.Unlock()
	l.sendLater(cancelled(p.linkID, "the client stopped waiting for the answer"))
	time.AfterFunc(abandonGrace, func() { l.forget(p) })
}

// idleLocked returns the function Retire left to call, once no runner
// request is in progress.
func (l *Link) idleLocked() func() {
	if l.onIdle == nil {
		return nil
	}
	for _, p := range l.pending {
		if p.session != nil {
			return nil
		}
	}
	f := l.onIdle
	l.onIdle = nil
	return f
}

// Close ends the link: the connection is gone, for the reason err says
// (safe to show runners). Requests in progress get an error saying so,
// and are never sent again: they may have run. Streams end, and the
// link's sessions are gone, so that toolgate_proxy re-creates them.
func (l *Link) Close(err error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	if err == nil {
		err = errors.New("the connection to the server ended")
	}
	l.err = err
	close(l.done)
	pendings := l.pending
	l.pending, l.tokens, l.serverRequests = map[string]*pending{}, map[string]*pending{}, map[string]*serverRequest{}
	for _, p := range pendings {
		p.answered = true
	}
	sessions := l.sessions
	l.sessions = map[*Session]struct{}{}
	idle := l.onIdle
	l.onIdle = nil
	for s := range sessions {
		s.closed = true
		if s.get != nil {
			s.get.finish()
			s.get = nil
		}
		s.requests = nil
	}
	l.mu.Unlock()
	for _, p := range pendings {
		if p.reply != nil {
			close(p.reply)
			continue
		}
		if p.out != nil {
			p.out.push(gateway.RPCError(p.runnerID, gateway.CodeUnavailable,
				err.Error()+" while the request was in progress; toolgate does not send it again, so it may or may not have run",
				gateway.Retryable))
			p.out.finish()
		}
	}
	for s := range sessions {
		l.bridge.forgetSession(s)
	}
	if idle != nil {
		idle()
	}
}

// sendLater sends a message of toolgate's own (an answer to a ping, a
// refusal, a cancellation) without holding up the connection's reader. At
// most maxOwnSends are on their way at once: a server that floods pings
// while it stalls the answers gets the rest dropped, not one connection
// and goroutine of toolgate's each.
func (l *Link) sendLater(msg []byte) {
	select {
	case l.ownSends <- struct{}{}:
	default:
		if l.droppedOwn.Add(1) == 1 {
			l.bridge.log().Warn("the server is sent toolgate's own messages slower than it asks for them; dropping those past the limit",
				zap.String("service", l.bridge.service), zap.Int("limit", maxOwnSends))
		}
		return
	}
	go func() {
		defer func() { <-l.ownSends }()
		ctx, cancel := context.WithTimeout(context.Background(), answerTimeout)
		defer cancel()
		_ = l.cfg.Send(ctx, msg)
	}()
}

// maxServerRequests bounds the server's requests a link keeps waiting for
// their runners' answers (a runner that reads its stream and never answers
// would otherwise have them kept until its session ends).
const maxServerRequests = 256

// maxOwnSends bounds the messages of toolgate's own on their way to a
// server at once (see sendLater).
const maxOwnSends = 8

// answerTimeout bounds sending a message of toolgate's own.
const answerTimeout = 10 * time.Second

// errorCode names the code of a JSON-RPC error object.
func errorCode(errObj []byte) string {
	if c := gjson.GetBytes(errObj, "code"); c.Type == gjson.Number && c.Num == float64(int64(c.Num)) {
		return "JSON-RPC error " + strconv.FormatInt(int64(c.Num), 10)
	}
	return "an error without a code"
}
