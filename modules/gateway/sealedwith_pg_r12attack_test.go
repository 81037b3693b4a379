package gateway

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/pgtest"
	"github.com/toolgate/toolgate/modules/storage/postgres"
)

// r12PG is the postgres storage (its DeleteIfValue promoted: the
// gateway's valueDeleter) whose next Load of key, the first after skip
// others, runs then right after it read, or fails, once.
type r12PG struct {
	*postgres.Storage
	mu   sync.Mutex
	key  string
	skip int
	then func()
	fail bool
}

func (s *r12PG) Load(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	var then func()
	fail := false
	switch {
	case key == s.key && s.skip > 0 && (s.then != nil || s.fail):
		s.skip--
	case key == s.key:
		then, s.then = s.then, nil
		fail, s.fail = s.fail, false
	}
	s.mu.Unlock()
	if fail {
		return nil, errors.New("r12: postgres: connection reset by peer")
	}
	v, err := s.Storage.Load(ctx, key)
	if then != nil {
		then()
	}
	return v, err
}

// afterLoad sets then to run right after the next Load of key, the first
// after skip others.
func (s *r12PG) afterLoad(skip int, then func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skip, s.then = skip, then
}

// failLoad makes the next Load of key fail.
func (s *r12PG) failLoad() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = true
}

// pending reports whether the hook or the fault set is still to come.
func (s *r12PG) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.then != nil || s.fail
}

// r12Postgres is a postgres storage on a cluster of t's own.
func r12Postgres(t *testing.T) *postgres.Storage {
	t.Helper()
	if os.Getenv("TOOLGATE_REQUIRE_PEERS") == "" {
		t.Skip("PostgreSQL tests run with TOOLGATE_REQUIRE_PEERS=1")
	}
	srv := pgtest.Start(t)
	return pgProvisioned(t, &postgres.Storage{DSN: srv.DSN("postgres"), Table: "r12"})
}

// pgProvisioned is s provisioned and validated, cleaned up with t.
func pgProvisioned(t *testing.T, s *postgres.Storage) *postgres.Storage {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Cleanup() })
	return s
}

