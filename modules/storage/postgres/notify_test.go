package postgres

import (
	"slices"
	"testing"
	"time"
)

// changes subscribes to prefix on s and returns the channel the changes
// arrive on.
func changes(t *testing.T, s *Storage, prefix string) <-chan Change {
	t.Helper()
	ch := make(chan Change, 64)
	stop, err := s.Subscribe(prefix, func(c Change) { ch <- c })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ch
}

// next waits (at most 20 s) for the next change.
func next(t *testing.T, ch <-chan Change) Change {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("no change delivered within 20s")
	}
	return Change{}
}

// until collects changes up to and including the one for key.
func until(t *testing.T, ch <-chan Change, key string) []Change {
	t.Helper()
	var got []Change
	for {
		c := next(t, ch)
		got = append(got, c)
		if c.Key == key {
			return got
		}
	}
}

// TestNotifyAcrossPools: a change published through one pool reaches the
// subscribers of another pool (another replica) whose prefix covers it,
// and only those.
func TestNotifyAcrossPools(t *testing.T) {
	table := newTableName()
	a := newStorage(t, sharedDSN(t, "notify_a"), table, DefaultLockLease)
	b := newStorage(t, sharedDSN(t, "notify_b"), table, DefaultLockLease)
	if a.db == b.db {
		t.Fatal("the two storages share a pool")
	}
	onB := changes(t, b, "sessions")
	allOnA := changes(t, a, "")
	if c := next(t, onB); !c.Reset {
		t.Fatalf("first change %+v, want the Reset that says listening started", c)
	}
	if c := next(t, allOnA); !c.Reset {
		t.Fatalf("first change on a %+v, want Reset", c)
	}
	// a subscriber joining a pool that already listens gets its Reset too
	lateOnB := changes(t, b, "sessions/sub")
	if c := next(t, lateOnB); !c.Reset {
		t.Fatalf("first change of a late subscriber %+v, want Reset", c)
	}
	ctx := t.Context()
	for _, k := range []string{"sessions/x", "other/y", "sessionsX/w", "sessions", "sessions/sub/z", "sessions/end"} {
		if err := a.Publish(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	for _, c := range until(t, onB, "sessions/end") {
		if c.Local || c.Reset {
			t.Fatalf("change %+v: published by another pool, not a reset", c)
		}
		keys = append(keys, c.Key)
	}
	if want := []string{"sessions/x", "sessions", "sessions/sub/z", "sessions/end"}; !slices.Equal(keys, want) {
		t.Fatalf("b heard %q, want %q", keys, want)
	}
	if c := next(t, lateOnB); c.Key != "sessions/sub/z" {
		t.Fatalf("the late subscriber heard %+v, want sessions/sub/z", c)
	}
	got := until(t, allOnA, "sessions/end")
	if len(got) != 6 || !got[0].Local {
		t.Fatalf("a's own subscriber heard %+v, want all six, marked Local", got)
	}
	// a table of another name is another channel
	other := newStorage(t, sharedDSN(t, "notify_a"), newTableName(), DefaultLockLease)
	if err := other.Publish(ctx, "sessions/elsewhere"); err != nil {
		t.Fatal(err)
	}
	if err := a.Publish(ctx, "sessions/last"); err != nil {
		t.Fatal(err)
	}
	if c := next(t, onB); c.Key != "sessions/last" {
		t.Fatalf("b heard %+v from another table", c)
	}
}

// TestNotifyReconnect: when the listening connection is cut, subscribers
// are told at once (a Reset marked Lost: until it is back they miss
// changes), get a Reset once it is back, and later changes arrive again.
func TestNotifyReconnect(t *testing.T) {
	table := newTableName()
	a := newStorage(t, sharedDSN(t, "reconnect_a"), table, DefaultLockLease)
	b := newStorage(t, sharedDSN(t, "reconnect_b"), table, DefaultLockLease)
	onB := changes(t, b, "")
	if c := next(t, onB); !c.Reset {
		t.Fatalf("first change %+v, want Reset", c)
	}
	var killed int
	query(t, sharedDSN(t, "admin"), `select count(pg_terminate_backend(pid)) from pg_stat_activity
		where application_name = 'toolgate listener' and query ilike 'listen%'||$1||'%'`,
		[]any{table}, &killed)
	if killed != 1 {
		t.Fatalf("terminated %d listener connections, want b's one", killed)
	}
	if c := next(t, onB); !c.Reset || !c.Lost {
		t.Fatalf("after the connection was cut: %+v, want Reset and Lost", c)
	}
	if c := next(t, onB); !c.Reset || c.Lost {
		t.Fatalf("once it is back: %+v, want Reset, not Lost", c)
	}
	if err := a.Publish(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	if c := next(t, onB); c.Key != "k" {
		t.Fatalf("after reconnecting: %+v, want k", c)
	}
}

// TestLockWakesOnRelease: a waiting Lock is woken by the release
// notification, not by polling: with polling effectively off it still gets
// the lock as soon as the holder releases it.
func TestLockWakesOnRelease(t *testing.T) {
	table := newTableName()
	a := newStorage(t, sharedDSN(t, "wake_a"), table, time.Hour)
	b := newStorage(t, sharedDSN(t, "wake_b"), table, time.Hour)
	b.maxPoll = time.Hour
	ctx := t.Context()
	if err := a.Lock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx, "l") }()
	// b is waiting once its listener is on the channel and it has tried
	waitFor(t, "b waiting", func() bool {
		b.db.mu.Lock()
		l := b.db.listener
		b.db.mu.Unlock()
		if l == nil {
			return false
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		c := l.channels[b.t.channel]
		return c != nil && len(c.waiters["l"]) == 1
	})
	time.Sleep(200 * time.Millisecond) // let b's first attempt fail
	if err := a.Unlock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
	if err := b.Unlock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond (at most 20 s).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
