package approval

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// loadHook runs afterLoad (once) after the value under key was read, before
// the reader gets it: what another replica does in between.
type loadHook struct {
	certmagic.Storage
	key       string
	afterLoad func()
}

func (h *loadHook) Load(ctx context.Context, key string) ([]byte, error) {
	data, err := h.Storage.Load(ctx, key)
	if key == h.key && h.afterLoad != nil {
		f := h.afterLoad
		h.afterLoad = nil
		f()
	}
	return data, err
}

// The sweep clears the sealed contents of an approval it finds expired.
// Another replica whose clock is a second behind may consume the approval
// meanwhile; the sweep must not write the approved state back over the
// consumed one, or that replica lets the once approval through again.
func TestSweepDoesNotUndoAConsumption(t *testing.T) {
	ctx := context.Background()
	expiry := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := expiry
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })

	storage := &loadHook{Storage: &certmagic.FileStorage{Path: t.TempDir()}, key: recordKey("a1")}
	s := &Store{storage: storage}
	a := &Approval{ID: "a1", State: StateApproved, Scope: ScopeOnce, Scopes: []string{ScopeOnce},
		CreatedAt: expiry.Add(-10 * time.Minute), ExpiresAt: expiry, Sealed: []byte("sealed")}
	if err := s.save(ctx, a); err != nil {
		t.Fatal(err)
	}
	behind := func() {
		// The replica a second behind sees the approval still valid.
		clock = expiry.Add(-time.Second)
		defer func() { clock = expiry }()
		if _, ok, err := s.Consume(ctx, "a1"); !ok || err != nil {
			t.Fatalf("the first consumption: %v, %v", ok, err)
		}
	}
	storage.afterLoad = behind
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	clock = expiry.Add(-time.Second)
	if _, ok, _ := s.Consume(ctx, "a1"); ok {
		t.Fatal("a once approval was consumed twice: the sweep undid the first consumption")
	}
	got, err := s.Get(ctx, "a1")
	if err != nil || got.State != StateConsumed {
		t.Fatalf("after the sweep: %+v, %v", got, err)
	}
}
