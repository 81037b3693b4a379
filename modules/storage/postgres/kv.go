package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/certmagic"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// maxKeyLen bounds keys and lock names, in bytes, well below what a
// PostgreSQL index entry can hold.
const maxKeyLen = 2000

// cleanKey returns key the way FileStorage would address it: "a//b",
// "a/./b" and "/a/b/" are "a/b", and "" (or "/") is the root. Keys that
// would leave the root ("..") or that PostgreSQL cannot hold (NUL bytes,
// invalid UTF-8) are errors.
func cleanKey(key string) (string, error) {
	if strings.IndexByte(key, 0) >= 0 {
		return "", errors.New("contains a NUL byte")
	}
	if !utf8.ValidString(key) {
		return "", errors.New("is not valid UTF-8")
	}
	for part := range strings.SplitSeq(key, "/") {
		if part == ".." {
			return "", errors.New(`contains ".."`)
		}
	}
	k := strings.TrimPrefix(path.Clean("/"+key), "/")
	if len(k) > maxKeyLen {
		return "", fmt.Errorf("is longer than %d bytes", maxKeyLen)
	}
	return k, nil
}

// key cleans key for operation op; the root is an error unless allowRoot.
func (s *Storage) key(op, key string, allowRoot bool) (string, error) {
	k, err := cleanKey(key)
	if err == nil && k == "" && !allowRoot {
		err = errors.New("is empty")
	}
	if err != nil {
		return "", fmt.Errorf("postgres storage: %s: key %q %v", op, key, err)
	}
	return k, nil
}

// below returns the range of keys under directory k: [k+"/", k+"0").
func below(k string) (lo, hi string) { return k + "/", k + "0" }

// ancestors returns the directories above k: "a" and "a/b" for "a/b/c".
func ancestors(k string) []string {
	var a []string
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			a = append(a, k[:i])
		}
	}
	return a
}

func notExist(op, key string) error {
	return fmt.Errorf("postgres storage: %w", &fs.PathError{Op: op, Path: key, Err: fs.ErrNotExist})
}

// Store puts value at key, creating or replacing it, in one transaction.
// Like FileStorage, it fails when a directory above key is a value ("a" is
// stored, so "a/b" cannot be) or when key is a directory (keys are stored
// under it). Writers of a key and of a key beneath it take advisory locks
// (shared on the ancestors, exclusive on the key) so that these checks
// hold under concurrency.
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	k, err := s.key("storing", key, false)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("storing %q", k)
	q, err := s.t.ready(ctx)
	if err != nil {
		return err
	}
	if value == nil {
		value = []byte{} // pgx sends nil as NULL
	}
	anc := ancestors(k)
	locks := make([]int64, len(anc))
	for i, a := range anc {
		locks[i] = s.t.advisory(a)
	}
	lo, hi := below(k)
	var stored int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		// one round trip, one implicit transaction: locks, then the write
		b := &pgx.Batch{}
		b.Queue(q.lockShared, locks)
		b.Queue(q.lockExclusive, s.t.advisory(k))
		b.Queue(q.store, k, lo, hi, value, anc).QueryRow(func(row pgx.Row) error { return row.Scan(&stored) })
		return s.db.pool.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return wrapErr(what, err)
	}
	if stored == 1 {
		return nil
	}
	var file string
	err = s.db.do(ctx, func(ctx context.Context) error {
		return s.db.pool.QueryRow(ctx, q.storeConflict, anc).Scan(&file)
	})
	switch {
	case err == nil:
		return fmt.Errorf("postgres storage: %s: %q holds a value, so no key can be stored under it", what, file)
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("postgres storage: %s: it is a directory (keys are stored under it)", what)
	default:
		return wrapErr(what, err)
	}
}

