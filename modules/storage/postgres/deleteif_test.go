package postgres

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeleteIfValue deletes a key only while it holds the value given: not
// another value, not a missing key, and not a value another replica wrote
// while the delete waited for the row (its transaction committed after
// the delete began).
func TestDeleteIfValue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	table := newTableName()
	s := newStorage(t, sharedDSN(t, "deleteif"), table, 0)
	// The shape modules/gateway looks for (its valueDeleter).
	var _ interface {
		DeleteIfValue(ctx context.Context, key string, value []byte) (bool, error)
	} = s
	const key = "toolgate/connections/personal/alice"
	mustStore(t, ctx, s, key, []byte("old"))
	if deleted, err := s.DeleteIfValue(ctx, key, []byte("other")); err != nil || deleted {
		t.Fatalf("DeleteIfValue of another value: %v %v", deleted, err)
	}
	if got := mustLoad(t, ctx, s, key); string(got) != "old" {
		t.Fatalf("after DeleteIfValue of another value: %q", got)
	}
	if deleted, err := s.DeleteIfValue(ctx, key+"-none", []byte("old")); err != nil || deleted {
		t.Fatalf("DeleteIfValue of a missing key: %v %v", deleted, err)
	}
	if deleted, err := s.DeleteIfValue(ctx, "toolgate/connections", []byte("old")); err != nil || deleted {
		t.Fatalf("DeleteIfValue of a directory: %v %v", deleted, err)
	}
	if got := mustLoad(t, ctx, s, key); string(got) != "old" {
		t.Fatalf("after DeleteIfValue of its directory: %q", got)
	}

	// Another replica's write, its transaction open, holds the row; the
	// delete of the old value waits for it, and must find the new one.
	deleted, err := whileAWriteHoldsTheRow(t, ctx, s, key, []byte("new"), "deleteif", func() (bool, error) {
		return s.DeleteIfValue(ctx, key, []byte("old"))
	})
	if err != nil || deleted {
		t.Fatalf("DeleteIfValue of the old value, committed over meanwhile: deleted %v, %v", deleted, err)
	}
	if got := mustLoad(t, ctx, s, key); !bytes.Equal(got, []byte("new")) {
		t.Fatalf("the other replica's write: %q", got)
	}

	if deleted, err := s.DeleteIfValue(ctx, key, []byte("new")); err != nil || !deleted {
		t.Fatalf("DeleteIfValue of the value held: %v %v", deleted, err)
	}
	if _, err := s.Load(ctx, key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after DeleteIfValue of the value held: %v", err)
	}
}

// ReplaceIfValue stores a value only while the key holds the old one
// given: not over another value, not at a missing key or a directory, and
// not over a value another replica wrote while it waited for the row.
func TestReplaceIfValue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newStorage(t, sharedDSN(t, "replaceif"), newTableName(), 0)
	// The shape modules/gateway looks for (its valueReplacer).
	var _ interface {
		ReplaceIfValue(ctx context.Context, key string, old, value []byte) (bool, error)
	} = s
	const key = "toolgate/connections/personal/alice"
	mustStore(t, ctx, s, key, []byte("old"))
	if replaced, err := s.ReplaceIfValue(ctx, key, []byte("other"), []byte("x")); err != nil || replaced {
		t.Fatalf("ReplaceIfValue of another value: %v %v", replaced, err)
	}
	if replaced, err := s.ReplaceIfValue(ctx, key+"-none", []byte("old"), []byte("x")); err != nil || replaced {
		t.Fatalf("ReplaceIfValue of a missing key: %v %v", replaced, err)
	}
	if _, err := s.Load(ctx, key+"-none"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReplaceIfValue stored a missing key: %v", err)
	}
	if replaced, err := s.ReplaceIfValue(ctx, "toolgate/connections", []byte("old"), []byte("x")); err != nil || replaced {
		t.Fatalf("ReplaceIfValue of a directory: %v %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, key); string(got) != "old" {
		t.Fatalf("after ReplaceIfValue of another value and of its directory: %q", got)
	}
	before, err := s.Stat(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if replaced, err := s.ReplaceIfValue(ctx, key, []byte("old"), []byte("put back")); err != nil || !replaced {
		t.Fatalf("ReplaceIfValue of the value held: %v %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, key); string(got) != "put back" {
		t.Fatalf("after ReplaceIfValue of the value held: %q", got)
	}
	if after, err := s.Stat(ctx, key); err != nil || after.Modified.Before(before.Modified) || after.Size != int64(len("put back")) {
		t.Fatalf("Stat after ReplaceIfValue: %+v %v (before %+v)", after, err, before)
	}
	replaced, err := whileAWriteHoldsTheRow(t, ctx, s, key, []byte("new"), "replaceif", func() (bool, error) {
		return s.ReplaceIfValue(ctx, key, []byte("put back"), []byte("stale"))
	})
	if err != nil || replaced {
		t.Fatalf("ReplaceIfValue of the old value, committed over meanwhile: replaced %v, %v", replaced, err)
	}
	if got := mustLoad(t, ctx, s, key); !bytes.Equal(got, []byte("new")) {
		t.Fatalf("the other replica's write: %q", got)
	}
}

// whileAWriteHoldsTheRow runs op while another replica's write of value
// to key, its transaction open, holds the row (op's session, named app,
// waits for it), then commits that write and returns what op returned.
func whileAWriteHoldsTheRow(t *testing.T, ctx context.Context, s *Storage, key string, value []byte, app string, op func() (bool, error)) (bool, error) {
	t.Helper()
	q, err := s.t.ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, sharedDSN(t, app+"-writer"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `update `+q.qualified+` set value = $2, modified = now() where key = $1`, key, value); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := op()
		done <- result{ok, err}
	}()
	waiting := false
	for range 200 {
		var n int
		query(t, sharedDSN(t, app+"-watch"), `select count(*) from pg_stat_activity where application_name = '`+app+`' and wait_event_type = 'Lock'`, nil, &n)
		if waiting = n > 0; waiting {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if !waiting {
		_ = tx.Rollback(ctx)
		t.Fatal("premise: the operation did not wait for the other replica's write")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	return r.ok, r.err
}
