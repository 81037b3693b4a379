package approval

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/modules/gateway"
)

// loadHook runs afterLoad (once) after the value under key was read, before
// the reader gets it: what another replica does in between.
type loadHook struct {
	certmagic.Storage
	key       string
	afterLoad func()
}

func (h *loadHook) Load(ctx context.Context, key string) ([]byte, error) {
	data, err := h.Storage.Load(ctx, key)
	if key == h.key && h.afterLoad != nil {
		f := h.afterLoad
		h.afterLoad = nil
		f()
	}
	return data, err
}

// The sweep clears the sealed contents of an approval it finds expired.
// Another replica whose clock is a second behind may consume the approval
// meanwhile; the sweep must not write the approved state back over the
// consumed one, or that replica lets the once approval through again.
func TestSweepDoesNotUndoAConsumption(t *testing.T) {
	ctx := context.Background()
	expiry := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := expiry
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })

	storage := &loadHook{Storage: &certmagic.FileStorage{Path: t.TempDir()}, key: recordKey("a1")}
	s := testStore(storage)
	a := &Approval{ID: "a1", State: StateApproved, Scope: ScopeOnce, Scopes: []string{ScopeOnce},
		CreatedAt: expiry.Add(-10 * time.Minute), ExpiresAt: expiry, Sealed: []byte("sealed")}
	if err := s.save(ctx, a); err != nil {
		t.Fatal(err)
	}
	behind := func() {
		// The replica a second behind sees the approval still valid.
		clock = expiry.Add(-time.Second)
		defer func() { clock = expiry }()
		if _, ok, err := s.Consume(ctx, "a1"); !ok || err != nil {
			t.Fatalf("the first consumption: %v, %v", ok, err)
		}
	}
	storage.afterLoad = behind
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	clock = expiry.Add(-time.Second)
	if _, ok, _ := s.Consume(ctx, "a1"); ok {
		t.Fatal("a once approval was consumed twice: the sweep undid the first consumption")
	}
	got, err := s.Get(ctx, "a1")
	if err != nil || got.State != StateConsumed {
		t.Fatalf("after the sweep: %+v, %v", got, err)
	}
}

// sealCipher is a cipher for tests: AES-GCM under a key of its own, bound
// to the context as additional data.
type sealCipher struct{ ring *seal.Keyring }

func (c sealCipher) Encrypt(_ context.Context, plain, context []byte) ([]byte, error) {
	return c.ring.Seal(plain, context), nil
}

func (c sealCipher) Decrypt(_ context.Context, sealed, context []byte) ([]byte, error) {
	return c.ring.Open(sealed, context)
}

func testStore(storage certmagic.Storage) *Store {
	return &Store{storage: storage, cipher: sealCipher{seal.Random("approvals test")}, logger: zap.NewNop()}
}

