package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/storecache"
	"github.com/toolgate/toolgate/internal/written"
)

// Session is a runner's toolgate session: which services a caller chose to
// use, until when. Runners send its id in the session header (default
// X-Toolgate-Session). A session id alone grants nothing: every request must
// also authenticate as the session's owner.
type Session struct {
	ID        string    `json:"id"`
	User      string    `json:"user"`
	Services  []string  `json:"services"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// Implied marks a session toolgate implied for a runner that sent no
	// session header (package impliedsession): it lives as long as its MCP
	// session, is never stored, and has no expiry of its own.
	Implied bool `json:"-"`
}

// anonymousSessionID is the id of the session of an anonymous caller,
// which is not stored.
const anonymousSessionID = "anonymous"

// Stored reports whether the session is one of the store's (created with
// POST /v1/sessions), which its person can end: not implied, nor an
// anonymous caller's.
func (s *Session) Stored() bool { return !s.Implied && storedSessionID(s.ID) }

// storedSessionID reports whether id can name a stored session: not an
// anonymous caller's, nor an implied one (whose ids hold a ':', outside
// the alphabet of stored ones).
func storedSessionID(id string) bool {
	return id != anonymousSessionID && !strings.Contains(id, ":")
}

// Ended reports whether the stored session id is known to have ended or
// expired (false when the storage cannot tell now, and for an id no
// stored session can have).
func (s *SessionStore) Ended(ctx context.Context, id string) bool {
	if !storedSessionID(id) {
		return false
	}
	_, err := s.Get(ctx, id)
	return errors.Is(err, ErrSessionNotFound)
}

// RefEnded reports whether user's stored session named by ref (see
// SessionRef) is known to have ended: its person ended it, or it expired
// and was swept. false when the storage cannot tell now.
func (s *SessionStore) RefEnded(ctx context.Context, user, ref string) bool {
	if !isHashKey(ref) {
		return false
	}
	_, err := s.storage.Stat(ctx, sessionIndexKey(user, ref))
	return errors.Is(err, fs.ErrNotExist)
}

// Selected reports whether the session selected service.
func (s *Session) Selected(service string) bool {
	for _, id := range s.Services {
		if id == service {
			return true
		}
	}
	return false
}

// ErrSessionNotFound reports a session id that does not exist or has expired.
var ErrSessionNotFound = errors.New("session not found or expired")

// ErrTooManySessions reports that a caller has as many live sessions as
// max_sessions_per_user allows.
var ErrTooManySessions = errors.New("too many toolgate sessions")

// SessionStore keeps sessions in Caddy storage, under the SHA-256 of their
// id, so that reading the storage reveals no usable session id, and an
// index of each user's sessions (their hashes, services and times; no id)
// under the SHA-256 of the user, so that a person can list and end their
// sessions and their number is bounded. Sessions read are kept in memory
// (see internal/storecache): until they end, with a storage that announces
// changes — ending a session on one replica ends it on every replica at
// once —, else for CacheTTL.
type SessionStore struct {
	storage certmagic.Storage
	ttl     time.Duration
	perUser int

	watch *storecache.Watch
	cache *storecache.Cache[*Session]
}

const (
	sessionPrefix       = "toolgate/sessions"
	sessionByUserPrefix = "toolgate/sessions-by-user"
)

func newSessionStore(storage certmagic.Storage, ttl, cacheTTL time.Duration, perUser int) *SessionStore {
	w := storecache.NewWatch(storage, sessionPrefix)
	return &SessionStore{storage: storage, ttl: ttl, perUser: perUser,
		watch: w, cache: storecache.NewCache[*Session](w, cacheTTL, func() time.Time { return now() })}
}

// start follows changes made by other replicas; stop ends that.
func (s *SessionStore) start(logger *zap.Logger) error { return s.watch.Start(logger) }
func (s *SessionStore) stop()                          { s.watch.Stop() }

func sessionKey(id string) string { return path.Join(sessionPrefix, hashKey(id)) }

// SessionRef names the session with id without revealing it: the SHA-256
// of the id, as storage and SessionSummary know it.
func SessionRef(id string) string { return hashKey(id) }

// IsSessionRef reports whether s has the shape of a SessionRef (no session
// id has it).
func IsSessionRef(s string) bool { return isHashKey(s) }

func sessionIndexKey(user, ref string) string {
	return path.Join(sessionByUserPrefix, hashKey(user), ref)
}

// SessionSummary is what the per-user index tells about a session: never
// its id, which only its creator ever saw. Ref (the SHA-256 of the id)
// names it for ending it.
type SessionSummary struct {
	Ref       string    `json:"-"`
	Services  []string  `json:"services"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Create stores a new session for user, unless user already has as many
// live sessions as allowed (ErrTooManySessions).
func (s *SessionStore) Create(ctx context.Context, user string, services []string) (*Session, error) {
	if s.perUser > 0 {
		// Counted and stored under the user's lock, on every replica: two
		// creations at once must not both see room for one.
		lock := "toolgate_sessions_" + hashKey(user)
		if err := s.storage.Lock(ctx, lock); err != nil {
			return nil, fmt.Errorf("storing session: %w", err)
		}
		defer func() { _ = s.storage.Unlock(context.WithoutCancel(ctx), lock) }()
	}
	live, err := s.List(ctx, user)
	if err != nil {
		return nil, err
	}
	if s.perUser > 0 && len(live) >= s.perUser {
		return nil, fmt.Errorf("%w: %s has %d (max_sessions_per_user): end one first (DELETE /v1/sessions/{id}, or the ref GET /v1/sessions lists; or End on the console's Sessions page), or wait until one expires", ErrTooManySessions, user, len(live))
	}
	t := now().UTC().Truncate(time.Second)
	sess := &Session{ID: NewID(), User: user, Services: services, CreatedAt: t, ExpiresAt: t.Add(s.ttl)}
	stored := *sess
	stored.ID = "" // only the hash of the id is kept
	data, err := json.Marshal(stored)
	if err != nil {
		return nil, err
	}
	ref := hashKey(sess.ID)
	summary, _ := json.Marshal(SessionSummary{Services: services, CreatedAt: t, ExpiresAt: sess.ExpiresAt})
	if err := s.storage.Store(ctx, sessionIndexKey(user, ref), summary); err != nil {
		return nil, fmt.Errorf("storing session: %w", err)
	}
	if err := s.storage.Store(ctx, path.Join(sessionPrefix, ref), data); err != nil {
		_ = s.storage.Delete(ctx, sessionIndexKey(user, ref))
		return nil, fmt.Errorf("storing session: %w", err)
	}
	s.cache.Put(path.Join(sessionPrefix, ref), sess)
	return sess, nil
}

// List returns user's live sessions, newest first. Index entries of
// sessions that expired or were ended elsewhere are removed on the way.
func (s *SessionStore) List(ctx context.Context, user string) ([]SessionSummary, error) {
	keys, err := s.storage.List(ctx, path.Join(sessionByUserPrefix, hashKey(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing sessions: %w", err)
	}
	t := now()
	var out []SessionSummary
	for _, key := range keys {
		data, err := s.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing sessions: %w", err)
		}
		var sum SessionSummary
		sum.Ref = path.Base(key)
		gone := json.Unmarshal(data, &sum) != nil || t.After(sum.ExpiresAt)
		if !gone {
			// Ended on another replica? Only a storage that says so counts:
			// a failing one must not unlist a live session. An entry written
			// a moment ago names a session whose record another replica is
			// still writing (Create writes the entry first): it is left, and
			// not listed yet.
			if _, err := s.storage.Stat(ctx, path.Join(sessionPrefix, sum.Ref)); errors.Is(err, fs.ErrNotExist) {
				if written.Recently(ctx, s.storage, key) {
					continue
				}
				gone = true
			} else if err != nil {
				return nil, fmt.Errorf("listing sessions: %w", err)
			}
		}
		if gone {
			_ = s.storage.Delete(ctx, key)
			continue
		}
		out = append(out, sum)
	}
	slices.SortFunc(out, func(a, b SessionSummary) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}

// Get returns the session with id, or ErrSessionNotFound.
func (s *SessionStore) Get(ctx context.Context, id string) (*Session, error) {
	if id == "" || len(id) > 256 {
		return nil, ErrSessionNotFound
	}
	key := sessionKey(id)
	sess, err := s.cache.Load(ctx, key, func(ctx context.Context) (*Session, bool, error) {
		data, err := s.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, ErrSessionNotFound
		}
		if err != nil {
			return nil, false, fmt.Errorf("loading session: %w", err)
		}
		var sess Session
		if err := json.Unmarshal(data, &sess); err != nil {
			return nil, false, fmt.Errorf("loading session: %w", err)
		}
		sess.ID = id
		return &sess, true, nil
	})
	if err != nil {
		return nil, err
	}
	if now().After(sess.ExpiresAt) {
		return nil, ErrSessionNotFound
	}
	return sess, nil
}

// SessionCheckEvery is how often the MCP sessions held here are checked
// against their toolgate sessions: those of a session its person ended
// (on any replica: the check reads what the store's cache knows, which a
// deletion here changes at once and another replica's when its
// notification arrives, or within cache_ttl), or that expired, end, and
// with them their runners' streams, calls in progress and calls held.
const SessionCheckEvery = 2 * time.Second

// Delete ends sess (read from this store: its record is its user's, with
// or without an index entry naming it).
func (s *SessionStore) Delete(ctx context.Context, sess *Session) error {
	return s.deleteRef(ctx, sess.User, hashKey(sess.ID))
}

// DeleteRef ends user's session named by ref (see SessionSummary); a ref
// that is not one of user's sessions changes nothing. A ref comes from a
// URL: anything but a SHA-256 in hex (such as "..", which would name a
// directory of the storage) names no session.
func (s *SessionStore) DeleteRef(ctx context.Context, user, ref string) error {
	if !isHashKey(ref) {
		return nil
	}
	if _, err := s.storage.Stat(ctx, sessionIndexKey(user, ref)); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	return s.deleteRef(ctx, user, ref)
}

func (s *SessionStore) deleteRef(ctx context.Context, user, ref string) error {
	index := sessionIndexKey(user, ref)
	record := path.Join(sessionPrefix, ref)
	for _, key := range []string{record, index} {
		if err := s.storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	s.cache.Deleted(ctx, record)
	s.cache.Settle(ctx, record, time.Second) // ended everywhere once the caller is told
	return nil
}

// sweep deletes expired sessions, and their index entries, from storage.
func (s *SessionStore) sweep(ctx context.Context) (int, error) {
	t := now()
	n, err := sweepExpired(ctx, s.storage, sessionPrefix, false, func(data []byte) bool {
		var sess Session
		return json.Unmarshal(data, &sess) == nil && t.After(sess.ExpiresAt)
	})
	if err != nil {
		return n, err
	}
	_, err = sweepExpired(ctx, s.storage, sessionByUserPrefix, true, func(data []byte) bool {
		var sum SessionSummary
		return json.Unmarshal(data, &sum) != nil || t.After(sum.ExpiresAt)
	})
	return n, err
}

// sweepExpired deletes the records under prefix (and, when recursive, under
// its sub-prefixes) that expired says are over, and returns how many it
// deleted.
func sweepExpired(ctx context.Context, storage certmagic.Storage, prefix string, recursive bool, expired func(data []byte) bool) (int, error) {
	keys, err := storage.List(ctx, prefix, recursive)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, key := range keys {
		data, err := storage.Load(ctx, key)
		if err != nil || !expired(data) { // a "directory" does not load
			continue
		}
		if storage.Delete(ctx, key) == nil {
			removed++
		}
	}
	return removed, nil
}
