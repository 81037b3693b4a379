package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Attack (fixed): the save's store on a storage that writes by value falls back to
// a plain Store when its ReplaceIfValue of what it read fails. The rolling
// reset of r13RollingReset (A on the replaced key K1, its save held in its
// Encrypt; B on K2 seals the new canary; alice connects again on B,
// tok-B). Right after A's storeSealed read tok-B's record (its Stat and
// Load), alice refreshes or connects once more on B (tok-B2): A's
// ReplaceIfValue(tok-B → A's record) finds tok-B2 and writes nothing, and
// A then stores over tok-B2 unconditionally, with nothing to put back.
//
// Expected: the README: "the save stores over what it read only while it
// is still there", and "a newer record its own store replaced (a person
// connecting again on a new-key replica during that very save) is put
// back": alice stays connected on B with tok-B2 (or at worst tok-B).
//
// Reproduced (97eaa63): the plain Store overwrote tok-B2 (a record A never
// read), prev was nil, the canary refused, and the undo deleted A's
// record: alice, who connected on the new-key replica twice during A's
// save, was not connected at all (ErrNotConnected). Severity: low (a
// rolling reset, and B's write inside A's Stat→ReplaceIfValue window of
// two round trips). Fixed: storeSealed reads the record again when another
// write came in between (a few times) before it stores unconditionally.
func TestR14FallbackStoreOverwritesARecordItNeverReadAndTheUndoLosesIt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	hook := &hookStore{Storage: storage}
	_, replicaB, saved, k1 := r13RollingReset(t, dir, storage, newCAS(hook), nil, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	hook.afterLoad(key, 0, func() { // right after storeSealed's Load of tok-B's record
		if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B2", RefreshToken: "refresh-B2"}); err != nil {
			t.Errorf("alice connecting once more on replica B: %v", err)
		}
	})
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if hook.loadPending() {
		t.Fatal("premise: alice's second connection on B did not run during A's save")
	}
	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	if err != nil || conn.AccessToken != "tok-B2" && conn.AccessToken != "tok-B" {
		t.Fatalf("alice on replica B after A's undone save: %s %v; want tok-B2 (her newest connection on the new-key replica), which A's fallback Store overwrote and its undo deleted", r13Tok(conn), err)
	}
}