// A record changed in storage is no approval: a pending one turned
// approved by someone who can write the storage is not found, and the
// sweep removes it; a record toolgate wrote reads back.
func TestChangedRecordsAreNoApprovals(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	s := testStore(storage)
	a := &Approval{ID: "a1", State: StatePending, Requester: "alice", Approvers: []string{"carol"}, Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC(), Sealed: []byte("sealed")}
	if err := s.save(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "a1"); err != nil || got.State != StatePending {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	data, _ := storage.Load(ctx, recordKey("a1"))
	forged := strings.Replace(string(data), `"state":"pending"`, `"state":"approved","scope":"once","decided_by":"carol"`, 1)
	if err := storage.Store(ctx, recordKey("a1"), []byte(forged)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a record changed in storage: %v, want ErrNotFound", err)
	}
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.Load(ctx, recordKey("a1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sweep left the changed record: %v", err)
	}
	// Another store of the same storage (a replica) shares the key.
	b := &Approval{ID: "b1", State: StatePending, Requester: "bob", Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
	if err := s.save(ctx, b); err != nil {
		t.Fatal(err)
	}
	other := testStore(storage)
	other.cipher = s.cipher
	if _, err := other.Get(ctx, "b1"); err != nil {
		t.Errorf("another replica reads the record: %v", err)
	}
}

// Sealed contents whose record is gone are swept when two sweeps in a row
// find them without one (never those of a record, nor ones first seen:
// their record may be on its way); a requester's pending index counts
// only approvals still waiting.
func TestSweepAndCountLeftovers(t *testing.T) {
	ctx := context.Background()
	clock := time.Now()
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })
	s := testStore(&certmagic.FileStorage{Path: t.TempDir()})

	for _, id := range []string{"decided", "waiting"} {
		a := &Approval{ID: id, State: StatePending, Requester: "alice", Approvers: []string{"bob"}, Scopes: []string{ScopeOnce},
			CreatedAt: clock, ExpiresAt: clock.Add(time.Hour)}
		if err := s.Create(ctx, a, Contents{Arguments: []byte(`{"x":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Decide(ctx, "decided", &gateway.Caller{User: "bob"}, false, "", ""); err != nil {
		t.Fatal(err)
	}
	// Entries a decision or a creation cut short left behind.
	for _, id := range []string{"decided", "never-made"} {
		_ = s.storage.Store(ctx, path.Join(pendingOfPrefix, hashOf("alice"), id), []byte(clock.Add(time.Hour).Format(time.RFC3339)))
	}
	if n, err := s.CountPending(ctx, "alice"); err != nil || n != 1 {
		t.Fatalf("CountPending = %d, %v; want 1", n, err)
	}
	if keys, _ := s.storage.List(ctx, path.Join(pendingOfPrefix, hashOf("alice")), false); len(keys) != 1 {
		t.Errorf("the count left %d index entries, want the waiting one", len(keys))
	}

	if err := s.storage.Store(ctx, contentsKey("orphan"), []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if !s.storage.Exists(ctx, contentsKey("orphan")) {
		t.Error("contents first seen without a record (it may be on its way) were swept")
	}
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if s.storage.Exists(ctx, contentsKey("orphan")) {
		t.Error("contents without a record were kept")
	}
	if !s.storage.Exists(ctx, contentsKey("waiting")) {
		t.Error("the contents of a pending approval were swept")
	}
	// While the storage cannot say whether a record exists (Exists answers
	// false then), contents are never taken for orphans: two sweeps in a
	// row deleted a pending approval's arguments.
	healthy := s.storage
	s.storage = statFails{healthy}
	for range 2 {
		s.sweepContents(ctx)
	}
	s.storage = healthy
	if !s.storage.Exists(ctx, contentsKey("waiting")) {
		t.Error("the contents of a pending approval were swept while the storage failed")
	}
}

// statFails is a storage whose Stat and Exists fail as a database that
// went away does (certmagic's Exists cannot say so: it answers false).
type statFails struct{ certmagic.Storage }

func (statFails) Stat(context.Context, string) (certmagic.KeyInfo, error) {
	return certmagic.KeyInfo{}, errors.New("connection refused")
}
func (statFails) Exists(context.Context, string) bool { return false }

// An approval counts under max_pending_per_user until the instant it
// expires, not until the whole second before: index entries keep the
// expiry to the nanosecond (a one-second ttl was otherwise counted as gone
// within its first second, letting a third ask past a limit of two).
func TestCountPendingUntilTheExactExpiry(t *testing.T) {
	ctx := context.Background()
	clock := time.Date(2026, 12, 3, 1, 0, 10, 900_000_000, time.UTC)
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })
	s := testStore(&certmagic.FileStorage{Path: t.TempDir()})
	a := &Approval{ID: "short", State: StatePending, Requester: "alice", Approvers: []string{"bob"}, Scopes: []string{ScopeOnce},
		CreatedAt: clock, ExpiresAt: clock.Add(time.Second)}
	if err := s.Create(ctx, a, Contents{Arguments: []byte(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(500 * time.Millisecond) // past 01:00:11, before 01:00:11.9
	if n, err := s.CountPending(ctx, "alice"); err != nil || n != 1 {
		t.Fatalf("CountPending half a second before the expiry = %d, %v; want 1", n, err)
	}
	clock = a.ExpiresAt
	if n, err := s.CountPending(ctx, "alice"); err != nil || n != 0 {
		t.Fatalf("CountPending at the expiry = %d, %v; want 0", n, err)
	}
}

// An approval holds what it is about, and its place under
// max_pending_per_user, only while it may still be used: approved, it
// keeps both; used up, it gives both back (its record stays); denied, the
// same at once. A released result is opened before it is used up.
func TestContentsAndPlaceLastWhileUsable(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m := &Manager{Store: testStore(storage), audit: zap.NewNop(), logger: zap.NewNop()}
	s := m.Store
	alice := &gateway.Caller{User: "alice"}
	ask := func(id string, c Contents) {
		t.Helper()
		a := &Approval{ID: id, State: StatePending, Requester: "alice", RequesterMayApprove: true, Stage: StageResult,
			Scopes: []string{ScopeOnce}, CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
		if err := s.Create(ctx, a, c); err != nil {
			t.Fatal(err)
		}
	}
	places := func(want int, when string) {
		t.Helper()
		if n, err := s.CountPending(ctx, "alice"); err != nil || n != want {
			t.Errorf("%s: CountPending = %d, %v; want %d", when, n, err, want)
		}
	}
	contents := func(id string, want bool, when string) {
		t.Helper()
		_, err := storage.Load(ctx, contentsKey(id))
		if has := err == nil; has != want {
			t.Errorf("%s: sealed contents of %s in storage: %v, want %v", when, id, has, want)
		}
		a, err := s.Get(ctx, id)
		if err != nil || a.HasContents() != want {
			t.Errorf("%s: the record of %s: %+v, %v; want HasContents %v", when, id, a, err, want)
		}
	}
	ask("a1", Contents{Arguments: []byte(`{"n":1}`), Result: []byte(`{"content":[]}`)})
	ask("a2", Contents{Arguments: []byte(`{"n":2}`)})
	places(2, "two asks")
	if _, err := s.Decide(ctx, "a1", alice, true, ScopeOnce, ""); err != nil {
		t.Fatal(err)
	}
	places(2, "one approved, not used")
	contents("a1", true, "approved, not used")
	a1, _ := s.Get(ctx, "a1")
	res, ok, err := m.release(ctx, a1)
	if err != nil || !ok || string(res.Result) != `{"content":[]}` {
		t.Fatalf("releasing the approved result: %+v, %v, %v", res, ok, err)
	}
	if _, ok, err := m.release(ctx, a1); ok || err != nil {
		t.Errorf("released again from the copy read before: %v, %v; want nothing, no error", ok, err)
	}
	places(1, "one used up")
	contents("a1", false, "used up")
	if got, _ := s.Get(ctx, "a1"); got == nil || got.State != StateConsumed {
		t.Errorf("the used-up record: %+v", got)
	}
	if _, err := s.Decide(ctx, "a2", alice, false, "", "no"); err != nil {
		t.Fatal(err)
	}
	places(0, "one used up, one denied")
	contents("a2", false, "denied")
}

// lockCounter counts the storage locks taken.
type lockCounter struct {
	certmagic.Storage
	locks int
}

func (l *lockCounter) Lock(ctx context.Context, name string) error {
	l.locks++
	return l.Storage.Lock(ctx, name)
}

// Someone who may not decide an approval is refused before its lock is
// taken (a bulk decision in the console names up to 100 ids); its
// approver still decides it.
func TestDecideRefusesBeforeTheLock(t *testing.T) {
	ctx := context.Background()
	storage := &lockCounter{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	s := testStore(storage)
	a := &Approval{ID: "a1", State: StatePending, Requester: "alice", Approvers: []string{"carol"}, Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
	if err := s.Create(ctx, a, Contents{Arguments: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	storage.locks = 0
	for range 100 {
		if _, err := s.Decide(ctx, "a1", &gateway.Caller{User: "mallory"}, true, "", ""); !errors.Is(err, ErrForbidden) {
			t.Fatalf("mallory deciding: %v, want ErrForbidden", err)
		}
	}
	if storage.locks != 0 {
		t.Errorf("100 refused decisions took %d storage locks, want none", storage.locks)
	}
	if got, err := s.Decide(ctx, "a1", &gateway.Caller{User: "carol"}, true, "", ""); err != nil || got.State != StateApproved {
		t.Errorf("carol deciding: %+v, %v", got, err)
	}
}

// An approved approval of a stored session that has ended can no longer be
// used: counted, it gives its place and its contents back (its record
// stays). One of an implied session (which ends only at its expiry), and a
// pending one, keep both.
func TestApprovalsOfAnEndedSessionGiveTheirPlaceBack(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	s := testStore(storage)
	s.sessionEnded = func(_ context.Context, user, ref string) bool { return user == "alice" && ref == "ended" }
	alice := &gateway.Caller{User: "alice"}
	ask := func(id, session string, stored, approve bool) {
		t.Helper()
		a := &Approval{ID: id, State: StatePending, Requester: "alice", Session: session, StoredSession: stored, RequesterMayApprove: true,
			Scopes: []string{ScopeSession}, CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
		if err := s.Create(ctx, a, Contents{Arguments: []byte(`{"id":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
		if approve {
			if _, err := s.Decide(ctx, id, alice, true, ScopeSession, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	ask("ended-approved", "ended", true, true)
	ask("ended-pending", "ended", true, false)
	ask("implied-approved", "ended", false, true)
	ask("live-approved", "live", true, true)
	if n, err := s.CountPending(ctx, "alice"); err != nil || n != 3 {
		t.Fatalf("CountPending = %d, %v; want 3 (all but the ended session's approved one)", n, err)
	}
	for id, want := range map[string]bool{"ended-approved": false, "ended-pending": true, "implied-approved": true, "live-approved": true} {
		a, err := s.Get(ctx, id)
		if err != nil || a.HasContents() != want {
			t.Errorf("%s: %+v, %v; want HasContents %v", id, a, err, want)
		}
		if _, err := storage.Load(ctx, contentsKey(id)); (err == nil) != want {
			t.Errorf("%s: sealed contents in storage: %v, want %v", id, err == nil, want)
		}
	}
	if a, _ := s.Get(ctx, "ended-approved"); a == nil || a.State != StateApproved {
		t.Errorf("the ended session's approval's record: %+v", a)
	}
}
