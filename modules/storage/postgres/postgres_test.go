package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestProvisionDoesNotDial: validating a config (which provisions the
// storage) opens no connection to the database.
func TestProvisionDoesNotDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	cfg := fmt.Sprintf(`{"storage": {"module": "postgres", "dsn": "postgres://u:pw@%s/db?sslmode=disable"}}`, l.Addr())
	var c caddy.Config
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&c); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	l.Close()
	if n := accepted.Load(); n != 0 {
		t.Fatalf("validating the config connected %d times", n)
	}
}

// TestNoPasswordInErrors: neither a malformed DSN nor an unreachable
// server produces an error (or a String) that shows the password.
func TestNoPasswordInErrors(t *testing.T) {
	const pw = "s3cret-pw-42"
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	bad := &Storage{DSN: "postgres://toolgate:" + pw + "@127.0.0.1:notaport/db"}
	err := bad.Provision(ctx)
	if err == nil || strings.Contains(err.Error(), pw) {
		t.Fatalf("Provision with a malformed DSN: %v", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	s := newStorage(t, "postgres://toolgate:"+pw+"@"+addr+"/db?sslmode=disable&connect_timeout=5", newTableName(), DefaultLockLease)
	errs := []error{
		s.Store(t.Context(), "k", []byte("v")),
		second(s.Load(t.Context(), "k")),
		s.Lock(t.Context(), "l"),
		s.Publish(t.Context(), "k"),
	}
	for _, err := range errs {
		if err == nil || !errors.Is(err, ErrUnavailable) || strings.Contains(err.Error(), pw) {
			t.Errorf("unreachable server: %v (want ErrUnavailable, no password)", err)
		}
	}
	if str := s.String(); strings.Contains(str, pw) || !strings.Contains(str, addr) {
		t.Errorf("String() = %q", str)
	}
}

// TestConcurrentMigration: replicas starting together on an empty
// database create the schema once, and all of them work.
func TestConcurrentMigration(t *testing.T) {
	table := newTableName()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		s := newStorage(t, sharedDSN(t, fmt.Sprintf("migrate_%d", i)), table, DefaultLockLease)
		wg.Go(func() {
			errs <- s.Store(t.Context(), fmt.Sprintf("r/%d", i), []byte("v"))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows, version int
	query(t, sharedDSN(t, "admin"), fmt.Sprintf("select count(*), max(version) from %s_version", table), nil, &rows, &version)
	if rows != 1 || version != len(migrations) {
		t.Fatalf("version table: %d rows, version %d; want 1 row, version %d", rows, version, len(migrations))
	}
	// a version newer than this code knows is refused
	query(t, sharedDSN(t, "admin"), fmt.Sprintf("update %s_version set version = 99", table), nil)
	s := newStorage(t, sharedDSN(t, "migrate_new"), table, DefaultLockLease)
	if err := s.Store(t.Context(), "x", nil); err == nil || !strings.Contains(err.Error(), "upgrade toolgate") {
		t.Fatalf("Store with schema version 99: %v", err)
	}
}

// TestSchemaOption: the tables go to the configured schema.
func TestSchemaOption(t *testing.T) {
	schema := "s_" + newTableName()
	query(t, sharedDSN(t, "admin"), "create schema "+schema, nil)
	s := provisioned(t, &Storage{DSN: sharedDSN(t, "schema"), Schema: schema, Table: "vals"})
	mustStore(t, t.Context(), s, "k", []byte("v"))
	var n int
	query(t, sharedDSN(t, "admin"), "select count(*) from "+schema+".vals where key = 'k'", nil, &n)
	if n != 1 {
		t.Fatalf("%d rows in %s.vals", n, schema)
	}
}

// TestSharedPool: module instances with one DSN share a pool across
// reloads; it closes when the last one is cleaned up.
func TestSharedPool(t *testing.T) {
	dsn, table := sharedDSN(t, "shared"), newTableName()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	old := &Storage{DSN: dsn, Table: table}
	if err := old.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	mustStore(t, t.Context(), old, "k", []byte("v"))
	reloaded := &Storage{DSN: dsn, Table: table}
	if err := reloaded.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if reloaded.db != old.db {
		t.Fatal("a reload opened a second pool")
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := mustLoadPG(t, reloaded, "k"); string(got) != "v" {
		t.Fatalf("after the old instance's cleanup: %q", got)
	}
	if err := reloaded.Lock(t.Context(), "l"); err != nil {
		t.Fatal(err)
	}
	if err := reloaded.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := reloaded.Load(t.Context(), "k"); err == nil {
		t.Fatal("the pool is still open after the last cleanup")
	}
	// closing released the lock this process held
	other := newStorage(t, sharedDSN(t, "shared_other"), table, DefaultLockLease)
	if ok, err := other.TryLock(t.Context(), "l"); err != nil || !ok {
		t.Fatalf("TryLock after the holder's pool closed = %v, %v", ok, err)
	}
}

// TestInvalidKeys: keys PostgreSQL cannot hold or that would leave the
// root are refused, and nothing is stored.
func TestInvalidKeys(t *testing.T) {
	s := newStorage(t, sharedDSN(t, "keys"), newTableName(), DefaultLockLease)
	ctx := t.Context()
	for _, k := range []string{"", "/", "nul\x00byte", "bad\xffutf8", "../up", "a/../../b", strings.Repeat("k", maxKeyLen+1)} {
		if err := s.Store(ctx, k, []byte("v")); err == nil || !strings.HasPrefix(err.Error(), "postgres storage: storing: key") {
			t.Errorf("Store(%q) = %v", k, err)
		}
		if _, err := s.Load(ctx, k); err == nil || errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Load(%q) = %v, want an invalid key error", k, err)
		}
		if err := s.Delete(ctx, k); err == nil {
			t.Errorf("Delete(%q) succeeded", k)
		}
	}
	if keys, err := s.List(ctx, "", true); err != nil || len(keys) != 0 {
		t.Fatalf("after refused stores: %q, %v", keys, err)
	}
	for _, name := range []string{"", "nul\x00", "bad\xff"} {
		if err := s.Lock(ctx, name); err == nil {
			t.Errorf("Lock(%q) succeeded", name)
		}
	}
}

// TestLockSemantics covers one process's view: TryLock, fences, Unlock
// of a lock not held, a lost lock, lease renewal, and a Lock whose
// context ends.
func TestLockSemantics(t *testing.T) {
	table := newTableName()
	a := newStorage(t, sharedDSN(t, "sem_a"), table, 2*time.Second)
	b := newStorage(t, sharedDSN(t, "sem_b"), table, 2*time.Second)
	ctx := t.Context()

	if ok, err := a.TryLock(ctx, "l"); err != nil || !ok {
		t.Fatalf("TryLock of a free lock = %v, %v", ok, err)
	}
	f1, ok := a.Fence("l")
	if !ok {
		t.Fatal("no fence for a held lock")
	}
	if ok, err := b.TryLock(ctx, "l"); err != nil || ok {
		t.Fatalf("TryLock of a held lock = %v, %v", ok, err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := b.Lock(waitCtx, "l")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock until the context ends = %v", err)
	}
	if err := b.Unlock(ctx, "l"); err == nil {
		t.Fatal("Unlock of a lock b never took succeeded")
	}
	if err := a.Unlock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx, "l"); err == nil {
		t.Fatal("a second Unlock succeeded")
	}
	if _, ok := a.Fence("l"); ok {
		t.Fatal("a fence after Unlock")
	}
	if err := b.Lock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
	if f2, _ := b.Fence("l"); f2 <= f1 {
		t.Fatalf("fence %d after %d", f2, f1)
	}

	// b's lease runs out (as if b had been cut off): a takes the lock, and
	// b learns at Unlock that its critical section was not protected
	query(t, sharedDSN(t, "admin"), fmt.Sprintf("update %s_locks set expires = now() - interval '1 second' where name = 'l'", table), nil)
	if ok, err := a.TryLock(ctx, "l"); err != nil || !ok {
		t.Fatalf("TryLock of an expired lock = %v, %v", ok, err)
	}
	if err := b.Unlock(ctx, "l"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of a lost lock = %v, want ErrLockLost", err)
	}
	if ok, err := b.TryLock(ctx, "l"); err != nil || ok {
		t.Fatalf("the loser's Unlock released the new holder's lock (TryLock = %v, %v)", ok, err)
	}

	// RenewLockLease sets the lease from now
	if err := b.RenewLockLease(ctx, "l", time.Hour); err == nil {
		t.Fatal("RenewLockLease of a lock b does not hold succeeded")
	}
	if err := a.RenewLockLease(ctx, "l", time.Hour); err != nil {
		t.Fatal(err)
	}
	var left time.Duration
	query(t, sharedDSN(t, "admin"), fmt.Sprintf("select expires - now() from %s_locks where name = 'l'", table), nil, &left)
	if left < 50*time.Minute {
		t.Fatalf("lease left after renewing for an hour: %s", left)
	}
	if err := a.Unlock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
}

// TestLeastPrivilege: once the schema exists, a role with only the grants
// the README lists (no CREATE anywhere) can use everything.
func TestLeastPrivilege(t *testing.T) {
	table := newTableName()
	owner := newStorage(t, sharedDSN(t, "owner"), table, DefaultLockLease)
	mustStore(t, t.Context(), owner, "seed", []byte("v"))
	role := "r_" + table
	for _, sql := range []string{
		"create role " + role + " login",
		"revoke create on schema public from public",
		fmt.Sprintf("grant select, insert, update, delete on %[1]s, %[1]s_locks to %[2]s", table, role),
		fmt.Sprintf("grant select on %s_version to %s", table, role),
		fmt.Sprintf("grant usage on sequence %s_fence to %s", table, role),
	} {
		query(t, sharedDSN(t, "admin"), sql, nil)
	}
	dsn := strings.Replace(sharedDSN(t, "least"), "toolgate@", role+"@", 1)
	s := newStorage(t, dsn, table, DefaultLockLease)
	ctx := t.Context()
	onS := changes(t, s, "")
	mustStore(t, ctx, s, "a/b", []byte("v"))
	if got := mustLoadPG(t, s, "seed"); string(got) != "v" {
		t.Fatal(string(got))
	}
	if keys, err := s.List(ctx, "", true); err != nil || len(keys) != 3 {
		t.Fatalf("List = %q, %v", keys, err)
	}
	if _, err := s.Stat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mustDelete(t, ctx, s, "a")
	if err := s.Lock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
	if err := s.Unlock(ctx, "l"); err != nil {
		t.Fatal(err)
	}
	if c := next(t, onS); !c.Reset {
		t.Fatalf("%+v", c)
	}
	if err := s.Publish(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if c := next(t, onS); c.Key != "k" {
		t.Fatalf("%+v", c)
	}
	// and it cannot create the schema of a new table
	fresh := newStorage(t, dsn, newTableName(), DefaultLockLease)
	if err := fresh.Store(ctx, "k", nil); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("creating a table without CREATE: %v", err)
	}
}

// TestValueDirectoryRace: two replicas storing "x" and "x/y" at the same
// moment never both succeed, so a value never sits above another key. A
// trigger that sleeps in every insert makes the two writes overlap.
func TestValueDirectoryRace(t *testing.T) {
	table := newTableName()
	a := newStorage(t, sharedDSN(t, "race_a"), table, DefaultLockLease)
	b := newStorage(t, sharedDSN(t, "race_b"), table, DefaultLockLease)
	ctx := t.Context()
	mustStore(t, ctx, a, "created", nil)
	query(t, sharedDSN(t, "admin"), `create or replace function slow_insert() returns trigger
		language plpgsql as $$ begin perform pg_sleep(0.2); return new; end $$`, nil)
	query(t, sharedDSN(t, "admin"), "create trigger slow before insert on "+table+
		" for each row execute function slow_insert()", nil)
	for i := range 5 {
		mustDelete(t, ctx, a, "x")
		start := make(chan struct{})
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() { <-start; errA = a.Store(ctx, "x", []byte("value")) })
		wg.Go(func() { <-start; errB = b.Store(ctx, "x/y", []byte("below")) })
		close(start)
		wg.Wait()
		if errA == nil && errB == nil {
			t.Fatalf("round %d: both the value x and the key x/y were stored", i)
		}
		if errA != nil && errB != nil {
			t.Fatalf("round %d: neither store succeeded: %v; %v", i, errA, errB)
		}
		keys, err := a.List(ctx, "x", true)
		if err != nil && errA != nil {
			t.Fatal(err)
		}
		if errA != nil && !slices.Equal(keys, []string{"x/y"}) {
			t.Fatalf("round %d: keys under x %q after x/y won", i, keys)
		}
	}
}
