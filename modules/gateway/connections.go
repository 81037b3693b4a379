package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/storecache"
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
	// Issuer names the authorization server, client and resource an
	// OAuth grant was issued under (OAuthClient.issuer): a grant of
	// another (a reload pointed the service at another provider, client
	// or upstream) is neither sent, refreshed nor revoked, and the person
	// connects again. Empty in a grant an earlier version stored.
	Issuer string `json:"issuer,omitempty"`
	// Retired are the access tokens the connection carried before
	// AccessToken (replaced by a refresh, after an upstream refused one or
	// as it neared expiry, or by connecting again), each until it expires,
	// the newest maxRetired: upstreams were sent them, and a hostile one
	// may quote one in a later answer — through any replica, after a
	// restart — while the provider still honours it. What an upstream sends
	// is searched for them as for AccessToken (Credential.EachSecret).
	Retired []RetiredToken `json:"retired,omitempty"`
}

// RetiredToken is an access token a connection no longer sends, and when
// it expires (zero: not known).
type RetiredToken struct {
	Token  string    `json:"token"`
	Expiry time.Time `json:"expiry,omitzero"`
}

// maxRetired bounds the retired tokens a connection keeps (a refresh the
// upstream's refusal starts comes at most once per refusedRefreshInterval).
const maxRetired = 8

// retiring is c's retired tokens with the token of was added (the
// connection c replaces; nil for none): retire's list.
func (c *Connection) retiring(was *Connection) []RetiredToken {
	if was == nil {
		return c.Retired
	}
	return retire(was.Retired, []RetiredToken{{Token: was.AccessToken, Expiry: was.Expiry}}, c.AccessToken)
}

// retire is the retired tokens kept with replaced added, the newest last:
// without the ones sent now (current), the expired ones and repeats (each
// kept where it was retired last), at most maxRetired. It is a new slice:
// kept may be shared (a connection read from the cache).
func retire(kept, replaced []RetiredToken, current ...string) []RetiredToken {
	all := append(slices.Clone(kept), replaced...)
	var out []RetiredToken
	for i, r := range all {
		switch {
		case r.Token == "" || slices.Contains(current, r.Token):
		case !r.Expiry.IsZero() && !now().Before(r.Expiry):
		case slices.ContainsFunc(all[i+1:], func(o RetiredToken) bool { return o.Token == r.Token }):
			// kept once, where it was retired last
		default:
			out = append(out, r)
		}
	}
	if len(out) > maxRetired {
		out = out[len(out)-maxRetired:]
	}
	return out
}

// Grant names the connection: when it was made. Connecting again (maybe to
// another account at the provider) makes another; refreshing keeps it.
// What an upstream said through one connection (its tools, instructions,
// sessions) is not taken for what it says through another.
func (c *Connection) Grant() string { return c.ConnectedAt.UTC().Format(time.RFC3339Nano) }

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

// ErrSealedWithOtherKey reports a stored connection sealed with the key
// the operator's reset of the cipher's canary replaced (see
// sealedwith.go). It never opens with this key: its person connects
// again, which replaces it.
var ErrSealedWithOtherKey = errors.New("the stored connection was sealed with the cipher key a reset replaced")

// ConnectionStore keeps users' connections, encrypted by the cipher, in Caddy
// storage under toolgate/connections/<service>/<sha256 of user>. Decrypted
// records are kept in memory so the steady-state call path makes no
// storage or cipher (Vault, KMS) round trip: until they change, with a
// storage that announces changes (a refresh, a new connect or a disconnect
// on one replica is seen by every replica at once), else for CacheTTL.
type ConnectionStore struct {
	storage certmagic.Storage
	cipher  Cipher

	watch *storecache.Watch
	cache *storecache.Cache[*Connection]

	// gone are called with the key of a connection deleted here, or
	// changed on another replica (see App.OnConnectionGone).
	goneMu sync.Mutex
	gone   []func(key string)
	logger *zap.Logger // set at start
}

const connectionPrefix = "toolgate/connections"

