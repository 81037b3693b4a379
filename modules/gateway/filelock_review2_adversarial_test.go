package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// adv2WriteStale leaves the lock file of a crashed replica: valid JSON,
// last refreshed a minute ago.
func adv2WriteStale(t *testing.T, file string) {
	t.Helper()
	old := time.Now().Add(-time.Minute)
	data, _ := json.Marshal(lockMeta{Created: old, Updated: old, Holder: "crashed"})
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// adv2Tail shortens an error naming a long path.
func adv2Tail(err error) string {
	if err == nil {
		return "<nil>"
	}
	msg := err.Error()
	if i := strings.Index(msg, ": open "); i >= 0 {
		if j := strings.LastIndex(msg, ": "); j > i {
			return msg[:i] + ": open locks/…" + msg[j:]
		}
	}
	return msg
}

func (s *fileSystemStorage) adv2Holder(name string) string {
	s.locks.mu.Lock()
	defer s.locks.mu.Unlock()
	if h := s.locks.held[name]; h != nil {
		return h.holder
	}
	return ""
}

// Attack (fixed): a plain certmagic.FileStorage replica that locked and released
// a name leaves its refresher asleep for up to 5 s (it stops only when it
// finds no file). When this storage locks the name meanwhile, that
// refresher wakes, decodes this storage's file into FileStorage's lockMeta
// (no "holder") and rewrites it without the holder. This storage's
// refresher then stops, and its Unlock finds holder "" != its own: it
// reports the lock "lost: taken over as stale" (it was not) and leaves the
// file, which FileStorage's refresher keeps fresh every 5 s from then on,
// since it never disappears: the name stays locked against every replica,
// past any staleness, for as long as the plain process lives. FileStorage
// alone would have removed the file on Unlock (ending its refresher).
// Takes ~10.7 s (the second look is past the lock's staleness).
// Fixed: a file naming no holder, created when this holder's was, is
// this holder's (heldLock.owns); its refresher names it again.
func TestAdv2FileLockPlainRefresherErasesHolderLocksNameForever(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	plain := &certmagic.FileStorage{Path: dir}
	s, other := advStorage(dir), advStorage(dir)
	ctx := context.Background()
	file := s.lockFile("x")
	// Ends FileStorage's leftover refresher (it stops once the file is gone).
	defer os.Remove(file)
	if err := plain.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if err := plain.Unlock(ctx, "x"); err != nil { // its refresher sleeps on
		t.Fatal(err)
	}
	if err := s.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	locked := time.Now()
	time.Sleep(lockFresh + 400*time.Millisecond) // FileStorage's refresher wakes first
	meta, _ := readLock(file)
	errUnlock := s.Unlock(ctx, "x")
	released := time.Now()
	ok, err := other.TryLock(ctx, "x")
	if ok {
		_ = other.Unlock(ctx, "x")
	}
	if errUnlock != nil || !ok {
		t.Errorf("a lock held by this storage alone, its file rewritten by FileStorage's leftover refresher (holder now %q): Unlock = %v; another replica's TryLock after it = (%v, %v)",
			meta.Holder, errUnlock, ok, err)
	}
	// This storage last wrote the file when it locked it (its refresher
	// stopped at its first tick): stale by now, had nothing else kept it.
	time.Sleep(time.Until(locked.Add(lockStale + 600*time.Millisecond)))
	if ok, err := other.TryLock(ctx, "x"); ok {
		_ = other.Unlock(ctx, "x")
	} else {
		meta, _ := readLock(file)
		t.Errorf("%v after it was locked (and released at %v), the name is still locked (TryLock = %v, %v): its file, refreshed %v ago by FileStorage's leftover refresher, outlives every staleness",
			time.Since(locked).Round(100*time.Millisecond), released.Sub(locked).Round(100*time.Millisecond), ok, err, time.Since(meta.Updated).Round(10*time.Millisecond))
	}
}

// Attack (fixed): a lock name whose lock file fits the file system's 255-byte
// name limit but whose takeover marker (<name>.lock.takeover, 9 bytes
// longer) does not can never be taken over as stale: with a crashed
// holder's file left behind, TryLock and Lock fail at once with "creating
// lock takeover file: file name too long", forever, on every replica
// (plain FileStorage takes the same stale lock over). Names of 242..250
// safe characters are otherwise good lock names: they lock and unlock.
// Fixed: a takeover file whose name would pass 255 bytes is named by a
// hash of the lock file's name (takeoverFile).
func TestAdv2FileLockLongNameStaleLockNeverTakenOver(t *testing.T) {
	dir := t.TempDir()
	s := advStorage(dir)
	ctx := context.Background()
	name := strings.Repeat("n", 245) // locks/nnn….lock: 250 bytes
	if err := s.Lock(ctx, name); err != nil {
		t.Fatalf("a %d-byte name cannot be locked at all: %v", len(name), err)
	}
	if err := s.Unlock(ctx, name); err != nil {
		t.Fatal(err)
	}
	adv2WriteStale(t, s.lockFile(name)) // its holder crashed
	ok, err := s.TryLock(ctx, name)
	if ok {
		defer s.Unlock(ctx, name)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	var lockErr error
	if !ok {
		if lockErr = s.Lock(short, name); lockErr == nil {
			ok = true
			defer s.Unlock(ctx, name)
		}
	}
	if !ok {
		t.Errorf("a stale lock of a %d-byte name never taken over: TryLock = %v, Lock = %v", len(name), adv2Tail(err), adv2Tail(lockErr))
	}
}

// Attack (fixed): "a storage does not take over a name it holds" is keyed by the
// name as given, but the lock file by certmagic.StorageKeys.Safe(name):
// "Job" and "job" (or "a/b" and "ab") are one lock file. With the
// process paused past 10 s (both goroutines were paused: its own
// refresher had no chance to run), a goroutine of the same storage locking
// "job" takes over the lock the storage holds as "Job": two holders in
// one process, the very case the earlier fix rules out for equal names.
// Fixed: a storage's held locks are keyed by the safe name, as their
// files are.
func TestAdv2FileLockCollidingNameSameStorageTakesOverItsOwnLock(t *testing.T) {
	dir := t.TempDir()
	s := advStorage(dir)
	ctx := context.Background()
	if err := s.Lock(ctx, "Job"); err != nil {
		t.Fatal(err)
	}
	advMakeStale(t, s.lockFile("Job"))
	ok, err := s.TryLock(ctx, "job")
	errOld := s.Unlock(ctx, "Job")
	if ok {
		_ = s.Unlock(ctx, "job")
		t.Errorf("a storage holding %q took over its own lock file as %q (err %v): both held at once, and the first holder's Unlock says %v",
			"Job", "job", err, errOld)
	}
}

// Attack (fixed): Unlock reads its file, finds its holder, then removes the file
// by name: not atomic against a takeover. A holder paused past 10 s that
// calls Unlock as it resumes, while a waiter takes the lock over, has its
// check pass on its own (stale) file, the waiter removes that and creates
// its own, and the Unlock then removes the waiter's fresh file and returns
// nil (no "lock lost"): the new holder, never paused, holds a lock with no
// file, and the next replica takes it too: two holders. The documented
// limit is only that the paused holder loses its lock and is told so.
// Fixed: Unlock looks and removes as the one holding the takeover file
// (withTakeover), as a replica taking the lock over does.
func TestAdv2FileLockUnlockRemovesTakerOversFreshFile(t *testing.T) {
	dir := t.TempDir()
	s := advStorage(dir)
	takers := []*fileSystemStorage{advStorage(dir), advStorage(dir)}
	ctx := context.Background()
	file := s.lockFile("x")
	deadline := time.Now().Add(3 * time.Second)
	for rounds := 1; time.Now().Before(deadline); rounds++ {
		if err := s.Lock(ctx, "x"); err != nil {
			t.Fatal(err)
		}
		advMakeStale(t, file) // paused past 10 s, resuming into Unlock
		var wg sync.WaitGroup
		start := make(chan struct{})
		won := make([]bool, len(takers))
		var errS error
		wg.Go(func() { <-start; errS = s.Unlock(ctx, "x") })
		for i, tk := range takers {
			wg.Go(func() { <-start; won[i], _ = tk.TryLock(ctx, "x") })
		}
		close(start)
		wg.Wait()
		var holders []string
		orphan := false
		meta, _ := readLock(file)
		for i, tk := range takers {
			if won[i] {
				h := tk.adv2Holder("x")
				holders = append(holders, h)
				orphan = orphan || meta.Holder != h
			}
		}
		for i, tk := range takers {
			if won[i] {
				_ = tk.Unlock(ctx, "x")
			}
		}
		_ = os.Remove(file)
		if errS == nil && orphan {
			t.Fatalf("round %d: the paused holder's Unlock returned nil while %d replica(s) took the lock over; the file names %q, not every holder of %q: a fresh holder's file removed under it",
				rounds, len(holders), meta.Holder, holders)
		}
	}
}

// Attack (fixed): (minor) TryLock on a free lock (a crashed replica's stale lock
// file, and its stale takeover marker: it died taking the lock over)
// returns false: takeOver removes the stale marker and gives up instead of
// taking the lock over. A TryLock-only caller (mcpstate's Sweep) skips a
// round; plain FileStorage's TryLock takes such a lock.
// Fixed: a stale takeover file removed, withTakeover creates its own.
func TestAdv2FileLockTryLockFalseOnStaleLockWithStaleMarker(t *testing.T) {
	dir := t.TempDir()
	s := advStorage(dir)
	ctx := context.Background()
	file := s.lockFile("sweep")
	adv2WriteStale(t, file)
	old := time.Now().Add(-time.Minute)
	if err := os.WriteFile(file+".takeover", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(file+".takeover", old, old); err != nil {
		t.Fatal(err)
	}
	ok, err := s.TryLock(ctx, "sweep")
	if ok {
		_ = s.Unlock(ctx, "sweep")
	}
	if !ok {
		t.Errorf("TryLock of a stale lock (its stale takeover marker left by a crash) = (%v, %v)", ok, err)
	}
}

// Holds: a Lock takes at once a stale lock whose stale takeover marker a
// crashed replica left. Replicas racing to take such a lock over (never
// two holders) are TestTakeoverAdvDeadReplicasFilesOneHolder's: that race
// failed about once in ten runs while a takeover file judged stale was
// removed by name (two replicas judged the crashed one's stale, the first
// removed it and created its own, the second then removed that fresh one
// and created its own, and both removed the stale lock file, the second
// after the first had made its own). Fixed: on unix the takeover file is
// an flock (holdTakeover), never stale.
func TestAdv2FileLockStaleMarkerTakenAtOnce(t *testing.T) {
	dir := t.TempDir()
	stores := []*fileSystemStorage{advStorage(dir)}
	ctx := context.Background()
	file := stores[0].lockFile("x")
	marker := file + ".takeover"
	old := time.Now().Add(-time.Minute)
	adv2WriteStale(t, file)
	_ = os.WriteFile(marker, nil, 0o644)
	_ = os.Chtimes(marker, old, old)
	lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := stores[0].Lock(lctx, "x"); err != nil {
		t.Fatalf("Lock of a stale lock with a stale marker: %v", err)
	}
	_ = stores[0].Unlock(ctx, "x")
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the crashed replica's marker left behind: %v", err)
	}
}

// Holds: readers racing the holder's refresh (WriteAt of a shorter or
// longer record, then Truncate: a torn file for a moment) never judge the
// fresh lock stale, another replica never takes it, and FileStorage's way
// of reading a lock file (json.Decoder, first value) never fails on it.
func TestAdv2FileLockTornRefreshNeverStale(t *testing.T) {
	dir := t.TempDir()
	s, other := advStorage(dir), advStorage(dir)
	ctx := context.Background()
	if err := s.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	defer s.Unlock(ctx, "x")
	s.locks.mu.Lock()
	h := s.locks.held["x"]
	s.locks.mu.Unlock()
	file := s.lockFile("x")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			if !h.refreshOnce(file) {
				t.Error("the holder's refresh failed")
				return
			}
		}
	})
	deadline := time.Now().Add(time.Second)
	plainErrs := 0
	for time.Now().Before(deadline) {
		if stale, err := lockIsStale(file); stale || err != nil {
			t.Errorf("a lock being refreshed judged stale=%v err=%v", stale, err)
			break
		}
		if ok, _ := other.TryLock(ctx, "x"); ok {
			t.Error("another replica took a lock being refreshed")
			_ = other.Unlock(ctx, "x")
			break
		}
		if f, err := os.Open(file); err == nil { // as FileStorage's obtainLock reads it
			var meta struct{ Created, Updated time.Time }
			if err := json.NewDecoder(f).Decode(&meta); err != nil || time.Since(meta.Updated) > lockStale {
				plainErrs++
			}
			f.Close()
		}
	}
	stop.Store(true)
	wg.Wait()
	if plainErrs > 0 {
		t.Errorf("FileStorage's reading of a lock being refreshed failed or found it stale %d times", plainErrs)
	}
}

