package mcpsession

import (
	"context"
	"encoding/json"
	"errors"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
)

// fixFailingDeletes is a storage whose next deletes of a replica's record
// of local sessions (held-…) fail, as a storage that is briefly down.
type fixFailingDeletes struct {
	certmagic.Storage
	mu   sync.Mutex
	fail int
}

func (s *fixFailingDeletes) failNext(n int) {
	s.mu.Lock()
	s.fail = n
	s.mu.Unlock()
}

func (s *fixFailingDeletes) Delete(ctx context.Context, key string) error {
	s.mu.Lock()
	fail := s.fail > 0 && strings.HasPrefix(path.Base(key), "held-")
	if fail {
		s.fail--
	}
	s.mu.Unlock()
	if fail {
		return errors.New("storage briefly unavailable")
	}
	return s.Storage.Delete(ctx, key)
}

// Attack (fixed): alice (max_mcp_sessions_per_caller 1) holds one local
// (stateless-implied) session on replica a, which ends (retired); the
// removal of a's record of it fails once (the storage briefly down).
// releaseHeld's own comment promises the record "counts a session too
// many until it runs out or is renewed", and housekeeping renews records.
// Expected: a's housekeeping rounds (here two, within the record's
// 5-minute lease) write the record again with its true count (none:
// removed), so that alice, holding no session anywhere, may start one on
// replica b. What happened: releaseHeld dropped alice from heldAt before
// its removal failed, so no housekeeping round ever looks at the record
// again; it keeps counting a session alice no longer holds on every other
// replica until its lease runs out, and b refuses her
// (max_mcp_sessions_per_caller) meanwhile.
// Fixed: a user leaves heldAt only once the record's removal succeeded;
// Housekeep tries again until then.
func TestFixAttackHeldRecordRemovalFailureLocksCallerOut(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	withClock(t, &clock)
	storage := &fixFailingDeletes{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	a, _ := replicaOf(t, storage, time.Hour, 100, 1)
	b, _ := replicaOf(t, storage, time.Hour, 100, 1)
	ctx := context.Background()
	expires := clock.Add(12 * time.Hour)
	s, err := a.CreateLocal(ctx, "alice", "s", expires, "svc")
	if err != nil {
		t.Fatal(err)
	}
	var limit *LimitError
	if _, err := b.CreateLocal(ctx, "alice", "s", expires, "svc"); !errors.As(err, &limit) {
		t.Fatalf("the test's own check: b allowed a second session while a holds one: %v", err)
	}
	storage.failNext(1)
	a.Retire(s)
	a.background.Wait()
	if !s.Closed() {
		t.Fatal("the test's own check: the retired session did not end")
	}
	for range 2 { // housekeeping rounds, the record's lease not yet out
		clock = clock.Add(2 * time.Minute)
		a.Housekeep(ctx)
		a.background.Wait()
	}
	if _, err := b.CreateLocal(ctx, "alice", "s", expires, "svc"); err != nil {
		t.Errorf("alice holds no session anywhere, 4 minutes and two housekeeping rounds of a after her session there ended (its record's removal failed once): b refuses her: %v", err)
	}
}

// Attack (held): concurrent creates and ends of alice's local sessions on
// replica a (40 created at once, then 25 of them retired while 10 more are
// created): once the background writes are done, a's record counts what a
// holds (25), and when every one has ended the record is gone and b lets
// alice start as many as her limit allows.
func TestFixAttackHeldRecordFollowsConcurrentCreatesAndEnds(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, b := fixReplica(t, storage, 50), fixReplica(t, storage, 50)
	ctx := context.Background()
	expires := time.Now().Add(12 * time.Hour)
	key := path.Join(initializingPrefix, callerHash("alice"), a.heldName())
	held := func() (int, bool) {
		data, err := storage.Load(ctx, key)
		if err != nil {
			return 0, false
		}
		var r reservation
		if json.Unmarshal(data, &r) != nil {
			t.Fatalf("record %q: %s", key, data)
		}
		return r.Count, true
	}
	var mu sync.Mutex
	var all []*Session
	create := func(n int) {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				s, err := a.CreateLocal(ctx, "alice", "s", expires, "svc")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				all = append(all, s)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	create(40)
	var wg sync.WaitGroup
	mu.Lock()
	retire := append([]*Session(nil), all[:25]...)
	mu.Unlock()
	for _, s := range retire {
		wg.Go(func() { a.Retire(s) })
	}
	wg.Go(func() { create(10) })
	wg.Wait()
	a.background.Wait()
	if n, ok := held(); !ok || n != 25 {
		t.Errorf("a holds 25 local sessions of alice; its record says %d (present: %v)", n, ok)
	}
	mu.Lock()
	rest := append([]*Session(nil), all...)
	mu.Unlock()
	for _, s := range rest {
		wg.Go(func() { a.Retire(s) })
	}
	wg.Wait()
	a.background.Wait()
	if n, ok := held(); ok {
		t.Errorf("every local session of alice on a ended; its record still counts %d", n)
	}
	for i := range 50 {
		if _, err := b.CreateLocal(ctx, "alice", "s", expires, "svc"); err != nil {
			t.Fatalf("session %d of alice's 50 on b, none left on a: %v", i+1, err)
		}
	}
}

// fixReplica is replicaOf with an end hook safe for concurrent ends.
func fixReplica(t *testing.T, storage certmagic.Storage, perCaller int) *Sessions {
	t.Helper()
	m := New()
	c := &Config{State: mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() }),
		Keys: testKeys(t), Max: 1000, PerCaller: perCaller, CacheTTL: 10 * time.Second, Idle: time.Hour,
		Logger: zap.NewNop(), OnEnd: func(Ended) {}}
	if err := m.Attach(c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Detach(c); _ = m.Destruct() })
	return m
}
