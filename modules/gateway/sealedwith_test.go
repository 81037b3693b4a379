package gateway

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/modules/storage/postgres"
)

// Regression: a save on a replica still on the replaced key undoes what it
// stored once it finds the new canary sealed meanwhile (see
// checkKeyAfterSealing). If the person connected again on a replica with
// the new key in that instant, the record there is theirs, newer: it
// used to be deleted with it, and they had to connect once more.
func TestSaveUndoneLeavesANewerRecordOfAnotherReplica(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	k1 := r10Gate(testCipher(t))
	const user = "alice"
	key := ConnectionKey("personal", user)

	// Replica A starts with K1 and alice connects. The operator's reset;
	// A refreshes alice's grant, its Encrypt in flight. Meanwhile replica
	// B restarts with K2 and seals the new canary.
	hooked := &hookStore{Storage: storage}
	replicaA := r10Replica(t, storage, hooked, k1, user)
	replicaB, saved := resetDuringSave(t, dir, storage, replicaA, k1, &Connection{AccessToken: "tok-2", RefreshToken: "r"})

	// Right after A stored its record, alice connects again on B.
	hooked.afterStore(key, func() {
		if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B"}); err != nil {
			t.Errorf("alice connecting again on replica B: %v", err)
		}
	})
	close(k1.release)
	if err := <-saved; err == nil {
		t.Fatal("a save sealed with the replaced key, after the new canary, succeeded")
	}

	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	if err != nil || conn.AccessToken != "tok-B" {
		t.Fatalf("alice's connection made again on replica B, after replica A's save of the replaced key was undone: %+v, %v; want tok-B", conn, err)
	}
}

// resetAndNewCanary is the operator's reset followed by a replica with a
// new key sealing the new canary: the replica, whose connections go
// straight to storage.
func resetAndNewCanary(t *testing.T, storage certmagic.Storage, user string) *App {
	t.Helper()
	if err := storage.Store(context.Background(), cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	b := r10Replica(t, storage, storage, testCipher(t), user)
	if err := b.checkCipherKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

// Regression: a replica still on the key a reset replaced, whose reads of
// the canary fail (a storage fault), took the canary it could not read
// for none and sealed alice's grant with the replaced key, stored after
// the reset: a record no replica opens nor takes for the old key's, so
// alice got a retryable error that never cleared. It seals nothing now,
// and tells her to try again; her record of before the reset is still
// the old key's, and she connects again.
func TestSaveRefusedWhileTheCanaryCannotBeRead(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	faulty := &hookStore{Storage: storage}
	replicaA := r10Replica(t, storage, faulty, testCipher(t), user)
	connectedBeforeReset(t, dir, replicaA, user)
	before := mustLoad(t, storage, key)
	replicaB := resetAndNewCanary(t, storage, user)

	faulty.failLoads(cipherCanaryKey, 1<<20)
	err := replicaA.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	faulty.failLoads(cipherCanaryKey, 0)
	if !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("a save while the canary could not be read: %v, want ErrStorageUnavailable (try again)", err)
	}
	if after := mustLoad(t, storage, key); string(after) != string(before) {
		t.Fatal("a save refused before sealing changed the stored connection")
	}
	if _, err := replicaB.connections.LoadFresh(ctx, "personal", user); !errors.Is(err, ErrSealedWithOtherKey) {
		t.Fatalf("alice on replica B: %v, want ErrSealedWithOtherKey (she connects again)", err)
	}
}

// Regression: a save on a replica still on the replaced key, whose check
// before sealing saw the operator's reset, then could not read the canary
// after storing (two reads failing: the new canary was sealed meanwhile,
// unseen), kept what it stored. It is undone now, and the person is told
// to try again.
func TestSaveUndoneWhenTheCanaryCannotBeReadAfterSealing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	k1 := r10Gate(testCipher(t))
	st := &hookStore{Storage: storage}
	replicaA := r10Replica(t, storage, st, k1, user)
	if err := replicaA.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	saved := r10SaveHeld(replicaA, k1, user, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	replicaB := r10Replica(t, storage, storage, testCipher(t), user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	st.afterStore(key, func() { st.failLoads(cipherCanaryKey, 2) })
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("a save whose canary could not be read after sealing: %v, want ErrStorageUnavailable (try again)", err)
	}
	if _, err := storage.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the record sealed with the replaced key after the new canary is still stored (%v)", err)
	}
	if _, err := replicaB.connections.LoadFresh(ctx, "personal", user); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("alice on replica B: %v, want ErrNotConnected (she connects again)", err)
	}
}