func newConnectionStore(storage certmagic.Storage, cipher Cipher, cacheTTL time.Duration) *ConnectionStore {
	w := storecache.NewWatch(storage, connectionPrefix)
	s := &ConnectionStore{storage: storage, cipher: cipher,
		watch: w, cache: storecache.NewCache[*Connection](w, cacheTTL, func() time.Time { return now() })}
	w.OnChange(func(ch storecache.Change) {
		switch {
		case ch.Reset:
			s.maybeGone("") // the listening connection was lost: anything may be gone
		case !ch.Local: // a local delete told them already
			s.maybeGone(ch.Key)
		}
	})
	return s
}

// onGone adds fn to what is told of connections that may be gone.
func (s *ConnectionStore) onGone(fn func(key string)) {
	s.goneMu.Lock()
	s.gone = append(s.gone, fn)
	s.goneMu.Unlock()
}

func (s *ConnectionStore) maybeGone(key string) {
	s.goneMu.Lock()
	fns := s.gone
	s.goneMu.Unlock()
	for _, fn := range fns {
		fn(key)
	}
}

// start follows changes made by other replicas; stop ends that.
func (s *ConnectionStore) start(logger *zap.Logger) error {
	s.logger = logger
	return s.watch.Start(logger)
}

func (s *ConnectionStore) stop() { s.watch.Stop() }

// ConnectionKey is the storage key of user's connection to service; it is
// also the name of the storage lock that serializes its refreshes.
func ConnectionKey(service, user string) string {
	// Joined as path.Join would (a service id is one path segment:
	// serviceIDPattern), without its cleaning: every search of an
	// upstream's message asks for it (App.EachCallSecret).
	return connectionPrefix + "/" + service + "/" + hashKey(user)
}

// Load returns user's connection to service, from the cache when fresh.
// The result is shared: do not modify it, copy it.
func (s *ConnectionStore) Load(ctx context.Context, service, user string) (*Connection, error) {
	return s.cache.Load(ctx, ConnectionKey(service, user), s.loader(service, user))
}

// LoadFresh reads the connection from storage, bypassing the cache, and
// leaves the cache as it read: with the connection read, or without one
// when there is none (the caller disconnected through another replica,
// which announced nothing) — a copy kept would go on serving a deleted
// token.
func (s *ConnectionStore) LoadFresh(ctx context.Context, service, user string) (*Connection, error) {
	key := ConnectionKey(service, user)
	conn, err := s.cache.Reload(ctx, key, s.loader(service, user))
	if errors.Is(err, ErrNotConnected) {
		s.cache.Forget(key)
	}
	return conn, err
}

// loader reads and decrypts user's connection to service. Absence is not
// kept, so a connection made on another replica is seen at once.
func (s *ConnectionStore) loader(service, user string) func(context.Context) (*Connection, bool, error) {
	return func(ctx context.Context) (*Connection, bool, error) {
		sealed, err := s.storage.Load(ctx, ConnectionKey(service, user))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, ErrNotConnected
		}
		if err != nil {
			return nil, false, fmt.Errorf("%w: reading storage: %v", ErrStorageUnavailable, err)
		}
		plain, err := s.cipher.Decrypt(ctx, sealed, CipherContext(service, user))
		if errors.Is(err, ErrCipherMismatch) && s.sealedWithOldKey(ctx, ConnectionKey(service, user)) {
			return nil, false, fmt.Errorf("%w (the %s connection): %w", ErrSealedWithOtherKey, service, err)
		}
		if err != nil {
			return nil, false, cipherError("decrypting the "+service+" connection", err)
		}
		var conn Connection
		err = json.Unmarshal(plain, &conn)
		clear(plain)
		if err != nil {
			return nil, false, fmt.Errorf("decoding the %s connection: %v", service, err)
		}
		return &conn, true, nil
	}
}

