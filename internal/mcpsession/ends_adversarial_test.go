package mcpsession

// Adversarial review of 5ce17d2 (a transport module's session held by a
// replica other than the one that ends the MCP session ends as the end is
// announced: changed → reloadLater for sessions marked HeldHere →
// reload → endedElsewhere → the end hook, marked Elsewhere).
//
// Attack: a burst of announced ends (a toolgate session ending its MCP
// sessions, a reconnect or a reload ending a caller's many sessions)
// reaches a replica that holds a transport module's session of more than
// maxBackgroundReads (16) of them. reloadLater drops what does not fit
// ("then the next use, or housekeeping, does"), but nothing uses an ended
// session again and Housekeep only re-reads sessions in use: the dropped
// ones never reach the end hook, and their programs' / legacy SSE
// servers' sessions stay until the module's idle timeout.
// Holds (fixed: Housekeep re-reads stale sessions held here too). Code:
// internal/mcpsession/sessions.go reloadLater (drops), changed
// (SessionChange), Housekeep (re-read only `inUse && !fresh`).
// (TestEndsAdversarialBurstOfEndsLeavesHeldSessions)
//
// Attack: the replica's LISTEN connection drops while the MCP session is
// ended through another replica: the announcement is lost, and the
// storage's Reset (anything may have changed) follows when it listens
// again. The Reset branch of changed re-reads only sessions in use or
// awaiting a listing, not those HeldHere: the ended session's transport
// module session stays until the idle timeout.
// Holds (fixed: the Reset re-reads held sessions too). Code:
// internal/mcpsession/sessions.go changed (ch.Reset branch ignored
// heldHere), Housekeep.
// (TestEndsAdversarialResetForgetsHeldSessions)
//
// Attack: the read that follows an announced change of a held session
// fails transiently (storage unavailable): is the session taken for ended
// elsewhere, and its module session ended though the MCP session lives?
// Holds: only ErrNotFound ends it; the copy stays open and usable.
// (TestEndsAdversarialHoldsTransientReadFailure)

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/storecache"
)

// gatedStorage is a file storage whose reads of MCP session records can
// be held (until released) or made to fail.
type gatedStorage struct {
	*certmagic.FileStorage
	mu   sync.Mutex
	gate chan struct{} // non-nil: reads of records wait until it closes
	fail bool
}

func (g *gatedStorage) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gatedStorage) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *gatedStorage) setFail(f bool) {
	g.mu.Lock()
	g.fail = f
	g.mu.Unlock()
}

func (g *gatedStorage) Load(ctx context.Context, key string) ([]byte, error) {
	if strings.HasPrefix(key, mcpstate.Prefix+"/sessions/") {
		g.mu.Lock()
		gate, fail := g.gate, g.fail
		g.mu.Unlock()
		if fail {
			return nil, errors.New("storage unavailable (injected)")
		}
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return g.FileStorage.Load(ctx, key)
}

// endsLog is an end hook's record, safe for the background reads.
type endsLog struct {
	mu    sync.Mutex
	ended []Ended
}

func (l *endsLog) add(e Ended) {
	l.mu.Lock()
	l.ended = append(l.ended, e)
	l.mu.Unlock()
}

func (l *endsLog) elsewhere() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.ended {
		if e.Elsewhere {
			n++
		}
	}
	return n
}

func (l *endsLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ended)
}

// gatedReplica is replicaOf on storage, with a concurrency-safe end hook.
func gatedReplica(t *testing.T, storage certmagic.Storage) (*Sessions, *endsLog) {
	t.Helper()
	m := New()
	log := &endsLog{}
	c := &Config{State: mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() }),
		Keys: testKeys(t), Max: 1000, PerCaller: 1000, CacheTTL: 10 * time.Second, Idle: time.Hour,
		Logger: zap.NewNop(), OnEnd: log.add}
	if err := m.Attach(c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Detach(c); _ = m.Destruct() })
	return m, log
}

// gatedPair is two replicas on one directory, b reading it through gs.
func gatedPair(t *testing.T) (a, b *Sessions, gs *gatedStorage, endedB *endsLog) {
	t.Helper()
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	gs = &gatedStorage{FileStorage: fs}
	a, _ = gatedReplica(t, fs)
	b, endedB = gatedReplica(t, gs)
	return a, b, gs, endedB
}

