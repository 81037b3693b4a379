package mcpsession

import (
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// Attack: the record of where a runner's request went (SentIn) is one
// entry per id with a count, and the last SentIn/SendingIn of any request of
// that id overwrites the upstream session of every other. A request A
// (id 7) whose SSE stream the runner dropped is kept (runnerStream owns
// its record, upstream generation 1); the upstream session is replaced
// (generation 2); a second request B under id 7 (the runner, which never
// got A's answer, re-sends under the same id) records generation 2 and
// finishes. A's record now says generation 2, the current session: the
// runner's notifications/cancelled for A, which still runs in generation
// 1 (the winding stdio process of a bridged program), goes to the current
// session, where nothing of that id runs, and A runs on unstopped. The
// same happens without a second finish: B's SendingIn (a re-initialization
// on B's way) moves A's record too.
// Severity: low (the runner reused an id while one of it was in
// progress; only its own cancellation is misrouted, and only a bridged
// program's winding process keeps running a replaced session's call).
// Fixed: one record per request (SentIn returns a handle for it); a
// cancellation goes to every upstream session a request of that id is in
// progress in (RequestsSentIn), and SendingIn and RequestDone act on that
// request's record only.
func TestFix4AttackSentInRecordOverwrittenBySameIDRequest(t *testing.T) {
	s := &Session{}
	gen1 := Upstream{SessionID: "up", Generation: 1}
	gen2 := Upstream{SessionID: "up", Generation: 2}
	id := []byte(`7`)

	a := s.SentIn(id, gen1) // A: its dropped stream is kept, owning this key
	b := s.SentIn(id, gen2) // B: same id, in the session that replaced gen1
	s.RequestDone(b)        // B answered

	ups := s.RequestsSentIn(id)
	if len(ups) != 1 {
		t.Fatalf("A alone is in progress (its kept stream owns its record), yet the records say %+v", ups)
	}
	if ups[0].Generation != gen1.Generation {
		t.Errorf("A (still running in generation 1) is recorded as sent to generation %d: the runner's cancellation of it goes to the current session instead", ups[0].Generation)
	}
	s.RequestDone(a)
}

// Attack: same root cause through SendingIn: request B of id 7 re-initializes
// on its way (post) and SendingIn rewrites the record request A of id 7,
// still running in generation 1, shares with it.
// Severity: low. Fixed: as above (per-request records).
func TestFix4AttackSendingInMovesAnotherRequestsRecord(t *testing.T) {
	s := &Session{}
	gen1 := Upstream{SessionID: "up", Generation: 1}
	gen2 := Upstream{SessionID: "up", Generation: 2}
	id := []byte(`"x"`)

	a := s.SentIn(id, gen1) // A runs in generation 1
	b := s.SentIn(id, gen1) // B recorded before its post...
	s.SendingIn(b, gen2)    // ...which re-initialized: B went to generation 2
	s.RequestDone(b)        // B answered

	if ups := s.RequestsSentIn(id); len(ups) != 1 || ups[0].Generation != gen1.Generation {
		t.Errorf("A (in generation 1) is recorded as sent to %+v after B's SendingIn and answer", ups)
	}
	s.RequestDone(a)
	if ups := s.RequestsSentIn(id); len(ups) != 0 {
		t.Errorf("no request of the id is in progress, yet the records say %+v", ups)
	}
}

// While two requests of one id run in different upstream sessions, the
// runner's cancellation of the id reaches both; each one's answer ends
// only its own record.
func TestFix4RequestsOfOneIDInTwoSessionsAreBothCancelled(t *testing.T) {
	s := &Session{}
	gen1 := Upstream{SessionID: "up", Generation: 1}
	gen2 := Upstream{SessionID: "up", Generation: 2}
	id := []byte(`7`)

	a := s.SentIn(id, gen1)
	b := s.SentIn(id, gen2)
	c := s.SentIn(id, gen2)
	ups := s.RequestsSentIn(id)
	if len(ups) != 2 || ups[0].Generation != 1 || ups[1].Generation != 2 {
		t.Fatalf("the cancellation of id 7 goes to %+v, want generations 1 and 2 once each", ups)
	}
	s.RequestDone(a) // the first of the id ends: the others' records stay
	if ups := s.RequestsSentIn(id); len(ups) != 1 || ups[0].Generation != 2 {
		t.Fatalf("after A's answer the records say %+v, want generation 2", ups)
	}
	s.RequestDone(c)
	s.RequestDone(c) // twice: nothing more
	if ups := s.RequestsSentIn(id); len(ups) != 1 {
		t.Fatalf("B is in progress, yet the records say %+v", ups)
	}
	s.RequestDone(b)
	if len(s.sentIn) != 0 {
		t.Fatalf("records left: %+v", s.sentIn)
	}
}

// The record of a request in progress costs no allocation of its own on
// every call: it stays within the map's slot (a value over 128 bytes is
// kept apart, one allocation per request).
func TestSentInRecordAllocatesNothingPerRequest(t *testing.T) {
	s := &Session{}
	up := Upstream{SessionID: "up", Generation: 1}
	id := []byte(`7`)
	s.RequestDone(s.SentIn(id, up)) // the map itself
	base := testing.AllocsPerRun(100, func() { _ = mcpmsg.IDKey(id) })
	if n := testing.AllocsPerRun(100, func() { s.RequestDone(s.SentIn(id, up)) }); n > base {
		t.Errorf("%.0f allocations per request recorded and done, beyond the %.0f of its key", n, base)
	}
}
