package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Attack (fixed): a lock of the file_system storage taken and released many
// times a second (a caller's MCP sessions, approvals) left a refresher
// goroutine behind each time, which lived on while the name was locked
// again and rewrote the next holder's file every 5 s: thousands piled up
// under steady use, logging errors; and a waiting replica polled once a
// second.
// Fixed: a lock's refresher ends with the lock (filelock.go).
func TestFileSystemLocksLeaveNothingBehind(t *testing.T) {
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	ctx := context.Background()
	before := runtime.NumGoroutine()
	for range 300 {
		if err := storage.Lock(ctx, "busy"); err != nil {
			t.Fatal(err)
		}
		if err := storage.Unlock(ctx, "busy"); err != nil {
			t.Fatal(err)
		}
	}
	var after int
	for range 100 { // goroutines exit a moment after their stop
		if after = runtime.NumGoroutine(); after <= before+2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after > before+2 {
		t.Errorf("300 locks taken and released left %d goroutines behind", after-before)
	}
}

// Holds: two replicas (two storages over one directory) locking one name
// exclude each other: 200 read-increment-writes under the lock lose none.
func TestFileSystemLocksExcludeReplicas(t *testing.T) {
	dir := t.TempDir()
	replicas := []certmagic.Storage{SafeListing(&certmagic.FileStorage{Path: dir}), SafeListing(&certmagic.FileStorage{Path: dir})}
	ctx := context.Background()
	if err := replicas[0].Store(ctx, "counter", []byte("0")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		s := replicas[i%2]
		wg.Go(func() {
			for range 50 {
				if err := s.Lock(ctx, "counter"); err != nil {
					t.Error(err)
					return
				}
				data, _ := s.Load(ctx, "counter")
				n, _ := strconv.Atoi(string(data))
				_ = s.Store(ctx, "counter", []byte(strconv.Itoa(n+1)))
				_ = s.Unlock(ctx, "counter")
			}
		})
	}
	wg.Wait()
	if data, _ := replicas[1].Load(ctx, "counter"); string(data) != "200" {
		t.Errorf("200 increments under the lock on two replicas: %s", data)
	}
}

// Holds: the locks are certmagic's FileStorage locks on disk: one held by
// FileStorage (an older replica) keeps this one out and the other way
// round, a stale one is taken over, and a wait ends with its context.
func TestFileSystemLocksAreFileStorages(t *testing.T) {
	dir := t.TempDir()
	plain := &certmagic.FileStorage{Path: dir}
	storage := SafeListing(&certmagic.FileStorage{Path: dir}).(*fileSystemStorage)
	ctx := context.Background()
	if err := plain.Lock(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if ok, err := storage.TryLock(ctx, "shared"); ok || err != nil {
		t.Fatalf("a lock FileStorage holds: taken (%v, %v)", ok, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := storage.Lock(short, "shared"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for a held lock past the context: %v", err)
	}
	if err := plain.Unlock(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if err := storage.Lock(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := plain.TryLock(ctx, "shared"); ok {
		t.Fatal("FileStorage took a lock this storage holds")
	}
	if err := storage.Unlock(ctx, "shared"); err != nil {
		t.Fatal(err)
	}

	// A lock whose holder died: refreshed a minute ago, and one left empty.
	old := time.Now().Add(-time.Minute)
	data, _ := json.Marshal(lockMeta{Created: old, Updated: old})
	if err := os.WriteFile(storage.lockFile("dead"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := storage.lockFile("empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(empty, old, old); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dead", "empty"} {
		if ok, err := storage.TryLock(ctx, name); !ok || err != nil {
			t.Errorf("a stale lock %q: not taken over (%v, %v)", name, ok, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "locks", "dead.lock")); err != nil {
		t.Errorf("the lock taken over: %v", err)
	}
}

// Regression: a refresh rewrites the lock file in place while other
// replicas read it without a lock. Its times were written by
// encoding/json, which drops the fraction's trailing zeros: one refresh
// came out a byte or more shorter or longer than the last, and a read
// during the rewrite found a text cut short or torn (FileStorage could not
// parse it; TestAdv2FileLockTornRefreshNeverStale saw it under load). Every
// text of one holder is now as long as every other, and reads back as
// written, by this storage and as FileStorage reads it.
func TestLockFileTextHasOneLength(t *testing.T) {
	created := time.Date(2026, 12, 7, 10, 15, 59, 123456789, time.FixedZone("CET", 3600))
	const holder = "H7ZK2QW3XJ5NRB4MDV6TLYPCEA"
	var length int
	for i, updated := range []time.Time{
		created,
		time.Date(2026, 12, 7, 10, 16, 0, 0, time.UTC),
		time.Date(2026, 12, 7, 10, 16, 0, 100000000, time.UTC),
		time.Date(2026, 12, 7, 10, 16, 0, 120000000, time.Local),
		time.Date(2027, 1, 1, 0, 0, 0, 1, time.UTC),
	} {
		text := lockMeta{Created: created, Updated: updated, Holder: holder}.encode()
		if i == 0 {
			length = len(text)
		} else if len(text) != length {
			t.Errorf("the lock file's text at %v is %d bytes, at %v %d: %s", created, length, updated, len(text), text)
		}
		var mine lockMeta
		if err := json.Unmarshal(text, &mine); err != nil || !mine.Created.Equal(created) || !mine.Updated.Equal(updated) || mine.Holder != holder {
			t.Errorf("%s read back as %+v, %v", text, mine, err)
		}
		var theirs struct{ Created, Updated time.Time } // as FileStorage reads it
		if err := json.Unmarshal(text, &theirs); err != nil || !theirs.Updated.Equal(updated) {
			t.Errorf("%s read by FileStorage as %+v, %v", text, theirs, err)
		}
	}
}
