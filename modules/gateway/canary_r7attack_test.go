package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// r7App is an app on storage with cipher c whose configuration names the
// API key users users (as AuthConfig.users sees them once provisioned).
func r7App(t *testing.T, storage certmagic.Storage, c Cipher, users ...string) *App {
	t.Helper()
	auth := &AuthConfig{}
	for _, u := range users {
		sum := sha256.Sum256([]byte("key-of-" + u))
		auth.APIKeys = append(auth.APIKeys, APIKey{Hash: "sha256:" + hex.EncodeToString(sum[:]), User: u})
	}
	if err := auth.provision(caddy.NewReplacer()); err != nil {
		t.Fatal(err)
	}
	return &App{storage: storage, cipher: c, logger: zap.NewNop(), Auth: auth}
}

// r7StoreConnection seals a connection of user to service with c, as
// ConnectionStore.Save does.
func r7StoreConnection(t *testing.T, storage certmagic.Storage, c Cipher, service, user string) {
	t.Helper()
	ctx := context.Background()
	sealed, err := c.Encrypt(ctx, []byte(`{"access_token":"tok-`+user+`"}`), CipherContext(service, user))
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, ConnectionKey(service, user), sealed); err != nil {
		t.Fatal(err)
	}
}

// Found and fixed (change B, 1a79dc9): the refusal's own way forward no
// longer worked. It said "to go on with this key, delete
// toolgate/cipher-canary from the storage"; an operator whose local key
// file was lost did exactly that, and the next start, finding no canary,
// opened an API key user's connection sealed with the old key and refused
// again, telling once more to delete the canary, which was no longer
// there. A storage without a canary cannot tell a deletion from one
// sealed before canaries existed.
// Severity: medium (an operator locked out of the documented recovery
// from a lost key; every restart refused).
// Fixed: the way forward is to store the word "reset" as the canary: the
// next start seals a new one with its key without looking at older
// records (and says so in the log); the canary then vouches for the new
// key, and the old one is refused.
func TestR7CanaryDeletedAsToldStillRefusedByAConnection(t *testing.T) {
	ctx := context.Background()
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	old, fresh := testCipher(t), testCipher(t)
	r7StoreConnection(t, storage, old, "personal", "alice")

	// premise: the old key started here and sealed the canary
	if err := r7App(t, storage, old, "alice").checkCipherKey(ctx); err != nil {
		t.Fatalf("premise: the key that sealed the connection: %v", err)
	}
	if !storage.Exists(ctx, cipherCanaryKey) {
		t.Fatal("premise: no canary sealed")
	}

	// The key is lost: a new one is refused, naming what to do, also once
	// the canary is deleted (the connection speaks for the old key).
	err := r7App(t, storage, fresh, "alice").checkCipherKey(ctx)
	if err == nil || !strings.Contains(err.Error(), `store the word "reset" as `+cipherCanaryKey) {
		t.Fatalf("a new key: %v; want it refused, saying to store the word reset as the canary", err)
	}
	if err := storage.Delete(ctx, cipherCanaryKey); err != nil {
		t.Fatal(err)
	}
	if err := r7App(t, storage, fresh, "alice").checkCipherKey(ctx); err == nil || !strings.Contains(err.Error(), "personal") {
		t.Fatalf("a new key, the canary deleted: %v; want it refused by the connection the key does not open", err)
	}
	// Do as told.
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	if err := r7App(t, storage, fresh, "alice").checkCipherKey(ctx); err != nil {
		t.Fatalf("the canary reset as the refusal says, the new key is still refused: %v", err)
	}
	if err := r7App(t, storage, fresh, "alice").checkCipherKey(ctx); err != nil {
		t.Fatalf("the next start with the new key: %v", err)
	}
	if err := r7App(t, storage, old, "alice").checkCipherKey(ctx); err == nil {
		t.Fatal("once reset, the canary still lets the old key start: it must vouch for the new one")
	}
}

// Found and fixed (change B, 1a79dc9): a false refusal of the right key. A user
// with several connections: checkConnection keeps, per user, only the last
// one listed (byUser[user] = service) and refuses the start if that one
// does not open — although another connection of the same user opens with
// this very key, which proves it is the right one. One damaged record (a
// bit flipped on disk, a partial write, an upstream's record restored from
// another backup) stops the whole gateway with "the cipher's key does not
// open the records in storage, which were sealed with another key" — a
// false diagnosis that sends the operator to restore or replace a key that
// is right. Before 1a79dc9 only that one connection failed.
// Severity: medium (false refusal of the start; the advice, replacing the
// key, would make things worse).
// Reproduction: alice's connections to "a-good" (opens) and "b-damaged"
// (one byte flipped), no canary, right key → start refused.
// Fixed: a key that opens any stored connection is the right one: try the
// named users' connections (bounded), go on when one opens, refuse only
// when every one tried was sealed with another key.
func TestR7CanaryOneDamagedConnectionRefusesTheRightKey(t *testing.T) {
	ctx := context.Background()
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	c := testCipher(t)
	r7StoreConnection(t, storage, c, "a-good", "alice")
	r7StoreConnection(t, storage, c, "b-damaged", "alice")
	key := ConnectionKey("b-damaged", "alice")
	sealed, err := storage.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	sealed[len(sealed)-1] ^= 1
	if err := storage.Store(ctx, key, sealed); err != nil {
		t.Fatal(err)
	}
	// premise: the key is the right one — alice's other connection opens.
	good, _ := storage.Load(ctx, ConnectionKey("a-good", "alice"))
	if _, err := c.Decrypt(ctx, good, CipherContext("a-good", "alice")); err != nil {
		t.Fatalf("premise: %v", err)
	}

	if err := r7App(t, storage, c, "alice").checkCipherKey(ctx); err != nil {
		t.Errorf("the right key (it opens alice's a-good connection) is refused because of one damaged record: %v", err)
	}
}

