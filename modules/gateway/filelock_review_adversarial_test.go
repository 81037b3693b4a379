package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

func advStorage(dir string) *fileSystemStorage {
	return SafeListing(&certmagic.FileStorage{Path: dir}).(*fileSystemStorage)
}

// advMakeStale rewrites a held lock's file in place (same inode) as if its
// refresher had not run for a minute: the holder's process was paused (GC,
// SIGSTOP, VM migration, a clock step) while it held the lock.
func advMakeStale(t *testing.T, file string) {
	t.Helper()
	old := time.Now().Add(-time.Minute)
	held, _ := readLock(file)
	data, _ := json.Marshal(lockMeta{Created: old, Updated: old, Holder: held.Holder})
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
}

// Attack (fixed): several replicas taking over one stale lock at once end up with
// two holders: one has read the file as stale, another removes it and
// creates its own, then the first removes that fresh file (os.Remove
// without a check) and creates its own too.
// Fixed: one replica at a time takes a stale lock over (the one that
// created its takeover file), judging it stale again first.
func TestAdvFileLockStaleTakeoverRaceTwoHolders(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	stores := make([]*fileSystemStorage, n)
	for i := range stores {
		stores[i] = advStorage(dir)
	}
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	stale, _ := json.Marshal(lockMeta{Created: old, Updated: old})
	file := stores[0].lockFile("job")
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	worst, rounds := 0, 0
	deadline := time.Now().Add(3 * time.Second)
	for ; rounds < 2000 && worst < 2 && time.Now().Before(deadline); rounds++ {
		if err := os.WriteFile(file, stale, 0o644); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var got atomic.Int32
		start := make(chan struct{})
		won := make([]bool, n)
		for i, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ok, err := s.TryLock(ctx, "job")
				if err != nil {
					t.Error(err)
				}
				if ok {
					won[i] = true
					got.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		worst = max(worst, int(got.Load()))
		for i, s := range stores {
			if won[i] {
				_ = s.Unlock(ctx, "job")
			}
		}
		_ = os.Remove(file)
	}
	if worst > 1 {
		t.Errorf("a stale lock taken over by %d replicas at once: %d hold it (round %d)", n, worst, rounds)
	}
}

// Attack (fixed): Unlock of a name this storage never locked removes the lock file
// another replica holds (no ownership check), and a third replica then
// takes it: two holders.
// Fixed: Unlock releases only a lock this storage holds, and removes only
// a file naming its holder.
func TestAdvFileLockUnlockNeverLockedFreesOthers(t *testing.T) {
	dir := t.TempDir()
	holder, stray, third := advStorage(dir), advStorage(dir), advStorage(dir)
	ctx := context.Background()
	if err := holder.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(ctx, "x")
	err := stray.Unlock(ctx, "x")
	if err == nil {
		t.Error("Unlock of a lock this storage does not hold reported no error")
	}
	if ok, _ := third.TryLock(ctx, "x"); ok {
		defer third.Unlock(ctx, "x")
		t.Errorf("Unlock by a storage that never locked %q returned %v and released the holder's lock: a third replica took it while the first still holds it", "x", err)
	}
}

// Attack (fixed): a holder whose lock was taken over as stale (its process paused
// past 10 s) releases, on its Unlock, the new holder's lock file: a third
// replica then takes it while the second still holds it.
// Fixed: the file names its holder; Unlock leaves another's and reports
// the lock lost.
func TestAdvFileLockUnlockAfterTakeoverFreesNewHolder(t *testing.T) {
	dir := t.TempDir()
	a, b, c := advStorage(dir), advStorage(dir), advStorage(dir)
	ctx := context.Background()
	if err := a.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	advMakeStale(t, a.lockFile("x"))
	if ok, err := b.TryLock(ctx, "x"); !ok || err != nil {
		t.Fatalf("the stale lock not taken over: %v %v", ok, err)
	}
	defer b.Unlock(ctx, "x")
	errA := a.Unlock(ctx, "x") // a's critical section ends
	if errA == nil || !strings.Contains(errA.Error(), "lost") {
		t.Errorf("the late holder's Unlock: %v, not the lock reported lost", errA)
	}
	if ok, _ := c.TryLock(ctx, "x"); ok {
		defer c.Unlock(ctx, "x")
		t.Errorf("the late holder's Unlock (err %v, no 'lock lost') removed the new holder's lock file: a third replica took it while the second holds it", errA)
	}
}

// Attack (fixed): within one storage, a goroutine taking over its own process's
// stale lock, then the old holder's Unlock, leaves the new holder with no
// lock file and no refresher (the held map is by name only).
// Fixed: a name this storage holds is not taken over by it (its refresher
// is alive): the second goroutine waits for the first one's Unlock.
func TestAdvFileLockSameStorageTakeoverThenOldUnlock(t *testing.T) {
	dir := t.TempDir()
	s, other := advStorage(dir), advStorage(dir)
	ctx := context.Background()
	if err := s.Lock(ctx, "x"); err != nil { // goroutine A
		t.Fatal(err)
	}
	advMakeStale(t, s.lockFile("x"))
	if ok, err := s.TryLock(ctx, "x"); ok || err != nil { // goroutine B
		t.Fatalf("a lock this storage holds taken over by it: %v %v", ok, err)
	}
	if err := s.Unlock(ctx, "x"); err != nil { // A's release
		t.Fatal(err)
	}
	if ok, err := s.TryLock(ctx, "x"); !ok || err != nil { // B again
		t.Fatalf("the lock released not taken: %v %v", ok, err)
	}
	defer s.Unlock(ctx, "x")
	if ok, _ := other.TryLock(ctx, "x"); ok {
		defer other.Unlock(ctx, "x")
		t.Errorf("another replica took the lock B holds")
	}
}

// Attack (fixed): the refresher of a lock taken over as stale keeps writing into
// the new holder's lock file: the new file reuses the removed file's inode
// (ext4 does) so os.SameFile(info, created) holds. The dead lock of the new
// holder would be kept fresh by the old holder's refresher. Takes ~5.5 s.
// Fixed: the refresher writes only into the file it opened and found
// naming its holder.
func TestAdvFileLockOldRefresherWritesNewHoldersFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := advStorage(dir), advStorage(dir)
	ctx := context.Background()
	file := a.lockFile("x")
	if err := a.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	defer a.Unlock(ctx, "x")
	lockedA := time.Now()
	infoA, _ := os.Stat(file)
	time.Sleep(700 * time.Millisecond) // so that the two refreshers tick apart
	advMakeStale(t, file)
	beforeB := time.Now()
	if ok, err := b.TryLock(ctx, "x"); !ok || err != nil {
		t.Fatalf("the stale lock not taken over: %v %v", ok, err)
	}
	infoB, _ := os.Stat(file)
	var metaB lockMeta
	data, _ := os.ReadFile(file)
	_ = json.Unmarshal(data, &metaB)
	// a's refresher ticks at lockedA+5s, b's at about lockedA+5.7s.
	time.Sleep(time.Until(lockedA.Add(lockFresh + 300*time.Millisecond)))
	data, _ = os.ReadFile(file)
	readAt := time.Now()
	var now lockMeta
	_ = json.Unmarshal(data, &now)
	if now.Holder != metaB.Holder {
		t.Errorf("the taken-over holder's refresher wrote its own lock over the new holder's (same inode reused: %v): holder %q -> %q",
			os.SameFile(infoA, infoB), metaB.Holder, now.Holder)
	}
	// A newer time is a's write only while b's own refresher cannot have
	// ticked yet: a sleep that overshot (a loaded machine) tells nothing.
	if readAt.Before(beforeB.Add(lockFresh)) && now.Updated.After(metaB.Updated) {
		t.Errorf("the taken-over holder's refresher rewrote the new holder's lock file (same inode reused: %v): created %v -> %v",
			os.SameFile(infoA, infoB), metaB.Created, now.Created)
	}
}

