package pgtest

import (
	"context"
	"fmt"
	"os"
	"runtime"
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

// recorder is a testing.TB that records Fatal and Skip instead of ending
// the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Fatal(args ...any)         { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Skip(args ...any)          { r.skip = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Fatalf(f string, a ...any) { r.Fatal(fmt.Sprintf(f, a...)) }

// TestMissingBinaries: without PostgreSQL a test is skipped, or fails
// when TOOLGATE_REQUIRE_PEERS=1.
func TestMissingBinaries(t *testing.T) {
	t.Setenv(EnvPGBin, t.TempDir()) // holds no postgres
	for _, require := range []string{"", "1"} {
		t.Setenv(EnvRequirePeers, require)
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Start(r)
		}()
		<-done
		if require == "1" && (r.fatal == "" || r.skip != "") {
			t.Errorf("with %s=1: fatal %q, skip %q; want a failure", EnvRequirePeers, r.fatal, r.skip)
		}
		if require == "" && (r.skip == "" || r.fatal != "") {
			t.Errorf("without %s: fatal %q, skip %q; want a skip", EnvRequirePeers, r.fatal, r.skip)
		}
	}
}
