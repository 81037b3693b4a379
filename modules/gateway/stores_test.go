package gateway

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// gcmCipher is a test-only Cipher: AES-256-GCM with the context as
// additional data, like toolgate.ciphers.local, without its key file. It
// may be used concurrently, as a Cipher is.
type gcmCipher struct {
	aead     cipher.AEAD
	decrypts atomic.Int64
}

func testCipher(t testing.TB) *gcmCipher {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return &gcmCipher{aead: aead}
}

func (c *gcmCipher) Encrypt(_ context.Context, plaintext, context []byte) ([]byte, error) {
	nonce := make([]byte, c.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return c.aead.Seal(nonce, nonce, plaintext, context), nil
}

func (c *gcmCipher) Decrypt(_ context.Context, ciphertext, context []byte) ([]byte, error) {
	c.decrypts.Add(1)
	n := c.aead.NonceSize()
	if len(ciphertext) < n {
		return nil, errors.New("test cipher: short ciphertext")
	}
	plain, err := c.aead.Open(nil, ciphertext[:n], ciphertext[n:], context)
	if err != nil {
		return nil, fmt.Errorf("test cipher: %w and context", ErrCipherMismatch)
	}
	return plain, nil
}

var _ Cipher = (*gcmCipher)(nil)

// setClock makes now return *clock for the rest of the test.
func setClock(t *testing.T, start time.Time) *time.Time {
	t.Helper()
	clock := start
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })
	return &clock
}

func fileStorage(t testing.TB) (*certmagic.FileStorage, string) {
	dir := t.TempDir()
	return &certmagic.FileStorage{Path: dir}, dir
}

// storedFiles returns every file under dir (relative path → contents).
func storedFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = data
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestSessionStoreLifecycle(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 29, 12, 0, 0, 500, time.UTC))
	storage, dir := fileStorage(t)
	s := newSessionStore(storage, time.Hour, 10*time.Second, 0)

	sess, err := s.Create(ctx, "alice@example.com", []string{"tracker", "search"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.ID) < 22 { // 128 bits in base64url
		t.Errorf("session id %q is shorter than 128 bits", sess.ID)
	}
	if !sess.CreatedAt.Equal(clock.Truncate(time.Second)) || !sess.ExpiresAt.Equal(sess.CreatedAt.Add(time.Hour)) {
		t.Errorf("times = %v..%v", sess.CreatedAt, sess.ExpiresAt)
	}
	if !sess.Selected("tracker") || sess.Selected("weather") || sess.Selected("Tracker") {
		t.Error("Selected does not match the chosen services")
	}

	// Storage holds the session under the hash of its id, and an index
	// entry under the hash of its user; never the id.
	files := storedFiles(t, dir)
	record := "toolgate/sessions/" + hashKey(sess.ID)
	index := "toolgate/sessions-by-user/" + hashKey("alice@example.com") + "/" + hashKey(sess.ID)
	if _, ok := files[record]; !ok || len(files) != 2 {
		t.Fatalf("stored files = %v, want %s and %s", keys(files), record, index)
	}
	if _, ok := files[index]; !ok {
		t.Fatalf("stored files = %v, want the index entry %s", keys(files), index)
	}
	for name, data := range files {
		if strings.Contains(name, sess.ID) || bytes.Contains(data, []byte(sess.ID)) {
			t.Errorf("storage reveals the session id: %s = %s", name, data)
		}
	}
	if !bytes.Contains(files[record], []byte("alice@example.com")) {
		t.Errorf("stored record %s lacks the owner", files[record])
	}

	// Another replica (no cache) reads it back.
	other := newSessionStore(storage, time.Hour, 10*time.Second, 0)
	got, err := other.Get(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sess.ID || got.User != sess.User || strings.Join(got.Services, ",") != "tracker,search" || !got.ExpiresAt.Equal(sess.ExpiresAt) {
		t.Errorf("Get = %+v, want %+v", got, sess)
	}

	// Unknown, empty and absurd ids.
	for _, id := range []string{"", "nope", strings.Repeat("x", 257), sess.ID + "x", strings.ToUpper(sess.ID)} {
		if _, err := other.Get(ctx, id); !errors.Is(err, ErrSessionNotFound) {
			t.Errorf("Get(%.20q) = %v, want ErrSessionNotFound", id, err)
		}
	}

	// Expiry, whether the session comes from the cache or from storage.
	*clock = sess.ExpiresAt.Add(-time.Second)
	if _, err := s.Get(ctx, sess.ID); err != nil {
		t.Errorf("one second before expiry: %v", err)
	}
	*clock = sess.ExpiresAt.Add(time.Second)
	if _, err := s.Get(ctx, sess.ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("after expiry: %v, want ErrSessionNotFound", err)
	}
	fresh := newSessionStore(storage, time.Hour, 10*time.Second, 0)
	if _, err := fresh.Get(ctx, sess.ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("after expiry, uncached: %v, want ErrSessionNotFound", err)
	}

	// Delete.
	*clock = sess.CreatedAt
	if err := s.Delete(ctx, sess); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, sess.ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("after Delete: %v, want ErrSessionNotFound", err)
	}
	if files := storedFiles(t, dir); len(files) != 0 {
		t.Errorf("after Delete, storage still holds %v", keys(files))
	}
	if err := s.Delete(ctx, sess); err != nil {
		t.Errorf("deleting twice: %v", err)
	}
}

