// Package websession keeps the sign-ins of people's browsers: the console
// creates them, and every page that acts for a person — the console's, and
// toolgate_api's OAuth callback, which completes a connect only in the
// browser sign-in that started it — reads them.
//
// A browser session is a server-side record: the browser holds only a
// random id in an HttpOnly, SameSite=Lax cookie (Secure and __Host- on
// https), and storage holds only the id's SHA-256, so a storage listing
// signs no one in. A session ends when unused for its idle time, at its
// absolute expiry, on sign-out (the record is deleted, so the old cookie no
// longer works on any replica) or on sign-out everywhere. The CSRF token of
// a session is derived from its id, so it needs no storage and is unknown
// to anyone who does not hold the cookie.
package websession

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/written"
	"github.com/toolgate/toolgate/modules/gateway"
)

// now is the clock; tests replace it.
var now = time.Now

// Session is a person's sign-in in one browser.
type Session struct {
	// ID is the cookie's value; storage holds only its hash.
	ID     string   `json:"-"`
	User   string   `json:"user"`
	Groups []string `json:"groups,omitempty"`
	Method string   `json:"method"` // MethodOIDC or MethodAPIKey
	// Key is what vouched for the sign-in: for an API-key sign-in the
	// key's SHA-256 (hex), for an OpenID Connect one the issuer. The
	// sign-in lasts as long as the configuration has the key for that
	// user, or the issuer (see Store.Limit).
	Key       string        `json:"key,omitempty"`
	CreatedAt time.Time     `json:"created_at"`
	SeenAt    time.Time     `json:"seen_at"`
	Idle      time.Duration `json:"idle"`       // the session ends when unused this long
	ExpiresAt time.Time     `json:"expires_at"` // and at this time in any case
	// MAC binds the record to its id and the person it signs in, under a
	// key of toolgate's (see signed): a record written into storage by
	// anyone else signs no one in.
	MAC []byte `json:"mac"`
}

// Ref names the session without revealing anything usable: the OAuth
// connect flow binds its state to it.
func (s *Session) Ref() string {
	sum := sha256.Sum256([]byte("toolgate browser session\x00" + s.ID))
	return hex.EncodeToString(sum[:16])
}

// CSRF is the token every state-changing form of the session carries.
func (s *Session) CSRF() string {
	mac := hmac.New(sha256.New, []byte(s.ID))
	mac.Write([]byte("toolgate csrf"))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// CheckCSRF reports whether token is the session's CSRF token.
func (s *Session) CheckCSRF(token string) bool {
	return token != "" && hmac.Equal([]byte(token), []byte(s.CSRF()))
}

// Caller is the person as the gateway's stores know callers.
func (s *Session) Caller() *gateway.Caller {
	return &gateway.Caller{User: s.User, Groups: s.Groups, Method: "console"}
}

// Browser is the session as the OAuth connect flow binds to it.
func (s *Session) Browser() gateway.Browser { return gateway.Browser{User: s.User, Ref: s.Ref()} }

// ErrNotSignedIn reports a missing, unknown, expired or ended session.
var ErrNotSignedIn = errors.New("not signed in")

// Store keeps browser sessions in Caddy storage. It caches nothing, so a
// sign-out on any replica takes effect everywhere at once (people make few
// requests; the call path never reads it). A session is live while both its
// record and its person's index entry exist.
type Store struct {
	storage certmagic.Storage
	perUser int
	auth    *gateway.AuthConfig // the API keys API-key sign-ins are checked against; nil: none
	keys    *seal.Keyring       // sign the records (see signed)
	limits  *Limits             // this handler's, when it set them (Limit)
	every   *limitSet           // every handler's of the configuration (For); nil: limits alone
}

// limitSet holds the limits of every handler of one configuration that
// reads sign-ins: a sign-in one of them still accepts is not deleted by
// another (several consoles with different terms), and a handler without
// terms of its own (the API's OAuth callback) accepts what one of them
// accepts.
type limitSet struct {
	mu  sync.Mutex
	all []Limits
}

func (ls *limitSet) add(l Limits) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.all = append(ls.all, l)
}

func (ls *limitSet) list() []Limits {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.all
}

