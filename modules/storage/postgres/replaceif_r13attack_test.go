package postgres

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Attack: ReplaceIfValue of keys spelled otherwise than stored
// ("/a//b/./c/"), of keys that leave the root or cannot be held, of a
// directory, and of a value with keys below it (a row only a hand-made
// insert gives).
//
// Expected and Held: the key is cleaned as Store and Load clean it (the
// value is found and replaced); "..", NUL and the root are errors and
// write nothing; a directory is not written (no row is made for it); a
// value with keys below it is replaced alone, its keys below untouched.
// Severity: none.
func TestR13ReplaceIfValueKeysCleanedAndDirectories(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := sharedDSN(t, "r13-keys")
	s := newStorage(t, dsn, newTableName(), 0)
	const key = "toolgate/connections/personal/alice"
	mustStore(t, ctx, s, key, []byte("v"))
	for _, bad := range []string{"toolgate/../toolgate/connections/personal/alice", "toolgate/connections/personal/alice\x00", "", "/"} {
		if replaced, err := s.ReplaceIfValue(ctx, bad, []byte("v"), []byte("x")); err == nil || replaced {
			t.Errorf("ReplaceIfValue(%q): %v %v, want an error", bad, replaced, err)
		}
	}
	if got := mustLoad(t, ctx, s, key); string(got) != "v" {
		t.Fatalf("after the refused keys: %q", got)
	}
	if replaced, err := s.ReplaceIfValue(ctx, "/toolgate//connections/./personal/alice/", []byte("v"), []byte("w")); err != nil || !replaced {
		t.Fatalf("ReplaceIfValue of the key spelled otherwise: %v %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, key); string(got) != "w" {
		t.Fatalf("after ReplaceIfValue of the key spelled otherwise: %q", got)
	}

	mustStore(t, ctx, s, "dir/a", []byte("v"))
	mustStore(t, ctx, s, "dir/b/c", []byte("v"))
	for _, k := range []string{"dir", "dir/", "dir/b"} {
		if replaced, err := s.ReplaceIfValue(ctx, k, []byte("v"), []byte("x")); err != nil || replaced {
			t.Fatalf("ReplaceIfValue of directory %q: %v %v", k, replaced, err)
		}
		if _, err := s.Load(ctx, k); err == nil {
			t.Fatalf("ReplaceIfValue made a value of directory %q", k)
		}
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	query(t, dsn, `insert into `+q.qualified+` (key, value, modified) values ('dir/b', 'w', now())`, nil)
	if replaced, err := s.ReplaceIfValue(ctx, "dir/b", []byte("v"), []byte("x")); err != nil || replaced {
		t.Fatalf("ReplaceIfValue of dir/b with another value: %v %v", replaced, err)
	}
	if replaced, err := s.ReplaceIfValue(ctx, "dir/b", []byte("w"), []byte("x")); err != nil || !replaced {
		t.Fatalf("ReplaceIfValue of dir/b with its value: %v %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, "dir/b/c"); string(got) != "v" {
		t.Fatalf("a key below dir/b after its ReplaceIfValue: %q", got)
	}
}

// Attack: ReplaceIfValue with nil and empty values: Store keeps nil as
// the empty value, and pgx sends a nil slice as NULL ("value = NULL" is
// never true; a NULL value would then Load as empty but match nothing).
//
// Expected and Held: nil and []byte{} are both the empty value, as old
// and as the new value; an empty value is not taken for another, nor
// another for it. Severity: none.
func TestR13ReplaceIfValueNilAndEmpty(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := sharedDSN(t, "r13-nil")
	s := newStorage(t, dsn, newTableName(), 0)
	mustStore(t, ctx, s, "a", nil)
	if replaced, err := s.ReplaceIfValue(ctx, "a", nil, []byte("x")); err != nil || !replaced {
		t.Fatalf("ReplaceIfValue(a, nil, x) of the empty value Store(a, nil) stored: %v %v", replaced, err)
	}
	if replaced, err := s.ReplaceIfValue(ctx, "a", []byte("x"), nil); err != nil || !replaced {
		t.Fatalf("ReplaceIfValue(a, x, nil): %v %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, "a"); got == nil || len(got) != 0 {
		t.Fatalf("after ReplaceIfValue to nil: %#v, want the empty value", got)
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var isNull bool
	query(t, dsn, `select value is null from `+q.qualified+` where key = 'a'`, nil, &isNull)
	if isNull {
		t.Fatal("ReplaceIfValue to nil stored NULL, which no later compare matches")
	}
	if replaced, err := s.ReplaceIfValue(ctx, "a", []byte{}, []byte("y")); err != nil || !replaced {
		t.Fatalf("ReplaceIfValue(a, empty, y): %v %v", replaced, err)
	}
	if replaced, err := s.ReplaceIfValue(ctx, "a", nil, []byte("z")); err != nil || replaced {
		t.Fatalf("ReplaceIfValue(a, nil, z) of a non-empty value: %v %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, "a"); string(got) != "y" {
		t.Fatalf("after the compares: %q", got)
	}
}

// Attack: ReplaceIfValue while another writer's transaction holds the
// row: (1) it deletes the row and inserts the key again with a new value
// (a delete-then-store in one transaction), (2) it deletes the row and
// commits (a disconnect), (3) it writes a new value and rolls back.
//
// Expected and Held: (1) and (2) nothing is written (the row the statement
// waited for is gone, and the new one is the writer's): the writer's
// value stays, and the deleted key stays deleted; (3) the value is
// replaced, the old one being there after the rollback. Severity: none.
func TestR13ReplaceIfValueAgainstAWritersTransaction(t *testing.T) {
	for _, how := range []string{"delete and insert again", "delete", "update rolled back"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			app := "r13-writer-" + map[string]string{"delete and insert again": "di", "delete": "d", "update rolled back": "rb"}[how]
			s := newStorage(t, sharedDSN(t, app), newTableName(), 0)
			const key = "toolgate/connections/personal/alice"
			mustStore(t, ctx, s, key, []byte("old"))
			q, err := s.t.ready(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, sharedDSN(t, app+"-tx"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "delete and insert again":
				if _, err := tx.Exec(ctx, `delete from `+q.qualified+` where key = $1`, key); err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, `insert into `+q.qualified+` (key, value, modified) values ($1, $2, now())`, key, []byte("new")); err != nil {
					t.Fatal(err)
				}
			case "delete":
				if _, err := tx.Exec(ctx, `delete from `+q.qualified+` where key = $1`, key); err != nil {
					t.Fatal(err)
				}
			default:
				if _, err := tx.Exec(ctx, `update `+q.qualified+` set value = $2, modified = now() where key = $1`, key, []byte("new")); err != nil {
					t.Fatal(err)
				}
			}
			type result struct {
				ok  bool
				err error
			}
			done := make(chan result, 1)
			go func() {
				ok, err := s.ReplaceIfValue(ctx, key, []byte("old"), []byte("put back"))
				done <- result{ok, err}
			}()
			waiting := false
			for range 400 {
				var n int
				query(t, sharedDSN(t, app+"-watch"), `select count(*) from pg_stat_activity where application_name = '`+app+`' and wait_event_type = 'Lock'`, nil, &n)
				if waiting = n > 0; waiting {
					break
				}
				time.Sleep(25 * time.Millisecond)
			}
			if !waiting {
				_ = tx.Rollback(ctx)
				t.Fatal("premise: ReplaceIfValue did not wait for the writer's transaction")
			}
			if how == "update rolled back" {
				err = tx.Rollback(ctx)
			} else {
				err = tx.Commit(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			got, lerr := s.Load(ctx, key)
			switch how {
			case "delete and insert again":
				if r.err != nil || r.ok || string(got) != "new" {
					t.Fatalf("ReplaceIfValue across a delete and insert: replaced %v, %v; now %q %v; want the writer's value", r.ok, r.err, got, lerr)
				}
			case "delete":
				if r.err != nil || r.ok || !errors.Is(lerr, fs.ErrNotExist) {
					t.Fatalf("ReplaceIfValue across a delete: replaced %v, %v; now %q %v; want it deleted", r.ok, r.err, got, lerr)
				}
			default:
				if r.err != nil || !r.ok || string(got) != "put back" {
					t.Fatalf("ReplaceIfValue after a rolled back write: replaced %v, %v; now %q %v", r.ok, r.err, got, lerr)
				}
			}
		})
	}
}
