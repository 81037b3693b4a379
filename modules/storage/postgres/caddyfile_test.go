package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, c := range []struct {
		name, input string
		want        Storage
		err         string
	}{
		{name: "block", input: `postgres {
			dsn        {env.TOOLGATE_DATABASE_URL}
			schema     toolgate
			table      gateway_state
			lock_lease 30s
		}`, want: Storage{DSN: "{env.TOOLGATE_DATABASE_URL}", Schema: "toolgate", Table: "gateway_state", LockLease: caddy.Duration(30 * time.Second)}},
		{name: "inline", input: `postgres postgres://db/toolgate`, want: Storage{DSN: "postgres://db/toolgate"}},
		{name: "no dsn", input: "postgres {\n table x\n}", err: "dsn is required"},
		{name: "dsn twice", input: "postgres {\n dsn a\n dsn b\n}", err: "dsn given twice"},
		{name: "inline and block dsn", input: "postgres a {\n dsn b\n}", err: "dsn given twice"},
		{name: "table twice", input: "postgres {\n dsn a\n table x\n table y\n}", err: "table given twice"},
		{name: "unknown option", input: "postgres {\n dsn a\n password x\n}", err: `unknown option "password"`},
		{name: "extra argument", input: "postgres {\n dsn a b\n}", err: "wrong argument count"},
		{name: "two inline arguments", input: "postgres a b", err: "wrong argument count"},
		{name: "bad lease", input: "postgres {\n dsn a\n lock_lease soon\n}", err: "invalid duration"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got Storage
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.DSN != c.want.DSN || got.Schema != c.want.Schema || got.Table != c.want.Table || got.LockLease != c.want.LockLease {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		s   Storage
		err string
	}{
		{Storage{DSN: "x", Table: "Upper"}, "table"},
		{Storage{DSN: "x", Table: "semi;colon"}, "table"},
		{Storage{DSN: "x", Table: strings.Repeat("t", 41)}, "at most 40"},
		{Storage{DSN: "x", Schema: "a.b"}, "schema"},
		{Storage{DSN: "x", LockLease: caddy.Duration(500 * time.Millisecond)}, "at least 1s"},
		{Storage{}, "dsn is required"},
	} {
		if err := c.s.Validate(); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Validate(%+v) = %v, want %q", c.s, err, c.err)
		}
	}
	t.Setenv("TOOLGATE_TEST_UNSET_DSN", "")
	s := &Storage{DSN: "{env.TOOLGATE_TEST_UNSET_DSN}"}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	if err := s.Provision(ctx); err == nil || !strings.Contains(err.Error(), "environment variable") {
		t.Fatalf("Provision with an empty expansion: %v", err)
	}
	// A password from a variable not set: the DSN would go on without
	// one, and a server that trusts the host would take it.
	s = &Storage{DSN: "postgres://toolgate:{env.TOOLGATE_TEST_UNSET_DSN}@db.internal/toolgate"}
	if err := s.Provision(ctx); err == nil || !strings.Contains(err.Error(), "the environment variable TOOLGATE_TEST_UNSET_DSN ({env.TOOLGATE_TEST_UNSET_DSN}) is not set, or empty") ||
		strings.Contains(err.Error(), "db.internal") {
		t.Fatalf("Provision with an empty password: %v; want the placeholder named, not the DSN", err)
	}
}

// The SQL toolgate gives an operator to store a value by hand (the cipher
// canary's reset) runs as given, in the storage's schema and table, and
// the storage then loads what it stored, over an older value too.
func TestStoreCommandRunsAsGiven(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dsn := sharedDSN(t, "storecommand")
	query(t, dsn, "CREATE SCHEMA IF NOT EXISTS storecmd", nil)
	s := provisioned(t, &Storage{DSN: dsn, Schema: "storecmd", Table: newTableName(), LockLease: caddy.Duration(DefaultLockLease)})
	if err := s.Store(ctx, "toolgate/cipher-canary", []byte("sealed bytes")); err != nil {
		t.Fatal(err)
	}
	for _, value := range []string{"reset", "it's"} {
		sql := s.StoreCommand("toolgate/cipher-canary", value)
		if !strings.Contains(sql, "storecmd."+s.Table) {
			t.Fatalf("the command does not name the schema's table: %s", sql)
		}
		query(t, dsn, sql, nil)
		if got, err := s.Load(ctx, "toolgate/cipher-canary"); err != nil || string(got) != value {
			t.Fatalf("after %s: loaded %q, %v; want %q", sql, got, err, value)
		}
	}
}

