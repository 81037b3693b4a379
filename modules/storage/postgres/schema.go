package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// migrations create and evolve the tables, in order; the version table
// records how many have run. %[1]s is the values table, %[2]s the locks
// table, %[3]s the fencing sequence. Never change a released step: append.
var migrations = []string{
	`CREATE TABLE IF NOT EXISTS %[1]s (
		key      text COLLATE "C" PRIMARY KEY CHECK (key <> ''),
		value    bytea NOT NULL,
		modified timestamptz NOT NULL DEFAULT now()
	);
	CREATE TABLE IF NOT EXISTS %[2]s (
		name     text COLLATE "C" PRIMARY KEY,
		owner    text NOT NULL,
		fence    bigint NOT NULL,
		acquired timestamptz NOT NULL,
		expires  timestamptz NOT NULL
	);
	CREATE SEQUENCE IF NOT EXISTS %[3]s AS bigint;`,
}

// table is the state of one storage table in one database, shared by the
// module instances that use it: whether its schema is ready, its SQL, and
// the locks this process holds in it.
type table struct {
	db     *database
	schema string // as configured; "" resolves through search_path
	name   string
	// channel is the notification channel of the table. It depends on the
	// table's name only, so replicas that spell the schema differently
	// still hear each other (at worst, a same-named table in another
	// schema adds spurious notifications).
	channel string

	migrateMu sync.Mutex
	q         atomic.Pointer[queries]

	locksMu sync.Mutex
	held    map[string]*heldLock
}

func newTable(db *database, schema, name string) *table {
	return &table{db: db, schema: schema, name: name, channel: name + "_changes", held: make(map[string]*heldLock)}
}

// queries are the table's statements, with its schema-qualified names.
type queries struct {
	qualified string // schema.table, for messages

	store, storeConflict, lockShared, lockExclusive string
	load, exists, existsAny, isFile, delete         string
	deleteIfValue, replaceIfValue                   string
	listChildren, listChildrenRoot                  string
	listAll, listAllRoot, stat, statRoot            string

	acquire, renew, release, lockOwner string
}

// advisory returns the advisory lock id of path in this table: the same in
// every process, so concurrent writers of a key and of a key beneath it
// serialize (see Store).
func (t *table) advisory(path string) int64 {
	h := fnv.New64a()
	h.Write([]byte(t.schema + "." + t.name + "\x00" + path))
	return int64(h.Sum64())
}

// ready returns the table's statements, creating or migrating the schema
// first if this process has not yet seen it at the current version.
func (t *table) ready(ctx context.Context) (*queries, error) {
	if q := t.q.Load(); q != nil {
		return q, nil
	}
	t.migrateMu.Lock()
	defer t.migrateMu.Unlock()
	if q := t.q.Load(); q != nil {
		return q, nil
	}
	var q *queries
	err := t.db.do(ctx, func(ctx context.Context) error {
		var err error
		q, err = t.migrate(ctx)
		return err
	})
	if err != nil {
		return nil, wrapErr("preparing table "+t.name, err)
	}
	t.q.Store(q)
	return q, nil
}

// migrate brings the schema to the newest version. Starting replicas
// serialize on an advisory lock; one that finds the schema current does no
// DDL at all, so steady-state starts need no CREATE privilege.
func (t *table) migrate(ctx context.Context) (*queries, error) {
	pool := t.db.pool
	schema := t.schema
	if schema == "" {
		var cur *string
		if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&cur); err != nil {
			return nil, err
		}
		if cur == nil {
			return nil, errors.New("no schema of the search_path exists: create one or set the schema option")
		}
		schema = *cur
	}
	ident := func(suffix string) string { return pgx.Identifier{schema, t.name + suffix}.Sanitize() }
	data, locks, fence, version := ident(""), ident("_locks"), ident("_fence"), ident("_version")
	latest := len(migrations)

	current, err := t.version(ctx, pool.QueryRow(ctx, "SELECT max(version) FROM "+version))
	if err != nil {
		return nil, err
	}
	if current < latest {
		if current, err = t.upgrade(ctx, schema, data, locks, fence, version); err != nil {
			return nil, err
		}
	}
	if current > latest {
		return nil, fmt.Errorf("table %s.%s has schema version %d, newer than this toolgate knows (%d): upgrade toolgate", schema, t.name, current, latest)
	}
	return buildQueries(schema+"."+t.name, data, locks, fence), nil
}

// version reads the recorded schema version; a missing version table is
// version 0.
func (t *table) version(_ context.Context, row pgx.Row) (int, error) {
	var v *int
	err := row.Scan(&v)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if v == nil {
		return 0, nil
	}
	return *v, nil
}

