package mcpproxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

// stream relays the upstream's standalone SSE stream (server-initiated
// notifications and requests) to the runner's GET, or resumes a stream
// the runner lost when the GET carries Last-Event-ID.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	if !acceptsSSE(r) {
		gateway.WriteRPCError(w, http.StatusNotAcceptable, nil, gateway.CodeInvalidRequest,
			"GET opens an SSE stream: Accept must include text/event-stream", nil)
		return
	}
	if id := r.Header.Get("Last-Event-Id"); id != "" {
		h.resumeForRunner(w, r, call, id)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(call.MCPSession.Context(), cancel)()
	up, resp, err := h.openStream(ctx, call)
	if err != nil {
		var ue *upstreamError
		if errors.As(err, &ue) && ue.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", "POST, DELETE")
			gateway.WriteRPCError(w, http.StatusMethodNotAllowed, nil, gateway.CodeInvalidRequest,
				"this service offers no standalone SSE stream", nil)
			return
		}
		h.answerError(w, r, call, err)
		return
	}
	if !isSSE(resp.Header) {
		resp.Body.Close()
		h.answerError(w, r, call, unavailable("the upstream answered GET without an SSE stream"))
		return
	}
	rs := &response{h: h, ctx: ctx, call: call, up: up, resp: resp, sse: newSSEReader(resp.Body, h.maxMessage)}
	defer rs.close()
	out := newSSEWriter(w)
	out.start(nil)
	defer out.close() // a notice sent as the stream ends writes nothing
	// toolgate's own notifications to the runner (an approval decided)
	// go on this stream too.
	defer h.notices.Attach(call.MCPSession.ID, func(msg []byte) error { return out.send("", msg) })()
	h.relay(r.Context(), w, call, rs, out, newRunnerStream(call, time.Time{}, out, cancel))
}

// openStream opens the upstream's standalone stream, re-initializing the
// upstream session if it forgot it. Re-initializing, and waiting for the
// stream's response headers, are bounded by the service timeout; the
// stream itself only by ctx.
func (h *Handler) openStream(ctx context.Context, call *gateway.Call) (gateway.Upstream, *http.Response, error) {
	timeout := time.Duration(call.Service.Timeout)
	open := func(up gateway.Upstream) (*http.Response, error) {
		hctx, cancel := context.WithCancel(ctx)
		t := time.AfterFunc(timeout, cancel)
		resp, err := h.exchange(hctx, call, up, http.MethodGet, nil, "")
		if !t.Stop() {
			if err == nil {
				resp.Body.Close()
			}
			return nil, unavailable("the upstream did not open its stream in time")
		}
		if err != nil {
			cancel()
			return nil, err
		}
		resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel} // the body lives as long as the stream
		return resp, nil
	}
	up := call.MCPSession.Upstream()
	resp, err := open(up)
	if isKind(err, kindSessionGone) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		up, err = h.reinitialize(rctx, call, up)
		cancel()
		if err == nil {
			resp, err = open(up)
		}
	}
	return up, resp, err
}

// resumeWindow is how many of its latest event ids a runner stream can be
// resumed from.
const resumeWindow = 64

// runnerStream numbers the events toolgate writes on one SSE stream to a
// runner, so that a runner whose stream drops can resume it with GET and
// Last-Event-ID, as the Streamable HTTP transport allows. An event gets an
// id when the upstream event it carries had one: toolgate's id stands for
// the upstream's, and resuming resumes the upstream stream there. The ids
// are toolgate's own (a random token and a number), so a runner can only
// resume where toolgate let it, on its own session, and the answer passes
// the result hooks of the request it belongs to. A stream that may be
// resumed is kept in the MCP session until its request's deadline.
type runnerStream struct {
	session  *gateway.MCPSession
	token    string
	call     *gateway.Call // the runner's request, or its GET for the standalone stream
	deadline time.Time     // zero for the standalone stream

	mu      sync.Mutex
	out     *sseWriter
	primed  bool
	seq     uint64
	ids     []string           // upstream event ids, by seq % resumeWindow; made at the first
	owner   context.CancelFunc // stops the relay writing the stream now
	active  chan struct{}      // closed when that relay ends
	settled bool               // the answer was written: nothing to resume
	// takeovers counts the resumes that stopped the relay writing the
	// stream (takeOver), so that a relay can tell being stopped for a
	// resume from a failure (takenOver).
	takeovers uint64
	// room is the room of the runner's request body while the stream is
	// kept after its request ended: a kept stream keeps the request, so a
	// runner dropping streams one after another stays within the bounds on
	// request bytes in flight.
	room *gateway.RequestBytes
}

