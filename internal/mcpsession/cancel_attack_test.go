package mcpsession

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Attack (fixed): Reinitialize of a stored session stored the new upstream session
// in the shared record first (state().Update), and only then finds the copy
// here closed and hands the new upstream session to discard, which ends it
// (toolgate sends it DELETE). A copy closed here while its record is kept
// — the case the commit names: this replica's copy dropped while the MCP
// session lives on for the other replicas (Destruct as the replica stops,
// in a rolling deploy, while a call's re-initialization still runs within
// the shutdown grace period) — leaves the record naming an
// upstream session toolgate itself just ended. The closer ended nothing
// (closeLocal of a kept record does not end the upstream: "what is shared
// stays"), so the comment's "whoever closed it ended the upstream session
// it knew of" does not hold. Every replica (and this one after the reload)
// then opens the session on a dead upstream session: its next request gets
// 404 and re-initializes once more, and a call another replica already sent
// into the new session — it hears of the new generation as soon as the
// record changes — is cut by the DELETE mid-run. Before the commit the new
// session was kept (right for a kept record).
// Severity: low (an extra re-initialization, the upstream session's state
// lost; a call already running in the new session on another replica is
// ended under the runner).
// Fix: check s.closed before storing next (under the storage lock, or just
// before Update) and discard next without storing it; once the record names
// next, keep it (do not discard) unless the record itself is gone (End),
// which Update's ErrNotFound already handles.
// Fixed so: a copy closed before the store discards next unstored; once
// stored, next is kept.
func TestCancelAttackReinitializeDiscardsTheUpstreamItsKeptRecordNames(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := replicaOf(t, storage, time.Hour, 100, 100)
	b, _ := replicaOf(t, storage, time.Hour, 100, 100)
	s := started(t, a, aliceSession, "up-1")
	var discarded []string
	_, err := s.Reinitialize(context.Background(), s.Upstream().Generation, func(cur Upstream) (Upstream, error) {
		a.closeLocal(s) // this replica's copy only: the record is kept
		return Upstream{SessionID: "up-2", ProtocolVersion: cur.ProtocolVersion}, nil
	}, func(up Upstream) { discarded = append(discarded, up.SessionID) })
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("premise: Reinitialize of a copy closed meanwhile: %v (want ErrClosed)", err)
	}
	for _, m := range []*Sessions{a, b} {
		again, err := m.Open(context.Background(), s.ID, aliceSession.User, aliceSession.ID)
		if err != nil {
			t.Fatalf("premise: the kept record does not open: %v", err)
		}
		up := again.Upstream()
		for _, d := range discarded {
			if up.SessionID == d {
				t.Errorf("the MCP session's kept record names upstream session %q (generation %d), which Reinitialize discarded (ended): discarded %v",
					up.SessionID, up.Generation, discarded)
			}
		}
	}
}

// Attack (fixed): the cancelled mark lives on the per-id entry, and SentIn of a
// second request of the same id rewrote the entry without it. The runner
// cancels request A (id 7) while A is on its way to the re-created upstream
// session (CancelGone: marked, the cancellation is swallowed — nothing is
// sent), then sends request B reusing id 7 before A's re-initialization
// ends. SentIn for B clears A's mark, and A's SendingIn lets A through: A
// runs in the new session though its cancellation was accepted (202) and
// never sent anywhere. Severity: low (the runner reused an id of a request
// in progress, which MCP forbids; only its own call is affected). Fix: keep
// the mark per request (SentIn returning a handle; the fix4 open finding's
// per-request records), or keep cancelled when SentIn adds to an entry.
// Fixed: each request keeps its own record and mark (SentIn returns a
// handle), so B neither clears A's mark nor inherits it.
func TestCancelAttackSameIDRequestClearsCancelledMark(t *testing.T) {
	s := &Session{}
	id := []byte("7")
	gen1 := Upstream{SessionID: "up-1", Generation: 1}
	gen2 := Upstream{SessionID: "up-2", Generation: 2}
	a := s.SentIn(id, gen1) // A went to generation 1, which answered 404
	if _, follow := s.CancelGone(id, gen1, gen2); follow {
		t.Fatal("premise: the cancellation of A on its way to generation 2 was not taken")
	}
	b := s.SentIn(id, gen2) // B reuses id 7
	if s.SendingIn(a, gen2) {
		t.Errorf("request A, whose cancellation was swallowed (CancelGone), is sent to generation 2 after a request of the same id was recorded")
	}
	if !s.SendingIn(b, gen2) {
		t.Errorf("request B, sent after the cancellation of A, is kept from generation 2 by A's mark")
	}
	s.RequestDone(a)
	s.RequestDone(b)
}

