package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// ErrUnavailable is wrapped by every error that comes from PostgreSQL being
// unreachable, restarting or overloaded: the operation did not happen (or,
// for Store and Delete, happened completely or not at all) and may be
// retried later.
var ErrUnavailable = errors.New("PostgreSQL is unavailable, retry later")

// defaultConnectTimeout bounds a connection attempt when the DSN sets no
// connect_timeout.
const defaultConnectTimeout = 10 * time.Second

// databases holds one *database per DSN, shared by every module instance
// of the process, so that pools survive config reloads.
var databases = caddy.NewUsagePool()

// database is a connection pool, its listener, and the state of the tables
// used through it.
type database struct {
	pool *pgxpool.Pool
	// logger is Caddy's process-wide logger: the database outlives the
	// config that opened it.
	logger *zap.Logger
	// origin identifies this process's pool in notifications.
	origin string

	mu       sync.Mutex
	tables   map[string]*table
	listener *listener
	closed   bool
}

// openDatabase returns the shared database for dsn, creating its pool on
// first use. Nothing is dialed: the pool connects when it is first used.
func openDatabase(dsn string) (*database, error) {
	val, _, err := databases.LoadOrNew(dsn, func() (caddy.Destructor, error) {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, parseError(err)
		}
		if cfg.ConnConfig.ConnectTimeout == 0 {
			// an unreachable host fails like a refused connection, not
			// after the operating system gives up
			cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
		}
		if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
			cfg.ConnConfig.RuntimeParams["application_name"] = "toolgate"
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return nil, err
		}
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		return &database{
			pool:   pool,
			logger: caddy.Log().Named("storage.postgres"),
			origin: hex.EncodeToString(b),
			tables: make(map[string]*table),
		}, nil
	})
	if err != nil {
		return nil, err
	}
	return val.(*database), nil
}

// Destruct stops the listener, releases the locks this process holds, and
// closes the pool. The UsagePool calls it when the last module instance
// using the DSN is cleaned up.
func (db *database) Destruct() error {
	db.mu.Lock()
	db.closed = true
	l := db.listener
	tables := make([]*table, 0, len(db.tables))
	for _, t := range db.tables {
		tables = append(tables, t)
	}
	db.mu.Unlock()
	if l != nil {
		l.stop()
	}
	for _, t := range tables {
		t.releaseAll()
	}
	db.pool.Close()
	return nil
}

func (db *database) isClosed() bool {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.closed
}

// table returns the shared state of schema.name, creating it on first use.
func (db *database) table(schema, name string) *table {
	db.mu.Lock()
	defer db.mu.Unlock()
	id := schema + "." + name
	t := db.tables[id]
	if t == nil {
		t = newTable(db, schema, name)
		db.tables[id] = t
	}
	return t
}

// getListener returns the database's listener, starting it on first use.
func (db *database) getListener() *listener {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.listener == nil {
		db.listener = newListener(db)
		if !db.closed {
			db.listener.start()
		}
	}
	return db.listener
}

// do runs op, and runs it once more when it failed because a pooled
// connection was broken (PostgreSQL restarted or a connection was cut): the
// pool is reset first, so the retry gets a fresh connection. Every
// operation passed here is idempotent.
func (db *database) do(ctx context.Context, op func(context.Context) error) error {
	err := op(ctx)
	if err != nil && brokenConnection(err) && ctx.Err() == nil {
		db.pool.Reset()
		err = op(ctx)
	}
	return err
}

// brokenConnection reports whether err says the connection failed rather
// than that the statement did.
func brokenConnection(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02": // admin_shutdown, crash_shutdown: this session was ended
			return true
		}
		return pgErr.Code[:2] == "08" // connection_exception
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed)
}

// unavailable reports whether err means PostgreSQL cannot serve now (down,
// restarting, out of connections, a conflict worth retrying) rather than
// that the request itself is wrong.
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", // connection_exception
			"53", // insufficient_resources
			"57": // operator_intervention: shutdown, cannot_connect_now, query_canceled
			return true
		}
		switch pgErr.Code {
		case "40001", "40P01": // serialization_failure, deadlock_detected
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	return brokenConnection(err)
}

// wrapErr describes a failed operation: "postgres storage: <what>: …",
// wrapping ErrUnavailable when a retry may succeed. err never holds the
// DSN's password: pgx leaves it out of connection and parse errors.
func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("postgres storage: %s: %w", what, err)
	}
	if unavailable(err) {
		return fmt.Errorf("postgres storage: %s: %w: %w", what, ErrUnavailable, err)
	}
	return fmt.Errorf("postgres storage: %s: %w", what, err)
}

// jitter returns d plus up to a tenth more, so that waiters woken together
// do not retry in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	return d + time.Duration(int64(d)/10*int64(b[0])/255)
}
