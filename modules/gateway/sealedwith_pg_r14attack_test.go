package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/toolgate/toolgate/modules/storage/postgres"
)

// r14SecondStorage is another postgres storage on pg's database and
// table, with a pool of its own (another DSN string: pools are shared per
// DSN), as another replica's.
func r14SecondStorage(t *testing.T, pg *postgres.Storage) *postgres.Storage {
	t.Helper()
	return pgProvisioned(t, &postgres.Storage{DSN: pg.DSN + "&application_name=r14-replica-b", Table: pg.Table})
}

// Attack: TestR14FallbackStoreOverwritesARecordItNeverReadAndTheUndoLosesIt
// on real PostgreSQL. The rolling reset (A on K1, its save held; B on K2
// seals the new canary; alice connects again on B, tok-B); right after
// A's storeSealed loaded tok-B's record, alice connects once more on B
// (tok-B2).
//
// Expected: alice stays connected on B (tok-B2, or at worst tok-B): "the
// save stores over what it read only while it is still there", and the
// undo puts back what its store replaced.
//
// Reproduced: ReplaceIfValue(tok-B → A's record) writes nothing (tok-B2 is
// there); storeSealed falls back to a plain Store over tok-B2 and returns
// no prev; the canary refuses and the undo deletes A's record
// (DeleteIfValue): alice is not connected. Severity: low.
func TestR14RealPostgresFallbackStoreLosesANewerRecord(t *testing.T) {
	pg := r12Postgres(t)
	ctx := context.Background()
	const user = "alice"
	st := &r12PG{Storage: pg, key: ConnectionKey("personal", user)}
	_, replicaB, saved, k1 := pgRollingReset(t, pg, st, r14SecondStorage(t, pg))
	st.afterLoad(0, func() { // right after storeSealed's Load of tok-B's record
		if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B2"}); err != nil {
			t.Errorf("alice connecting once more on replica B: %v", err)
		}
	})
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	if st.pending() {
		t.Fatal("premise: alice's second connection on B did not run during A's save")
	}
	conn, err := replicaB.connections.LoadFresh(ctx, "personal", user)
	if err != nil || conn.AccessToken != "tok-B2" && conn.AccessToken != "tok-B" {
		t.Fatalf("alice on replica B after A's undone save: %s %v; want tok-B2, which A's fallback Store overwrote and its undo deleted", r13Tok(conn), err)
	}
}

// Attack: a healthy gateway (no reset anywhere, one key) as two replicas on
// real PostgreSQL, each with its own pool, saving alice's connection over
// and over at once (refreshes racing with the grant lock lost, or a person
// connecting on both): every save goes through storeSealed's Stat, Load
// and ReplaceIfValue, which the other replica's writes keep invalidating
// (the fallback Store); and disconnects racing them.
//
// Expected and Held: every save answers no error; what is stored at the
// end opens with the key and is one of the saved tokens (or nothing after
// a disconnect that came last), and both replicas read the same fresh.
// Severity: none.
func TestR14RealPostgresTwoHealthyReplicasRacingSaves(t *testing.T) {
	pg := r12Postgres(t)
	ctx := context.Background()
	const user = "alice"
	k := testCipher(t)
	pg2 := r14SecondStorage(t, pg)
	a := r10Replica(t, pg, pg, k, user)
	b := r10Replica(t, pg2, pg2, k, user)
	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	const rounds = 25
	saved := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range []struct {
		name string
		app  *App
	}{{"a", a}, {"b", b}} {
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					tok := fmt.Sprintf("tok-%s%d-%d", r.name, g, i)
					mu.Lock()
					saved[tok] = true
					mu.Unlock()
					if err := r.app.connections.Save(ctx, "personal", user, &Connection{AccessToken: tok}); err != nil {
						t.Errorf("healthy save %s: %v", tok, err)
						return
					}
					if g == 1 && i%7 == 3 && i < rounds-1 {
						if err := r.app.connections.Delete(ctx, "personal", user); err != nil {
							t.Errorf("disconnect: %v", err)
							return
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	ca, errA := a.connections.LoadFresh(ctx, "personal", user)
	cb, errB := b.connections.LoadFresh(ctx, "personal", user)
	switch {
	case errors.Is(errA, ErrNotConnected) && errors.Is(errB, ErrNotConnected):
		// a disconnect came last
	case errA != nil || errB != nil:
		t.Fatalf("after the race: %v / %v", errA, errB)
	case ca.AccessToken != cb.AccessToken || !saved[ca.AccessToken]:
		t.Fatalf("after the race: a reads %s, b reads %s", ca.AccessToken, cb.AccessToken)
	}
	// A last save on each settles it: every replica reads it.
	if err := a.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-last"}); err != nil {
		t.Fatal(err)
	}
	r12Has(t, b, user, "tok-last")
}
