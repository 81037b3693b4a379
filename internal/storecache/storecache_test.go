package storecache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/pgtest"
	"github.com/toolgate/toolgate/modules/storage/postgres"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// replica is one process's view of a shared storage: a watch and a cache
// of string values, counting its storage reads.
type replica struct {
	storage certmagic.Storage
	watch   *Watch
	cache   *Cache[string]
	reads   atomic.Int32
	changes atomic.Int32 // changes received (not resets)
}

func newReplica(t *testing.T, storage certmagic.Storage, ttl time.Duration, now func() time.Time) *replica {
	t.Helper()
	r := &replica{storage: storage, watch: NewWatch(storage, "things")}
	r.cache = NewCache[string](r.watch, ttl, now)
	r.watch.OnChange(func(c Change) {
		if !c.Reset {
			r.changes.Add(1)
		}
	})
	if err := r.watch.Start(nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.watch.Stop)
	return r
}

func (r *replica) get(t *testing.T, key string) (string, error) {
	t.Helper()
	return r.cache.Load(context.Background(), key, func(ctx context.Context) (string, bool, error) {
		r.reads.Add(1)
		b, err := r.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			return "", false, err
		}
		return string(b), err == nil, err
	})
}

func (r *replica) put(t *testing.T, key, value string) {
	t.Helper()
	if err := r.storage.Store(context.Background(), key, []byte(value)); err != nil {
		t.Fatal(err)
	}
	r.cache.Wrote(context.Background(), key, value)
}

// postgresStorage provisions caddy.storage.postgres on a fresh table of
// the shared cluster; processes is the pool's application_name (another
// name, another pool: another process).
func postgresStorage(t *testing.T, table, process string) *postgres.Storage {
	t.Helper()
	s := &postgres.Storage{DSN: pgtest.Shared(t).DSN("postgres") + "&application_name=" + process, Table: table}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Cleanup() })
	return s
}

func tableName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "cache_" + hex.EncodeToString(b)
}

// waitUntil polls cond every 5 ms for at most 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// With notifications an entry is read once and kept however long nothing
// changes; a change through another process drops it there, and the next
// read sees the new value.
func TestCacheFollowsNotifications(t *testing.T) {
	table := tableName()
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	a := newReplica(t, postgresStorage(t, table, "cache_a"), time.Second, now)
	b := newReplica(t, postgresStorage(t, table, "cache_b"), time.Second, now)
	waitUntil(t, "both watches to listen", func() bool { return a.watch.Live() && b.watch.Live() })

	a.put(t, "things/one", "v1")
	waitUntil(t, "b to be told", func() bool { return b.changes.Load() == 1 })
	if v, err := b.get(t, "things/one"); err != nil || v != "v1" {
		t.Fatalf("b reads %q, %v", v, err)
	}
	clock = clock.Add(time.Hour) // far beyond the TTL: notifications decide now
	for range 100 {
		if v, _ := b.get(t, "things/one"); v != "v1" {
			t.Fatalf("b reads %q", v)
		}
	}
	if n := b.reads.Load(); n != 1 {
		t.Errorf("100 reads of an unchanged key cost %d storage reads, want 1", n)
	}
	// The writer keeps its own value: its echo does not drop it.
	if v, _ := a.get(t, "things/one"); v != "v1" || a.reads.Load() != 0 {
		t.Errorf("the writer reads %q with %d storage reads, want its own value and none", v, a.reads.Load())
	}

	a.put(t, "things/one", "v2")
	waitUntil(t, "b to drop its copy", func() bool { _, ok := b.cache.Get("things/one"); return !ok })
	if v, _ := b.get(t, "things/one"); v != "v2" {
		t.Errorf("after the change b reads %q, want v2", v)
	}
	if v, _ := a.get(t, "things/one"); v != "v2" || a.reads.Load() != 0 {
		t.Errorf("after its echo the writer reads %q with %d storage reads", v, a.reads.Load())
	}
	// Deleting is a change too; absence is never cached.
	if err := a.storage.Delete(context.Background(), "things/one"); err != nil {
		t.Fatal(err)
	}
	a.cache.Deleted(context.Background(), "things/one")
	waitUntil(t, "b to drop the deleted key", func() bool { _, ok := b.cache.Get("things/one"); return !ok })
	if _, err := b.get(t, "things/one"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the delete: %v", err)
	}
	a.put(t, "things/one", "v3")
	if v, _ := b.get(t, "things/one"); v != "v3" {
		t.Errorf("a value created elsewhere: %q", v)
	}
}

