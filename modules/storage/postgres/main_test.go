package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate/internal/pgtest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envHelper); mode != "" {
		os.Exit(helperMain(mode))
	}
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// newTable returns a fresh table name, so tests sharing a cluster do not
// see each other's keys.
func newTableName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "t_" + hex.EncodeToString(b)
}

// newStorage provisions a storage module like Caddy does and cleans it up
// when t ends. Storages with the same dsn share a pool, as module
// instances of one process do; give a different dsn (for example another
// application_name) to get a separate pool, as another process would.
func newStorage(t testing.TB, dsn, table string, lease time.Duration) *Storage {
	t.Helper()
	return provisioned(t, &Storage{DSN: dsn, Table: table, LockLease: caddy.Duration(lease)})
}

// provisioned provisions and validates s, and cleans it up when t ends.
func provisioned(t testing.TB, s *Storage) *Storage {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := s.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	t.Cleanup(func() { _ = s.Cleanup() })
	return s
}

// pool returns the DSN of the shared cluster's postgres database with an
// application_name of its own, so that each name gets its own pool.
func sharedDSN(t testing.TB, name string) string {
	return pgtest.Shared(t).DSN("postgres") + "&application_name=" + name
}

// query runs sql on a fresh connection to dsn and scans one row into dst.
func query(t testing.TB, dsn, sql string, args []any, dst ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	defer conn.Close(ctx)
	if len(dst) == 0 {
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return
	}
	if err := conn.QueryRow(ctx, sql, args...).Scan(dst...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
