// Package postgres is caddy.storage.postgres: Caddy storage in a
// PostgreSQL table, so that several toolgate replicas (and Caddy's own TLS
// automation) share sessions, credentials and certificates, and coordinate
// through locks that survive no dead holder.
//
// # Values
//
// Every value lives in one table (default toolgate_storage) as a row (key,
// value, modified). Keys follow certmagic's FileStorage: "/"-separated,
// directories are implied by the keys below them, List lists a
// directory's children (or, recursively, everything below it, directories
// included) in a depth-first walk order, Stat tells values from
// directories, Delete of a directory deletes everything below it, and a
// value cannot sit where a directory is or above another value. Every
// operation is one statement or one pipelined transaction: it happens
// completely or not at all.
//
// # Locks
//
// A lock is a row in <table>_locks with a random owner token, a fencing
// value drawn from the sequence <table>_fence (larger at every
// acquisition) and an expiry on PostgreSQL's clock. Lock waits until the
// lock is free or expired (woken at once by the releasing owner's
// notification, otherwise polling at most every second), TryLock does not
// wait, Unlock releases only this process's lock. While a lock is held its
// lease (lock_lease, default 10s) is renewed every third of the lease, so
// it never expires while its holder lives and reaches the database, and
// expires within one lease of its holder's death.
//
// # Schema
//
// The tables are created, or migrated to the newest version recorded in
// <table>_version, on first use, in one transaction under an advisory
// lock, so replicas starting together migrate once. Provision never
// connects: the pool is opened lazily, shared by every module instance
// with the same DSN across config reloads, and closed with the last one.
//
// # Change notifications
//
// [Storage.Publish] announces that a key changed, and [Storage.Subscribe]
// calls a function for the changes of keys under a prefix, in every
// process using the same database and table, through PostgreSQL's
// LISTEN/NOTIFY on the channel <table>_changes. Each pool keeps one
// listening connection and reconnects after failures. A subscriber's
// first Change is a Reset, once it is listening; after every reconnection
// it gets another, because notifications sent meanwhile are lost. A cache
// stays correct by subscribing before it fills, dropping an entry on its
// key's Change, and dropping everything under its prefix on Reset.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(Storage{})
}

// Defaults.
const (
	DefaultTable     = "toolgate_storage"
	DefaultLockLease = 10 * time.Second
)

// Storage is a certmagic.Storage in a PostgreSQL table, with locks.
//
// Caddyfile (as Caddy's global storage option, or inside the toolgate
// block):
//
//	storage postgres [<dsn>] {
//		dsn        <dsn>
//		schema     <name>
//		table      <name>
//		lock_lease <duration>
//	}
type Storage struct {
	// DSN is the connection string, as a URL
	// (postgres://user:password@host:5432/db?sslmode=verify-full) or in
	// key=value form, with libpq's parameters and pgxpool's pool_*
	// options (pool_max_conns, …); connect_timeout defaults to 10s.
	// Placeholders such as
	// {env.TOOLGATE_DATABASE_URL} are expanded. Required. Errors and logs
	// never show its password.
	DSN string `json:"dsn,omitempty"`

	// Schema holds the tables. Default: the first existing schema of the
	// connection's search_path.
	Schema string `json:"schema,omitempty"`

	// Table is the name of the values table; the locks table, fencing
	// sequence and version table are named after it (<table>_locks,
	// <table>_fence, <table>_version), and so is the notification
	// channel (<table>_changes). Lower-case letters, digits and
	// underscores, at most 40 characters. Default: toolgate_storage.
	Table string `json:"table,omitempty"`

	// LockLease is how long a lock outlives its holder's last renewal:
	// a holder that dies blocks others for at most this long. Holders
	// renew every third of it. At least 1s. Default: 10s.
	LockLease caddy.Duration `json:"lock_lease,omitempty"`

	// maxPoll bounds how long a waiting Lock sleeps between attempts when
	// no notification wakes it (a released lock notifies its waiters at
	// once; an expired one does not).
	maxPoll time.Duration

	dsn    string // DSN with placeholders expanded
	db     *database
	t      *table
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Storage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.storage.postgres",
		New: func() caddy.Module { return new(Storage) },
	}
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Provision expands the DSN and prepares the shared pool without
// connecting to anything.
func (s *Storage) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	if s.Table == "" {
		s.Table = DefaultTable
	}
	if s.LockLease == 0 {
		s.LockLease = caddy.Duration(DefaultLockLease)
	}
	if err := s.Validate(); err != nil {
		return err
	}
	s.maxPoll = time.Second
	dsn, err := expandDSN(s.DSN)
	if err != nil {
		return fmt.Errorf("postgres storage: %v", err)
	}
	s.dsn = dsn
	db, err := openDatabase(s.dsn)
	if err != nil {
		return fmt.Errorf("postgres storage: dsn: %v", err)
	}
	s.db = db
	s.t = db.table(s.Schema, s.Table)
	return nil
}