// Attack (fixed): an Unlock at the moment of its lock's refresh can leave the lock
// file behind: Unlock closes stop and removes the file without waiting for
// the refresher, which had passed its stop check and Stat, and whose
// os.WriteFile (O_CREATE|O_TRUNC) recreates the file: a released lock that
// keeps every replica out for 10 s (or a write into the next holder's
// file). Takes ~5.5 s.
// Fixed: Unlock waits for the refresher to end, which never creates the
// file.
func TestAdvFileLockRefresherRecreatesReleasedLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := advStorage(dir)
	ctx := context.Background()
	const n = 3000
	var wg sync.WaitGroup
	for i := range n {
		name := "n" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + "_" + itoa(i)
		if err := s.Lock(ctx, name); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		time.AfterFunc(lockFresh, func() { defer wg.Done(); _ = s.Unlock(ctx, name) })
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond)
	entries, _ := os.ReadDir(filepath.Join(dir, "locks"))
	if len(entries) > 0 {
		t.Errorf("%d of %d locks released at their refresh left a lock file behind (e.g. %s): held for 10 s more against every replica", len(entries), n, entries[0].Name())
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// Holds: a lock held 11 s is refreshed and not taken over as stale by
// another replica nor by plain FileStorage. Takes ~11 s.
func TestAdvFileLockHeldPastStaleIsRefreshed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, other := advStorage(dir), advStorage(dir)
	plain := &certmagic.FileStorage{Path: dir}
	ctx := context.Background()
	if err := s.Lock(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	defer s.Unlock(ctx, "long")
	end := time.Now().Add(lockStale + time.Second)
	for time.Now().Before(end) {
		if ok, _ := other.TryLock(ctx, "long"); ok {
			t.Fatal("a lock held and refreshed taken over by another replica")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ok, _ := plain.TryLock(ctx, "long"); ok {
		t.Fatal("a lock held and refreshed taken over by FileStorage")
	}
}

// Holds: goroutines of one storage exclude each other, and leave the held
// map empty.
func TestAdvFileLockOneStorageGoroutinesExclude(t *testing.T) {
	s := advStorage(t.TempDir())
	ctx := context.Background()
	var in, worst atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 30 {
				if err := s.Lock(ctx, "c"); err != nil {
					t.Error(err)
					return
				}
				v := in.Add(1)
				if v > worst.Load() {
					worst.Store(v)
				}
				time.Sleep(100 * time.Microsecond)
				in.Add(-1)
				if err := s.Unlock(ctx, "c"); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if worst.Load() > 1 {
		t.Errorf("%d goroutines held the lock at once", worst.Load())
	}
	s.locks.mu.Lock()
	defer s.locks.mu.Unlock()
	if len(s.locks.held) != 0 {
		t.Errorf("held map left with %d entries", len(s.locks.held))
	}
}

// Holds: a wait ends promptly with its context (mid-backoff), and names
// with "..", "/" stay in the locks directory (colliding names such as "A"
// and "a" or "a/b" and "ab" exclude each other: contention only, the
// FileStorage format).
func TestAdvFileLockCtxAndNames(t *testing.T) {
	dir := t.TempDir()
	s, other := advStorage(dir), advStorage(dir)
	ctx := context.Background()
	if err := other.Lock(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	defer other.Unlock(ctx, "w")
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(400*time.Millisecond, cancel)
	start := time.Now()
	if err := s.Lock(cctx, "w"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock past cancel: %v", err)
	}
	if d := time.Since(start); d > 400*time.Millisecond+300*time.Millisecond {
		t.Errorf("Lock returned %v after its cancel", d-400*time.Millisecond)
	}
	for _, name := range []string{"..", "../../etc/x", "a/../../b", "/abs", " ", ""} {
		f := s.lockFile(name)
		if filepath.Dir(f) != filepath.Join(dir, "locks") {
			t.Errorf("%q locks %s", name, f)
		}
	}
	if err := s.Lock(ctx, "a/b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := other.TryLock(ctx, "AB"); ok {
		t.Error("colliding names did not exclude each other")
	}
	_ = s.Unlock(ctx, "a/b")
}