// Holds: cancellation and interleavings within one storage: a Lock
// cancelled while waiting leaves nothing held and no goroutine; Unlock of
// a name only waited for errors without touching the holder's file;
// colliding names on one storage exclude each other while fresh.
func TestAdv2FileLockCancelAndCollidingNamesFresh(t *testing.T) {
	dir := t.TempDir()
	s, other := advStorage(dir), advStorage(dir)
	ctx := context.Background()
	if err := other.Lock(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			defer cancel()
			if err := s.Lock(cctx, "w"); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lock past its context: %v", err)
			}
		})
	}
	wg.Wait()
	if err := s.Unlock(ctx, "w"); err == nil {
		t.Error("Unlock of a lock only waited for: no error")
	}
	if ok, _ := s.TryLock(ctx, "W"); ok {
		t.Error("a colliding name of a held lock taken")
	}
	if err := other.Unlock(ctx, "w"); err != nil {
		t.Errorf("the holder's Unlock after others' cancelled waits: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	if after := runtime.NumGoroutine(); after > before+1 {
		t.Errorf("cancelled waits left %d goroutines", after-before)
	}
	s.locks.mu.Lock()
	n := len(s.locks.held)
	s.locks.mu.Unlock()
	if n != 0 {
		t.Errorf("cancelled waits left %d held entries", n)
	}

	// One storage, colliding names, goroutines: one at a time.
	var in, worst atomic.Int32
	names := []string{"Sess", "sess", "SESS", " sess "}
	for i := range 4 {
		wg.Go(func() {
			for range 20 {
				if err := s.Lock(ctx, names[i]); err != nil {
					t.Error(err)
					return
				}
				if v := in.Add(1); v > worst.Load() {
					worst.Store(v)
				}
				time.Sleep(200 * time.Microsecond)
				in.Add(-1)
				if err := s.Unlock(ctx, names[i]); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if worst.Load() > 1 {
		t.Errorf("%d holders of colliding names at once", worst.Load())
	}
}
