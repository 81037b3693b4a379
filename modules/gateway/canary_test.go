package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// On a storage sealed before it had a canary, a witness (the approvals'
// key) that the cipher's key does not open refuses the start, and no
// canary is sealed with that key; one that opens lets the canary be
// sealed. A storage without a witness gets its canary at once.
func TestCanaryWitnessOfAStorageWithoutACanary(t *testing.T) {
	ctx := context.Background()
	const witness = "toolgate/approvals-key"
	witnessContext := []byte("toolgate/v1/approvals-key")
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	old, fresh := testCipher(t), testCipher(t)
	sealed, err := old.Encrypt(ctx, []byte("the approvals' key"), witnessContext)
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, witness, sealed); err != nil {
		t.Fatal(err)
	}
	app := func(c Cipher) *App {
		a := &App{storage: storage, cipher: c, logger: zap.NewNop()}
		a.AddSealedWitness(witness, witnessContext)
		return a
	}

	err = app(fresh).checkCipherKey(ctx)
	if err == nil || !strings.Contains(err.Error(), "does not open the records in storage") || !strings.Contains(err.Error(), witness) {
		t.Fatalf("a key that does not open the approvals' key: %v; want the start refused", err)
	}
	if storage.Exists(ctx, cipherCanaryKey) {
		t.Fatal("a canary was sealed with the refused key")
	}
	if err := app(old).checkCipherKey(ctx); err != nil {
		t.Fatalf("the key that sealed the witness: %v", err)
	}
	if !storage.Exists(ctx, cipherCanaryKey) {
		t.Fatal("no canary after a key that opens the witness")
	}
	if err := app(fresh).checkCipherKey(ctx); err == nil || !strings.Contains(err.Error(), cipherCanaryKey) {
		t.Errorf("another key, once the canary is sealed: %v; want the start refused, naming the canary", err)
	}
}

// A canary that opens but holds another value is no canary of this
// cipher's: the start is refused, saying so.
func TestCanaryHoldingAnotherValueIsRefused(t *testing.T) {
	ctx := context.Background()
	storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	c := testCipher(t)
	sealed, err := c.Encrypt(ctx, []byte("another value"), cipherCanaryContext)
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.Store(ctx, cipherCanaryKey, sealed); err != nil {
		t.Fatal(err)
	}
	err = (&App{storage: storage, cipher: c, logger: zap.NewNop()}).checkCipherKey(ctx)
	if err == nil || !strings.Contains(err.Error(), "it holds another value") || strings.Contains(err.Error(), "<nil>") {
		t.Errorf("a canary holding another value: %v; want the start refused, saying why", err)
	}
}

// A storage holding connections but no canary, none of a user the
// configuration names: nothing can be checked, so no canary is sealed (it
// would vouch for a key nothing checked, and turn away the right one were
// it restored); the warning says how to seal one, with the storage's own
// path. The operator's reset then seals it.
func TestCanaryNotSealedWhenNoConnectionCanBeChecked(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	c := testCipher(t)
	r7StoreConnection(t, storage, c, "personal", "jwt-user@example.com")
	core, logs := observer.New(zap.WarnLevel)
	a := r7App(t, storage, c, "alice")
	a.logger = zap.New(core)

	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatalf("connections of users the configuration does not name: %v; want the start to go on", err)
	}
	if storage.Exists(ctx, cipherCanaryKey) {
		t.Fatal("a canary was sealed with a key nothing checked")
	}
	warned := logs.FilterMessageSnippet("no canary is sealed").All()
	if len(warned) != 1 || !strings.Contains(warned[0].Message, "printf reset > "+filepath.Join(dir, "toolgate", "cipher-canary")) {
		t.Fatalf("the warning does not say how to seal one in this storage: %v", logs.All())
	}
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatalf("the canary reset: %v", err)
	}
	if sealed, err := storage.Load(ctx, cipherCanaryKey); err != nil || isCanaryReset(sealed) {
		t.Fatalf("no canary sealed after the reset: %q, %v", sealed, err)
	}
	if err := r7App(t, storage, testCipher(t), "alice").checkCipherKey(ctx); err == nil {
		t.Fatal("another key, once the canary is sealed, was not refused")
	}
}

