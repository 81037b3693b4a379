// Package mcpstate keeps what any toolgate replica needs to continue a
// runner's MCP session, so that a load balancer needs no stickiness and a
// replica that dies takes no session with it.
//
// # Sealed, stored, or local
//
// A session's state has three homes, chosen by how often it is read and
// how often it changes:
//
//   - Sealed into the Mcp-Session-Id the runner sends with every request
//     (see [ID]): the session's storage ref, the caller and toolgate
//     session it belongs to, its service and its expiry. These never
//     change, so every replica checks them on every request without a
//     storage read, and an id that is unknown, forged or sealed under a
//     retired secret is refused (404, so clients initialize again) before
//     storage is touched.
//   - Stored, in the gateway's Caddy storage (see [Record]): the upstream's
//     session id, the negotiated protocol version and the re-initialization
//     generation, what is replayed of the runner's initialize, the tool
//     catalog (shared by content between sessions that listed the same
//     tools), the pending server→client requests, the caller's index and
//     the idle-tracking marks, the calls the session's tasks were created
//     by. These change, rarely: at initialize, after
//     the first tool listing, when an upstream forgets its session, at the
//     end.
//   - Local to the replica: open SSE streams, runner streams kept for
//     resumption with Last-Event-ID, requests in flight. A stream is a
//     connection; it stays where it is.
//
// A replica keeps the records it read in memory until they change: every
// change is announced (see internal/storecache), so the steady state costs
// a tools/call no storage read or write — a replica reads a session's
// record the first time it serves the session, and again only after the
// record changed. With storages that announce nothing it re-reads after
// cache_ttl.
//
// # Storage layout
//
//	toolgate/mcp/sessions/<ref>/state           the session's Record (JSON)
//	toolgate/mcp/sessions/<ref>/pending/<id>    a pending server→client request (PendingRequest, JSON)
//	toolgate/mcp/sessions/<ref>/requests/<id>   one recorded by an earlier version: its method
//	toolgate/mcp/sessions/<ref>/tasks/<id>      the call a task was created by (TaskCall, JSON, sealed)
//	toolgate/mcp/catalogs/<sha256>              a tool catalog
//	toolgate/mcp/active/<window>/<ref>          the session was used in that window
//	toolgate/mcp/users/<sha256 of user>/<ref>   the caller's sessions
//
// A session exists exactly as long as its state record: ending it deletes
// the record, removes everything else under toolgate/mcp/sessions/<ref>
// (best effort) and announces the change, so every replica refuses it at
// once. What is written there (pending requests, tasks) is written only
// while the record exists, and removed again when the session turns out
// to have ended meanwhile; what is read there counts only while the record
// exists, as the removal may come late or not at all. Index entries
// without a record are leftovers and are removed when found, once older
// than a minute (see internal/written): a younger one is a session another
// replica is creating. Marks without a record go with their window in the
// sweep.
//
// Changes to a record are made under the storage's lock for the session
// (which expires when a replica dies holding it): read, change, write,
// announce. Two replicas re-initializing the same upstream session keep
// one result; an end racing a re-initialization wins, and the upstream
// session the re-initialization made is ended too.
//
// # Idle sessions
//
// A replica marks a session it used (or holds a stream of) once per window
// of a quarter of the idle timeout (toolgate/mcp/active/<window>/<ref>),
// from its housekeeping, never on a request; the mark is announced, so
// the other replicas that used the session in the same window skip theirs.
// One replica at a time (the storage's try-lock) sweeps: the sessions whose
// newest mark is older than the idle timeout are ended. A sweep reads only
// the old windows, so its cost follows the sessions that went idle, not
// all sessions.
package mcpstate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/storecache"
	"github.com/toolgate/toolgate/internal/written"
)

// Prefix is where MCP session state lives in storage.
const Prefix = "toolgate/mcp"

const (
	sessionsPrefix = Prefix + "/sessions"
	catalogsPrefix = Prefix + "/catalogs"
	activePrefix   = Prefix + "/active"
	usersPrefix    = Prefix + "/users"
)

