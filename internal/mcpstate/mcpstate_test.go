package mcpstate

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/written"
)

func keyring(t *testing.T, secrets ...string) *seal.Keyring {
	t.Helper()
	var bs [][]byte
	for _, s := range secrets {
		bs = append(bs, []byte(s))
	}
	r, err := seal.New(Purpose, bs...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// An id opens with the ring that sealed it, or one that kept its secret as
// a previous one; anything else (another secret, another purpose, a changed
// byte, a truncated or oversized text) is ErrBadID, and the id is bound to
// its owner and expiry.
func TestIDSealedBoundAndRotatable(t *testing.T) {
	oldRing := keyring(t, "old-secret-0123456789-0123456789-xx")
	expires := time.Unix(1_900_000_000, 0)
	id := ID{Ref: NewRef(), Expires: expires, Owner: Owner("alice", "s1"), Service: "tracker", Session: "s1"}
	text := Seal(oldRing, id)

	got, err := Open(oldRing, text)
	if err != nil || got != id {
		t.Fatalf("Open = %+v, %v; want %+v", got, err, id)
	}
	if !got.Owns("alice", "s1") || got.Owns("alice", "s2") || got.Owns("bob", "s1") || got.Owns("alices1", "") {
		t.Error("Owns does not bind the id to exactly its caller and toolgate session")
	}
	if got.Expired(expires.Add(-time.Second)) || !got.Expired(expires) {
		t.Error("Expired is wrong at its edge")
	}
	rotated := keyring(t, "new-secret-0123456789-0123456789-xx", "old-secret-0123456789-0123456789-xx")
	if got, err := Open(rotated, text); err != nil || got != id {
		t.Errorf("after rotation: %+v, %v", got, err)
	}
	if _, err := Open(oldRing, Seal(rotated, id)); !errors.Is(err, ErrBadID) {
		t.Errorf("an id sealed with the new secret opened under the old one alone: %v", err)
	}
	otherPurpose, _ := seal.New("another purpose", []byte("old-secret-0123456789-0123456789-xx"))
	raw, _ := base64.RawURLEncoding.DecodeString(text)
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-1] ^= 1
	for name, bad := range map[string]string{
		"another secret":    Seal(keyring(t, "mallory-0123456789-0123456789-xxxxx"), id),
		"another purpose":   base64.RawURLEncoding.EncodeToString(otherPurpose.Seal(raw, ad)),
		"a changed byte":    base64.RawURLEncoding.EncodeToString(flipped),
		"truncated":         text[:len(text)-4],
		"not base64url":     text[:10] + "+/" + text[12:],
		"empty":             "",
		"oversized":         strings.Repeat("A", maxIDText+1),
		"a random UUID-ish": "5f0c6a2e-9d1b-4c59-9b7e-0a3f3a9e4c11",
	} {
		if _, err := Open(rotated, bad); !errors.Is(err, ErrBadID) {
			t.Errorf("%s: Open = %v, want ErrBadID", name, err)
		}
	}
	for _, c := range text {
		if c <= 0x20 || c >= 0x7f {
			t.Fatalf("the id %q holds %q, not visible ASCII", text, c)
		}
	}
}

func testStore(t *testing.T, storage certmagic.Storage, clock *time.Time) *Store {
	t.Helper()
	return New(storage, time.Hour, 12*time.Hour, func() time.Time { return *clock })
}

func record(user string) *Record {
	return &Record{Ref: NewRef(), User: user, Service: "svc", Created: time.Now(), Expires: time.Now().Add(time.Hour),
		Upstream: Upstream{SessionID: "up-1", ProtocolVersion: "2025-11-25", Generation: 1}, Initialize: []byte(`{"protocolVersion":"2025-11-25"}`)}
}

// A session exists from Create to End for every store on the storage;
// Update changes it under its lock and refuses an ended one; End twice
// reports the second as not found.
func TestStoreLifecycleAcrossStores(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, b := testStore(t, storage, &clock), testStore(t, storage, &clock)
	ctx := context.Background()
	rec := record("alice")
	if _, err := a.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := b.Load(ctx, rec.Ref)
	if err != nil || got.User != "alice" || got.Upstream != rec.Upstream || string(got.Initialize) != string(rec.Initialize) {
		t.Fatalf("another store reads %+v, %v", got, err)
	}
	if _, err := b.Update(ctx, rec.Ref, func(r *Record) error { r.Upstream.Generation = 2; return nil }); err != nil {
		t.Fatal(err)
	}
	refuse := errors.New("refused")
	if _, err := a.Update(ctx, rec.Ref, func(r *Record) error { r.Upstream.Generation = 99; return refuse }); !errors.Is(err, refuse) {
		t.Fatalf("Update with a refusing fn: %v", err)
	}
	if got, _ := a.Load(ctx, rec.Ref); got.Upstream.Generation != 2 {
		t.Errorf("generation %d, want 2 (a refused update changed the record)", got.Upstream.Generation)
	}
	if n, err := a.CountUser(ctx, "alice", 100); err != nil || n != 1 {
		t.Errorf("CountUser = %d, %v", n, err)
	}
	if ended, err := b.End(ctx, rec.Ref, false); err != nil || ended.Upstream.SessionID != "up-1" {
		t.Fatalf("End = %+v, %v", ended, err)
	}
	if _, err := a.Load(ctx, rec.Ref); !errors.Is(err, ErrNotFound) {
		t.Errorf("Load after End: %v", err)
	}
	if _, err := a.End(ctx, rec.Ref, false); !errors.Is(err, ErrNotFound) {
		t.Errorf("End twice: %v", err)
	}
	if _, err := a.Update(ctx, rec.Ref, func(*Record) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("Update after End: %v", err)
	}
	if n, _ := a.CountUser(ctx, "alice", 100); n != 0 {
		t.Errorf("CountUser after End = %d", n)
	}
}

// Sessions updated and ended leave no lock behind in the store (one per
// session ever seen grew without bound), and one session's callers still
// queue on its lock.
func TestLocksOfEndedSessionsAreFreed(t *testing.T) {
	clock := time.Now()
	s := testStore(t, &certmagic.FileStorage{Path: t.TempDir()}, &clock)
	ctx := context.Background()
	for range 50 {
		rec := record("alice")
		if _, err := s.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Update(ctx, rec.Ref, func(r *Record) error { r.Upstream.Generation++; return nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.End(ctx, rec.Ref, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.locks.held(); n != 0 {
		t.Fatalf("50 ended sessions left %d locks", n)
	}

	rec := record("alice")
	if _, err := s.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := s.Update(ctx, rec.Ref, func(r *Record) error {
				n := inside.Add(1)
				if n > most.Load() {
					most.Store(n)
				}
				r.Upstream.Generation++
				inside.Add(-1)
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.Load(ctx, rec.Ref); most.Load() != 1 || got.Upstream.Generation != 9 {
		t.Errorf("8 concurrent updates: at most %d at once, generation %d; want 1 and 9", most.Load(), got.Upstream.Generation)
	}
	if n := s.locks.held(); n != 0 {
		t.Errorf("%d locks left after the updates", n)
	}
}

// Index entries left by a session whose record is gone (a replica died
// part way) are not counted once the count reaches the limit, and are
// removed; one younger than written.Grace is a session being created (its
// record on its way) and is kept and counted.
func TestCountUserDropsLeftovers(t *testing.T) {
	clock := time.Now()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	s := testStore(t, storage, &clock)
	ctx := context.Background()
	live := record("alice")
	if _, err := s.Create(ctx, live); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		dead := record("alice")
		if _, err := s.Create(ctx, dead); err != nil {
			t.Fatal(err)
		}
		if err := storage.Delete(ctx, stateKey(dead.Ref)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			continue // young: a creation under way
		}
		old := time.Now().Add(-written.Grace - time.Minute)
		if err := os.Chtimes(storage.Filename(userKey("alice", dead.Ref)), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := s.CountUser(ctx, "alice", 10); n != 4 {
		t.Errorf("under the limit: %d, want the cheap count of 4 entries", n)
	}
	if n, err := s.CountUser(ctx, "alice", 4); err != nil || n != 2 {
		t.Errorf("at the limit: %d, %v, want the live session and the one being created", n, err)
	}
	if n, _ := s.CountUser(ctx, "alice", 10); n != 2 {
		t.Errorf("old leftovers were not removed, or the young entry was: %d", n)
	}
}

// The sweep ends the sessions whose newest mark is older than the idle
// timeout, keeps those marked since (by any replica) or in use here, and
// reads only old windows.
func TestSweepEndsOnlyIdleSessions(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, b := testStore(t, storage, &clock), testStore(t, storage, &clock)
	ctx := context.Background()
	idle, used, held := record("alice"), record("alice"), record("bob")
	windows := map[string]int64{}
	for _, r := range []*Record{idle, used, held} {
		w, err := a.Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		windows[r.Ref] = w
	}
	clock = clock.Add(50 * time.Minute)
	w, err := b.Mark(ctx, used.Ref, windows[used.Ref]) // used through the other replica
	if err != nil || w <= windows[used.Ref] {
		t.Fatalf("Mark = %d, %v", w, err)
	}
	if again, err := a.Mark(ctx, used.Ref, w); err != nil || again != w {
		t.Errorf("a mark known for this window was made again: %d, %v", again, err)
	}
	clock = clock.Add(30 * time.Minute) // idle for 80 minutes, used 30 minutes ago
	ended, err := a.Sweep(ctx, time.Hour, func(ref string) bool { return ref == held.Ref })
	if err != nil {
		t.Fatal(err)
	}
	if len(ended) != 1 || ended[0].Ref != idle.Ref || ended[0].Upstream.SessionID != "up-1" {
		t.Fatalf("swept %+v, want only the idle session", ended)
	}
	for _, r := range []*Record{used, held} {
		if _, err := a.Load(ctx, r.Ref); err != nil {
			t.Errorf("session %s was ended: %v", r.User, err)
		}
	}
	// The replica that held a stream of held died: nobody marks it again,
	// and it still expires.
	clock = clock.Add(2 * time.Hour)
	ended, err = b.Sweep(ctx, time.Hour, func(string) bool { return false })
	if err != nil || len(ended) != 2 {
		t.Fatalf("later sweep ended %d, %v; want the two left", len(ended), err)
	}
	if dirs, _ := storage.List(ctx, activePrefix, false); len(dirs) != 0 {
		t.Errorf("old windows left: %v", dirs)
	}
}

// Catalogs are named by content: the same tools in any order make one
// catalog, stored once and read back by another store.
func TestCatalogsSharedByContent(t *testing.T) {
	clock := time.Now()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	a, b := testStore(t, storage, &clock), testStore(t, storage, &clock)
	ctx := context.Background()
	tools := map[string][]byte{"echo": []byte(`{"name":"echo", "annotations":{"readOnlyHint":true}}`), "add": []byte(`{"name":"add"}`)}
	c1, err := a.PutCatalog(ctx, tools)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := a.PutCatalog(ctx, map[string][]byte{"add": []byte(`{"name":"add"}`), "echo": tools["echo"]})
	if c1 != c2 {
		t.Error("the same tools made two catalogs in memory")
	}
	got, err := b.Catalog(ctx, c1.Hash)
	if err != nil || len(got.Tools) != 2 || string(got.Tools["echo"].Raw) != string(tools["echo"]) {
		t.Fatalf("another store reads %+v, %v", got, err)
	}
	if other, _ := a.PutCatalog(ctx, map[string][]byte{"echo": tools["echo"]}); other.Hash == c1.Hash {
		t.Error("different tools share a name")
	}
	if _, err := b.Catalog(ctx, strings.Repeat("0", 64)); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown catalog: %v", err)
	}
}

func TestParseChange(t *testing.T) {
	ref := NewRef()
	for key, want := range map[string]struct {
		kind   ChangeKind
		ref    string
		window int64
	}{
		stateKey(ref):                       {SessionChange, ref, 0},
		activeKey(1234, ref):                {SessionMarked, ref, 1234},
		requestKey(ref, "1"):                {OtherChange, "", 0},
		catalogKey("abc"):                   {OtherChange, "", 0},
		activePrefix + "/notawindow/" + ref: {OtherChange, "", 0},
	} {
		kind, r, w := ParseChange(key)
		if kind != want.kind || r != want.ref || w != want.window {
			t.Errorf("ParseChange(%q) = %v %q %d, want %+v", key, kind, r, w, want)
		}
	}
}

// A task's call is stored sealed under the session keys, bound to its
// session and task id: its arguments are not readable at rest, a record
// copied to another session or task does not open there, and a record of
// the clear form earlier versions wrote is still read.
func TestTaskCallsAreSealedAtRest(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	var clock time.Time
	s := New(storage, time.Hour, 12*time.Hour, func() time.Time { return clock })
	keys := keyring(t, "task-secret-0123456789-0123456789-xx")
	rec := record("alice")
	if _, err := s.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	ref, other := rec.Ref, NewRef()
	call := TaskCall{Tool: "transfer", Arguments: []byte(`{"iban":"DE89370400440532013000"}`)}
	if err := s.TaskCreated(ctx, keys, ref, "t1", call); err != nil {
		t.Fatal(err)
	}
	raw, err := storage.Load(ctx, taskKey(ref, "t1"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "DE89370400440532013000") || strings.Contains(string(raw), "transfer") {
		t.Fatalf("the task's call is stored in clear: %q", raw)
	}
	if got, ok, err := s.Task(ctx, keys, ref, "t1"); err != nil || !ok || got.Tool != call.Tool || string(got.Arguments) != string(call.Arguments) {
		t.Fatalf("Task = %+v, %v, %v", got, ok, err)
	}
	// Moved to another session or task id, the record does not open.
	for _, to := range []string{taskKey(other, "t1"), taskKey(ref, "t2")} {
		if err := storage.Store(ctx, to, raw); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Task(ctx, keys, other, "t1"); err == nil {
		t.Error("a task record copied to another session opened there")
	}
	if _, _, err := s.Task(ctx, keys, ref, "t2"); err == nil {
		t.Error("a task record copied to another task id opened there")
	}
	if _, _, err := s.Task(ctx, keyring(t, "another-secret-0123456789-0123456789"), ref, "t1"); err == nil {
		t.Error("a task record opened under another secret")
	}
	// What earlier versions stored in clear is read as it is.
	if err := storage.Store(ctx, taskKey(ref, "old"), []byte(`{"tool":"build","arguments":{"q":1}}`)); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := s.Task(ctx, keys, ref, "old"); err != nil || !ok || got.Tool != "build" || string(got.Arguments) != `{"q":1}` {
		t.Errorf("a clear record of an earlier version = %+v, %v, %v", got, ok, err)
	}
}

// keyedMutex excludes holders of one key while other keys proceed,
// under many goroutines locking and unlocking a few keys (each lock's
// entry is deleted and made anew many times over), and leaves no entry
// behind.
func TestKeyedMutexUnderChurn(t *testing.T) {
	var k keyedMutex
	keys := []string{"a", "b", "c"}
	var inside [3]atomic.Int32
	var counts [3]int // guarded by the key's lock only
	var bad atomic.Int32
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			for i := range 500 {
				j := (g + i) % len(keys)
				unlock := k.lock(keys[j])
				if inside[j].Add(1) != 1 {
					bad.Add(1)
				}
				counts[j]++
				inside[j].Add(-1)
				unlock()
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d times two goroutines held one key's lock at once", bad.Load())
	}
	if total := counts[0] + counts[1] + counts[2]; total != 24*500 {
		t.Fatalf("%d increments under the keys' locks, want %d (lost updates)", total, 24*500)
	}
	if n := k.held(); n != 0 {
		t.Fatalf("%d keys left a lock behind", n)
	}
}

// held is how many keys have a mutex now.
func (k *keyedMutex) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// What is recorded below a session (a pending request, a task) is recorded
// only while the session exists: after End it is ErrNotFound and recreates
// nothing of the ended session's directory.
func TestNothingIsWrittenBelowAnEndedSession(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	clock := time.Now()
	s := testStore(t, storage, &clock)
	keys := keyring(t, "task-secret-0123456789-0123456789-xx")
	rec := record("alice")
	if _, err := s.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.ServerRequestSent(ctx, rec.Ref, "1", PendingRequest{Method: "elicitation/create", ID: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.End(ctx, rec.Ref, false); err != nil {
		t.Fatal(err)
	}
	if err := s.ServerRequestSent(ctx, rec.Ref, "2", PendingRequest{Method: "elicitation/create", ID: json.RawMessage(`2`)}); !errors.Is(err, ErrNotFound) {
		t.Errorf("ServerRequestSent after End: %v", err)
	}
	if err := s.TaskCreated(ctx, keys, rec.Ref, "t1", TaskCall{Tool: "x"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("TaskCreated after End: %v", err)
	}
	if _, err := storage.Stat(ctx, sessionDir(rec.Ref)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the ended session's directory is there: %v", err)
	}
}

// A pending server request keeps the id its upstream gave it, where an
// earlier version does not look (it would read the record as a method's
// text); one an earlier version recorded (its method alone, under the
// upstream's id) is still answered, with no id of its own to restore.
func TestPendingRequestKeepsTheUpstreamsID(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	clock := time.Now()
	s := testStore(t, storage, &clock)
	rec := record("alice")
	if _, err := s.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.ServerRequestSent(ctx, rec.Ref, `"toolgate-request:1"`, PendingRequest{Method: "roots/list", ID: json.RawMessage(`"up-1"`)}); err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, requestKey(rec.Ref, "9"), []byte("sampling/createMessage")); err != nil {
		t.Fatal(err)
	}
	if storage.Exists(ctx, requestKey(rec.Ref, `"toolgate-request:1"`)) {
		t.Error("a request recorded where an earlier version reads its method")
	}
	if req, ok, err := s.ServerRequestAnswered(ctx, rec.Ref, `"toolgate-request:1"`); !ok || err != nil || req.Method != "roots/list" || string(req.ID) != `"up-1"` {
		t.Errorf("answered %+v, %v, %v", req, ok, err)
	}
	if req, ok, err := s.ServerRequestAnswered(ctx, rec.Ref, "9"); !ok || err != nil || req.Method != "sampling/createMessage" || req.ID != nil {
		t.Errorf("an earlier version's request answered %+v, %v, %v", req, ok, err)
	}
}
