package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

// Attack (fixed): TestR13DisconnectDuringTheSaveIsUndoneByThePutBack on
// real PostgreSQL, whose put-back is ReplaceIfValue: alice, connected
// again on B (tok-B) during A's save across the rolling reset, disconnects
// on B right after A's save read B's record, before A's store.
//
// Expected: the connection she forgot stays forgotten (ErrNotConnected on
// B).
//
// Reproduced (0a065bb): A's store landed over nothing; the canary
// refused; the undo read back A's own record and ReplaceIfValue(key, A's
// record, B's record) found A's record there and wrote B's back: alice was
// connected with tok-B again. ReplaceIfValue guarded the put-back's own
// moment only, not the read of prev before the store. Severity:
// low-medium. Fixed: the save's store replaces what it read only while it
// is still there (storeSealed); here it is gone, and nothing is put back.
func TestR13RealPostgresPutBackResurrectsADisconnectedConnection(t *testing.T) {
	pg := r12Postgres(t)
	ctx := context.Background()
	const user = "alice"
	st := &r12PG{Storage: pg, key: ConnectionKey("personal", user)}
	_, replicaB, saved, k1 := pgRollingReset(t, pg, st, pg)
	st.afterLoad(0, func() { // right after A's save read B's record
		if err := replicaB.connections.Delete(ctx, "personal", user); err != nil {
			t.Errorf("alice disconnecting on replica B: %v", err)
		}
	})
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if st.pending() {
		t.Fatal("premise: the disconnect did not run during A's save")
	}
	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	if !errors.Is(err, ErrNotConnected) {
		t.Fatalf("alice on replica B after she disconnected there: %s %v; want ErrNotConnected (the connection she forgot came back)", r13Tok(conn), err)
	}
}

// Attack: the cache of another replica on the replaced key. Replica C
// (K1, following PostgreSQL's announcements, its copies trusted until a
// change is announced) reads alice's connection right after A's store
// across the rolling reset: A's record opens with K1, and C keeps tok-2.
// A's check after sealing then puts B's record back (tok-B).
//
// Expected and Held: the undo announces the key (cache.Deleted); C drops
// its copy of the undone record once the announcement arrives (waited
// for, not timed) and reads B's record, which K1 does not open; C never
// serves tok-2 after that. Severity: none.
func TestR13RealPostgresPutBackDropsAnotherReplicasCopy(t *testing.T) {
	pg := r12Postgres(t)
	ctx := context.Background()
	const user = "alice"
	key := ConnectionKey("personal", user)
	for _, k := range []string{cipherCanaryKey, cipherResetKey, key} {
		if err := pg.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	k1 := r10Gate(testCipher(t))
	hook := &r12PGStoreHook{r12PG: &r12PG{Storage: pg, key: key}, key: key}
	replicaA := r10Replica(t, pg, hook, k1, user)
	replicaC := r10Replica(t, pg, pg, k1.key, user)
	replicaC.connections = newConnectionStore(pg, k1.key, time.Hour)
	if err := replicaC.connections.start(zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replicaC.connections.stop)
	for i := 0; !replicaC.connections.watch.Live(); i++ {
		if i > 400 {
			t.Fatal("premise: C's watch of announcements is not live")
		}
		time.Sleep(25 * time.Millisecond)
	}
	if err := replicaA.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := replicaA.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-1"}); err != nil {
		t.Fatal(err)
	}
	if err := pg.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	saved := r10SaveHeld(replicaA, k1, user, &Connection{AccessToken: "tok-2", RefreshToken: "r"})
	replicaB := r10Replica(t, pg, pg, testCipher(t), user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B"}); err != nil {
		t.Fatalf("alice connecting again on replica B: %v", err)
	}
	// Every announcement made so far (B's save) has reached C: only the
	// undo's can drop the copy C is about to keep.
	if !replicaC.connections.watch.ChangedAndWait(ctx, connectionPrefix+"/r13-barrier", 10*time.Second) {
		t.Fatal("premise: C heard its own announcement back")
	}
	hook.then = func() { // right after A's store: C reads and keeps A's record
		conn, err := replicaC.connections.LoadFresh(ctx, "personal", user)
		if err != nil || conn.AccessToken != "tok-2" {
			t.Errorf("premise: C read A's record: %s %v", r13Tok(conn), err)
		}
	}
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if hook.then != nil {
		t.Fatal("premise: C did not read A's record")
	}
	// C kept it, or the undo's announcement already dropped it: either way
	// C must not serve it once the announcement arrived.
	r12Has(t, replicaB, user, "tok-B")
	for i := 0; ; i++ {
		if _, ok := replicaC.connections.cache.Get(key); !ok {
			break
		}
		if i > 400 {
			t.Fatal("C kept its copy of the undone record (tok-2): the undo's announcement never reached it")
		}
		time.Sleep(25 * time.Millisecond)
	}
	if conn, err := replicaC.connections.Load(ctx, "personal", user); err == nil {
		t.Fatalf("C serves %s after the undo; want an error (B's record does not open with K1)", r13Tok(conn))
	}
}

// Attack: the put-back's own moment on real PostgreSQL: right after A's
// undo read back its own record (and decided to put B's back), alice
// (1) refreshes on B (tok-B2, newer than the tok-B A's store replaced), or
// (2) disconnects on B.
//
// Expected and Held: ReplaceIfValue writes only over A's own record:
// (1) tok-B2 stays, not the stale tok-B; (2) alice stays disconnected.
// (On a storage without ReplaceIfValue the plain Store brings tok-B back:
// TestR13DisconnectDuringTheSaveIsUndoneByThePutBack, "between the undo's
// read and its put-back".) Severity: none.
func TestR13RealPostgresPutBackByValueAgainstAChangeAfterTheUndosRead(t *testing.T) {
	pg := r12Postgres(t)
	for _, change := range []string{"refreshed on B", "disconnected on B"} {
		t.Run(change, func(t *testing.T) {
			ctx := context.Background()
			const user = "alice"
			st := &r12PG{Storage: pg, key: ConnectionKey("personal", user)}
			_, replicaB, saved, k1 := pgRollingReset(t, pg, st, pg)
			st.afterLoad(1, func() { // skipping the save's read of what it stores over
				var err error
				if change == "refreshed on B" {
					err = replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B2"})
				} else {
					err = replicaB.connections.Delete(ctx, "personal", user)
				}
				if err != nil {
					t.Errorf("alice's change on B: %v", err)
				}
			})
			close(k1.release)
			if err := <-saved; !errors.Is(err, ErrCipherRefused) {
				t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
			}
			if st.pending() {
				t.Fatal("premise: the undo did not read the record back")
			}
			if change == "refreshed on B" {
				r12Has(t, replicaB, user, "tok-B2")
				return
			}
			if conn, err := replicaB.connections.LoadFresh(ctx, "personal", user); !errors.Is(err, ErrNotConnected) {
				t.Fatalf("alice on B after she disconnected there: %s %v; want ErrNotConnected", r13Tok(conn), err)
			}
		})
	}
}