// Held: a hostile runner cannot grow the sentIn records: cancellations of
// ids never requested add nothing, and every record — cancelled or not,
// answered after a re-initialization or not — goes with its RequestDone,
// under concurrent use (run with -race).
func TestCancelAttackSentInRecordsDoNotLeak(t *testing.T) {
	s := &Session{}
	gen1 := Upstream{SessionID: "up-1", Generation: 1}
	gen2 := Upstream{SessionID: "up-2", Generation: 2}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				id := []byte(fmt.Sprint(w*1000 + i%50))
				other := []byte(fmt.Sprintf(`"x%d-%d"`, w, i))
				key := s.SentIn(id, gen1)
				s.CancelGone(other, gen1, gen2) // names no request
				if i%3 == 0 {
					s.CancelGone(id, gen1, gen2)
				}
				s.SendingIn(key, gen2)
				s.RequestsSentIn(id)
				s.RequestDone(key)
			}
		}()
	}
	wg.Wait()
	s.mu.Lock()
	n := len(s.sentIn)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("%d sentIn records left after every request ended", n)
	}
}

// Attack (fixed): CancelUnsent (since replaced) could not tell a request
// on its way to the new upstream session from one delivered to the old one
// and running there: it marked (and the proxy swallowed the cancellation
// of) any request whose record named an older generation than the session
// the cancellation was about to go to, which the proxy read apart from the
// record: when another request's Reinitialize made S2 current between
// them, the cancellation of a call delivered to S1 — still running there,
// as a bridged program's winding process does — was answered 202 and sent
// nowhere, and the call ran on.
// Severity: low (a narrow race; bridged programs whose session was
// replaced while a call runs).
// Fixed: a cancellation of a request in progress goes to the session its
// record names, whatever is current (mcpproxy cancelInProgress); only when
// that session answers 404 (it runs nothing) is the request kept from the
// session replacing it (CancelGone), and only if it still is recorded in
// the session found gone; if it went on, the cancellation follows it.
func TestCancelAttackCancelUnsentSwallowsCancellationOfDeliveredRequest(t *testing.T) {
	s := &Session{}
	id := []byte("7")
	gen1 := Upstream{SessionID: "up", Generation: 1}
	gen2 := Upstream{SessionID: "up", Generation: 2} // a bridged program re-initialized under the same id
	gen3 := Upstream{SessionID: "up", Generation: 3}
	key := s.SentIn(id, gen1)
	if !s.SendingIn(key, gen1) { // delivered to generation 1, which runs it (no 404 followed)
		t.Fatal("premise: the request was not sent")
	}
	// Another request re-initialized meanwhile (generation 2 is current):
	// the cancellation goes where the record says.
	if ups := s.RequestsSentIn(id); len(ups) != 1 || ups[0].Generation != gen1.Generation {
		t.Fatalf("the request delivered to generation 1 is recorded in %+v", ups)
	}
	// Had generation 1 answered the cancellation 404 while the request was
	// re-sent to generation 2, the cancellation follows it there.
	if !s.SendingIn(key, gen2) {
		t.Fatal("premise: the request was not sent again")
	}
	if up, follow := s.CancelGone(id, gen1, gen2); !follow || up.Generation != gen2.Generation {
		t.Errorf("the cancellation of a request sent again to generation 2, finding generation 1 gone: follows to %+v (%v), want generation 2", up, follow)
	}
	// Finding generation 2 gone too, before the request is sent to 3: it
	// is kept from 3.
	if _, follow := s.CancelGone(id, gen2, gen3); follow {
		t.Error("the cancellation of a request still recorded in the session found gone follows it elsewhere")
	}
	if s.SendingIn(key, gen3) {
		t.Error("a request cancelled on its way to generation 3 is sent there")
	}
	s.RequestDone(key)
}
