package gateway

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

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
