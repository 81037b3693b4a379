package gateway

import (
	"context"
	"strings"
	"testing"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
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