func TestSessionStoreCacheTTL(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	a := newSessionStore(storage, time.Hour, 10*time.Second, 0)
	b := newSessionStore(storage, time.Hour, 10*time.Second, 0)

	sess, err := a.Create(ctx, "alice", []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, sess.ID); err != nil { // b caches it now
		t.Fatal(err)
	}
	if err := a.Delete(ctx, sess); err != nil {
		t.Fatal(err)
	}
	// b keeps using its cached copy for up to CacheTTL…
	*clock = clock.Add(9 * time.Second)
	if _, err := b.Get(ctx, sess.ID); err != nil {
		t.Errorf("within cache_ttl on another replica: %v, want the cached session", err)
	}
	// …then reads storage again and sees the session is gone.
	*clock = clock.Add(2 * time.Second)
	if _, err := b.Get(ctx, sess.ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("after cache_ttl: %v, want ErrSessionNotFound", err)
	}
	// A read after the TTL fills the cache again: a now-missing record is
	// not resurrected.
	if _, err := b.Get(ctx, sess.ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("second read after cache_ttl: %v", err)
	}
}

func TestSessionStoreSweep(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	storage, dir := fileStorage(t)
	s := newSessionStore(storage, time.Hour, time.Second, 0)

	if n, err := s.sweep(ctx); n != 0 || err != nil {
		t.Errorf("sweep of empty storage = %d, %v", n, err)
	}
	old, _ := s.Create(ctx, "a", nil)
	*clock = clock.Add(30 * time.Minute)
	young, _ := s.Create(ctx, "b", nil)
	*clock = clock.Add(31 * time.Minute) // old expired, young not
	n, err := s.sweep(ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep = %d, %v; want 1 removed", n, err)
	}
	files := storedFiles(t, dir)
	_, record := files["toolgate/sessions/"+hashKey(young.ID)]
	_, index := files["toolgate/sessions-by-user/"+hashKey("b")+"/"+hashKey(young.ID)]
	if !record || !index || len(files) != 2 {
		t.Errorf("after sweep storage holds %v, want only the young session and its index entry", keys(files))
	}
	if _, err := newSessionStore(storage, time.Hour, time.Second, 0).Get(ctx, old.ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("swept session: %v", err)
	}
}

