package mcpproxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/eventstream"
	"github.com/toolgate/toolgate/modules/gateway"
)

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
// the result hooks of the request it belongs to.
//
// A stream that may be resumed is kept in the MCP session, holding its
// request (and that request's body room), until it is forgotten: when its
// answer reached the runner, at its call's deadline, when newer streams
// push it out of its session's few, or when its session ends. A call whose
// stream is forgotten unanswered is cancelled upstream: nobody can have
// its answer any more.
type runnerStream struct {
	session  *gateway.MCPSession
	token    string
	call     *gateway.Call // the runner's request, or its GET for the standalone stream
	deadline time.Time     // zero for the standalone stream
	// up is the upstream session whose stream it relays (under mu): its
	// event ids are that session's, and a session toolgate replaced since
	// (the upstream forgot it) has nothing left to resume.
	up gateway.Upstream
	// cancelCall tells the upstream to stop the call (nil for the
	// standalone stream).
	cancelCall func(why string)
	// sent is the call's record of the upstream session it went to
	// (mcpsession.Session.SentIn), which the stream keeps until it is
	// forgotten: the runner may cancel the call of a stream it dropped.
	sent gateway.SentRequest

	mu     sync.Mutex
	out    *sseWriter
	primed bool
	seq    uint64
	floor  uint64             // the last event of an upstream session replaced since (continuesIn)
	ids    []string           // upstream event ids, by seq % resumeWindow; made at the first
	owner  context.CancelFunc // stops the relay writing the stream now
	active chan struct{}      // closed when that relay ends
	// settled: the answer was written, nothing to resume; evicted: newer
	// streams pushed it out of its session; replaced: its upstream session
	// was replaced; forgotten: see forget.
	settled, evicted, replaced, forgotten bool
	// takeovers counts the resumes that stopped the relay writing the
	// stream (takeOver); ownerSince is what it was when that relay took
	// the stream over: a relay stopped for a resume ends quietly
	// (stoppedForResume).
	takeovers, ownerSince uint64
	// room is the room of the runner's request body while the stream is
	// kept after its request ended: a kept stream keeps the request, so a
	// runner dropping streams one after another stays within the bounds on
	// request bytes in flight.
	room *gateway.RequestBytes
	// expiry forgets the stream at its call's deadline; unwatch stops
	// forgetting it when its session ends.
	expiry  *time.Timer
	unwatch func() bool
}

// newRunnerStream starts numbering the events of out, the SSE stream of the
// runner's call (nil when the runner gets a JSON answer: nothing to
// number), relayed from a stream of the upstream session up. stop stops
// the relay that writes it; cancelCall (nil for the standalone stream)
// tells the upstream to stop the call.
func newRunnerStream(call *gateway.Call, up gateway.Upstream, deadline time.Time, out *sseWriter, stop context.CancelFunc, cancelCall func(why string)) *runnerStream {
	if out == nil {
		return nil
	}
	return &runnerStream{session: call.MCPSession, token: gateway.NewID()[:16], call: call, up: up, deadline: deadline,
		cancelCall: cancelCall, out: out, owner: stop, active: make(chan struct{})}
}

// maxUpstreamEventID bounds the upstream event ids a stream remembers
// (resumeWindow of them): an event with a longer id is relayed without an
// id of toolgate's, so it is not one to resume from.
const maxUpstreamEventID = 256

// id returns the id of the event that carries the upstream event with the
// id upstreamID, or "" when there is none.
func (s *runnerStream) id(upstreamID string) string {
	if s == nil || upstreamID == "" || len(upstreamID) > maxUpstreamEventID {
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
		s.keep()
	}
	return s.token + "." + strconv.FormatUint(seq, 10)
}