// Save encrypts and stores user's connection to service.
func (s *ConnectionStore) Save(ctx context.Context, service, user string, conn *Connection) error {
	resetBefore, err := s.checkKeyBeforeSealing(ctx)
	if err != nil {
		return err
	}
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
	prev, err := s.storeSealed(ctx, key, sealed)
	if err != nil {
		return fmt.Errorf("%w: writing storage: %v", ErrStorageUnavailable, err)
	}
	if err := s.checkKeyAfterSealing(ctx, service, user, sealed, prev, resetBefore); err != nil {
		return err
	}
	stored := *conn
	s.cache.Wrote(ctx, key, &stored)
	return nil
}

// settle waits (a second at most) until every replica was sent the change
// of user's connection to service: a person told that a token was replaced
// or forgotten is told so once every replica is dropping its copy (as the
// announcement arrives there).
func (s *ConnectionStore) settle(ctx context.Context, service, user string) {
	s.cache.Settle(ctx, ConnectionKey(service, user), time.Second)
}

// Delete forgets user's connection to service.
func (s *ConnectionStore) Delete(ctx context.Context, service, user string) error {
	key := ConnectionKey(service, user)
	s.cache.Forget(key)
	for _, k := range []string{key, rejectedKey(service, user)} {
		err := s.storage.Delete(ctx, k)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: deleting from storage: %v", ErrStorageUnavailable, err)
		}
	}
	s.cache.Deleted(ctx, key)
	s.maybeGone(key)
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

// Reject deletes a grant the provider refused, leaving a mark so the
// catalog can tell the user it expired. was is the grant as it stood: its
// tokens (the access token and the retired ones) may still be honoured
// until they expire, and upstreams had them, so the mark keeps them
// sealed for the next connection to keep as retired (Connect); a cipher
// that cannot seal them leaves the mark without them.
func (s *ConnectionStore) Reject(ctx context.Context, service, user string, was *Connection) error {
	key := ConnectionKey(service, user)
	s.cache.Forget(key)
	if err := s.storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: deleting from storage: %v", ErrStorageUnavailable, err)
	}
	s.cache.Deleted(ctx, key)
	s.maybeGone(key)
	m := rejectedMark{RejectedAt: now().UTC()}
	if retired := (&Connection{}).retiring(was); len(retired) > 0 {
		plain, _ := json.Marshal(retired)
		m.Retired, _ = s.cipher.Encrypt(ctx, plain, retiredContext(service, user))
		clear(plain)
	}
	mark, _ := json.Marshal(m)
	if err := s.storage.Store(ctx, rejectedKey(service, user), mark); err != nil {
		return fmt.Errorf("%w: writing storage: %v", ErrStorageUnavailable, err)
	}
	return nil
}

// rejectedMark is what Reject leaves of a grant.
type rejectedMark struct {
	RejectedAt time.Time `json:"rejected_at"`
	// Retired is the cipher's output for the JSON of the grant's tokens
	// ([]RetiredToken), under retiredContext.
	Retired []byte `json:"retired,omitempty"`
}

// retiredContext is the cipher context of a rejected grant's tokens:
// another than its record's (CipherContext), so that neither opens as the
// other.
func retiredContext(service, user string) []byte {
	return []byte("toolgate/v1-retired/" + service + "/" + user)
}

// rejected is what the mark of user's rejected grant for service keeps of
// its tokens, as a connection holding them as retired; nil when there is
// no mark, it keeps none, or they cannot be read.
func (s *ConnectionStore) rejected(ctx context.Context, service, user string) *Connection {
	data, err := s.storage.Load(ctx, rejectedKey(service, user))
	if err != nil {
		return nil
	}
	var m rejectedMark
	if json.Unmarshal(data, &m) != nil || len(m.Retired) == 0 {
		return nil
	}
	plain, err := s.cipher.Decrypt(ctx, m.Retired, retiredContext(service, user))
	if err != nil {
		return nil
	}
	var retired []RetiredToken
	err = json.Unmarshal(plain, &retired)
	clear(plain)
	if err != nil {
		return nil
	}
	return &Connection{Retired: retired}
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

// ErrStorageUnavailable reports that Caddy storage could not be read or
// written; retrying later may succeed.
var ErrStorageUnavailable = storecache.ErrUnavailable