// A canary read failing once after sealing, then opening, keeps what was
// stored: a passing fault loses no connection.
func TestSaveKeptAfterOneFailedCanaryRead(t *testing.T) {
	ctx := context.Background()
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	const user = "alice"
	key := ConnectionKey("personal", user)
	st := &hookStore{Storage: storage}
	st.afterStore(key, func() { st.failLoads(cipherCanaryKey, 1) })
	replica := r10Replica(t, storage, st, testCipher(t), user)
	if err := replica.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := replica.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-1"}); err != nil {
		t.Fatalf("a save whose canary read failed once after sealing: %v", err)
	}
	if st.loadFaultsLeft(cipherCanaryKey) > 0 {
		t.Fatal("premise: the canary was not read after sealing")
	}
	conn, err := replica.connections.LoadFresh(ctx, "personal", user)
	if err != nil || conn.AccessToken != "tok-1" {
		t.Fatalf("the connection after a passing fault: %v %v", conn, err)
	}
}

// connectedBeforeReset starts a (its canary checked, sealed when there is
// none) and stores user's first connection to "personal" through it, both
// dated back as long before an operator's reset.
func connectedBeforeReset(t *testing.T, dir string, a *App, user string) {
	t.Helper()
	ctx := context.Background()
	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-1"}); err != nil {
		t.Fatal(err)
	}
	r8Age(t, dir, cipherCanaryKey, 48*time.Hour)
	r8Age(t, dir, ConnectionKey("personal", user), 24*time.Hour)
}

// Regression: a save undone on a replica still on the replaced key read
// back its own record, then deleted whatever was there: a record another
// replica with the new key stored in between (the person connecting again
// there) went with it. On a storage that deletes a key only while it
// holds a value, that record is kept.
func TestSaveUndoneKeepsARecordStoredBetweenItsReadAndItsDelete(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	k1 := r10Gate(testCipher(t))
	cas := &valueDeleting{hookStore: &hookStore{Storage: storage}}
	replicaA := r10Replica(t, storage, cas, k1, user)
	replicaB, saved := resetDuringSave(t, dir, storage, replicaA, k1, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	cas.afterLoad(key, 0, func() { // the undo has read A's record back
		if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B"}); err != nil {
			t.Errorf("alice connecting again on replica B: %v", err)
		}
	})
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if cas.loadPending() {
		t.Fatal("premise: the undo did not read the record back")
	}
	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	if err != nil || conn.AccessToken != "tok-B" {
		t.Fatalf("alice's connection made again on replica B while A's undo ran: %+v, %v; want tok-B", conn, err)
	}
}

// Regression (found by an attack round, r12): the rolling reset. Replica
// A (K1) saw no new canary before sealing alice's refreshed grant; while
// its Encrypt is on its way (a Vault round trip), replica B (K2) starts,
// seals the new canary, and alice connects again on B. A's store lands
// over B's record, and A's check after sealing undoes it: it deleted what
// it stored, and with it alice's connection made on B. On a storage that
// writes by value, the undo puts back what its store replaced (a record
// stored since the reset that A's key does not open), only while its own
// record is still there; on another it still deletes (putting back there
// could bring back a connection deleted meanwhile: see
// TestR13DisconnectDuringTheSaveIsUndoneByThePutBack). Other replicas are
// told of the change either way.
func TestSaveUndoneAcrossTheResetPutsBackTheRecordItsStoreReplaced(t *testing.T) {
	for _, storageKind := range []string{"writes by value", "plain"} {
		t.Run(storageKind, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			storage := SafeListing(&certmagic.FileStorage{Path: dir})
			const user = "alice"
			key := ConnectionKey("personal", user)
			k1 := r10Gate(testCipher(t))
			published := &announcements{}
			var connStorage certmagic.Storage = &struct {
				certmagic.Storage
				*announcements
			}{storage, published}
			if storageKind == "writes by value" {
				connStorage = &struct {
					*casStore
					*announcements
				}{newCAS(&hookStore{Storage: storage}), published}
				if _, ok := connStorage.(valueReplacer); !ok {
					t.Fatal("premise: A's storage writes by value")
				}
			}
			replicaA := r10Replica(t, storage, connStorage, k1, user)
			replicaB, saved := resetDuringSave(t, dir, storage, replicaA, k1, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
			if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B"}); err != nil {
				t.Fatalf("alice connecting again on replica B: %v", err)
			}
			published.reset()
			close(k1.release)
			if err := <-saved; !errors.Is(err, ErrCipherRefused) {
				t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
			}
			if storageKind == "plain" {
				if _, err := replicaB.connections.LoadFresh(ctx, "personal", user); !errors.Is(err, ErrNotConnected) {
					t.Fatalf("alice's connection after the undo on a storage that cannot write by value: %v; want ErrNotConnected", err)
				}
			} else {
				r12Has(t, replicaB, user, "tok-B")
			}
			if got := published.keys(); !slices.Contains(got, key) {
				t.Errorf("the undo announced %q, want %q among them (other replicas drop their copies)", got, key)
			}
		})
	}
}