// keep puts the stream in its session for the runner to resume, and
// forgets it when the session ends.
func (s *runnerStream) keep() {
	if !s.session.KeepStream(s.token, s) {
		s.mu.Lock()
		s.forgotten = true // the session ended: nothing resumes the stream
		s.mu.Unlock()
		return
	}
	unwatch := context.AfterFunc(s.session.Context(), func() { s.forget("") })
	s.mu.Lock()
	s.unwatch = unwatch
	s.mu.Unlock()
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
	if seq <= s.floor {
		return "", true // an event of an upstream session replaced since (continuesIn)
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
	return s.resumableLocked()
}

// resumableLocked is resumable with s.mu held.
func (s *runnerStream) resumableLocked() bool {
	return s.seq > 0 && !s.settled && !s.evicted && !s.replaced && !s.forgotten && s.beforeDeadline()
}

// beforeDeadline reports whether the call's deadline is still ahead (always
// for the standalone stream). s.mu is held.
func (s *runnerStream) beforeDeadline() bool {
	return s.deadline.IsZero() || time.Now().Before(s.deadline)
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

// relaying reports whether a relay writes the stream now. s.mu is held.
func (s *runnerStream) relaying() bool {
	select {
	case <-s.active:
		return false
	default:
		return true
	}
}

// ownsSent makes the stream keep the call's record (see sent).
func (s *runnerStream) ownsSent(sent gateway.SentRequest) {
	if s != nil {
		s.sent = sent
	}
}

// upstreamIs reports whether the stream relays a stream of the upstream
// session up (of its generation).
func (s *runnerStream) upstreamIs(up gateway.Upstream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up.Generation == up.Generation
}

// continuesIn makes the standalone stream one of the upstream session up,
// which replaced the one it relayed: the event ids it relayed so far are
// the old session's, and a resume from one of them opens the stream anew.
func (s *runnerStream) continuesIn(up gateway.Upstream) {
	s.mu.Lock()
	s.up, s.floor = up, s.seq
	s.mu.Unlock()
}

// upstreamReplaced ends the resume that took the stream over (takeOver) and
// forgets the stream: its upstream session was replaced, so there is
// nothing to resume, and its call, that session's, is cancelled there.
func (s *runnerStream) upstreamReplaced() {
	s.mu.Lock()
	s.replaced = true
	s.mu.Unlock()
	s.release("its upstream session was replaced")
}

// release ends the relay writing the stream. A stream that cannot be
// resumed is forgotten, the upstream told to stop its unanswered call for
// the reason why unless why is "" (the relay told it already); one that
// can is kept, with its request's body room, until its call's deadline at
// the latest, and may push older dropped ones out of its session.
func (s *runnerStream) release(why string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	resumable := s.resumableLocked()
	var pushedOut []any
	if resumable {
		if !s.deadline.IsZero() {
			if s.room == nil {
				s.room = s.call.Room.Handover()
			}
			if s.expiry == nil {
				s.expiry = time.AfterFunc(time.Until(s.deadline)+time.Millisecond, s.expire)
			}
		}
		// Recorded dropped before the relay is seen to end: a resume
		// waiting for that (takeOver) records the stream written again
		// only after, so a stream being resumed never counts among the
		// dropped ones that newer streams push out.
		pushedOut = s.session.StreamDropped(s.token)
	}
	if s.relaying() { // never closed twice (takeOver replaces it only once it is closed)
		close(s.active)
	}
	s.mu.Unlock()
	if !resumable {
		s.forget(why)
		return
	}
	for _, v := range pushedOut {
		if old, ok := v.(*runnerStream); ok {
			old.evict()
		}
	}
}

// expire forgets the stream at its call's deadline, unless a relay still
// writes it (which ends at the deadline too, and answers the runner).
func (s *runnerStream) expire() {
	s.mu.Lock()
	relaying := s.relaying()
	s.mu.Unlock()
	if !relaying {
		s.forget("the client did not resume its stream before the call's deadline")
	}
}

// evict marks the stream pushed out of its session by newer ones: nothing
// can resume it any more. One no relay writes is forgotten now.
func (s *runnerStream) evict() {
	s.mu.Lock()
	s.evicted = true
	relaying := s.relaying()
	s.mu.Unlock()
	if !relaying {
		s.forget("the client dropped the stream, and too many newer ones of its session were kept for it to resume this one")
	}
}

// forget drops the stream from its MCP session and gives back the room it
// held for its request. When why is not "" and the call was not answered,
// the upstream is told to stop it, for that reason. Only the first call
// does anything.
func (s *runnerStream) forget(why string) {
	s.mu.Lock()
	if s.forgotten {
		s.mu.Unlock()
		return
	}
	s.forgotten = true
	room, settled, expiry, unwatch := s.room, s.settled, s.expiry, s.unwatch
	s.mu.Unlock()
	s.session.ForgetStream(s.token)
	s.session.RequestDone(s.sent)
	room.Release()
	if expiry != nil {
		expiry.Stop()
	}
	if unwatch != nil {
		unwatch()
	}
	if why != "" && !settled && s.cancelCall != nil {
		s.cancelCall(why)
	}
}

// takeOver stops the relay still writing the stream, if any, and makes out
// the stream's writer. When several resumes race, the last one to ask gets
// the stream: each stops the one before it. It fails when ctx ends first,
// with errNothingToResume once the call's deadline passed, and with
// errEvicted when newer dropped streams pushed the stream out of its
// session after the resume found it (its call was cancelled). (A stream
// whose answer was written meanwhile is resumed all the same: the runner
// that resumes did not get it.)
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
		case !s.beforeDeadline():
			s.mu.Unlock()
			return errNothingToResume
		case s.evicted:
			// (Forgotten because its answer was written meanwhile, it is
			// resumed all the same: see above.)
			s.mu.Unlock()
			return errEvicted
		}
		s.out, s.owner, s.active, s.primed = out, stop, make(chan struct{}), true
		s.ownerSince = s.takeovers
		s.session.StreamResumed(s.token) // under s.mu: ordered with release's StreamDropped
		s.mu.Unlock()
		return nil
	}
}

// stoppedForResume reports whether a resume stopped the relay writing the
// stream, before the call's deadline: the call goes on there.
func (s *runnerStream) stoppedForResume() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.takeovers != s.ownerSince && s.beforeDeadline()
}