// Limits are what the configuration in force says of sign-ins it did not
// make itself (made before a reload, or on another replica): a shorter
// idle time or lifetime ends them sooner (a longer one extends none), an
// OpenID Connect sign-in lasts only while its issuer is configured, and an
// API-key sign-in only while API keys sign people in.
type Limits struct {
	Idle, Lifetime time.Duration // 0: the record's own
	// Issuers are the OpenID Connect issuers people may sign in with; an
	// OpenID Connect sign-in through another, or made by a version that
	// did not record its issuer, has ended.
	Issuers []string
	// APIKeys: people may sign in with an API key; without it, an API-key
	// sign-in has ended (an administrator who moved to an identity
	// provider's sign-in leaves none of them behind).
	APIKeys bool
}

// Limit applies l to every session the store reads from now on, and adds
// it to the terms of the store's configuration (For).
func (st *Store) Limit(l Limits) {
	st.limits = &l
	if st.every != nil {
		st.every.add(l)
	}
}

// alive reports whether s has not ended for this store: by its own idle
// time and lifetime, and by the store's limits, or, for a store without
// limits of its own, by those of one handler of its configuration.
func (st *Store) alive(s *Session) bool {
	if st.limits != nil {
		return aliveUnder(s, st.limits)
	}
	return !st.over(s)
}

// over reports whether s has ended for every handler of the store's
// configuration, so that it may be deleted.
func (st *Store) over(s *Session) bool {
	var all []Limits
	if st.every != nil {
		all = st.every.list()
	}
	if len(all) == 0 {
		return !aliveUnder(s, st.limits)
	}
	for i := range all {
		if aliveUnder(s, &all[i]) {
			return false
		}
	}
	return true
}

// aliveUnder reports whether s has not ended by its own idle time and
// lifetime, shortened by l (nil: none).
func aliveUnder(s *Session, l *Limits) bool {
	t := now()
	idle, expires := s.Idle, s.ExpiresAt
	if l != nil {
		if l.Idle > 0 && (idle <= 0 || l.Idle < idle) {
			idle = l.Idle
		}
		if e := s.CreatedAt.Add(l.Lifetime); l.Lifetime > 0 && e.Before(expires) {
			expires = e
		}
		if s.Method == MethodOIDC && !slices.Contains(l.Issuers, s.Key) || s.Method == MethodAPIKey && !l.APIKeys {
			return false
		}
	}
	return t.Before(expires) && (idle <= 0 || t.Before(s.SeenAt.Add(idle)))
}

// Purpose names the keys that sign browser sessions (gateway.App.Keyring).
const Purpose = "toolgate/v1/browser-session"

// processKeys sign the records of a store made without keys: they do not
// open in another process.
var processKeys = seal.Random(Purpose)

const (
	prefix       = "toolgate/browser-sessions"
	byUserPrefix = "toolgate/browser-sessions-by-user"
	// seenEvery bounds how often a session's last use is written back.
	seenEvery = time.Minute
)

// NewStore returns a store over storage that keeps at most perUser
// sessions of one person (signing in again ends the oldest). An API-key
// sign-in lives only while auth has the key for its user, and has the
// key's groups now. keys sign the records (nil: keys of this process).
func NewStore(storage certmagic.Storage, perUser int, auth *gateway.AuthConfig, keys *seal.Keyring) *Store {
	if keys == nil {
		keys = processKeys
	}
	return &Store{storage: storage, perUser: perUser, auth: auth, keys: keys}
}

// For returns a store of app's browser sign-ins for one of its handlers,
// keeping at most perUser sessions of one person (see NewStore), signed
// with app's keys. The stores of one configuration share their terms:
// each handler's Limit ends sign-ins for that handler, but a sign-in is
// deleted only once every handler's terms end it, and a handler that sets
// none accepts a sign-in while one handler's terms do.
func For(app *gateway.App, perUser int) (*Store, error) {
	keys, err := app.Keyring(Purpose)
	if err != nil {
		return nil, err
	}
	every, err := app.Shared(Purpose, func() (any, error) { return new(limitSet), nil })
	if err != nil {
		return nil, err
	}
	st := NewStore(app.Storage(), perUser, app.Auth, keys)
	st.every = every.(*limitSet)
	return st, nil
}

// signed is what a record's MAC covers: the hash of its id and everything
// that says who it signs in and for how long, its last use included (each
// use written back is signed again).
func (s *Session) signed() []byte {
	groups := s.Groups
	if len(groups) == 0 {
		groups = nil // as the record reads back: stored without them
	}
	b, _ := json.Marshal(struct {
		Ref       string        `json:"ref"`
		User      string        `json:"user"`
		Groups    []string      `json:"groups"`
		Method    string        `json:"method"`
		Key       string        `json:"key"`
		CreatedAt time.Time     `json:"created_at"`
		SeenAt    time.Time     `json:"seen_at"`
		Idle      time.Duration `json:"idle"`
		ExpiresAt time.Time     `json:"expires_at"`
	}{hashOf(s.ID), s.User, groups, s.Method, s.Key, s.CreatedAt, s.SeenAt, s.Idle, s.ExpiresAt})
	return append([]byte("toolgate browser session record v1\x00"), b...)
}

