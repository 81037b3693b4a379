package mcpsession

import (
	"slices"
	"sync"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// The runner's requests in progress in a session: their progress tokens
// (an upstream's progress about anything else is about nothing the runner
// asked for), and where each went upstream (its cancellation goes there,
// whatever replaced that upstream session since).

// Requesting marks token, the progressToken of a runner's request, as that
// of a request in progress here until end is called (see Progressing).
func (s *Session) Requesting(token []byte) (end func()) {
	key := mcpmsg.IDKey(token)
	if key == "" {
		return func() {}
	}
	s.mu.Lock()
	if s.progress == nil {
		s.progress = make(map[string]int)
	}
	s.progress[key]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.progress[key]--; s.progress[key] <= 0 {
				delete(s.progress, key)
			}
			s.mu.Unlock()
		})
	}
}

// Sent is the record of one runner's request in progress here (SentIn);
// its zero value records nothing.
type Sent struct {
	key string // mcpmsg.IDKey of the request's id
	seq uint64 // tells apart requests of one id (a runner reusing an id)
}

// Recorded reports whether sent records a request.
func (sent Sent) Recorded() bool { return sent.key != "" }

// sentReq is the upstream session a runner's request in progress went to.
// cancelled: the runner cancelled it while it was on its way to the
// upstream session that replaced up (CancelGone); it is not sent there
// (SendingIn).
type sentReq struct {
	seq       uint64
	up        Upstream
	cancelled bool
}

// sentIn holds the runner's requests in progress here under one id: nearly
// always one (first). A runner reusing the id of a request in progress,
// which JSON-RPC forbids, adds more; each keeps its own record, so that
// one's answer or re-initialization does not move where another's
// cancellation goes.
type sentIn struct {
	first sentReq
	more  *[]sentReq // a pointer: the whole stays inside the map's slot (at most 128 bytes), with no allocation per request
}

// others are the requests of the id besides first.
func (e *sentIn) others() []sentReq {
	if e.more == nil {
		return nil
	}
	return *e.more
}

// setOthers makes o the requests of the id besides first.
func (e *sentIn) setOthers(o []sentReq) {
	if len(o) == 0 {
		e.more = nil
		return
	}
	e.more = &o
}

// find returns the request seq of e, nil when it is no longer there.
func (e *sentIn) find(seq uint64) *sentReq {
	if e.first.seq == seq {
		return &e.first
	}
	o := e.others()
	for i := range o {
		if o[i].seq == seq {
			return &o[i]
		}
	}
	return nil
}

// SentIn records that the runner's request id, in progress here until
// RequestDone is called with what it returns, went to the upstream
// session up: the runner's cancellation of it goes there (RequestsSentIn),
// whatever replaced that session since.
func (s *Session) SentIn(id []byte, up Upstream) Sent {
	key := mcpmsg.IDKey(id)
	if key == "" {
		return Sent{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sentIn == nil {
		s.sentIn = make(map[string]sentIn)
	}
	s.sentSeq++
	r := sentReq{seq: s.sentSeq, up: up}
	if e, ok := s.sentIn[key]; ok {
		e.setOthers(append(e.others(), r))
		s.sentIn[key] = e
	} else {
		s.sentIn[key] = sentIn{first: r}
	}
	return Sent{key: key, seq: r.seq}
}

// SendingIn records, just before it is sent, that the runner's request in
// progress here (what SentIn returned) goes to up (the upstream session it
// was recorded with, or the one toolgate re-created after that one forgot
// it unprocessed). It reports false when the runner cancelled the request
// meanwhile (CancelGone): it must not be sent. A request not recorded
// (SentIn) is sent.
func (s *Session) SendingIn(sent Sent, up Upstream) bool {
	if !sent.Recorded() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sentIn[sent.key]
	if !ok {
		return true
	}
	r := e.find(sent.seq)
	switch {
	case r == nil:
		return true
	case r.cancelled:
		return false
	}
	r.up = up
	s.sentIn[sent.key] = e
	return true
}

// CancelGone is the runner's cancellation of its request id, which found
// gone the upstream session gone the request was recorded in: gone runs
// nothing, and the request, unprocessed there, is re-sent into next, the
// session that replaced it (or is on its way there). A request of id still
// recorded in gone is marked cancelled and not sent (SendingIn) — the
// cancellation, sent first, would name a request next never heard of, and
// be overtaken. If a request of id went to another session since,
// CancelGone returns that session, where the cancellation goes; else it
// reports false, as when no request of id is in progress.
func (s *Session) CancelGone(id []byte, gone, next Upstream) (Upstream, bool) {
	key := mcpmsg.IDKey(id)
	if key == "" {
		return Upstream{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sentIn[key]
	if !ok {
		return Upstream{}, false
	}
	var elsewhere Upstream
	found := false
	cancel := func(r *sentReq) {
		switch {
		case r.up.Generation != gone.Generation:
			if !found {
				elsewhere, found = r.up, true
			}
		case gone.Generation < next.Generation:
			r.cancelled = true
		}
	}
	cancel(&e.first)
	o := e.others()
	for i := range o {
		cancel(&o[i])
	}
	s.sentIn[key] = e
	return elsewhere, found
}

// RequestDone ends a request SentIn recorded (sent is what it returned).
func (s *Session) RequestDone(sent Sent) {
	if !sent.Recorded() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sentIn[sent.key]
	switch {
	case !ok:
	case e.first.seq == sent.seq && len(e.others()) == 0:
		delete(s.sentIn, sent.key)
	case e.first.seq == sent.seq:
		o := e.others()
		e.first = o[0]
		e.setOthers(slices.Delete(o, 0, 1))
		s.sentIn[sent.key] = e
	default:
		e.setOthers(slices.DeleteFunc(e.others(), func(r sentReq) bool { return r.seq == sent.seq }))
		s.sentIn[sent.key] = e
	}
}

// RequestsSentIn returns the upstream sessions the runner's requests of
// id in progress here went to, without repeats: nearly always one, none
// when no request of id is in progress here.
func (s *Session) RequestsSentIn(id []byte) []Upstream {
	key := mcpmsg.IDKey(id)
	if key == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sentIn[key]
	if !ok {
		return nil
	}
	ups := []Upstream{e.first.up}
	for _, r := range e.others() {
		if !slices.ContainsFunc(ups, func(u Upstream) bool { return u.Generation == r.up.Generation }) {
			ups = append(ups, r.up)
		}
	}
	return ups
}

// Progressing reports whether token is the progressToken of a runner's
// request in progress here: an upstream's progress about any other token
// is about nothing the runner asked for.
func (s *Session) Progressing(token []byte) bool {
	key := mcpmsg.IDKey(token)
	s.mu.Lock()
	defer s.mu.Unlock()
	return key != "" && s.progress[key] > 0
}