// r7VanishingStorage deletes key right after a listing: a person
// disconnecting (Delete) between checkConnection's List and its Load.
type r7VanishingStorage struct {
	certmagic.Storage
	key string
}

func (s *r7VanishingStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	keys, err := s.Storage.List(ctx, prefix, recursive)
	_ = s.Storage.Delete(ctx, s.key)
	return keys, err
}

// Found and fixed (change B, 1a79dc9), low: the check fails open and then seals
// the wrong key's canary for good. checkConnection picks one connection
// per user from the listing; if that record is gone when it is loaded (its
// user disconnected meanwhile, on another replica), it logs "cannot read
// a stored connection now" and returns nil — without trying the user's
// other connections — and sealCanary then seals the canary with a key
// that opens none of the stored records. Every later start opens that
// canary and goes on: the wrong key is vouched for from then on, which is
// what the check exists to prevent.
// Reproduction: alice's connections to "a-svc" and "b-svc" sealed with
// K1; start with K2 while b-svc is deleted between List and Load → no
// refusal, and the canary is sealed with K2.
// Fixed: a record gone (fs.ErrNotExist) is skipped and the next one tried;
// and when no record could be checked for a reason that may pass (read
// error), do not seal the canary on this start.
func TestR7CanaryConnectionGoneMidCheckSealsTheWrongKey(t *testing.T) {
	ctx := context.Background()
	base := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	old, fresh := testCipher(t), testCipher(t)
	r7StoreConnection(t, base, old, "a-svc", "alice")
	r7StoreConnection(t, base, old, "b-svc", "alice")
	storage := &r7VanishingStorage{Storage: base, key: ConnectionKey("b-svc", "alice")}

	err := r7App(t, storage, fresh, "alice").checkCipherKey(ctx)
	if err == nil {
		t.Errorf("a key that opens none of the stored connections (alice's a-svc is still there) went on")
	}
	if base.Exists(ctx, cipherCanaryKey) {
		t.Errorf("the canary was sealed with a key that opens no stored record: every later start now accepts it")
	}
}

// HELD (change B, 1a79dc9): the refusal raised by a connection names the
// record by its storage key (the user's hash), never the user's name or
// the token sealed in it; and a start with many API keys and many stored
// connections of users the configuration does not name (JWT users) goes
// on (nothing it can check) without error.
func TestR7CanaryConnectionCheckQuietAndPrompt(t *testing.T) {
	ctx := context.Background()
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	old, fresh := testCipher(t), testCipher(t)
	r7StoreConnection(t, storage, old, "personal", "alice@example.com")
	err := r7App(t, storage, fresh, "alice@example.com").checkCipherKey(ctx)
	if err == nil {
		t.Fatal("premise: the wrong key was not refused")
	}
	for _, secret := range []string{"alice@example.com", "tok-alice"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the refusal shows %q: %v", secret, err)
		}
	}

	storage2 := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	c := testCipher(t)
	users := make([]string, 5000)
	for i := range users {
		users[i] = "apikey-user-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "-" + hashKey(string(rune(i)))[:8]
	}
	for i := range 2000 {
		sealed, _ := c.Encrypt(ctx, []byte("{}"), CipherContext("svc", "jwt-user"))
		if err := storage2.Store(ctx, "toolgate/connections/svc/"+hashKey("jwt-user-"+string(rune(i+1))), sealed); err != nil {
			t.Fatal(err)
		}
	}
	a := r7App(t, storage2, fresh, users...)
	if err := a.checkCipherKey(ctx); err != nil {
		t.Errorf("connections of users the configuration does not name: %v; want the start to go on", err)
	}
}

// HELD (change B, 1a79dc9): no false refusal of the right key for a
// connection of a service the configuration no longer names (its context
// is the service id stored in its key), nor because of a rejected grant's
// mark (toolgate/connections-rejected/, JSON, not sealed) of a named user
// beside it; the canary is then sealed.
func TestR7CanaryRightKeyWithRemovedServiceAndRejectedMark(t *testing.T) {
	ctx := context.Background()
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	c := testCipher(t)
	r7StoreConnection(t, storage, c, "removed-svc", "alice")
	if err := storage.Store(ctx, rejectedKey("personal", "bob"), []byte(`{"rejected_at":"2026-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, rejectedKey("removed-svc", "alice"), []byte(`{"rejected_at":"2026-01-01T00:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	if err := r7App(t, storage, c, "alice", "bob").checkCipherKey(ctx); err != nil {
		t.Errorf("the right key: %v", err)
	}
	if !storage.Exists(ctx, cipherCanaryKey) {
		t.Error("no canary sealed after the check passed")
	}
}