// A person lists their own live sessions (never the ids), ends one by its
// ref, and cannot hold more than max_sessions_per_user.
func TestSessionStorePerUserIndexAndLimit(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	s := newSessionStore(storage, time.Hour, time.Second, 3)

	var made []*Session
	for i := range 3 {
		sess, err := s.Create(ctx, "alice", []string{fmt.Sprint("svc", i)})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, sess)
		*clock = clock.Add(time.Minute)
	}
	if _, err := s.Create(ctx, "alice", []string{"x"}); !errors.Is(err, ErrTooManySessions) {
		t.Fatalf("a fourth session: %v, want ErrTooManySessions", err)
	}
	if _, err := s.Create(ctx, "bob", []string{"x"}); err != nil {
		t.Fatalf("bob is not limited by alice's sessions: %v", err)
	}
	list, err := s.List(ctx, "alice")
	if err != nil || len(list) != 3 {
		t.Fatalf("List = %v, %v; want 3", list, err)
	}
	if list[0].Ref != hashKey(made[2].ID) || list[0].Services[0] != "svc2" {
		t.Errorf("List is not newest first: %+v", list)
	}

	// bob cannot end alice's session by naming its ref.
	if err := s.DeleteRef(ctx, "bob", list[0].Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, made[2].ID); err != nil {
		t.Fatalf("bob's DeleteRef ended alice's session: %v", err)
	}
	if err := s.DeleteRef(ctx, "alice", list[0].Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, made[2].ID); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("after DeleteRef: %v", err)
	}
	if _, err := s.Create(ctx, "alice", []string{"x"}); err != nil {
		t.Errorf("after ending one, a new session: %v", err)
	}

	// Expired sessions do not count.
	*clock = clock.Add(2 * time.Hour)
	if list, _ := s.List(ctx, "alice"); len(list) != 0 {
		t.Errorf("after expiry List = %+v", list)
	}
	for range 3 {
		if _, err := s.Create(ctx, "alice", []string{"x"}); err != nil {
			t.Fatalf("after expiry: %v", err)
		}
	}
}

func TestConnectionStoreStoresOnlyCipherOutput(t *testing.T) {
	ctx := context.Background()
	setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	storage, dir := fileStorage(t)
	c := testCipher(t)
	s := newConnectionStore(storage, c, 10*time.Second)

	conn := &Connection{
		Kind: AuthOAuth, AccessToken: "at-VERY-SECRET-access", RefreshToken: "rt-VERY-SECRET-refresh", TokenType: "Bearer",
		Expiry: now().Add(time.Hour), Scopes: []string{"tickets.read"}, ConnectedAt: now(),
	}
	if err := s.Save(ctx, "tracker", "alice@example.com", conn); err != nil {
		t.Fatal(err)
	}
	files := storedFiles(t, dir)
	if len(files) != 1 {
		t.Fatalf("stored files = %v, want one", keys(files))
	}
	for name, data := range files {
		if name != ConnectionKey("tracker", "alice@example.com") || !strings.HasSuffix(name, hashKey("alice@example.com")) {
			t.Errorf("stored as %q, want %q", name, ConnectionKey("tracker", "alice@example.com"))
		}
		for _, secret := range []string{"VERY-SECRET", "alice", "access_token", "refresh_token", "tickets.read", "Bearer"} {
			if strings.Contains(name, secret) || bytes.Contains(data, []byte(secret)) {
				t.Errorf("storage shows %q in %s: %q", secret, name, data)
			}
		}
		plain, err := c.Decrypt(ctx, data, CipherContext("tracker", "alice@example.com"))
		if err != nil || !bytes.Contains(plain, []byte("at-VERY-SECRET-access")) {
			t.Errorf("stored bytes are not the cipher output of the record: %v", err)
		}
	}

	// Another replica decrypts it.
	other := newConnectionStore(storage, c, 10*time.Second)
	got, err := other.Load(ctx, "tracker", "alice@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if got.AccessToken != conn.AccessToken || got.RefreshToken != conn.RefreshToken || !got.Expiry.Equal(conn.Expiry) || got.Kind != AuthOAuth {
		t.Errorf("Load = %v, want the saved connection", got)
	}

	// The record copied into bob's slot does not decrypt for bob.
	sealed := files[ConnectionKey("tracker", "alice@example.com")]
	if err := storage.Store(ctx, ConnectionKey("tracker", "bob@example.com"), sealed); err != nil {
		t.Fatal(err)
	}
	_, err = other.LoadFresh(ctx, "tracker", "bob@example.com")
	if err == nil {
		t.Fatal("alice's record decrypted in bob's slot")
	}
	if strings.Contains(err.Error(), "VERY-SECRET") {
		t.Errorf("error shows the token: %v", err)
	}
	// Nor for another service of alice's.
	if err := storage.Store(ctx, ConnectionKey("search", "alice@example.com"), sealed); err != nil {
		t.Fatal(err)
	}
	if _, err := other.LoadFresh(ctx, "search", "alice@example.com"); err == nil {
		t.Error("the tracker record decrypted as alice's search record")
	}

	// Not connected.
	if _, err := other.Load(ctx, "tracker", "carol@example.com"); !errors.Is(err, ErrNotConnected) {
		t.Errorf("unknown user: %v, want ErrNotConnected", err)
	}

	// Delete.
	if err := s.Delete(ctx, "tracker", "alice@example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx, "tracker", "alice@example.com"); !errors.Is(err, ErrNotConnected) {
		t.Errorf("after Delete: %v, want ErrNotConnected", err)
	}
	if err := s.Delete(ctx, "tracker", "alice@example.com"); err != nil {
		t.Errorf("deleting twice: %v", err)
	}
}