// errNothingToResume: a resumed stream's call's deadline passed while the
// resume waited for it.
var errNothingToResume = errors.New("nothing to resume")

// errEvicted: a resumed stream was pushed out of its session while the
// resume waited for it.
var errEvicted = errors.New("the stream was pushed out of its session")

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
		refuseResume(w, "Last-Event-ID names no stream this MCP session can resume")
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
	defer h.app.WhileAuthorized(r, call, cancel)() // a reload may take away what let it open
	out := newSSEWriter(w)
	if err := st.takeOver(ctx, out, cancel); err != nil {
		if errors.Is(err, errEvicted) {
			refuseResume(w, "Last-Event-ID names no stream this MCP session can resume")
			return
		}
		if errors.Is(err, errNothingToResume) || errors.Is(err, context.DeadlineExceeded) {
			refuseResume(w, "the request this Last-Event-ID belongs to reached its deadline")
			return
		}
		h.answerError(w, r, call, unavailable("the stream is still in use; retry"))
		return
	}
	up := ms.Upstream()
	if !st.upstreamIs(up) {
		// The upstream forgot the session the stream belongs to, and
		// toolgate replaced it: the stream's events were that session's.
		if st.call.IsRequest() {
			// And so was its request.
			st.upstreamReplaced()
			refuseResume(w, lostWithItsSession)
			return
		}
		// The standalone stream goes on as the new session's: what the
		// old one sent since is gone with it.
		st.continuesIn(up)
		upstreamID = ""
	}
	orig := *st.call
	orig.Credential = call.Credential // the current one: an OAuth token may have been refreshed
	resp, err := h.getStream(ctx, &orig, up, upstreamID)
	if isKind(err, kindSessionGone) {
		// The upstream forgot the session the stream belongs to (it
		// restarted, say, which is why the stream dropped).
		if orig.IsRequest() {
			st.upstreamReplaced()
			refuseResume(w, lostWithItsSession)
			return
		}
		if up, err = h.reinitialize(ctx, &orig, up); err == nil {
			st.continuesIn(up)
			upstreamID = ""
			resp, err = h.getStream(ctx, &orig, up, "")
		}
	}
	if err == nil && !isSSE(resp.Header) {
		resp.Body.Close()
		err = unavailable("the upstream did not resume its stream")
	}
	if err != nil {
		if st.stoppedForResume() {
			st.release("")
			refuseResume(w, "another request resumed this stream")
			return
		}
		// Resumed no more, past its deadline or pushed out meanwhile, the
		// call is given up.
		st.release("toolgate could not resume the upstream's stream")
		h.answerError(w, r, call, err)
		return
	}
	sse := eventstream.NewReader(resp.Body, h.maxMessage)
	sse.StartAfter(upstreamID)
	rs := &response{h: h, ctx: ctx, call: &orig, up: up, resp: resp, sse: sse, sent: []*gateway.Credential{st.call.Credential}}
	defer rs.close()
	out.start(nil)
	if !orig.IsRequest() {
		// The standalone stream: toolgate's own notifications to the
		// runner go on it, as on a new one.
		defer h.notices.Attach(ms.ID, func(msg []byte) error { return out.send("", msg) })()
	}
	h.relay(r.Context(), w, &orig, rs, out, st)
}

// lostWithItsSession refuses the resume of a request's stream whose
// upstream session is gone.
const lostWithItsSession = "the upstream session this stream belonged to was replaced (the upstream forgot it): the request's answer is lost; send it again"

// getStream opens an upstream stream with a GET: the standalone stream,
// or with lastEventID the one it resumes. While the upstream answers 409
// it is asked again, for about a second in all: it still holds the
// stream's previous connection, which toolgate closed a moment ago (the
// relay a resume took over, or the relay of a runner's stream that the
// runner reset before it opened another), and lets the stream go as soon
// as it notices.
func (h *Handler) getStream(ctx context.Context, call *gateway.Call, up gateway.Upstream, lastEventID string) (*http.Response, error) {
	resp, err := h.exchange(ctx, call, up, http.MethodGet, nil, lastEventID)
	for try := 1; try < conflictTries && upstreamStatus(err) == http.StatusConflict; try++ {
		select {
		case <-time.After(time.Duration(try) * 10 * time.Millisecond):
		case <-ctx.Done():
		}
		resp, err = h.exchange(ctx, call, up, http.MethodGet, nil, lastEventID)
	}
	return resp, err
}

// conflictTries is how often a stream is asked for while the upstream
// answers 409.
const conflictTries = 12

// upstreamStatus is the HTTP status of the upstream's answer err reports,
// or 0.
func upstreamStatus(err error) int {
	var ue *upstreamError
	if errors.As(err, &ue) {
		return ue.status
	}
	return 0
}

// refuseResume answers a Last-Event-ID that resumes nothing: 400, not 404
// (a 404 would tell the runner its session is gone).
func refuseResume(w http.ResponseWriter, why string) {
	gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest, why, nil)
}
