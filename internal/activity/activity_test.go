package activity

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/modules/gateway"
)

func setClock(t *testing.T, start time.Time) *time.Time {
	t.Helper()
	clock := start
	old := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = old })
	return &clock
}

func decision(user, id string, at time.Time) gateway.DecisionRecord {
	return gateway.DecisionRecord{Time: at, User: user, Service: "svc", Method: "tools/call", Tool: "echo",
		Stage: "request", Action: "allow", DecisionID: id}
}

func TestRecentIsPerUserAndNewestFirst(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	l := New(&certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 0, zap.NewNop())
	for i := range 3 {
		at := clock.Add(time.Duration(i) * time.Second)
		l.Flush(ctx, []gateway.DecisionRecord{decision("alice", fmt.Sprint("a", i), at), decision("bob", fmt.Sprint("b", i), at)})
		*clock = clock.Add(time.Second)
	}
	got, err := l.Recent(ctx, "alice", 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("Recent(alice) = %v, %v", got, err)
	}
	for i, d := range got {
		if d.User != "alice" || d.DecisionID != fmt.Sprint("a", 2-i) {
			t.Errorf("alice's decision %d = %+v, want a%d", i, d, 2-i)
		}
	}
	if got, _ := l.Recent(ctx, "alice", 2); len(got) != 2 || got[0].DecisionID != "a2" {
		t.Errorf("limit 2 = %+v", got)
	}
	all, err := l.RecentAll(ctx, 10)
	if err != nil || len(all) != 6 || all[0].Time.Before(all[5].Time) {
		t.Fatalf("RecentAll = %+v, %v", all, err)
	}
	if got, _ := l.Recent(ctx, "carol", 10); len(got) != 0 {
		t.Errorf("carol, who made no call, sees %+v", got)
	}
}

func TestRetentionAndSweep(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	l := New(&certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 2, zap.NewNop())
	for i := range 4 {
		l.Flush(ctx, []gateway.DecisionRecord{decision("alice", fmt.Sprint(i), *clock)})
		*clock = clock.Add(time.Minute)
	}
	// Per user, only the newest two objects survive a sweep.
	if n, err := l.Sweep(ctx); n != 2 || err != nil {
		t.Fatalf("Sweep = %d, %v; want 2", n, err)
	}
	got, _ := l.Recent(ctx, "alice", 10)
	if len(got) != 2 || got[0].DecisionID != "3" {
		t.Fatalf("after the sweep: %+v", got)
	}
	// Past the retention, decisions are neither shown nor kept.
	*clock = clock.Add(2 * time.Hour)
	if got, _ := l.Recent(ctx, "alice", 10); len(got) != 0 {
		t.Errorf("decisions past the retention are shown: %+v", got)
	}
	if n, _ := l.Sweep(ctx); n != 2 {
		t.Errorf("Sweep past the retention removed %d, want 2", n)
	}
}

func TestWriterFlushesOnStopAndNeverBlocks(t *testing.T) {
	ctx := context.Background()
	core, logs := observer.New(zap.InfoLevel)
	l := New(&certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 0, zap.New(core))
	// Not started: the queue fills, and the excess is dropped, counted,
	// without blocking the caller.
	for i := range queueSize + 10 {
		l.RecordDecision(decision("alice", fmt.Sprint(i), time.Now()))
	}
	if l.Dropped() != 10 {
		t.Fatalf("dropped %d, want 10", l.Dropped())
	}
	l.Start()
	l.Stop()
	got, err := l.Recent(ctx, "alice", queueSize+10)
	if err != nil || len(got) != queueSize {
		t.Fatalf("after Stop %d decisions are stored (%v), want %d", len(got), err, queueSize)
	}
	// The operator learns of the dropped ones.
	warned := logs.FilterMessageSnippet("activity record").All()
	if len(warned) != 1 || warned[0].ContextMap()["dropped"] != int64(10) {
		t.Errorf("the dropped decisions were reported as %+v, want one warning of 10", warned)
	}
	// Stop without Start does nothing, twice.
	idle := New(&certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 0, zap.NewNop())
	idle.Stop()
	idle.Stop()
}

// The writer is not woken for each decision (that cost the call path a
// system call): decisions wait in the queue until a batch is full, which
// is flushed without waiting for the next tick.
func TestWriterWakesForABatchNotADecision(t *testing.T) {
	ctx := context.Background()
	l := New(&certmagic.FileStorage{Path: t.TempDir()}, time.Hour, 0, zap.NewNop())
	l.every = time.Hour // no tick during the test
	l.Start()
	defer l.Stop()
	for i := range 10 {
		l.RecordDecision(decision("alice", fmt.Sprint("early", i), time.Now()))
	}
	// A writer woken per decision would have taken them by now.
	time.Sleep(50 * time.Millisecond)
	if n := len(l.queue); n != 10 {
		t.Fatalf("%d of 10 decisions are queued: the writer took decisions before a batch was waiting", n)
	}
	for i := range batchSize - 10 {
		l.RecordDecision(decision("alice", fmt.Sprint(i), time.Now()))
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err := l.Recent(ctx, "alice", 2*batchSize)
		if err == nil && len(got) == batchSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a full batch was not flushed before the tick: %d stored (%v), want %d", len(got), err, batchSize)
		}
	}
}

// A reload stops the replaced configuration's log while calls that began
// on it still run: what they decide later reaches the newest log, and no
// decision is lost, however the decisions and the stop interleave.
func TestDecisionsAfterStopGoToTheNewestLog(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	old := New(storage, time.Hour, 0, zap.NewNop())
	old.Start()
	const recorders, each = 4, 500
	var wg sync.WaitGroup
	started := make(chan struct{})
	for r := range recorders {
		wg.Go(func() {
			for i := range each {
				if i == each/10 {
					started <- struct{}{}
				}
				old.RecordDecision(decision("alice", fmt.Sprint(r, "-", i), time.Now()))
			}
		})
	}
	for range recorders {
		<-started
	}
	next := New(storage, time.Hour, 0, zap.NewNop())
	next.Start() // the new configuration starts before the old one stops
	old.Stop()
	wg.Wait()
	old.RecordDecision(decision("alice", "after", time.Now()))
	next.Stop()
	got, err := next.Recent(ctx, "alice", 2*recorders*each)
	if err != nil || len(got) != recorders*each+1 {
		t.Fatalf("%d of %d decisions are stored (%v); dropped %d by the old log, %d by the new", len(got), recorders*each+1, err, old.Dropped(), next.Dropped())
	}
	// With no running log left, a late decision is dropped and counted.
	old.RecordDecision(decision("alice", "orphan", time.Now()))
	if old.Dropped() != 1 {
		t.Errorf("a decision with no running log: dropped %d, want 1", old.Dropped())
	}
}

// What a runner names is kept to a bound, cut on a character boundary and
// marked with the size it had.
func TestCutNames(t *testing.T) {
	if got := cut("tools/call", maxName); got != "tools/call" {
		t.Errorf("a short name was changed: %q", got)
	}
	long := strings.Repeat("é", 200) // 400 bytes
	got := cut(long, maxName)
	if !utf8.ValidString(got) || !strings.HasSuffix(got, "… (400 bytes)") || len(got) > maxName+len("… (400 bytes)") {
		t.Errorf("cut(400 bytes of é) = %q", got)
	}
}