// Load returns the value at key; an error satisfying
// errors.Is(err, fs.ErrNotExist) if there is none.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	k, err := s.key("loading", key, false)
	if err != nil {
		return nil, err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return nil, err
	}
	lo, hi := below(k)
	var value []byte
	var found, dir bool
	err = s.db.do(ctx, func(ctx context.Context) error {
		return s.db.pool.QueryRow(ctx, q.load, k, lo, hi).Scan(&value, &found, &dir)
	})
	switch {
	case err != nil:
		return nil, wrapErr(fmt.Sprintf("loading %q", k), err)
	case found:
		if value == nil {
			value = []byte{}
		}
		return value, nil
	case dir:
		return nil, fmt.Errorf("postgres storage: loading %q: it is a directory", k)
	default:
		return nil, notExist("load", k)
	}
}

// Delete deletes key and, if it is a directory, every key under it. A
// missing key is not an error.
func (s *Storage) Delete(ctx context.Context, key string) error {
	k, err := s.key("deleting", key, false)
	if err != nil {
		return err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return err
	}
	lo, hi := below(k)
	err = s.db.do(ctx, func(ctx context.Context) error {
		_, err := s.db.pool.Exec(ctx, q.delete, k, lo, hi)
		return err
	})
	return wrapErr(fmt.Sprintf("deleting %q", k), err)
}

// DeleteIfValue deletes key only while it holds value, and reports whether
// it did: one statement, so that a write another replica makes meanwhile
// is never deleted with it (PostgreSQL evaluates the condition again on a
// row updated since the statement began). toolgate undoes a connection it
// has just stored this way (see modules/gateway's checkKeyAfterSealing).
func (s *Storage) DeleteIfValue(ctx context.Context, key string, value []byte) (bool, error) {
	k, err := s.key("deleting", key, false)
	if err != nil {
		return false, err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return false, err
	}
	if value == nil {
		value = []byte{} // as Store keeps it: nil would be NULL, equal to nothing
	}
	var deleted int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		tag, err := s.db.pool.Exec(ctx, q.deleteIfValue, k, value)
		deleted = tag.RowsAffected()
		return err
	})
	return deleted > 0, wrapErr(fmt.Sprintf("deleting %q", k), err)
}

// ReplaceIfValue stores value at key only while key holds old, and
// reports whether it did: one statement, like DeleteIfValue. toolgate
// stores a connection this way over the record it read just before, and
// puts that record back the same way when it undoes the store (see
// modules/gateway's storeSealed and undoSealed). A key it does not hold,
// or holds as a directory, is not written.
func (s *Storage) ReplaceIfValue(ctx context.Context, key string, old, value []byte) (bool, error) {
	k, err := s.key("storing", key, false)
	if err != nil {
		return false, err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return false, err
	}
	if old == nil {
		old = []byte{} // as Store keeps it: nil would be NULL, equal to nothing
	}
	if value == nil {
		value = []byte{}
	}
	var replaced int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		tag, err := s.db.pool.Exec(ctx, q.replaceIfValue, k, old, value)
		replaced = tag.RowsAffected()
		return err
	})
	return replaced > 0, wrapErr(fmt.Sprintf("storing %q", k), err)
}

// Exists reports whether key is a value or a directory (a prefix of
// stored keys); the root exists when anything is stored. An error counts
// as not existing, and is logged.
func (s *Storage) Exists(ctx context.Context, key string) bool {
	k, err := s.key("checking", key, true)
	if err != nil {
		s.logger.Warn("invalid storage key", zap.Error(err))
		return false
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		s.logger.Warn("checking storage key", zap.Error(err))
		return false
	}
	var exists bool
	err = s.db.do(ctx, func(ctx context.Context) error {
		if k == "" {
			return s.db.pool.QueryRow(ctx, q.existsAny).Scan(&exists)
		}
		lo, hi := below(k)
		return s.db.pool.QueryRow(ctx, q.exists, k, lo, hi).Scan(&exists)
	})
	if err != nil {
		s.logger.Warn("checking storage key", zap.Error(wrapErr(fmt.Sprintf("checking %q", k), err)))
		return false
	}
	return exists
}