// ChangedAndWait returns once the announcement came back, so every
// listening process has been sent it.
func TestChangedAndWaitReturnsAfterTheEcho(t *testing.T) {
	table := tableName()
	a := newReplica(t, postgresStorage(t, table, "echo_a"), time.Second, time.Now)
	b := newReplica(t, postgresStorage(t, table, "echo_b"), time.Second, time.Now)
	waitUntil(t, "both watches to listen", func() bool { return a.watch.Live() && b.watch.Live() })
	a.put(t, "things/x", "1")
	if _, err := b.get(t, "things/x"); err != nil {
		t.Fatal(err)
	}
	if err := a.storage.Delete(context.Background(), "things/x"); err != nil {
		t.Fatal(err)
	}
	if !a.watch.ChangedAndWait(context.Background(), "things/x", 10*time.Second) {
		t.Fatal("the echo did not arrive")
	}
	waitUntil(t, "b to drop the key", func() bool { _, ok := b.cache.Get("things/x"); return !ok })
}

// Without notifications (file_system), entries are trusted for the TTL.
func TestCacheWithoutNotificationsUsesTheTTL(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a := newReplica(t, storage, 10*time.Second, now)
	b := newReplica(t, storage, 10*time.Second, now)
	if b.watch.Notifies() || b.watch.Live() {
		t.Fatal("file_system storage does not notify")
	}
	a.put(t, "things/k", "old")
	if v, _ := b.get(t, "things/k"); v != "old" {
		t.Fatal(v)
	}
	a.put(t, "things/k", "new")
	if v, _ := a.get(t, "things/k"); v != "new" || a.reads.Load() != 0 {
		t.Errorf("the writer reads %q with %d reads, want its own value and none", v, a.reads.Load())
	}
	clock = clock.Add(9 * time.Second)
	if v, _ := b.get(t, "things/k"); v != "old" {
		t.Errorf("within the TTL b reads %q, want its copy", v)
	}
	clock = clock.Add(2 * time.Second)
	if v, _ := b.get(t, "things/k"); v != "new" {
		t.Errorf("after the TTL b reads %q", v)
	}
}

// A load that raced a change of its key does not keep what it read: the
// value may be the one the change replaced.
func TestLoadRacingAChangeKeepsNothing(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	r := newReplica(t, storage, time.Hour, time.Now)
	for name, change := range map[string]func(){
		"a change of the key": func() { r.cache.changed(Change{Key: "things/k"}) },
		"a reset":             func() { r.cache.changed(Change{Reset: true}) },
		"a local write":       func() { r.cache.Wrote(context.Background(), "things/k", "new"); r.cache.Forget("things/k") },
	} {
		v, err := r.cache.Load(context.Background(), "things/k", func(context.Context) (string, bool, error) {
			change()
			return "read before the change", true, nil
		})
		if err != nil || v != "read before the change" {
			t.Fatalf("%s: %q, %v", name, v, err)
		}
		if got, ok := r.cache.Get("things/k"); ok {
			t.Errorf("%s: kept %q", name, got)
		}
	}
}

// The cache stays within its bound.
func TestCacheIsBounded(t *testing.T) {
	r := newReplica(t, &certmagic.FileStorage{Path: t.TempDir()}, time.Hour, time.Now)
	r.cache.max = 10
	for i := range 50 {
		r.cache.Wrote(context.Background(), "things/"+string(rune('a'+i)), "x")
	}
	if n := r.cache.Len(); n != 10 {
		t.Errorf("%d entries, want the bound 10", n)
	}
}

// When the storage's listening connection is lost (a Reset marked Lost),
// the watch is no longer live and every copy is dropped: until the
// connection is back, copies are trusted for the TTL only, as with a
// storage that announces nothing; its Reset makes the watch live again.
func TestLostListenerFallsBackToTheTTL(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	w := NewWatch(&certmagic.FileStorage{Path: t.TempDir()}, "things")
	c := NewCache[string](w, 10*time.Second, now)
	w.dispatch(postgres.Change{Reset: true})
	if !w.Live() {
		t.Fatal("not live after the first Reset")
	}
	c.Put("things/k", "old")
	clock = clock.Add(time.Hour)
	if v, ok := c.Get("things/k"); !ok || v != "old" {
		t.Fatalf("a live watch's copy, an hour on: %q %v", v, ok)
	}
	w.dispatch(postgres.Change{Reset: true, Lost: true})
	if w.Live() {
		t.Error("still live after the listening connection was lost")
	}
	if _, ok := c.Get("things/k"); ok {
		t.Error("a copy kept across the lost connection")
	}
	c.Put("things/k", "new")
	clock = clock.Add(9 * time.Second)
	if _, ok := c.Get("things/k"); !ok {
		t.Error("a copy dropped within the TTL")
	}
	clock = clock.Add(2 * time.Second)
	if _, ok := c.Get("things/k"); ok {
		t.Error("a copy trusted past the TTL while the connection is lost")
	}
	w.dispatch(postgres.Change{Reset: true})
	if !w.Live() {
		t.Error("not live once the connection is back")
	}
}