// newRunnerStream starts numbering the events of out, the SSE stream of the
// runner's call (nil when the runner gets a JSON answer: nothing to
// number). stop stops the relay that writes it.
func newRunnerStream(call *gateway.Call, deadline time.Time, out *sseWriter, stop context.CancelFunc) *runnerStream {
	if out == nil {
		return nil
	}
	return &runnerStream{session: call.MCPSession, token: gateway.NewID()[:16], call: call, deadline: deadline,
		out: out, owner: stop, active: make(chan struct{})}
}

// id returns the id of the event that carries the upstream event with the
// id upstreamID, or "" when there is none.
func (s *runnerStream) id(upstreamID string) string {
	if s == nil || upstreamID == "" {
		return ""
	}
	s.mu.Lock()
	s.seq++
	seq := s.seq
	if s.ids == nil {
		s.ids = make([]string, resumeWindow)
	}
	s.ids[seq%resumeWindow] = upstreamID
	s.mu.Unlock()
	if seq == 1 {
		s.session.KeepStream(s.token, s)
	}
	return s.token + "." + strconv.FormatUint(seq, 10)
}

// prime tells a runner of 2025-11-25 or later that the stream can be
// resumed before any message is written, when the upstream primed its own
// stream (SEP-1699).
func (s *runnerStream) prime(upstreamID string) {
	if s == nil || s.call.ProtocolVersion < "2025-11-25" {
		return
	}
	s.mu.Lock()
	if s.primed {
		s.mu.Unlock()
		return
	}
	s.primed = true
	out := s.out
	s.mu.Unlock()
	_ = out.prime(s.id(upstreamID))
}

// upstreamID returns the upstream event id that toolgate's event id seq
// stood for, if it is still in the window.
func (s *runnerStream) upstreamID(seq uint64) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq == 0 || seq > s.seq || s.seq-seq >= resumeWindow {
		return "", false
	}
	return s.ids[seq%resumeWindow], true
}

// resumable reports whether the runner could resume the stream.
func (s *runnerStream) resumable() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq > 0 && !s.settled && (s.deadline.IsZero() || time.Now().Before(s.deadline))
}

// finished records that the answer reached the runner.
func (s *runnerStream) finished() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.settled = true
	s.mu.Unlock()
}

// release ends the relay writing the stream. A stream that cannot be
// resumed is forgotten, and one that can is forgotten when its call's
// deadline passes, holding its request's body room until then (it holds
// the runner's request: kept on, streams the runner dropped would pin
// their requests until newer ones push them out, uncounted).
func (s *runnerStream) release() {
	if s == nil {
		return
	}
	resumable := s.resumable()
	s.mu.Lock()
	select {
	case <-s.active: // never closed twice (takeOver replaces it only once it is closed)
	default:
		close(s.active)
	}
	if resumable && !s.deadline.IsZero() && s.room == nil {
		s.room = s.call.Room.Handover()
	}
	s.mu.Unlock()
	switch {
	case !resumable:
		s.forget()
	case !s.deadline.IsZero():
		time.AfterFunc(time.Until(s.deadline)+time.Millisecond, func() {
			if !s.resumable() {
				s.forget()
			}
		})
	}
}

// forget drops the stream from its MCP session and gives back the room it
// held for its request.
func (s *runnerStream) forget() {
	s.session.ForgetStream(s.token)
	s.mu.Lock()
	room := s.room
	s.mu.Unlock()
	room.Release()
}

// takeOver stops the relay still writing the stream, if any, and makes out
// the stream's writer. When several resumes race, the last one to ask gets
// the stream: each stops the one before it. It fails when ctx ends first,
// and with errNothingToResume when the answer was written or the call's
// deadline passed meanwhile.
func (s *runnerStream) takeOver(ctx context.Context, out *sseWriter, stop context.CancelFunc) error {
	for {
		s.mu.Lock()
		owner, active := s.owner, s.active
		s.takeovers++
		s.mu.Unlock()
		owner()
		select {
		case <-active:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		switch {
		case s.active != active:
			// Another resume took the stream over meanwhile.
			s.mu.Unlock()
			continue
		case s.settled || (!s.deadline.IsZero() && !time.Now().Before(s.deadline)):
			s.mu.Unlock()
			return errNothingToResume
		}
		s.out, s.owner, s.active, s.primed = out, stop, make(chan struct{}), true
		s.mu.Unlock()
		return nil
	}
}

// takeoverCount returns how many resumes have taken the stream over so far
// (0 for no stream): a relay that started when it was n and ends with
// more was stopped for a resume.
func (s *runnerStream) takeoverCount() uint64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.takeovers
}