// List returns the keys under the directory prefix ("" is the root), as
// FileStorage does: without recursive, its direct children (values and
// directories); with recursive, every value and directory below it. Keys
// come in FileStorage's order (a depth-first walk, names sorted bytewise).
// A prefix that is a value has no children; one that does not exist is an
// fs.ErrNotExist error.
func (s *Storage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	p, err := s.key("listing", prefix, true)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("listing %q", p)
	q, err := s.t.ready(ctx)
	if err != nil {
		return nil, err
	}
	var found []string
	err = s.db.do(ctx, func(ctx context.Context) error {
		var rows pgx.Rows
		lo, hi := below(p)
		switch {
		case p == "" && recursive:
			rows, _ = s.db.pool.Query(ctx, q.listAllRoot)
		case p == "":
			rows, _ = s.db.pool.Query(ctx, q.listChildrenRoot)
		case recursive:
			rows, _ = s.db.pool.Query(ctx, q.listAll, lo, hi)
		default:
			rows, _ = s.db.pool.Query(ctx, q.listChildren, lo, hi)
		}
		var err error
		found, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, wrapErr(what, err)
	}
	if len(found) == 0 {
		if p == "" {
			return nil, nil
		}
		var file bool
		err = s.db.do(ctx, func(ctx context.Context) error {
			return s.db.pool.QueryRow(ctx, q.isFile, p).Scan(&file)
		})
		if err != nil {
			return nil, wrapErr(what, err)
		}
		if file {
			return nil, nil
		}
		return nil, notExist("list", p)
	}
	var keys []string
	if recursive {
		// the stored keys, and the directories between them and prefix
		seen := make(map[string]bool, len(found))
		start := len(p) + 1
		if p == "" {
			start = 0
		}
		for _, k := range found {
			for i := start; i < len(k); i++ {
				if k[i] == '/' && !seen[k[:i]] {
					seen[k[:i]] = true
					keys = append(keys, k[:i])
				}
			}
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	} else {
		keys = make([]string, len(found))
		for i, child := range found {
			keys[i] = path.Join(p, child)
		}
	}
	sortWalkOrder(keys)
	return keys, nil
}

// sortWalkOrder sorts keys the way a depth-first walk of sorted directories
// visits them: "a/b", "a/b/c", "a/b-c" ('/' before every other byte).
func sortWalkOrder(keys []string) {
	walk := make(map[string]string, len(keys))
	for _, k := range keys {
		walk[k] = strings.ReplaceAll(k, "/", "\x00")
	}
	sort.Slice(keys, func(i, j int) bool { return walk[keys[i]] < walk[keys[j]] })
}

// Stat describes key: a value (IsTerminal, its size, when it was stored)
// or a directory (Modified is the newest store below it, Size 0). Times
// are PostgreSQL's clock, the same for every replica.
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	k, err := s.key("stat", key, true)
	if err != nil {
		return certmagic.KeyInfo{}, err
	}
	q, err := s.t.ready(ctx)
	if err != nil {
		return certmagic.KeyInfo{}, err
	}
	var fileMod, dirMod *time.Time
	var size *int64
	err = s.db.do(ctx, func(ctx context.Context) error {
		if k == "" {
			return s.db.pool.QueryRow(ctx, q.statRoot).Scan(&dirMod)
		}
		lo, hi := below(k)
		return s.db.pool.QueryRow(ctx, q.stat, k, lo, hi).Scan(&fileMod, &size, &dirMod)
	})
	switch {
	case err != nil:
		return certmagic.KeyInfo{}, wrapErr(fmt.Sprintf("stat %q", k), err)
	case fileMod != nil:
		return certmagic.KeyInfo{Key: k, Modified: *fileMod, Size: *size, IsTerminal: true}, nil
	case dirMod != nil:
		return certmagic.KeyInfo{Key: k, Modified: *dirMod}, nil
	default:
		return certmagic.KeyInfo{}, notExist("stat", k)
	}
}