// A stored connection that does not open with the cipher's key asks its
// person to connect again (a sign-in error) only once the canary vouched
// for the key at start, and only when it is older than the canary: then it
// was sealed with a key the operator replaced since, and never opens.
// Before that (nothing could be checked), the key may be the wrong one,
// and people must not be sent to overwrite records the right key opens;
// one stored after the canary was changed (damaged, or moved from another
// record), for an administrator to see: both stay the cipher's error.
func TestConnectionOfAnotherKeyNeedsSignInOnlyOnceTheCanaryVouched(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	old, current := testCipher(t), testCipher(t)
	const user = "jwt-user@example.com"
	storeOld := func(age time.Duration) {
		r7StoreConnection(t, storage, old, "personal", user)
		at := time.Now().Add(-age)
		if err := os.Chtimes(filepath.Join(dir, filepath.FromSlash(ConnectionKey("personal", user))), at, at); err != nil {
			t.Fatal(err)
		}
	}
	storeOld(time.Hour)
	a := r7App(t, storage, current, "alice")
	a.connections = newConnectionStore(storage, current, 0)
	load := func(a *App) error {
		_, err := a.connections.LoadFresh(ctx, "personal", user)
		return err
	}

	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := load(a); err == nil || IsSignInError(err) || !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("a record of another key, no canary vouching for this one: %v; want the cipher's error, not a sign-in", err)
	}

	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := load(a); !IsSignInError(err) || !errors.Is(err, ErrSealedWithOtherKey) {
		t.Fatalf("a record of another key, older than the canary sealed with this one: %v; want ErrSealedWithOtherKey, a sign-in error", err)
	}
	r7StoreConnection(t, storage, current, "personal", user)
	if err := load(a); err != nil {
		t.Fatalf("the person connected again: %v", err)
	}

	// A restart whose key the canary opens vouches for it too; a record
	// that does not open stored since the canary was changed.
	b := r7App(t, storage, current, "alice")
	b.connections = newConnectionStore(storage, current, 0)
	storeOld(time.Hour)
	if err := b.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := load(b); !errors.Is(err, ErrSealedWithOtherKey) {
		t.Fatalf("after a start whose key the canary opened: %v; want ErrSealedWithOtherKey", err)
	}
	storeOld(-time.Minute)
	if err := load(b); err == nil || IsSignInError(err) || !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("a record that does not open, stored after the canary: %v; want the cipher's error, not a sign-in", err)
	}
}

// After a reset, a cipher whose backend lost the key for a while refuses
// every record alike, the canary too: a record of the old key's age then
// stays the cipher's error (the right key, once back, opens the canary
// again, and the records with it), and nothing is sealed meanwhile.
func TestOldKeyRecordsNeedSignInOnlyWhileTheCanaryOpens(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	storage := SafeListing(&certmagic.FileStorage{Path: dir})
	transit := &r8Transit{key: testCipher(t), upserted: testCipher(t)}
	r7StoreConnection(t, storage, testCipher(t), "personal", "alice") // of the key the reset replaced
	r8Age(t, dir, ConnectionKey("personal", "alice"), time.Hour)
	if err := storage.Store(ctx, cipherCanaryKey, []byte("reset")); err != nil {
		t.Fatal(err)
	}
	a := r7App(t, storage, transit, "alice")
	a.connections = newConnectionStore(storage, transit, 0)
	if err := a.checkCipherKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r8Load(a, "personal", "alice"); !errors.Is(err, ErrSealedWithOtherKey) {
		t.Fatalf("a record of the replaced key, the canary opening: %v; want ErrSealedWithOtherKey", err)
	}

	transit.gone.Store(true)
	if err := r8Load(a, "personal", "alice"); err == nil || IsSignInError(err) {
		t.Fatalf("the same record while the backend had lost the key (the canary did not open either): %v; want the cipher's error", err)
	}
	if err := a.connections.Save(ctx, "personal", "alice", &Connection{AccessToken: "new"}); !errors.Is(err, ErrCipherRefused) {
		t.Fatalf("sealing a connection while the canary does not open: %v; want it refused", err)
	}
	transit.gone.Store(false)
	if err := a.connections.Save(ctx, "personal", "alice", &Connection{AccessToken: "new"}); err != nil {
		t.Fatalf("sealing a connection once the key was back: %v", err)
	}
	if err := r8Load(a, "personal", "alice"); err != nil {
		t.Fatalf("the connection sealed again: %v", err)
	}
}

// At a reset, a sealed witness (the approvals' key) the new key does not
// open is deleted, so that its owner makes a new one (approvals would
// otherwise fail for good); one the key opens is kept.
func TestResetDropsWitnessesOfTheOldKey(t *testing.T) {
	ctx := context.Background()
	for _, sameKey := range []bool{false, true} {
		storage := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
		old, current := testCipher(t), testCipher(t)
		sealer := old
		if sameKey {
			sealer = current
		}
		witnessContext := []byte("toolgate/v1/approvals-key")
		sealed, err := sealer.Encrypt(ctx, []byte("the approvals' key"), witnessContext)
		if err != nil {
			t.Fatal(err)
		}
		if err := storage.Store(ctx, "toolgate/approvals-key", sealed); err != nil {
			t.Fatal(err)
		}
		if err := storage.Store(ctx, cipherCanaryKey, []byte("reset")); err != nil {
			t.Fatal(err)
		}
		a := r7App(t, storage, current)
		a.AddSealedWitness("toolgate/approvals-key", witnessContext)
		if err := a.checkCipherKey(ctx); err != nil {
			t.Fatal(err)
		}
		if kept := storage.Exists(ctx, "toolgate/approvals-key"); kept != sameKey {
			t.Errorf("a reset, the witness sealed with the same key %v: kept %v", sameKey, kept)
		}
		if !storage.Exists(ctx, cipherResetKey) {
			t.Error("the reset was not recorded")
		}
	}
}