// sign sets s's MAC: the keys' seal of nothing, with what signed returns
// as its associated data.
func (st *Store) sign(s *Session) { s.MAC = st.keys.Seal(nil, s.signed()) }

// genuine reports whether s's MAC is one of the keys' for what it says.
func (st *Store) genuine(s *Session) bool {
	_, err := st.keys.Open(s.MAC, s.signed())
	return err == nil
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func recordKey(id string) string       { return path.Join(prefix, hashOf(id)) }
func indexKey(user, ref string) string { return path.Join(byUserPrefix, hashOf(user), ref) }

// Create signs user in: a new session with groups, by method, that ends
// when unused for idle and after lifetime at the latest.
func (st *Store) Create(ctx context.Context, user string, groups []string, method, key string, idle, lifetime time.Duration) (*Session, error) {
	if err := st.makeRoom(ctx, user); err != nil {
		return nil, err
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	t := now().UTC()
	s := &Session{ID: base64.RawURLEncoding.EncodeToString(b[:]), User: user, Groups: groups, Method: method, Key: key,
		CreatedAt: t, SeenAt: t, Idle: idle, ExpiresAt: t.Add(lifetime)}
	st.sign(s)
	data, _ := json.Marshal(s)
	ref := hashOf(s.ID)
	if err := st.storage.Store(ctx, indexKey(user, ref), []byte(s.ExpiresAt.Format(time.RFC3339))); err != nil {
		return nil, fmt.Errorf("storing the browser session: %w", err)
	}
	if err := st.storage.Store(ctx, recordKey(s.ID), data); err != nil {
		_ = st.storage.Delete(ctx, indexKey(user, ref))
		return nil, fmt.Errorf("storing the browser session: %w", err)
	}
	return s, nil
}

// makeRoom removes user's oldest sessions while they have perUser.
func (st *Store) makeRoom(ctx context.Context, user string) error {
	keys, err := st.storage.List(ctx, path.Join(byUserPrefix, hashOf(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing browser sessions: %w", err)
	}
	type entry struct {
		ref     string
		created time.Time
	}
	var live []entry
	for _, key := range keys {
		ref := path.Base(key)
		data, err := st.storage.Load(ctx, path.Join(prefix, ref))
		switch {
		case errors.Is(err, fs.ErrNotExist) && written.Recently(ctx, st.storage, key):
			continue // a sign-in under way (on any replica): Create stores the entry first
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("reading browser sessions: %w", err)
		}
		var s Session
		if err != nil || json.Unmarshal(data, &s) != nil || st.over(&s) {
			st.remove(ctx, user, ref) // ended for every handler (one another console keeps counts)
			continue
		}
		live = append(live, entry{ref, s.CreatedAt})
	}
	slices.SortFunc(live, func(a, b entry) int { return a.created.Compare(b.created) })
	for st.perUser > 0 && len(live) >= st.perUser {
		st.remove(ctx, user, live[0].ref)
		live = live[1:]
	}
	return nil
}

// Get returns the live session with id, recording its use.
func (st *Store) Get(ctx context.Context, id string) (*Session, error) {
	if id == "" || len(id) > 128 {
		return nil, ErrNotSignedIn
	}
	data, err := st.storage.Load(ctx, recordKey(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotSignedIn
	}
	if err != nil {
		return nil, fmt.Errorf("reading the browser session: %w", err)
	}
	var s Session
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, ErrNotSignedIn
	}
	s.ID = id
	if !st.genuine(&s) {
		// Written by someone else than toolgate (or by a version before
		// records were signed: its person signs in again).
		return nil, ErrNotSignedIn
	}
	if !st.alive(&s) {
		if st.over(&s) {
			st.remove(ctx, s.User, hashOf(id))
		}
		return nil, ErrNotSignedIn
	}
	// A session lives only while its person's index lists it: a use
	// recorded below while the person signed out (everywhere) may have
	// stored the record again after it was deleted.
	if _, err := st.storage.Stat(ctx, indexKey(s.User, hashOf(id))); errors.Is(err, fs.ErrNotExist) {
		_ = st.storage.Delete(ctx, recordKey(id))
		return nil, ErrNotSignedIn
	} else if err != nil {
		return nil, fmt.Errorf("reading the browser session: %w", err)
	}
	if now().Sub(s.SeenAt) >= seenEvery {
		s.SeenAt = now().UTC()
		st.sign(&s)
		if data, err := json.Marshal(&s); err == nil {
			_ = st.storage.Store(ctx, recordKey(id), data) // best effort: idle expiry may come a minute early
		}
	}
	return &s, nil
}

// Delete ends s (sign-out).
func (st *Store) Delete(ctx context.Context, s *Session) error {
	return st.remove(ctx, s.User, hashOf(s.ID))
}

// DeleteAll ends every session of user (sign-out everywhere) and returns
// how many there were.
func (st *Store) DeleteAll(ctx context.Context, user string) (int, error) {
	keys, err := st.storage.List(ctx, path.Join(byUserPrefix, hashOf(user)), false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("listing browser sessions: %w", err)
	}
	n := 0
	for _, key := range keys {
		if err := st.remove(ctx, user, path.Base(key)); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func (st *Store) remove(ctx context.Context, user, ref string) error {
	for _, key := range []string{path.Join(prefix, ref), indexKey(user, ref)} {
		if err := st.storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("ending the browser session: %w", err)
		}
	}
	return nil
}

// Sweep deletes sessions that ended by themselves, and their index
// entries; it returns how many sessions it deleted.
func (st *Store) Sweep(ctx context.Context) (int, error) {
	keys, err := st.storage.List(ctx, prefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, key := range keys {
		data, err := st.storage.Load(ctx, key)
		if err != nil {
			continue
		}
		var s Session
		if json.Unmarshal(data, &s) == nil && st.over(&s) {
			if st.remove(ctx, s.User, path.Base(key)) == nil {
				n++
			}
		}
	}
	users, err := st.storage.List(ctx, byUserPrefix, true)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return n, err
	}
	for _, key := range users {
		// An index entry without its record, unless the record is still
		// being stored (Create stores the entry first). A storage that
		// fails to say leaves the entry: it keeps the session alive.
		info, err := st.storage.Stat(ctx, key)
		if err != nil || !info.IsTerminal || now().Sub(info.Modified) < seenEvery {
			continue
		}
		if _, err := st.storage.Stat(ctx, path.Join(prefix, path.Base(key))); errors.Is(err, fs.ErrNotExist) {
			_ = st.storage.Delete(ctx, key)
		}
	}
	return n, nil
}

// Cookie names: the __Host- prefix binds the cookie to the exact origin
// (Secure, Path=/, no Domain), which browsers allow only on https.
const (
	cookieName       = "toolgate_session"
	secureCookieName = "__Host-toolgate_session"
)

// CookieName is the name of the session cookie.
func CookieName(secure bool) string {
	if secure {
		return secureCookieName
	}
	return cookieName
}

// FromRequest returns the live session the request's cookie names, or
// ErrNotSignedIn.
func (st *Store) FromRequest(r *http.Request, secure bool) (*Session, error) {
	c, err := r.Cookie(CookieName(secure))
	if err != nil {
		return nil, ErrNotSignedIn
	}
	s, err := st.Get(r.Context(), c.Value)
	if err != nil || s.Method != MethodAPIKey {
		return s, err
	}
	// An API-key sign-in ends with its key: revoked, or given to another
	// user. Its groups are the key's now.
	var caller *gateway.Caller
	ok := st.auth != nil
	if ok {
		caller, ok = st.auth.CallerForAPIKeyDigest(s.Key)
	}
	if !ok || caller.User != s.User {
		_ = st.Delete(r.Context(), s)
		return nil, ErrNotSignedIn
	}
	s.Groups = caller.Groups
	return s, nil
}

// The Methods of a sign-in: with an API key, or through an OpenID Connect
// issuer.
const (
	MethodAPIKey = "api_key"
	MethodOIDC   = "oidc"
)

// SetCookie gives the browser s's cookie. It lives as long as the session
// may; the server decides when it ends.
func SetCookie(w http.ResponseWriter, s *Session, secure bool) {
	http.SetCookie(w, &http.Cookie{Name: CookieName(secure), Value: s.ID, Path: "/", Expires: s.ExpiresAt,
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode})
}

// ClearCookie removes the session cookie from the browser.
func ClearCookie(w http.ResponseWriter, secure bool) {
	http.SetCookie(w, &http.Cookie{Name: CookieName(secure), Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode})
}