// What a save stored over is not put back when it was stored before the
// reset: a record of the replaced key (or an older one), which put back
// now would no longer be taken for one, and would answer its person a
// retryable error for good instead of asking them to connect again.
func TestSaveUndoneDoesNotPutBackARecordOfBeforeTheReset(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	k1 := r10Gate(testCipher(t))
	replicaA := r10Replica(t, storage, storage, k1, user)
	connectedBeforeReset(t, dir, replicaA, user)
	// alice's record is of a key older still: neither A's nor B's opens it.
	k0 := testCipher(t)
	old, err := k0.Encrypt(ctx, []byte(`{"access_token":"tok-0"}`), CipherContext("personal", user))
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, key, old); err != nil {
		t.Fatal(err)
	}
	r8Age(t, dir, key, 24*time.Hour)
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	saved := r10SaveHeld(replicaA, k1, user, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	replicaB := r10Replica(t, storage, storage, testCipher(t), user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if _, err := replicaB.connections.LoadFresh(ctx, "personal", user); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("alice's connection after the undo: %v; want ErrNotConnected (she connects again)", err)
	}
}

// announcements is what storage that announces changes (storecache's
// Notifier) keeps of the keys it was asked to announce.
type announcements struct {
	mu        sync.Mutex
	announced []string
}

func (a *announcements) Publish(_ context.Context, key string) error {
	a.mu.Lock()
	a.announced = append(a.announced, key)
	a.mu.Unlock()
	return nil
}

func (a *announcements) Subscribe(string, func(postgres.Change)) (func(), error) {
	return func() {}, nil
}

func (a *announcements) keys() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.announced)
}

func (a *announcements) reset() {
	a.mu.Lock()
	a.announced = nil
	a.mu.Unlock()
}

// What an undone save replaced is put back only when the cipher says the
// record does not open with this gateway's key (ErrCipherMismatch), and
// it was stored since the last reset: a cipher that cannot tell now (a
// fault) may be looking at a record of the replaced key, which put back
// would answer its person an error for good.
func TestRestorableOnlyWhenTheKeyDoesNotOpenIt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	down := &cipherDown{Cipher: testCipher(t)}
	s := newConnectionStore(storage, down, 0)
	other, err := testCipher(t).Encrypt(ctx, []byte(`{"access_token":"tok-B"}`), CipherContext("personal", user))
	if err != nil {
		t.Fatal(err)
	}
	own, err := down.Encrypt(ctx, []byte(`{"access_token":"tok-C"}`), CipherContext("personal", user))
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, cipherResetKey, []byte("reset")); err != nil {
		t.Fatal(err)
	}
	r8Age(t, dir, cipherResetKey, time.Hour)
	since, before := time.Now(), time.Now().Add(-2*time.Hour)
	for _, c := range []struct {
		name string
		prev *priorRecord
		down bool
		want bool
	}{
		{"another key's, since the reset", &priorRecord{value: other, modified: since}, false, true},
		{"another key's, since the reset, the cipher down", &priorRecord{value: other, modified: since}, true, false},
		{"this key's, since the reset", &priorRecord{value: own, modified: since}, false, false},
		{"another key's, before the reset", &priorRecord{value: other, modified: before}, false, false},
		{"none", nil, false, false},
	} {
		down.down.Store(c.down)
		if got := s.restorable(ctx, "personal", user, c.prev); got != c.want {
			t.Errorf("%s: restorable %v, want %v", c.name, got, c.want)
		}
	}
}
