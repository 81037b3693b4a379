package gateway

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Attack (fixed): the rolling reset (A on the replaced key K1 saving
// alice's refreshed grant, B on K2 where alice connected again meanwhile,
// the grant lock lost as in the change's own scenario). While A's save is
// on its way, alice disconnects on B (Disconnect: ConnectionStore.Delete,
// maybe after revoking the grant at the provider), or the provider
// rejects B's grant (Reject deletes it the same way):
//   - "between the save's read of prev and its store": the delete lands
//     right after A's save read B's record;
//   - "between the undo's read and its put-back": the delete lands right
//     after A's undo read back its own record.
//
// Expected: a connection its person deliberately forgot stays forgotten:
// alice is not connected on B (ErrNotConnected).
//
// Reproduced (0a065bb): A's store landed over nothing (or the delete took
// A's record), the canary refused, and undoSealed put back what the save
// had read — B's record, which alice had just disconnected — with a plain
// Store, or on PostgreSQL with ReplaceIfValue, which only checked that A's
// own record was still there (see
// TestR13RealPostgresPutBackResurrectsADisconnectedConnection). alice was
// connected again with tok-B, a token she asked the gateway to forget.
// Severity: low-medium (the lost grant lock and a disconnect in a window
// of one or two storage round trips; the outcome resurrects a credential).
//
// Fixed: the save's store replaces what it read only while it is still
// there (ReplaceIfValue), else it stores as ever and has nothing to put
// back; and a storage that cannot write by value never puts back.
func TestR13DisconnectDuringTheSaveIsUndoneByThePutBack(t *testing.T) {
	for _, kind := range []string{"plain", "writes by value"} {
		for _, when := range []string{"between the save's read of prev and its store", "between the undo's read and its put-back"} {
			if kind == "plain" && when == "between the save's read of prev and its store" {
				continue // a plain storage's save reads nothing before its store
			}
			t.Run(kind+"/"+when, func(t *testing.T) {
				ctx := context.Background()
				dir := t.TempDir()
				storage := SafeListing(&certmagic.FileStorage{Path: dir})
				const user = "alice"
				key := ConnectionKey("personal", user)
				hook := &hookStore{Storage: storage}
				var connStorage certmagic.Storage = hook
				skip := 0 // the first Load of the key in the save
				if kind == "writes by value" {
					connStorage = newCAS(hook)
					if when == "between the undo's read and its put-back" {
						skip = 1 // after the save's read of what it stores over
					}
				}
				_, replicaB, saved, k1 := r13RollingReset(t, dir, storage, connStorage, nil, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
				hook.afterLoad(key, skip, func() {
					if err := replicaB.connections.Delete(ctx, "personal", user); err != nil {
						t.Errorf("alice disconnecting on replica B: %v", err)
					}
				})
				close(k1.release)
				if err := <-saved; !errors.Is(err, ErrCipherRefused) {
					t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
				}
				if hook.loadPending() {
					t.Fatal("premise: the disconnect did not run during A's save")
				}
				conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
				if !errors.Is(err, ErrNotConnected) {
					t.Fatalf("alice on replica B after she disconnected there: %v %v; want ErrNotConnected (the connection she forgot came back)", r13Tok(conn), err)
				}
			})
		}
	}
}

// r13Tok names c's access token ("<none>" for nil).
func r13Tok(c *Connection) string {
	if c == nil {
		return "<none>"
	}
	return "connection with " + c.AccessToken
}

// Attack (fixed): two replicas still on the replaced key K1, A and C,
// each with a save of alice's grant on its way across the rolling reset
// (the grant lock lost, as in TestR10SaveUndoneKeepsAnotherOldKeyReplicasRecord).
// C's store lands after the new canary; A's save reads C's record; C's
// check after sealing undoes C's store (deletes it: it opens with K1); A
// stores, finds the canary refusing, and undoes — and a Decrypt of C's
// record there would meet a passing cipher fault (Vault or KMS 429).
//
// Expected: no record of the replaced key stored after the reset is left:
// on B (K2) alice connects again (ErrNotConnected or
// ErrSealedWithOtherKey), never a cipher error that never clears.
//
// Reproduced (0a065bb): A's store landed over nothing, and restorable took
// the Decrypt error for "does not open": C's record, sealed with K1 after
// the reset and already deleted by C, was put back. On B alice got
// ErrCipherRefused for good: the very record the undo exists to remove.
// Severity: low (two old-key replicas racing one grant with the lock
// lost, the delete inside A's read-to-store window, and one cipher fault).
//
// Fixed: A's store replaces what it read only while it is still there
// (here it is gone: nothing to put back); and only a definite "not this
// key" (ErrCipherMismatch) puts back (TestRestorableOnlyWhenTheKeyDoesNotOpenIt).
func TestR13CipherBlipPutsBackAReplacedKeyRecordItsOwnReplicaDeleted(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	k1 := testCipher(t)
	gA, gC := r10Gate(k1), r10Gate(k1)
	blipA := &decryptBlips{Cipher: gA, context: CipherContext("personal", user)}
	hookA := &hookStore{Storage: storage}
	replicaA := r10Replica(t, storage, newCAS(hookA), blipA, user)
	hookC := &hookStore{Storage: storage}
	replicaC := r10Replica(t, storage, hookC, gC, user)
	connectedBeforeReset(t, dir, replicaA, user)
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	savedA := r10SaveHeld(replicaA, gA, user, &Connection{AccessToken: "tok-A", RefreshToken: "r"})
	savedC := r10SaveHeld(replicaC, gC, user, &Connection{AccessToken: "tok-C", RefreshToken: "r"})
	replicaB := r10Replica(t, storage, storage, testCipher(t), user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	r8Age(t, dir, cipherResetKey, time.Hour)

	aRead, cDone := make(chan struct{}), make(chan struct{})
	hookA.afterLoad(key, 0, func() { close(aRead); <-cDone })    // A's save read C's record
	hookC.afterStore(key, func() { close(gA.release); <-aRead }) // right after C's store
	close(gC.release)
	if err := <-savedC; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("premise: C's save, after the new canary, is undone: %v", err)
	}
	if _, err := storage.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("premise: C's undo deleted its record: %v", err)
	}
	blipA.n.Store(1) // a Decrypt of C's record in A's undo
	close(cDone)
	if err := <-savedA; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if sealed, err := storage.Load(ctx, key); err == nil {
		if plain, derr := k1.Decrypt(ctx, sealed, CipherContext("personal", user)); derr == nil {
			t.Errorf("a record sealed with the replaced key K1 after the reset is in storage: %s", plain)
		}
	}
	if _, err := replicaB.connections.LoadFresh(ctx, "personal", user); !errors.Is(err, ErrNotConnected) && !errors.Is(err, ErrSealedWithOtherKey) {
		t.Errorf("alice on replica B (K2): %v; want ErrNotConnected or ErrSealedWithOtherKey (connect again), not an error that never clears", err)
	}
}

// Attack (fixed): the undo's announcement. Delete and Reject tell this replica's
// own listeners (OnConnectionGone: a stdio program per user holding the
// credential in its environment) with maybeGone, because the watch drops
// local announcements ("a local delete told them already"). 0a065bb makes
// the undo announce its delete or put-back with cache.Deleted only.
//
// Expected: when the undo deletes alice's connection on A (what A's store
// replaced was her record of before the reset: not put back), A's
// listeners are told, as on every other replica.
//
// Reproduced (0a065bb): A's OnConnectionGone listeners heard nothing (the
// local echo is filtered, and undoSealed called no maybeGone): a program A
// runs for alice kept the credential of a connection that is gone until
// its idle timeout, while other replicas stopped theirs at once. Severity:
// low (a replica on the replaced key, about to be restarted; the
// credential is alice's own). Fixed: the undo calls maybeGone after its
// delete or put-back, as Delete and Reject do.
func TestR13UndoDoesNotTellThisReplicasGoneListeners(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	k1 := r10Gate(testCipher(t))
	published := &announcements{}
	connStorage := &struct {
		certmagic.Storage
		*announcements
	}{storage, published}
	replicaA := r10Replica(t, storage, connStorage, k1, user)
	var mu sync.Mutex
	var gone []string
	replicaA.connections.onGone(func(k string) {
		mu.Lock()
		gone = append(gone, k)
		mu.Unlock()
	})
	_, saved := resetDuringSave(t, dir, storage, replicaA, k1, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	published.reset()
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if _, err := storage.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("premise: the undo deleted alice's record: %v", err)
	}
	if !slices.Contains(published.keys(), key) {
		t.Fatalf("premise: the undo announced its delete to other replicas: %q", published.keys())
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(gone, key) {
		t.Errorf("A's OnConnectionGone listeners were told %q after the undo deleted alice's connection; want %q (as Delete tells them)", gone, key)
	}
}

// Attack: a healthy gateway (no reset anywhere, its key opens the canary):
// the reads a save makes on a storage that writes by value (storeSealed:
// Stat, then Load of the record about to be replaced) meet a passing
// storage fault.
//
// Expected and Held: a fault there is taken for "nothing to put back";
// the save is stored and kept, and answers no error. Severity: none.
func TestR13RecordBeforeFaultsDoNotFailAHealthySave(t *testing.T) {
	for _, fault := range []string{"stat", "load"} {
		for _, kind := range []string{"writes by value"} {
			t.Run(fault+"/"+kind, func(t *testing.T) {
				ctx := context.Background()
				storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
				const user = "alice"
				key := ConnectionKey("personal", user)
				st := &hookStore{Storage: storage}
				var connStorage certmagic.Storage = st
				if kind == "writes by value" {
					connStorage = newCAS(st)
				}
				gw := r10Replica(t, storage, connStorage, testCipher(t), user)
				if err := gw.checkCipherKey(ctx); err != nil {
					t.Fatal(err)
				}
				if err := gw.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-1"}); err != nil {
					t.Fatal(err)
				}
				faultsLeft := st.loadFaultsLeft
				if fault == "stat" {
					st.failStats(key, 1)
					faultsLeft = st.statFaultsLeft
				} else {
					st.failLoads(key, 1)
				}
				if err := gw.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-2"}); err != nil {
					t.Fatalf("a healthy save whose read of the record before failed: %v", err)
				}
				if faultsLeft(key) > 0 {
					t.Fatal("premise: the save did not read the record before")
				}
				r12Has(t, gw, user, "tok-2")
			})
		}
	}
}

