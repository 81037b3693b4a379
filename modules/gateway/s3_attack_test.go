package gateway

import (
	"context"
	"testing"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/storetest"
)

// Attack (3ae5760, the cipher canary): two replicas sharing a storage start
// at once for the first time with different keys (each generated its own
// `cipher local` key file, or one names another Vault/KMS key) — exactly
// the misconfiguration the canary is there to catch. checkCipherKey reads
// the canary, finds none, seals its own and stores it, with no lock and no
// check that what is stored afterwards is its own: both replicas see "no
// canary", both store one (the last write wins) and both start. Each then
// seals credentials and approvals with its own key, which the other cannot
// open (every stored credential fails as retryable on the other replica,
// the very failure the commit describes), and the replica whose canary was
// overwritten is not caught until its next restart, which is then refused
// while it has been sealing records for days.
// Here replica A's store of its canary is held (storetest.Gate) while
// replica B checks: both checks pass.
// Severity: medium (silent split-key storage on a fresh multi-replica
// deployment; unreadable credentials, people connect again).
// Suggested fix: seal the canary under a storage lock (storage.Lock
// "toolgate_cipher_canary"), reading it again under the lock, and after
// storing load it back and check it opens with this key (refuse the start
// otherwise).
// Fixed: sealCanary seals under that lock, reading the canary again under
// it.
func TestS3CanaryRaceTwoReplicasDifferentKeysBothStart(t *testing.T) {
	ctx := context.Background()
	base := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	gate := storetest.NewGate(base, func(key string) bool { return key == cipherCanaryKey })
	ka, kb := testCipher(t), testCipher(t)
	a := &App{storage: gate, cipher: ka, logger: zap.NewNop()}
	b := &App{storage: base, cipher: kb, logger: zap.NewNop()}

	// Premise: the canary does refuse a second key once one is sealed.
	{
		dir := SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
		x := &App{storage: dir, cipher: testCipher(t), logger: zap.NewNop()}
		y := &App{storage: dir, cipher: testCipher(t), logger: zap.NewNop()}
		if err := x.checkCipherKey(ctx); err != nil {
			t.Fatalf("premise: first start refused: %v", err)
		}
		if err := y.checkCipherKey(ctx); err == nil {
			t.Fatal("premise: a start with another key after the canary was sealed is not refused")
		}
	}

	errA := make(chan error, 1)
	go func() { errA <- a.checkCipherKey(ctx) }()
	gate.Wait(t) // A found no canary and is storing its own
	errB := b.checkCipherKey(ctx)
	gate.Open()
	if err := <-errA; err != nil {
		t.Fatalf("replica A refused: %v", err)
	}
	if errB == nil {
		t.Errorf("two replicas with different keys both started on one storage (A's canary overwrote B's): records each seals are unreadable to the other, and the canary is caught only at B's next restart")
		if err := (&App{storage: base, cipher: kb, logger: zap.NewNop()}).checkCipherKey(ctx); err != nil {
			t.Logf("B, running, would be refused at its next start: %v", err)
		}
	}
}
