package mcpsession

import (
	"fmt"
	"sync"
	"testing"
)

// HELD (change A, 57da935): records do not leak under concurrency. Many
// goroutines of one runner session reuse a handful of ids at once (the
// hostile case), re-send some into a replaced upstream session
// (SendingIn), cancel (RequestsSentIn, CancelGone), and end each request,
// some twice (RequestDone twice, and with a zero Sent); once all ended, no
// record is left and the -race detector finds nothing. Run with -race.
func TestR7SentInRecordsDoNotLeakUnderConcurrency(t *testing.T) {
	s := &Session{}
	gen1 := Upstream{SessionID: "u1", Generation: 1}
	gen2 := Upstream{SessionID: "u2", Generation: 2}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				id := []byte(fmt.Sprint(i % 3)) // ids reused across goroutines
				up := gen1
				if (g+i)%2 == 0 {
					up = gen2
				}
				sent := s.SentIn(id, up)
				if i%5 == 0 {
					s.SendingIn(sent, gen2)
				}
				if i%7 == 0 {
					_ = s.RequestsSentIn(id)
					_, _ = s.CancelGone(id, gen1, gen2)
				}
				s.RequestDone(sent)
				if i%11 == 0 {
					s.RequestDone(sent) // twice
					s.RequestDone(Sent{})
				}
			}
		}()
	}
	wg.Wait()
	s.mu.Lock()
	left := len(s.sentIn)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d ids still have records after every request ended", left)
	}
}

// HELD (change A, 57da935): a hostile runner reusing one id for every
// request it has in progress at once grows one list per id; it is bounded
// by what bounds its requests in progress (max_streams_per_caller, 1000
// by default; dropped streams kept for resumption by MaxResumableStreams
// per session), and each record is some hundred bytes. Its operations are
// linear in that list (RequestDone of the first shifts the rest;
// RequestsSentIn, CancelGone scan it), so the whole is quadratic in the
// bound, which keeps it small (suggested hardening, were the bound raised
// by orders of magnitude: index the records of one id by seq, or cap the
// records per id and refuse the reuse).
func TestR7SentInReusedIDCostBounded(t *testing.T) {
	const n = 3000
	s := &Session{}
	up := Upstream{SessionID: "u", Generation: 1, ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)}
	id := []byte(`7`)
	sents := make([]Sent, n)
	for i := range sents {
		sents[i] = s.SentIn(id, up)
	}
	for range 10 {
		if ups := s.RequestsSentIn(id); len(ups) != 1 {
			t.Fatalf("one upstream session, records say %+v", ups)
		}
	}
	for _, sent := range sents { // answered in the order sent: each shifts the rest
		s.RequestDone(sent)
	}
	if len(s.sentIn) != 0 {
		t.Errorf("records left: %d", len(s.sentIn))
	}
}

// HELD (change A, 57da935): a request recorded after the runner's
// cancellation of another request of its id was kept from a replaced
// session is not itself kept from being sent (before 57da935 it inherited
// the cancelled mark of the shared record and never ran), while the
// cancelled one still is not sent.
func TestR7CancelledMarkStaysWithItsRequest(t *testing.T) {
	s := &Session{}
	gen1 := Upstream{SessionID: "u1", Generation: 1}
	gen2 := Upstream{SessionID: "u2", Generation: 2}
	id := []byte(`"x"`)
	a := s.SentIn(id, gen1)
	if _, ok := s.CancelGone(id, gen1, gen2); ok {
		t.Fatal("A was recorded in the gone session only: nothing to follow")
	}
	b := s.SentIn(id, gen2) // the runner reuses the id
	if s.SendingIn(a, gen2) {
		t.Error("A, cancelled on its way to the replacing session, is sent")
	}
	if !s.SendingIn(b, gen2) {
		t.Error("B, never cancelled, is kept from being sent")
	}
	s.RequestDone(a)
	s.RequestDone(b)
	if len(s.sentIn) != 0 {
		t.Errorf("records left: %+v", s.sentIn)
	}
}
