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

// Connection is a user's credential for one service: a personal bearer
// token, or an OAuth grant. It reaches storage only as cipher output.
type Connection struct {
	Kind         string    `json:"kind"` // AuthBearer or AuthOAuth
	AccessToken  string    `json:"access_token"`
	TokenType    string    `json:"token_type,omitempty"`
	RefreshToken string    `json:"refresh_token,omitempty"`
	Expiry       time.Time `json:"expiry,omitzero"`
	Scopes       []string  `json:"scopes,omitempty"`
	ConnectedAt  time.Time `json:"connected_at"`
	RefreshedAt  time.Time `json:"refreshed_at,omitzero"`
	RefreshCount int       `json:"refresh_count"`
}

// String never shows the tokens, so a Connection is safe in logs and errors.
func (c *Connection) String() string {
	return fmt.Sprintf("connection{kind=%s expiry=%s refresh_count=%d}", c.Kind, c.Expiry.Format(time.RFC3339), c.RefreshCount)
}

// GoString is String, for %#v.
func (c *Connection) GoString() string { return c.String() }

// Expired reports whether the access token expires within skew.
func (c *Connection) Expired(skew time.Duration) bool {
	return !c.Expiry.IsZero() && now().Add(skew).After(c.Expiry)
}

// ErrNotConnected reports that a user has no credential for a service.
var ErrNotConnected = errors.New("not connected")

// ConnectionStore keeps users' connections, encrypted by the cipher, in Caddy
// storage under toolgate/connections/<service>/<sha256 of user>. Decrypted
// records are cached in memory for CacheTTL so the steady-state call path
// makes no cipher (Vault) round trip.
type ConnectionStore struct {
	storage  certmagic.Storage
	cipher   Cipher
	cacheTTL time.Duration

	mu    sync.Mutex
	cache map[string]cachedConnection
}

type cachedConnection struct {
	conn     *Connection
	loadedAt time.Time
}

const connectionPrefix = "toolgate/connections"

func newConnectionStore(storage certmagic.Storage, cipher Cipher, cacheTTL time.Duration) *ConnectionStore {
	return &ConnectionStore{storage: storage, cipher: cipher, cacheTTL: cacheTTL, cache: make(map[string]cachedConnection)}
}

// ConnectionKey is the storage key of user's connection to service; it is
// also the name of the storage lock that serializes its refreshes.
func ConnectionKey(service, user string) string {
	return path.Join(connectionPrefix, service, hashKey(user))
}

// Load returns user's connection to service, from the cache when fresh.
// The result is shared: do not modify it, copy it.
func (s *ConnectionStore) Load(ctx context.Context, service, user string) (*Connection, error) {
	key := ConnectionKey(service, user)
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok && now().Sub(c.loadedAt) < s.cacheTTL {
		return c.conn, nil
	}
	return s.LoadFresh(ctx, service, user)
}

// LoadFresh reads the connection from storage, bypassing the cache.
func (s *ConnectionStore) LoadFresh(ctx context.Context, service, user string) (*Connection, error) {
	key := ConnectionKey(service, user)
	sealed, err := s.storage.Load(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		s.remember(key, nil)
		return nil, ErrNotConnected
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading storage: %v", ErrStorageUnavailable, err)
	}
	plain, err := s.cipher.Decrypt(ctx, sealed, CipherContext(service, user))
	if err != nil {
		return nil, cipherError("decrypting the "+service+" connection", err)
	}
	var conn Connection
	if err := json.Unmarshal(plain, &conn); err != nil {
		return nil, fmt.Errorf("decoding the %s connection: %v", service, err)
	}
	clear(plain)
	s.remember(key, &conn)
	return &conn, nil
}

// Save encrypts and stores user's connection to service.
func (s *ConnectionStore) Save(ctx context.Context, service, user string, conn *Connection) error {
	plain, err := json.Marshal(conn)
	if err != nil {
		return err
	}
	sealed, err := s.cipher.Encrypt(ctx, plain, CipherContext(service, user))
	clear(plain)
	if err != nil {
		return cipherError("encrypting the "+service+" connection", err)
	}
	key := ConnectionKey(service, user)
	if err := s.storage.Store(ctx, key, sealed); err != nil {
		return fmt.Errorf("%w: writing storage: %v", ErrStorageUnavailable, err)
	}
	stored := *conn
	s.remember(key, &stored)
	return nil
}

// Delete forgets user's connection to service.
func (s *ConnectionStore) Delete(ctx context.Context, service, user string) error {
	key := ConnectionKey(service, user)
	s.remember(key, nil)
	for _, k := range []string{key, rejectedKey(service, user)} {
		err := s.storage.Delete(ctx, k)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: deleting from storage: %v", ErrStorageUnavailable, err)
		}
	}
	return nil
}

// Connect stores a newly made connection, replacing any earlier one and
// clearing the mark a rejected grant left.
func (s *ConnectionStore) Connect(ctx context.Context, service, user string, conn *Connection) error {
	if err := s.Save(ctx, service, user, conn); err != nil {
		return err
	}
	if err := s.storage.Delete(ctx, rejectedKey(service, user)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: deleting from storage: %v", ErrStorageUnavailable, err)
	}
	return nil
}

// Reject deletes a grant the provider refused, leaving a mark without any
// secret (the time) so the catalog can tell the user it expired.
func (s *ConnectionStore) Reject(ctx context.Context, service, user string) error {
	key := ConnectionKey(service, user)
	s.remember(key, nil)
	if err := s.storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: deleting from storage: %v", ErrStorageUnavailable, err)
	}
	mark, _ := json.Marshal(map[string]time.Time{"rejected_at": now().UTC()})
	if err := s.storage.Store(ctx, rejectedKey(service, user), mark); err != nil {
		return fmt.Errorf("%w: writing storage: %v", ErrStorageUnavailable, err)
	}
	return nil
}

// WasRejected reports whether user's last grant for service was deleted
// because the provider refused it, and no connection was made since.
func (s *ConnectionStore) WasRejected(ctx context.Context, service, user string) bool {
	return s.storage.Exists(ctx, rejectedKey(service, user))
}

const rejectedPrefix = "toolgate/connections-rejected"

func rejectedKey(service, user string) string {
	return path.Join(rejectedPrefix, service, hashKey(user))
}

// Storage is the storage connections live in (its locks serialize refreshes
// across replicas).
func (s *ConnectionStore) Storage() certmagic.Storage { return s.storage }

// remember caches conn under key; a nil conn evicts the key (absence is not
// cached, so a connection made on another replica is seen at once).
func (s *ConnectionStore) remember(key string, conn *Connection) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if conn == nil {
		delete(s.cache, key)
		return
	}
	if len(s.cache) > 100_000 {
		clear(s.cache)
	}
	s.cache[key] = cachedConnection{conn: conn, loadedAt: now()}
}

// ErrStorageUnavailable reports that Caddy storage could not be read or
// written; retrying later may succeed.
var ErrStorageUnavailable = errors.New("storage unavailable")
