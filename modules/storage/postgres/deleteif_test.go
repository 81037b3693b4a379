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
	q, err := s.t.ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dsn := sharedDSN(t, "deleteif-writer")
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `update `+q.qualified+` set value = $2, modified = now() where key = $1`, key, []byte("new")); err != nil {
		t.Fatal(err)
	}
	type result struct {
		deleted bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		deleted, err := s.DeleteIfValue(ctx, key, []byte("old"))
		done <- result{deleted, err}
	}()
	waiting := false
	for range 200 {
		var n int
		query(t, sharedDSN(t, "deleteif-watch"), `select count(*) from pg_stat_activity where application_name = 'deleteif' and wait_event_type = 'Lock'`, nil, &n)
		if waiting = n > 0; waiting {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if !waiting {
		t.Fatal("premise: the delete did not wait for the other replica's write")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.deleted {
		t.Fatalf("DeleteIfValue of the old value, committed over meanwhile: deleted %v, %v", r.deleted, r.err)
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