// Attack: the put-back's failure (a storage fault on the write that puts
// B's record back): its error log,
// the save's error; none may carry a token or the sealed bytes of either
// record (A's or the one put back), raw, base64 or hex.
//
// Expected and Held: the log names the key (the user's hash) and the
// storage's error; the save answers ErrCipherRefused; no token and no
// sealed bytes appear. Severity: none. (Reproduced, fixed: A's record,
// sealed with the replaced key after the reset, was left: on B a cipher
// error until alice connected again, although the log said "its person
// connects again". The undo now deletes what it sealed when the put-back
// fails, and alice is asked to connect again.)
func TestR13PutBackFailureLeaksNoSecrets(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	hook := &hookStore{Storage: storage}
	secrets := []string{"tok-SECRET-A", "refresh-SECRET-A", "tok-B", "refresh-B"}
	replicaA, _, saved, k1 := r13RollingReset(t, dir, storage, newCAS(hook), nil, &Connection{AccessToken: secrets[0], RefreshToken: secrets[1]})
	core, logs := observer.New(zapcore.DebugLevel)
	replicaA.connections.logger = zap.New(core)
	prevSealed, err := storage.Load(ctx, key) // B's record, which A's store replaces
	if err != nil {
		t.Fatal(err)
	}
	var aSealed []byte
	hook.afterStore(key, func() { // A's store; the put-back's Store fails
		aSealed, _ = storage.Load(ctx, key)
		hook.failStores(key, 1)
	})
	close(k1.release)
	serr := <-saved
	if !errors.Is(serr, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", serr)
	}
	var text strings.Builder
	text.WriteString(serr.Error() + "\n")
	for _, e := range logs.All() {
		text.WriteString(e.Message + " ")
		for k, v := range e.ContextMap() {
			fmt.Fprintf(&text, "%s=%v ", k, v)
		}
		text.WriteString("\n")
	}
	if len(logs.FilterMessageSnippet("cannot put back").All()) != 1 {
		t.Fatalf("premise: the put-back failed and was logged:\n%s", text.String())
	}
	if _, err := storage.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("A's record, sealed with the replaced key after the reset, after its put-back failed: %v; want it deleted", err)
	}
	forbidden := slices.Clone(secrets)
	for _, sealed := range [][]byte{prevSealed, aSealed} {
		if len(sealed) == 0 {
			t.Fatal("premise: both records were read")
		}
		forbidden = append(forbidden, string(sealed), base64.StdEncoding.EncodeToString(sealed),
			base64.RawURLEncoding.EncodeToString(sealed), hex.EncodeToString(sealed), fmt.Sprintf("%v", sealed)[1:20])
	}
	for _, s := range forbidden {
		if strings.Contains(text.String(), s) {
			t.Errorf("secret or sealed bytes %q in errors or logs:\n%s", s, text.String())
		}
	}
}