// Upstream is the upstream side of a session.
type Upstream struct {
	// SessionID is the upstream's Mcp-Session-Id ("" for a server without
	// sessions).
	SessionID string `json:"session_id,omitempty"`
	// ProtocolVersion is the negotiated protocol version.
	ProtocolVersion string `json:"protocol_version"`
	// Generation counts (re-)initializations; the first is 1.
	Generation uint64 `json:"generation"`
	// Endpoint names the upstream that issued SessionID (see
	// mcpsession.Upstream.Endpoint); "" in records of older versions.
	Endpoint string `json:"endpoint,omitempty"`
	// Grant names the caller's connection whose credential initialized
	// the upstream session (see mcpsession.Upstream.Grant).
	Grant string `json:"grant,omitempty"`
}

// Record is a session's stored state.
type Record struct {
	Ref      string    `json:"-"`
	User     string    `json:"user"`
	Service  string    `json:"service"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
	Upstream Upstream  `json:"upstream"`
	// Initialize is what is replayed of the runner's initialize when the
	// upstream session must be re-created: its protocolVersion,
	// capabilities and clientInfo.
	Initialize json.RawMessage `json:"initialize"`
	// Catalog names the session's tool catalog (see [Store.PutCatalog]);
	// "" until the upstream's tools were listed.
	Catalog string `json:"catalog,omitempty"`
	// Links are the MCP sessions this one opened with services on the
	// runner's behalf, by service: a federated session's session with
	// each service it used (toolgate_federation), so that any replica
	// continues them rather than opening its own.
	Links map[string]Link `json:"links,omitempty"`
}

// Link is an MCP session a session opened with a service.
type Link struct {
	// ID is the linked session's Mcp-Session-Id (sealed, as the runner
	// would carry it: opening it checks its owner like any other).
	ID string `json:"id"`
	// Capabilities are the service's, from its initialize result.
	Capabilities json.RawMessage `json:"capabilities,omitempty"`
}

// ErrNotFound reports a session that does not exist (any more).
var ErrNotFound = errors.New("MCP session not found")

// Store is the MCP session state of one storage. It is safe for
// concurrent use.
type Store struct {
	storage certmagic.Storage
	watch   *storecache.Watch
	now     func() time.Time

	window time.Duration // idle-tracking window: a quarter of the idle timeout
	maxAge time.Duration // the longest a session lives (its id's expiry)

	locks    keyedMutex // local callers queue here, not on the storage lock
	catalogs *catalogCache
}

// New returns the store of storage. idle is the idle timeout, maxAge the
// longest lifetime of a session; now is the clock.
func New(storage certmagic.Storage, idle, maxAge time.Duration, now func() time.Time) *Store {
	return &Store{storage: storage, watch: storecache.NewWatch(storage, Prefix), now: now,
		window: max(idle/4, time.Millisecond), maxAge: maxAge, catalogs: newCatalogCache()}
}

// MaxAge is the longest a session lives.
func (s *Store) MaxAge() time.Duration { return s.maxAge }

// Watch is the store's watch of the changes under [Prefix]: start it to
// receive the changes other replicas make (see [ParseChange]).
func (s *Store) Watch() *storecache.Watch { return s.watch }

// Storage is the storage the store uses.
func (s *Store) Storage() certmagic.Storage { return s.storage }

func stateKey(ref string) string   { return path.Join(sessionsPrefix, ref, "state") }
func sessionDir(ref string) string { return path.Join(sessionsPrefix, ref) }
func userKey(user, ref string) string {
	return path.Join(usersPrefix, hashText(user), ref)
}

func hashText(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ChangeKind tells what an announced key is about.
type ChangeKind int

// Kinds of changes.
const (
	OtherChange   ChangeKind = iota
	SessionChange            // a session's record changed or the session ended
	SessionMarked            // a session was marked used in a window
)

// ParseChange tells what an announced key under [Prefix] is about: the
// session ref, and for a mark its window.
func ParseChange(key string) (kind ChangeKind, ref string, window int64) {
	switch dir, name := path.Split(key); {
	case name == "state" && path.Dir(path.Clean(dir)) == sessionsPrefix:
		return SessionChange, path.Base(path.Clean(dir)), 0
	case path.Dir(path.Dir(key)) == activePrefix:
		w, err := parseWindow(path.Base(path.Clean(dir)))
		if err == nil {
			return SessionMarked, name, w
		}
	}
	return OtherChange, "", 0
}

// Create stores a new session: its index entry, its first mark and its
// record, in that order, so that a failure part way leaves no session
// (the leftovers are removed when found). It returns the window marked.
func (s *Store) Create(ctx context.Context, rec *Record) (int64, error) {
	index, _ := json.Marshal(map[string]any{"service": rec.Service, "created": rec.Created})
	if err := s.storage.Store(ctx, userKey(rec.User, rec.Ref), index); err != nil {
		return 0, fmt.Errorf("storing the MCP session: %w", err)
	}
	w := s.windowOf(s.now())
	if err := s.storage.Store(ctx, activeKey(w, rec.Ref), nil); err != nil {
		_ = s.storage.Delete(ctx, userKey(rec.User, rec.Ref))
		return 0, fmt.Errorf("storing the MCP session: %w", err)
	}
	if err := s.store(ctx, rec); err != nil {
		_ = s.storage.Delete(ctx, userKey(rec.User, rec.Ref))
		_ = s.storage.Delete(ctx, activeKey(w, rec.Ref))
		return 0, err
	}
	return w, nil
}

func (s *Store) store(ctx context.Context, rec *Record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.storage.Store(ctx, stateKey(rec.Ref), data); err != nil {
		return fmt.Errorf("storing the MCP session: %w", err)
	}
	return nil
}

// Load reads the session's record from storage, or ErrNotFound.
func (s *Store) Load(ctx context.Context, ref string) (*Record, error) {
	data, err := s.storage.Load(ctx, stateKey(ref))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading the MCP session: %w", err)
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("reading the MCP session: %v", err)
	}
	rec.Ref = ref
	return &rec, nil
}

// keyedMutex is a mutex per key, held only while someone holds or waits
// for it: a key nobody uses any more (a session that ended) leaves nothing
// behind.
type keyedMutex struct {
	mu   sync.Mutex
	keys map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int // holding or waiting; guarded by keyedMutex.mu
}

// lock locks key's mutex and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.keys == nil {
		k.keys = map[string]*keyLock{}
	}
	l := k.keys[key]
	if l == nil {
		l = &keyLock{}
		k.keys[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.keys, key)
		}
		k.mu.Unlock()
	}
}

// lockTimeout bounds waiting for a session's storage lock: a replica
// that died holding it releases it within the storage's lease.
const lockTimeout = 30 * time.Second

// locked runs fn holding the session's lock: this process's callers queue
// on a mutex, replicas on the storage lock.
func (s *Store) locked(ctx context.Context, ref string, fn func() error) error {
	return s.LockedAs(ctx, "toolgate_mcp_"+ref, fn)
}

// LockedAs runs fn holding the lock name, as locked does (waiting at most
// 30 seconds for it).
func (s *Store) LockedAs(ctx context.Context, name string, fn func() error) error {
	defer s.locks.lock(name)()
	lctx, cancel := context.WithTimeout(ctx, lockTimeout)
	defer cancel()
	if err := s.storage.Lock(lctx, name); err != nil {
		return fmt.Errorf("taking a storage lock: %w", err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.storage.Unlock(uctx, name) // a lock not released expires with its lease
	}()
	return fn()
}

// Update changes the session's record under its lock: fn gets the stored
// record (ErrNotFound when the session ended) and changes it; an error
// from fn changes nothing. The change is announced to every replica.
func (s *Store) Update(ctx context.Context, ref string, fn func(*Record) error) (*Record, error) {
	var rec *Record
	err := s.locked(ctx, ref, func() error {
		var err error
		if rec, err = s.Load(ctx, ref); err != nil {
			return err
		}
		if err := fn(rec); err != nil {
			return err
		}
		return s.store(ctx, rec)
	})
	if err != nil {
		return rec, err
	}
	s.watch.Changed(ctx, stateKey(ref))
	return rec, nil
}

// End ends the session: its record and its index entry are deleted, under
// its lock, what is left below the record is removed, and every replica is
// told. With wait, End returns only once this process heard its own
// announcement back, so that every listening replica has been sent it (at
// most a second). It returns the record as it was, or ErrNotFound when the
// session had ended already.
//
// The record goes first: the session has ended once it is gone, whatever
// happens to the rest. Other replicas write below it without the lock
// (ServerRequestSent, TaskCreated), so the directory may not go at once;
// that does not fail End (see removeDir), and whatever reads below the
// record checks that it still exists (see ended). The directory goes
// before the announcement, not after its wait of up to a second: what is
// left there meanwhile is refused, but need not be kept that long.
func (s *Store) End(ctx context.Context, ref string, wait bool) (*Record, error) {
	var rec *Record
	err := s.locked(ctx, ref, func() error {
		var err error
		rec, err = s.Load(ctx, ref)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if err := s.storage.Delete(ctx, stateKey(ref)); err != nil {
			return fmt.Errorf("ending the MCP session: %w", err)
		}
		if rec != nil {
			_ = s.storage.Delete(ctx, userKey(rec.User, ref)) // a leftover is removed when found
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.removeDir(ctx, ref)
	if rec != nil {
		if wait {
			s.watch.ChangedAndWait(ctx, stateKey(ref), time.Second)
		} else {
			s.watch.Changed(ctx, stateKey(ref))
		}
	}
	if rec == nil {
		return nil, ErrNotFound
	}
	return rec, nil
}

// removeDir removes what is left below an ended session's record. A write
// in flight there keeps the directory ("directory not empty"), so it is
// tried a few times; what a write puts there after the record went, its
// writer removes (see storeBelow).
func (s *Store) removeDir(ctx context.Context, ref string) {
	for range 3 {
		if s.storage.Delete(ctx, sessionDir(ref)) == nil {
			return
		}
	}
}

// storeBelow stores value at key, below the session's record, only while
// the session exists: End removes the session's directory without waiting
// for such writes, and one that came after would recreate the directory of
// an ended session, which nothing lists. A write the session turns out to
// have ended during (End's removal may have come before it) is removed
// again, with the directory. It returns ErrNotFound when the session ended.
func (s *Store) storeBelow(ctx context.Context, ref, key string, value []byte) error {
	switch _, err := s.storage.Stat(ctx, stateKey(ref)); {
	case errors.Is(err, fs.ErrNotExist):
		return ErrNotFound
	case err != nil:
		return err
	}
	if err := s.storage.Store(ctx, key, value); err != nil {
		return err
	}
	if _, err := s.storage.Stat(ctx, stateKey(ref)); errors.Is(err, fs.ErrNotExist) {
		s.removeDir(ctx, ref) // it existed a moment ago: it ended, for good
		return ErrNotFound
	}
	return nil
}

// ended tells whether the session ended, its record gone, for a reader of
// what is below the record: End removes that only after the record, best
// effort, so a pending request or a task found there may belong to a
// session that has ended (for good, when End's removal gave up). What such
// a reader found is then removed, with whatever else is left there (the
// session's ref is never used again). It costs the reader one Stat, made
// only when it found something.
func (s *Store) ended(ctx context.Context, ref string) (bool, error) {
	switch _, err := s.storage.Stat(ctx, stateKey(ref)); {
	case errors.Is(err, fs.ErrNotExist):
		s.removeDir(ctx, ref)
		return true, nil
	case err != nil:
		return false, err
	}
	return false, nil
}

// CountUser returns how many sessions user holds, all replicas together.
// When the count reaches limit, entries of sessions that no longer exist
// are removed and not counted. An entry whose record is missing but that
// was written within written.Grace names a session being created (Create
// stores the entry first, on any replica): it is kept, and counted, or a
// caller opening sessions through several replicas at once would pass the
// limit.
func (s *Store) CountUser(ctx context.Context, user string, limit int) (int, error) {
	keys, err := s.storage.List(ctx, path.Join(usersPrefix, hashText(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("counting MCP sessions: %w", err)
	}
	if len(keys) < limit {
		return len(keys), nil
	}
	n := 0
	for _, k := range keys {
		_, err := s.storage.Stat(ctx, stateKey(path.Base(k)))
		switch {
		case errors.Is(err, fs.ErrNotExist) && written.Recently(ctx, s.storage, k):
			n++
		case errors.Is(err, fs.ErrNotExist):
			_ = s.storage.Delete(ctx, k)
		case err != nil:
			return 0, fmt.Errorf("counting MCP sessions: %w", err)
		default:
			n++
		}
	}
	return n, nil
}