func TestConnectionStoreCache(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	c := testCipher(t)
	a := newConnectionStore(storage, c, 10*time.Second)
	b := newConnectionStore(storage, c, 10*time.Second)

	// Absence is not cached: a connection made on another replica is seen at once.
	if _, err := b.Load(ctx, "svc", "u"); !errors.Is(err, ErrNotConnected) {
		t.Fatal(err)
	}
	if err := a.Save(ctx, "svc", "u", &Connection{Kind: AuthBearer, AccessToken: "one"}); err != nil {
		t.Fatal(err)
	}
	got, err := b.Load(ctx, "svc", "u")
	if err != nil || got.AccessToken != "one" {
		t.Fatalf("b.Load right after a.Save = %v, %v", got, err)
	}

	// Steady state: no cipher round trip within the cache TTL.
	before := c.decrypts.Load()
	for range 5 {
		if _, err := b.Load(ctx, "svc", "u"); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.decrypts.Load() - before; n != 0 {
		t.Errorf("cached loads decrypted %d times", n)
	}

	// A change through a is seen by b only after the TTL…
	if err := a.Save(ctx, "svc", "u", &Connection{Kind: AuthBearer, AccessToken: "two"}); err != nil {
		t.Fatal(err)
	}
	*clock = clock.Add(9 * time.Second)
	if got, _ := b.Load(ctx, "svc", "u"); got.AccessToken != "one" {
		t.Errorf("within the TTL b sees %q, want its cached %q", got.AccessToken, "one")
	}
	*clock = clock.Add(2 * time.Second)
	if got, _ := b.Load(ctx, "svc", "u"); got.AccessToken != "two" {
		t.Errorf("after the TTL b sees %q, want %q", got.AccessToken, "two")
	}
	// …but LoadFresh always reads storage, and the writer's own cache is current.
	if err := a.Save(ctx, "svc", "u", &Connection{Kind: AuthBearer, AccessToken: "three"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.LoadFresh(ctx, "svc", "u"); got.AccessToken != "three" {
		t.Errorf("LoadFresh = %q, want three", got.AccessToken)
	}
	if got, _ := a.Load(ctx, "svc", "u"); got.AccessToken != "three" {
		t.Errorf("writer's Load = %q, want three", got.AccessToken)
	}

	// Save keeps its own copy: the caller changing its struct afterwards
	// does not change the cache.
	mine := &Connection{Kind: AuthBearer, AccessToken: "four"}
	if err := a.Save(ctx, "svc", "u", mine); err != nil {
		t.Fatal(err)
	}
	mine.AccessToken = "tampered"
	if got, _ := a.Load(ctx, "svc", "u"); got.AccessToken != "four" {
		t.Errorf("cache follows the caller's struct: %q", got.AccessToken)
	}

	// Delete evicts at once on the deleting replica.
	if err := a.Delete(ctx, "svc", "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Load(ctx, "svc", "u"); !errors.Is(err, ErrNotConnected) {
		t.Errorf("after Delete: %v", err)
	}
}

func TestConnectionNeverPrintsTokens(t *testing.T) {
	conn := &Connection{Kind: AuthOAuth, AccessToken: "at-SECRET", RefreshToken: "rt-SECRET", Expiry: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), RefreshCount: 2}
	for _, format := range []string{"%v", "%+v", "%s", "%#v"} {
		out := fmt.Sprintf(format, conn)
		if strings.Contains(out, "SECRET") {
			t.Errorf("%s shows a token: %s", format, out)
		}
		if !strings.Contains(out, "oauth") || !strings.Contains(out, "refresh_count=2") {
			t.Errorf("%s = %s, want kind and refresh count", format, out)
		}
	}
}

func TestConnectionExpired(t *testing.T) {
	clock := setClock(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := &Connection{Expiry: clock.Add(time.Minute)}
	if c.Expired(30 * time.Second) {
		t.Error("expires in 60s, skew 30s: not expired")
	}
	if !c.Expired(90 * time.Second) {
		t.Error("expires in 60s, skew 90s: expired")
	}
	if (&Connection{}).Expired(time.Hour) {
		t.Error("a connection without expiry never expires")
	}
}

func TestCipherContextSeparatesRecords(t *testing.T) {
	if bytes.Equal(CipherContext("a", "b"), CipherContext("b", "a")) {
		t.Error("swapping service and user gives the same context")
	}
	if ConnectionKey("svc", "alice") == ConnectionKey("svc", "bob") || strings.Contains(ConnectionKey("svc", "alice"), "alice") {
		t.Error("ConnectionKey must differ per user and not show the user")
	}
}

func TestNewIDIsRandom(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if len(id) != 32 || strings.ContainsAny(id, "+/=") {
			t.Fatalf("NewID() = %q: want 32 URL-safe characters (192 bits)", id)
		}
		if seen[id] {
			t.Fatalf("NewID repeated %q", id)
		}
		seen[id] = true
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A ref comes from a URL (the console's end-session form): one that is not
// a session's SHA-256 ends nothing, however it names a path.
func TestSessionStoreDeleteRefTakesOnlyRefs(t *testing.T) {
	ctx := context.Background()
	storage, dir := fileStorage(t)
	s := newSessionStore(storage, time.Hour, 0, 0)
	mine, err := s.Create(ctx, "alice", []string{"svc"})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := s.Create(ctx, "bob", []string{"svc"})
	if err != nil {
		t.Fatal(err)
	}
	before := storedFiles(t, dir)
	for _, ref := range []string{"", ".", "..", "../..", "../../..", "../sessions", "x/../..", strings.ToUpper(hashKey(mine.ID)), hashKey(mine.ID) + "/.."} {
		if err := s.DeleteRef(ctx, "alice", ref); err != nil {
			t.Errorf("DeleteRef(%q): %v", ref, err)
		}
		if after := storedFiles(t, dir); len(after) != len(before) {
			t.Fatalf("DeleteRef(%q) deleted %d of %d stored files", ref, len(before)-len(after), len(before))
		}
	}
	for _, sess := range []*Session{mine, theirs} {
		if _, err := s.Get(ctx, sess.ID); err != nil {
			t.Errorf("%s's session after DeleteRef of malformed refs: %v", sess.User, err)
		}
	}
}

// flakyStat is a storage whose existence checks fail while failing is set,
// as a database storage's do when a query fails: Exists says false, Stat
// returns the error.
type flakyStat struct {
	certmagic.Storage
	failing bool
}

func (f *flakyStat) Exists(ctx context.Context, key string) bool {
	return !f.failing && f.Storage.Exists(ctx, key)
}

func (f *flakyStat) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	if f.failing {
		return certmagic.KeyInfo{}, errors.New("the storage is unavailable")
	}
	return f.Storage.Stat(ctx, key)
}

// A storage that cannot tell whether a key exists neither makes ending a
// session report success without ending it, nor makes a live session
// vanish from its person's list (where they end it, and which bounds it).
func TestSessionIndexSurvivesAFailingStorage(t *testing.T) {
	ctx := context.Background()
	files, _ := fileStorage(t)
	storage := &flakyStat{Storage: files}
	s := newSessionStore(storage, time.Hour, 0, 0)
	sess, err := s.Create(ctx, "alice", []string{"svc"})
	if err != nil {
		t.Fatal(err)
	}
	storage.failing = true
	if _, err := s.List(ctx, "alice"); err == nil {
		t.Error("List with a failing storage reported no error")
	}
	if err := s.DeleteRef(ctx, "alice", SessionRef(sess.ID)); err == nil {
		if _, err := s.Get(ctx, sess.ID); err == nil {
			t.Error("DeleteRef reported success, and the session still works")
		}
	}
	storage.failing = false
	if list, err := s.List(ctx, "alice"); err != nil || len(list) != 1 {
		t.Fatalf("after the storage recovered, alice's sessions: %v, %v; want her live session", list, err)
	}
}