// errNothingToResume: a resumed stream's answer was written, or its
// call's deadline passed, while the resume waited for it.
var errNothingToResume = errors.New("nothing to resume")

// resumeForRunner continues a stream the runner lost, from the event id it
// last received: toolgate resumes the upstream's stream where that event
// came from and relays the rest as it relayed the beginning — the answer to
// the runner's request passes the same result hooks.
func (h *Handler) resumeForRunner(w http.ResponseWriter, r *http.Request, call *gateway.Call, lastEventID string) {
	ms := call.MCPSession
	token, seqText, _ := strings.Cut(lastEventID, ".")
	seq, _ := strconv.ParseUint(seqText, 10, 64)
	st, _ := ms.Stream(token).(*runnerStream)
	upstreamID, ok := "", false
	if st != nil {
		upstreamID, ok = st.upstreamID(seq)
	}
	if !ok || (!st.deadline.IsZero() && time.Now().After(st.deadline)) {
		refuseResume(w)
		return
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if st.deadline.IsZero() {
		ctx, cancel = context.WithCancel(r.Context())
	} else {
		ctx, cancel = context.WithDeadline(r.Context(), st.deadline)
	}
	defer cancel()
	defer context.AfterFunc(ms.Context(), cancel)()
	out := newSSEWriter(w)
	if err := st.takeOver(ctx, out, cancel); err != nil {
		if errors.Is(err, errNothingToResume) {
			refuseResume(w)
			return
		}
		h.answerError(w, r, call, unavailable("the stream is still in use; retry"))
		return
	}
	orig := *st.call
	orig.Credential = call.Credential // the current one: an OAuth token may have been refreshed
	up := ms.Upstream()
	resp, err := h.exchange(ctx, &orig, up, http.MethodGet, nil, upstreamID)
	if err == nil && !isSSE(resp.Header) {
		resp.Body.Close()
		err = unavailable("the upstream did not resume its stream")
	}
	if err != nil {
		st.release()
		h.answerError(w, r, call, err)
		return
	}
	sse := newSSEReader(resp.Body, h.maxMessage)
	sse.lastID, sse.idBuffer = upstreamID, upstreamID
	rs := &response{h: h, ctx: ctx, call: &orig, up: up, resp: resp, sse: sse}
	defer rs.close()
	out.start(nil)
	h.relay(r.Context(), w, &orig, rs, out, st)
}

// refuseResume answers a Last-Event-ID that resumes nothing: 400, not 404
// (a 404 would tell the runner its session is gone).
func refuseResume(w http.ResponseWriter) {
	gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
		"Last-Event-ID names no stream this MCP session can resume", nil)
}

// keepAlive writes a comment on out whenever it was silent for the
// service's sse_keepalive, until the returned function is called; after
// that, out writes nothing more. A timer does it, so no goroutine waits
// beside each stream.
func (h *Handler) keepAlive(out *sseWriter, svc *gateway.Service) (stop func()) {
	d := time.Duration(svc.SSEKeepAlive)
	if d <= 0 {
		return out.close
	}
	k := &keepAliveTimer{out: out, interval: d}
	k.mu.Lock()
	k.t = time.AfterFunc(d/2, k.fire)
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		k.t.Stop()
		k.mu.Unlock()
		out.close() // a fire already running writes nothing more
	}
}

// keepAliveTimer checks every half interval whether its stream needs a
// keep-alive comment.
type keepAliveTimer struct {
	out      *sseWriter
	interval time.Duration

	mu sync.Mutex
	t  *time.Timer
}

func (k *keepAliveTimer) fire() {
	if k.out.keepAlive(k.interval) != nil {
		return // the runner went away, or the stream is finished
	}
	k.mu.Lock()
	k.t.Reset(k.interval / 2)
	k.mu.Unlock()
}
