package mcpsession

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// countingStorage counts the writes and removals made through it once
// after is set.
type countingStorage struct {
	certmagic.Storage
	after  atomic.Bool
	writes atomic.Int32
}

func (s *countingStorage) Store(ctx context.Context, key string, value []byte) error {
	if s.after.Load() {
		s.writes.Add(1)
	}
	return s.Storage.Store(ctx, key, value)
}

func (s *countingStorage) Delete(ctx context.Context, key string) error {
	if s.after.Load() {
		s.writes.Add(1)
	}
	return s.Storage.Delete(ctx, key)
}

// A gateway stops (Destruct) while a call on a retired session is still
// running; the call ends afterwards. Destruct already closed the session
// and removed this replica's records of its sessions: the call's end
// starts nothing more (a background write then would run after Destruct
// returned, on a storage the stopping configuration may have closed, and
// raced Destruct's wait for the background under -race).
func TestACallEndingAfterDestructStartsNothing(t *testing.T) {
	storage := &countingStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	m, ended := replicaOf(t, storage, time.Hour, 100, 100)
	s, err := m.CreateLocal(context.Background(), "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	end := s.Begin()
	m.Retire(s)
	if s.Closed() {
		t.Fatal("the test's own check: a retired session with a call running ended at once")
	}
	if err := m.Destruct(); err != nil {
		t.Fatal(err)
	}
	storage.after.Store(true)
	end()
	m.background.Wait()
	if n := storage.writes.Load(); n != 0 {
		t.Errorf("the end of a call after Destruct wrote to the storage %d times", n)
	}
	if len(*ended) != 0 {
		t.Errorf("the end of a call after Destruct ended the upstream session again: %+v", *ended)
	}
}

// The same with the call ending while Destruct runs, many times: under
// -race, nothing is started in the background while Destruct waits for it.
func TestACallEndingDuringDestructRacesNothing(t *testing.T) {
	for range 30 {
		m, _ := replicaOf(t, &certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 100, 100)
		s, err := m.CreateLocal(context.Background(), "alice", "s", time.Now().Add(time.Hour), "svc")
		if err != nil {
			t.Fatal(err)
		}
		end := s.Begin()
		m.Retire(s)
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-start; end() })
		wg.Go(func() { <-start; _ = m.Destruct() })
		close(start)
		wg.Wait()
		m.background.Wait()
	}
}