// Validate checks the options.
func (s *Storage) Validate() error {
	if s.DSN == "" {
		return fmt.Errorf("postgres storage: dsn %s", emptyDSN(s.DSN))
	}
	if s.Table != "" && (!identifier.MatchString(s.Table) || len(s.Table) > 40) {
		return fmt.Errorf("postgres storage: table %q: use lower-case letters, digits and underscores, at most 40 characters", s.Table)
	}
	if s.Schema != "" && (!identifier.MatchString(s.Schema) || len(s.Schema) > 63) {
		return fmt.Errorf("postgres storage: schema %q: use lower-case letters, digits and underscores, at most 63 characters", s.Schema)
	}
	if s.LockLease != 0 && time.Duration(s.LockLease) < time.Second {
		return fmt.Errorf("postgres storage: lock_lease %s: must be at least 1s", time.Duration(s.LockLease))
	}
	return nil
}

// Cleanup releases this instance's use of the shared pool; the last user
// closes it (releasing the locks the process still holds).
func (s *Storage) Cleanup() error {
	if s.db != nil {
		_, err := databases.Delete(s.dsn)
		return err
	}
	return nil
}

// CertMagicStorage returns the storage itself.
func (s *Storage) CertMagicStorage() (certmagic.Storage, error) {
	return s, nil
}

// String names the database and table, never the password.
func (s *Storage) String() string {
	if s.db == nil {
		return "postgres storage"
	}
	cfg := s.db.pool.Config().ConnConfig
	schema := s.Schema
	if schema != "" {
		schema += "."
	}
	return fmt.Sprintf("postgres storage %s:%d/%s %s%s", cfg.Host, cfg.Port, cfg.Database, schema, s.Table)
}

// startCheckTimeout bounds CheckAtStart's connection.
const startCheckTimeout = 10 * time.Second

// CheckAtStart connects once (gateway.StorageChecker): a database that
// refuses the role or password, has no such database, or denies the
// connection refuses the start, in its own words (never the dsn's
// password); one that cannot be reached now does not, as the storage
// connects once it is back.
func (s *Storage) CheckAtStart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startCheckTimeout)
	defer cancel()
	err := s.db.pool.Ping(ctx)
	if err != nil && ctx.Err() == nil {
		// On a reload the pool is the configuration in force's: an idle
		// connection the database ended since (its database dropped, say)
		// fails the first ping, and is closed; a new one tells.
		err = s.db.pool.Ping(ctx)
	}
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && refusedForGood(pgErr.Code) {
		return fmt.Errorf("%s: the database refuses toolgate: %s (SQLSTATE %s): fix the dsn, or the database's roles and grants, then start again",
			s, pgErr.Message, pgErr.Code)
	}
	return nil
}

// refusedForGood reports whether code, a PostgreSQL error refusing a
// connection, will not pass by itself.
func refusedForGood(code string) bool {
	switch {
	case strings.HasPrefix(code, "28"): // invalid_authorization_specification, invalid_password
		return true
	case code == "3D000", code == "42501": // invalid_catalog_name, insufficient_privilege
		return true
	}
	return false
}

// StoreCommand is the SQL that stores value under key in this storage's
// table, for an operator to run by hand (gateway.StoreCommand).
func (s *Storage) StoreCommand(key, value string) string {
	table := s.Table
	if s.Schema != "" {
		table = s.Schema + "." + table
	}
	q := func(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }
	return fmt.Sprintf("INSERT INTO %s (key, value, modified) VALUES (%s, %s, now()) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, modified = now()",
		table, q(key), q(value))
}

func (s *Storage) lease() time.Duration { return time.Duration(s.LockLease) }

// Interface guards
var (
	_ caddy.Provisioner          = (*Storage)(nil)
	_ caddy.Validator            = (*Storage)(nil)
	_ caddy.CleanerUpper         = (*Storage)(nil)
	_ caddy.StorageConverter     = (*Storage)(nil)
	_ certmagic.Storage          = (*Storage)(nil)
	_ certmagic.TryLocker        = (*Storage)(nil)
	_ certmagic.LockLeaseRenewer = (*Storage)(nil)
	_ fmt.Stringer               = (*Storage)(nil)
)
