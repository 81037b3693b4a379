package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// TestStopRestart checks that a stopped server refuses connections, keeps
// its data, and serves it again after a restart on the same port.
func TestStopRestart(t *testing.T) {
	s := Start(t)
	dsn := s.CreateDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE t (v int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("a stopped server accepted a connection")
	}
	s.Restart(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil || v != 42 {
		t.Fatalf("after restart: v=%d err=%v, want 42", v, err)
	}
	var user string
	if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != User {
		t.Fatalf("current_user = %q (%v), want %q", user, err, User)
	}
}

// TestSharedOnce checks that Shared starts one server for the whole binary.
func TestSharedOnce(t *testing.T) {
	a, b := Shared(t), Shared(t)
	if a != b {
		t.Fatal("Shared started two servers")
	}
	conn, err := pgx.Connect(t.Context(), a.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(t.Context())
}