// heldCopy starts a session through a (with its tools listed), opens b's
// copy and marks it held by a transport module of b.
func heldCopy(t *testing.T, a, b *Sessions, upstreamID string) (*Session, *Session) {
	t.Helper()
	ctx := context.Background()
	s := started(t, a, aliceSession, upstreamID)
	if err := s.CatalogListed(ctx, map[string][]byte{"echo": []byte(`{"name":"echo"}`)}); err != nil {
		t.Fatal(err)
	}
	c, err := b.Open(ctx, s.ID, "alice", "s")
	if err != nil {
		t.Fatal(err)
	}
	c.HeldHere()
	if c.awaitingListing() || c.inUse.Load() != 0 {
		t.Fatalf("precondition: b's copy is neither awaiting a listing nor in use")
	}
	return s, c
}

func announce(m *Sessions, ref string) {
	m.changed(m.cfg(), storecache.Change{Key: mcpstate.Prefix + "/sessions/" + ref + "/state"})
}

// waitReads waits (bounded) until no background read of m is in flight.
func waitReads(t *testing.T, m *Sessions) {
	t.Helper()
	for i := 0; i < 200 && len(m.reloads) > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(m.reloads); n > 0 {
		t.Fatalf("%d background reads still in flight", n)
	}
}

// TestEndsAdversarialBurstOfEndsLeavesHeldSessions: see the header.
func TestEndsAdversarialBurstOfEndsLeavesHeldSessions(t *testing.T) {
	ctx := context.Background()
	a, b, gs, endedB := gatedPair(t)
	const n = 3 * maxBackgroundReads
	var copies []*Session
	for i := range n {
		s, c := heldCopy(t, a, b, fmt.Sprintf("up-%d", i))
		copies = append(copies, c)
		if _, ok, err := a.End(ctx, s); !ok || err != nil {
			t.Fatalf("End through a: %v %v", ok, err)
		}
	}
	// The announcements of the n ends reach b while its first reads are
	// on their way (a storage round trip of PostgreSQL: a few ms).
	gs.hold()
	for _, c := range copies {
		announce(b, c.Ref)
	}
	gs.release()
	waitReads(t, b)
	b.Housekeep(ctx) // "the next use, or housekeeping, does": nothing uses an ended session again
	waitReads(t, b)
	closed := 0
	for _, c := range copies {
		if c.Closed() {
			closed++
		}
	}
	if got := endedB.elsewhere(); got != n {
		t.Errorf("%d of %d MCP sessions ended through a, each with a transport module's session held by b, reached b's end hook "+
			"(marked Elsewhere) after their ends were announced and b housekept (%d of b's copies closed); "+
			"the other %d module sessions stay open until their idle timeout (reloadLater drops what exceeds %d reads in flight, "+
			"and Housekeep re-reads only sessions in use)", got, n, closed, n-got, maxBackgroundReads)
	}
}

// TestEndsAdversarialResetForgetsHeldSessions: see the header.
func TestEndsAdversarialResetForgetsHeldSessions(t *testing.T) {
	ctx := context.Background()
	fs := &certmagic.FileStorage{Path: t.TempDir()}
	a, _ := gatedReplica(t, fs)
	b, endedB := gatedReplica(t, fs)
	s, c := heldCopy(t, a, b, "up-held")
	if _, ok, err := a.End(ctx, s); !ok || err != nil {
		t.Fatalf("End through a: %v %v", ok, err)
	}
	// b's announcement of the end was lost (its LISTEN connection broke);
	// it listens again, and the storage tells it: anything may have changed.
	b.changed(b.cfg(), storecache.Change{Reset: true})
	waitReads(t, b)
	b.Housekeep(ctx)
	waitReads(t, b)
	if got := endedB.elsewhere(); got != 1 || !c.Closed() {
		t.Errorf("after the Reset that follows a lost announcement, b's end hook got %d sessions marked Elsewhere (want 1) and its copy "+
			"is closed: %v; the ended MCP session's transport module session on b stays until its idle timeout "+
			"(changed's Reset branch re-reads only sessions in use or awaiting a listing, not HeldHere)", got, c.Closed())
	}
}

// TestEndsAdversarialHoldsTransientReadFailure: see the header.
func TestEndsAdversarialHoldsTransientReadFailure(t *testing.T) {
	ctx := context.Background()
	a, b, gs, endedB := gatedPair(t)
	s, c := heldCopy(t, a, b, "up-held")
	gs.setFail(true)
	announce(b, s.Ref) // a change (not an end): the read fails
	waitReads(t, b)
	if _, err := b.Open(ctx, s.ID, "alice", "s"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("Open through b while storage fails: %v, want a storage error (not ErrNotFound)", err)
	}
	gs.setFail(false)
	if endedB.count() != 0 || c.Closed() {
		t.Errorf("a failed read of a live held session ended it on b: hook %+v, closed %v", endedB.ended, c.Closed())
	}
	if got, err := b.Open(ctx, s.ID, "alice", "s"); err != nil || got != c {
		t.Errorf("Open through b once storage answers: %v (same copy: %v)", err, got == c)
	}
}