// Attack (fixed): the undo of an unreadable canary (checkKeyAfterSealing's second
// case) on a replica whose key is the NEW one. The operator stored "reset";
// replica A restarted with K2, the new key, but its start could not seal
// the new canary (the cipher unreachable for that moment: sealCanary logs
// and goes on, as in TestR12NewKeyGatewayOnAResetCanaryLosesAGoodConnectionToTwoBlips).
// A and replica C (K1, the replaced key, not yet restarted) each begin a
// save of alice's grant while the canary reads "reset" (both pass their
// check before sealing). B (K2) starts, seals the new canary and
// records the reset. C's store lands (K1, after the reset); A's store
// (ReplaceIfValue: it read C's record) replaces it. C's check after
// sealing finds the canary refusing; its undo reads A's record, which K1
// does not open, and leaves it ("another replica's record stays"). Then
// A's two reads of the canary fail (a passing storage fault): a reset was
// recorded since A's save began, so A undoes — and restorable, seeing a
// record stored since the reset that A's key (K2) does not open, puts C's
// record back.
//
// Expected: no record sealed with the replaced key and stored after the
// reset is left (the very thing checkKeyAfterSealing exists to prevent):
// on B alice has A's connection, or is asked to connect again
// (ErrNotConnected / ErrSealedWithOtherKey).
//
// Reproduced (97eaa63): restorable reasoned as if this replica's key were the
// replaced one ("one that does not open with it ... stored by a replica
// with the new key"), which holds when the canary refuses but not when it
// could not be read: here A's key is the new one, and "does not open with
// it" means the replaced key's. C's K1 record, which C's own undo left
// only because A had replaced it, is put back: on B (K2) alice gets a
// cipher error (ErrCipherRefused wrapped as a decrypt error) that does not
// clear until she connects again, instead of a sign-in. Severity: low (a
// rolling reset, two saves of one grant across it with the grant lock
// lost, and two canary read faults right after A's store).
//
// Fixed: an undo puts back only when the canary refused this replica's
// key; after one that could not be read it deletes, as before the
// put-back.
func TestR14UnreadableCanaryUndoOnTheNewKeyPutsBackTheReplacedKeysRecord(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	const user = "alice"
	key := ConnectionKey("personal", user)
	k1, k2 := testCipher(t), testCipher(t)
	replicaO := r10Replica(t, storage, storage, k1, user)
	connectedBeforeReset(t, dir, replicaO, user)
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	gA, gC := r10Gate(k2), r10Gate(k1)
	casA := newCAS(&hookStore{Storage: storage})
	replicaA := r10Replica(t, storage, casA, gA, user)
	hookC := &hookStore{Storage: storage}
	replicaC := r10Replica(t, storage, hookC, gC, user)
	savedA := r10SaveHeld(replicaA, gA, user, &Connection{AccessToken: "tok-A", RefreshToken: "r"})
	savedC := r10SaveHeld(replicaC, gC, user, &Connection{AccessToken: "tok-C", RefreshToken: "r"})
	replicaB := r10Replica(t, storage, storage, k2, user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	r8Age(t, dir, cipherResetKey, time.Hour)

	aStored, cDone := make(chan struct{}), make(chan struct{})
	casA.afterStore(key, func() { // A's ReplaceIfValue over C's record
		casA.failLoads(cipherCanaryKey, 2) // A's two reads of the canary after it
		close(aStored)
		<-cDone
	})
	hookC.afterStore(key, func() { close(gA.release); <-aStored }) // right after C's store
	close(gC.release)
	if err := <-savedC; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("premise: C's save (K1) after the new canary is refused: %v", err)
	}
	now, err := storage.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if plain, err := k2.Decrypt(ctx, now, CipherContext("personal", user)); err != nil {
		t.Fatalf("premise: A's record (K2) replaced C's and C's undo left it: %v", err)
	} else {
		clear(plain)
	}
	close(cDone)
	if err := <-savedA; !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("premise: A's save, the canary unreadable twice and a reset recorded meanwhile, answers the fault: %v", err)
	}
	if sealed, err := storage.Load(ctx, key); err == nil {
		if plain, derr := k1.Decrypt(ctx, sealed, CipherContext("personal", user)); derr == nil {
			t.Errorf("a record sealed with the replaced key K1 after the reset is in storage (put back by A's undo): %s", plain)
		}
	}
	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	switch {
	case err == nil && conn.AccessToken == "tok-A":
	case errors.Is(err, ErrNotConnected), errors.Is(err, ErrSealedWithOtherKey):
	default:
		t.Errorf("alice on replica B (K2): %s %v; want tok-A, ErrNotConnected or ErrSealedWithOtherKey (connect again), not an error that never clears", r13Tok(conn), err)
	}
}

// Attack: a healthy gateway (no reset anywhere) on a storage that writes by
// value: the save's Stat and Load of the record it is about to replace see
// one record, and a disconnect (Delete) lands between them and the
// ReplaceIfValue; or the Load finds the key gone after the Stat found it.
//
// Expected and Held: the save is the later write and stores as before the
// change (the fallback Store): the save answers no error and alice is
// connected with the saved token, in the cache and in storage. Severity:
// none.
func TestR14HealthySaveAcrossADisconnectInItsReadToReplaceWindow(t *testing.T) {
	for _, when := range []string{"after the load", "between the stat and the load"} {
		t.Run(when, func(t *testing.T) {
			ctx := context.Background()
			storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
			const user = "alice"
			key := ConnectionKey("personal", user)
			cas := newCAS(&hookStore{Storage: storage})
			gw := r10Replica(t, storage, cas, testCipher(t), user)
			other := r10Replica(t, storage, storage, gw.cipher, user)
			if err := gw.checkCipherKey(ctx); err != nil {
				t.Fatal(err)
			}
			if err := gw.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-1"}); err != nil {
				t.Fatal(err)
			}
			disconnect := func() {
				if err := other.connections.Delete(ctx, "personal", user); err != nil {
					t.Errorf("disconnect: %v", err)
				}
			}
			if when == "after the load" {
				cas.afterLoad(key, 0, disconnect)
			} else {
				cas.afterStat(key, disconnect)
			}
			if err := gw.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-2"}); err != nil {
				t.Fatalf("a healthy save across a disconnect: %v", err)
			}
			if cas.loadPending() || cas.statPending() {
				t.Fatal("premise: the disconnect did not run during the save")
			}
			r12Has(t, gw, user, "tok-2")
			if _, err := storage.Stat(ctx, key); err != nil {
				t.Fatalf("the saved record: %v", err)
			}
		})
	}
}