// upgrade runs the missing migrations in one transaction, holding an
// advisory lock so that replicas starting together do it once.
func (t *table) upgrade(ctx context.Context, schema, data, locks, fence, version string) (int, error) {
	tx, err := t.db.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", t.advisory("\x00migrate")); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+version+" (version integer NOT NULL)"); err != nil {
		return 0, err
	}
	from, err := t.version(ctx, tx.QueryRow(ctx, "SELECT max(version) FROM "+version))
	if err != nil {
		return 0, err
	}
	if from >= len(migrations) {
		return from, tx.Commit(ctx) // another replica did it meanwhile
	}
	for i := from; i < len(migrations); i++ {
		if _, err := tx.Exec(ctx, fmt.Sprintf(migrations[i], data, locks, fence)); err != nil {
			return 0, fmt.Errorf("schema migration %d: %w", i+1, err)
		}
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+version); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+version+" (version) VALUES ($1)", len(migrations)); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	t.db.logger.Info("storage schema migrated",
		zap.String("table", schema+"."+t.name), zap.Int("from", from), zap.Int("to", len(migrations)))
	return len(migrations), nil
}

func buildQueries(qualified, data, locks, fence string) *queries {
	sql := strings.NewReplacer("{T}", data, "{L}", locks, "{F}", fence).Replace
	// the keys below a directory: [dir+"/", dir+"0"), '0' being the byte after '/'
	under := func(lo, hi string) string { return "key >= " + lo + " and key < " + hi }
	return &queries{
		qualified: qualified,

		lockShared:    `select pg_advisory_xact_lock_shared(x) from unnest($1::bigint[]) as x`,
		lockExclusive: `select pg_advisory_xact_lock($1)`,
		// $1 key, $2 and $3 the range below it, $4 value, $5 its ancestors
		store: sql(`with stored as (
			insert into {T} as t (key, value, modified)
			select $1, $4, now()
			where not exists (select 1 from {T} where key = any($5::text[]))
			  and not exists (select 1 from {T} where ` + under("$2", "$3") + `)
			on conflict (key) do update set value = excluded.value, modified = excluded.modified
			returning 1)
			select count(*) from stored`),
		storeConflict: sql(`select key from {T} where key = any($1::text[]) order by key limit 1`),

		// $1 key, $2 and $3 the range below it
		load: sql(`select f.value, f.found is not null, exists (select 1 from {T} where ` + under("$2", "$3") + `)
			from (select 1) as x
			left join lateral (select value, true as found from {T} where key = $1) as f on true`),
		exists:    sql(`select exists (select 1 from {T} where key = $1) or exists (select 1 from {T} where ` + under("$2", "$3") + `)`),
		existsAny: sql(`select exists (select 1 from {T})`),
		isFile:    sql(`select exists (select 1 from {T} where key = $1)`),
		delete:    sql(`delete from {T} where key = $1 or (` + under("$2", "$3") + `)`),
		// $1 key, $2 the value it must still hold
		deleteIfValue: sql(`delete from {T} where key = $1 and value = $2`),
		// $1 key, $2 the value it must still hold, $3 the new one
		replaceIfValue: sql(`update {T} set value = $3, modified = now() where key = $1 and value = $2`),
		stat: sql(`select f.modified, f.size, d.modified
			from (select 1) as x
			left join lateral (select modified, octet_length(value)::bigint as size from {T} where key = $1) as f on true
			left join lateral (select max(modified) as modified from {T} where ` + under("$2", "$3") + `) as d on true`),
		statRoot: sql(`select max(modified) from {T}`),

		// $1 and $2 the range below the listed directory
		listChildren:     sql(`select distinct split_part(substr(key, char_length($1) + 1), '/', 1) from {T} where ` + under("$1", "$2")),
		listChildrenRoot: sql(`select distinct split_part(key, '/', 1) from {T}`),
		listAll:          sql(`select key from {T} where ` + under("$1", "$2")),
		listAllRoot:      sql(`select key from {T}`),

		// $1 name, $2 owner token, $3 lease in milliseconds. A lock is
		// taken when free, expired, or already this owner's (a retried
		// acquisition); each taking draws a new fencing value. The second
		// column is how long the current holder's lease has left.
		acquire: sql(`with acquired as (
			insert into {L} as l (name, owner, fence, acquired, expires)
			values ($1, $2, nextval('{F}'), now(), now() + $3::bigint * interval '1 millisecond')
			on conflict (name) do update
			set owner = excluded.owner, fence = excluded.fence, acquired = excluded.acquired, expires = excluded.expires
			where l.expires <= now() or l.owner = excluded.owner
			returning l.fence)
			select (select fence from acquired),
			       (select ceil(extract(epoch from expires - now()) * 1000)::bigint from {L} where name = $1)`),
		renew: sql(`update {L} set expires = now() + $3::bigint * interval '1 millisecond' where name = $1 and owner = $2 returning fence`),
		// $3 channel, $4 payload: waiters hear of the release at once.
		release: sql(`with released as (delete from {L} where name = $1 and owner = $2 returning name)
			select count(*) from released cross join lateral (select pg_notify($3, $4)) as n`),
		lockOwner: sql(`select owner, fence from {L} where name = $1`),
	}
}
