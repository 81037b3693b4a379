package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
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

// SessionStore keeps sessions in Caddy storage, under the SHA-256 of their
// id, so that reading the storage reveals no usable session id. Reads are
// cached for CacheTTL; a session ended on another replica stops working here
// within that time.
type SessionStore struct {
	storage  certmagic.Storage
	ttl      time.Duration
	cacheTTL time.Duration

	mu    sync.Mutex
	cache map[string]cachedSession
}

type cachedSession struct {
	session  *Session
	loadedAt time.Time
}

const sessionPrefix = "toolgate/sessions"

func newSessionStore(storage certmagic.Storage, ttl, cacheTTL time.Duration) *SessionStore {
	return &SessionStore{storage: storage, ttl: ttl, cacheTTL: cacheTTL, cache: make(map[string]cachedSession)}
}

func sessionKey(id string) string { return path.Join(sessionPrefix, hashKey(id)) }

// Create stores a new session for user.
func (s *SessionStore) Create(ctx context.Context, user string, services []string) (*Session, error) {
	t := now().UTC().Truncate(time.Second)
	sess := &Session{ID: NewID(), User: user, Services: services, CreatedAt: t, ExpiresAt: t.Add(s.ttl)}
	stored := *sess
	stored.ID = "" // only the hash of the id is kept
	data, err := json.Marshal(stored)
	if err != nil {
		return nil, err
	}
	if err := s.storage.Store(ctx, sessionKey(sess.ID), data); err != nil {
		return nil, fmt.Errorf("storing session: %w", err)
	}
	s.remember(sess)
	return sess, nil
}

// Get returns the session with id, or ErrSessionNotFound.
func (s *SessionStore) Get(ctx context.Context, id string) (*Session, error) {
	if id == "" || len(id) > 256 {
		return nil, ErrSessionNotFound
	}
	key := hashKey(id)
	t := now()
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok && t.Sub(c.loadedAt) < s.cacheTTL {
		if t.After(c.session.ExpiresAt) {
			return nil, ErrSessionNotFound
		}
		return c.session, nil
	}
	data, err := s.storage.Load(ctx, path.Join(sessionPrefix, key))
	if errors.Is(err, fs.ErrNotExist) {
		s.forget(id)
		return nil, ErrSessionNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("loading session: %w", err)
	}
	var sess Session
	if err := json.Unmarshal(data, &sess); err != nil {
		return nil, fmt.Errorf("loading session: %w", err)
	}
	sess.ID = id
	if t.After(sess.ExpiresAt) {
		return nil, ErrSessionNotFound
	}
	s.remember(&sess)
	return &sess, nil
}

// Delete ends the session with id.
func (s *SessionStore) Delete(ctx context.Context, id string) error {
	s.forget(id)
	err := s.storage.Delete(ctx, sessionKey(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (s *SessionStore) remember(sess *Session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cache) > 100_000 {
		clear(s.cache)
	}
	s.cache[hashKey(sess.ID)] = cachedSession{session: sess, loadedAt: now()}
}

func (s *SessionStore) forget(id string) {
	s.mu.Lock()
	delete(s.cache, hashKey(id))
	s.mu.Unlock()
}

// sweep deletes expired sessions from storage.
func (s *SessionStore) sweep(ctx context.Context) (int, error) {
	t := now()
	return sweepExpired(ctx, s.storage, sessionPrefix, func(data []byte) bool {
		var sess Session
		return json.Unmarshal(data, &sess) == nil && t.After(sess.ExpiresAt)
	})
}

// sweepExpired deletes the records under prefix that expired says are
// over, and returns how many it deleted.
func sweepExpired(ctx context.Context, storage certmagic.Storage, prefix string, expired func(data []byte) bool) (int, error) {
	keys, err := storage.List(ctx, prefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, key := range keys {
		data, err := storage.Load(ctx, key)
		if err != nil || !expired(data) {
			continue
		}
		if storage.Delete(ctx, key) == nil {
			removed++
		}
	}
	return removed, nil
}