// pgResetDuringSave is the rolling reset on real PostgreSQL up to the new
// canary: replica A (K1, its connection store going through connA, which
// writes by value) connected alice (tok-1); the operator stores "reset";
// A's save of tok-2 is held in its Encrypt; replica B (K2, on pgB) starts,
// seals the new canary and records the reset. It returns A, B, the
// channel A's save answers on, and the gate to release it.
func pgResetDuringSave(t *testing.T, pg *postgres.Storage, connA certmagic.Storage, pgB *postgres.Storage) (*App, *App, chan error, *r9Gated) {
	t.Helper()
	ctx := context.Background()
	const user = "alice"
	for _, k := range []string{cipherCanaryKey, cipherResetKey, ConnectionKey("personal", user)} {
		if err := pg.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	k1 := r10Gate(testCipher(t))
	replicaA := r10Replica(t, pg, connA, k1, user)
	if _, ok := replicaA.connections.storage.(valueReplacer); !ok {
		t.Fatal("premise: A's storage writes by value")
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
	replicaB := r10Replica(t, pgB, pgB, testCipher(t), user)
	if err := replicaB.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	return replicaA, replicaB, saved, k1
}

// pgRollingReset is pgResetDuringSave, then alice connects again on B
// (tok-B).
func pgRollingReset(t *testing.T, pg *postgres.Storage, connA certmagic.Storage, pgB *postgres.Storage) (*App, *App, chan error, *r9Gated) {
	t.Helper()
	replicaA, replicaB, saved, k1 := pgResetDuringSave(t, pg, connA, pgB)
	if err := replicaB.connections.Save(context.Background(), "personal", "alice", &Connection{AccessToken: "tok-B", RefreshToken: "refresh-B"}); err != nil {
		t.Fatalf("alice connecting again on replica B: %v", err)
	}
	return replicaA, replicaB, saved, k1
}

// Attack: the rolling reset on real PostgreSQL. Replica A (K1) saw the
// reset marker before sealing alice's grant; B (K2) seals the new canary;
// A's check after sealing finds it refusing and undoes its store. (held)
// Right after the undo read A's record back, alice connects again on B
// (tok-B, K2); (reproduced) or the undo's read back fails once, and
// alice had connected again on B right after A's store.
//
// Expected: B's newer record is kept in both (the DeleteIfValue the
// change added for PostgreSQL).
//
// Held ("stored between the read and the delete"): DeleteIfValue finds
// another value and deletes nothing; tok-B stays. Reproduced ("read back
// fails"): undoSealed falls back to the plain Delete without the value
// read, and tok-B is deleted on real PostgreSQL too (see
// TestR12UndoWhoseReadBackFailsDeletesANewerRecordDespiteDeleteIfValue for
// the fix: DeleteIfValue(key, sealed)). Severity: low.
func TestR12RealPostgresUndoAndANewerRecord(t *testing.T) {
	pg := r12Postgres(t)
	for _, how := range []string{"stored between the read and the delete", "read back fails"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			const user = "alice"
			key := ConnectionKey("personal", user)
			st := &r12PG{Storage: pg, key: key}
			hook := &r12PGStoreHook{r12PG: st, key: key}
			replicaA, replicaB, saved, k1 := pgResetDuringSave(t, pg, hook, pg)
			if _, ok := replicaA.connections.storage.(valueDeleter); !ok {
				t.Fatal("premise: A's storage deletes by value")
			}
			connectOnB := func() {
				if err := replicaB.connections.Save(ctx, "personal", user, &Connection{AccessToken: "tok-B"}); err != nil {
					t.Errorf("alice connecting again on replica B: %v", err)
				}
			}
			if how == "read back fails" {
				hook.then = func() { // right after A's store
					connectOnB()
					st.failLoad()
				}
			} else {
				st.afterLoad(1, connectOnB) // skipping the save's read of what it stores over: right after the undo's read back
			}
			close(k1.release)
			if err := <-saved; !errors.Is(err, ErrCipherRefused) {
				t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
			}
			if st.pending() {
				t.Fatal("premise: the undo did not read the record back")
			}
			r12Has(t, replicaB, user, "tok-B")
		})
	}
}

// r12PGStoreHook is r12PG whose next Store of key, or ReplaceIfValue that
// replaced it (a save's store over a record it read), runs then right
// after it (DeleteIfValue still promoted from the postgres storage).
type r12PGStoreHook struct {
	*r12PG
	key  string
	then func()
}

func (s *r12PGStoreHook) Store(ctx context.Context, key string, value []byte) error {
	err := s.r12PG.Store(ctx, key, value)
	if key == s.key && s.then != nil {
		then := s.then
		s.then = nil
		then()
	}
	return err
}

// The rolling reset of TestSaveUndoneAcrossTheResetPutsBackTheRecordItsStoreReplaced
// on real PostgreSQL: the record A's store replaced (alice's connection
// made on B during A's save) is put back with ReplaceIfValue.
func TestSaveUndoneOnPostgresPutsBackTheRecordItsStoreReplaced(t *testing.T) {
	pg := r12Postgres(t)
	const user = "alice"
	_, replicaB, saved, k1 := pgRollingReset(t, pg, pg, pg)
	close(k1.release)
	if err := <-saved; !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("A's save sealed with the replaced key after the new canary: %v, want ErrCipherRefused", err)
	}
	r12Has(t, replicaB, user, "tok-B")
}

func (s *r12PGStoreHook) ReplaceIfValue(ctx context.Context, key string, old, value []byte) (bool, error) {
	replaced, err := s.r12PG.ReplaceIfValue(ctx, key, old, value)
	if key == s.key && replaced && s.then != nil {
		then := s.then
		s.then = nil
		then()
	}
	return replaced, err
}