// Attack: "a newer record its own store replaced" on a storage that
// writes by value, when the undo cannot read back what is stored (one
// passing fault): ours is taken, and prev put back with ReplaceIfValue;
// meanwhile alice refreshed again on B (tok-B2, newer than what A's
// save read before its store).
//
// Expected and Held: ReplaceIfValue finds not A's record but tok-B2 and
// writes nothing: the newer record stays (not the stale tok-B). Severity:
// none.
func TestR13PutBackByValueKeepsANewerRecordWhenTheReadBackFails(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	cas := newCAS(&hookStore{Storage: storage})
	_, replicaB, saved, k1 := r13RollingReset(t, dir, storage, cas, nil, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	cas.afterStore(key, func() {
		if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B2"}); err != nil {
			t.Errorf("alice refreshing again on replica B: %v", err)
		}
		cas.failLoads(key, 1) // A's read back in its undo
	})
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if cas.loadFaultsLeft(key) > 0 {
		t.Fatal("premise: the undo did not read the record back")
	}
	r12Has(t, replicaB, user, "tok-B2")
}

// Attack: the other undo, the canary unreadable twice after A's store (a
// storage fault, or the cipher down for every Decrypt), the reset recorded
// since A's save began: what A's store replaced is alice's connection made
// again on B (K2) meanwhile.
//
// Expected and Held: the save answers the fault's retryable error. B's
// record was put back then (0a065bb); since r14, an undo after a canary
// that could not be read puts nothing back (whose key A's is cannot be
// told: TestR14UnreadableCanaryUndoOnTheNewKeyPutsBackTheReplacedKeysRecord),
// and deletes, as before the put-back: alice connects again. Severity:
// none.
func TestR13UnreadableCanaryUndoDeletes(t *testing.T) {
	for _, fault := range []string{"storage", "cipher down"} {
		t.Run(fault, func(t *testing.T) {
			dir := t.TempDir()
			storage := SafeListing(&certmagic.FileStorage{Path: dir})
			const user = "alice"
			key := ConnectionKey("personal", user)
			st := &hookStore{Storage: storage}
			down := &cipherDown{}
			_, replicaB, saved, k1 := r13RollingReset(t, dir, storage, newCAS(st), func(c Cipher) Cipher { down.Cipher = c; return down }, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
			st.afterStore(key, func() {
				if fault == "storage" {
					st.failLoads(cipherCanaryKey, 2)
				} else {
					down.down.Store(true)
				}
			})
			close(k1.release)
			err := <-saved
			if fault == "storage" && !errors.Is(err, ErrStorageUnavailable) || fault != "storage" && !errors.Is(err, ErrCipherUnavailable) {
				t.Fatalf("A's save, the canary unreadable after its store and a reset recorded meanwhile: %v; want the fault's retryable error", err)
			}
			down.down.Store(false)
			if _, err := replicaB.connections.LoadFresh(context.Background(), "personal", user); !errors.Is(err, ErrNotConnected) {
				t.Fatalf("alice on B after an undo that could not tell whose record it replaced: %v; want ErrNotConnected", err)
			}
		})
	}
}