// A password given by a placeholder in a URL dsn whose value holds '@',
// '/', '?' or '#' is refused before anything parses it: those end a URL's
// password for pgx, and the rest of it would be taken for the host and
// database, and show in pgx's errors and logs. ':' is taken as it is, and
// a keyword=value dsn is not a URL.
func TestURLDSNPasswordThatEndsTheAuthorityIsRefused(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	for _, pw := range []string{"Sup3r@Secret.example:5/x", "Secret@host", "a?b", "a#b"} {
		t.Setenv("TOOLGATE_TEST_URL_PW", pw)
		s := &Storage{DSN: "postgres://toolgate:{env.TOOLGATE_TEST_URL_PW}@db.internal:5432/toolgate"}
		err := s.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), "{env.TOOLGATE_TEST_URL_PW} holds '@', '/', '?' or '#'") {
			t.Errorf("password %q: %v; want it refused, naming the placeholder", pw, err)
		}
		if err != nil && strings.Contains(err.Error(), "Secret") {
			t.Errorf("the refusal shows the password: %v", err)
		}
	}
	for _, dsn := range []string{
		"postgres://toolgate:{env.TOOLGATE_TEST_URL_PW}@db.internal:5432/toolgate",
		"host=db.internal user=toolgate password='{env.TOOLGATE_TEST_URL_PW}' dbname=toolgate",
		"postgres://toolgate@db.internal/{env.TOOLGATE_TEST_URL_DB}?sslmode=disable",
	} {
		t.Setenv("TOOLGATE_TEST_URL_PW", "pass:w%40rd")
		t.Setenv("TOOLGATE_TEST_URL_DB", "toolgate")
		s := &Storage{DSN: dsn}
		if err := s.Provision(ctx); err != nil {
			t.Errorf("%s: %v; want it taken", dsn, err)
			continue
		}
		_ = s.Cleanup()
	}
}

func TestUserinfoEnd(t *testing.T) {
	for rest, want := range map[string]int{
		"u:p@host/db":                 3,
		"u:p@ss@host/db":              6,
		"u:{file./run/pw}@host/db":    16,
		"u:{env.P}@host?x=@":          9,
		"host/db":                     -1,
		"u:p\\{x@host/db":             6,
		"u:{file./a@b/pw}@h/{env.D@}": 16,
	} {
		if got := userinfoEnd(rest); got != want {
			t.Errorf("userinfoEnd(%q) = %d, want %d", rest, got, want)
		}
	}
}

// At start, a database that refuses the role, or has no such database,
// refuses the start in its own words, without the dsn's password; one
// that cannot be reached does not (the storage connects once it is back),
// and one that takes the connection passes.
func TestCheckAtStart(t *testing.T) {
	ctx := t.Context()
	dsn := sharedDSN(t, "checkatstart")
	if err := provisioned(t, &Storage{DSN: dsn}).CheckAtStart(ctx); err != nil {
		t.Fatalf("a database that takes the connection: %v", err)
	}
	for _, c := range []struct{ dsn, want string }{
		{strings.Replace(dsn, "://toolgate@", "://nobody:s3cret-pw@", 1), "SQLSTATE 28"},
		{strings.Replace(dsn, "/postgres?", "/no_such_database?", 1), "SQLSTATE 3D000"},
	} {
		err := provisioned(t, &Storage{DSN: c.dsn}).CheckAtStart(ctx)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "fix the dsn") {
			t.Errorf("%s: %v; want the start refused (%s)", strings.ReplaceAll(c.dsn, "s3cret-pw", "…"), err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("the refusal shows the password: %v", err)
		}
	}
	unreachable := provisioned(t, &Storage{DSN: "postgres://toolgate@127.0.0.1:1/toolgate?sslmode=disable&connect_timeout=2"})
	if err := unreachable.CheckAtStart(ctx); err != nil {
		t.Errorf("a database that cannot be reached now: %v; want the start to go on", err)
	}
}
