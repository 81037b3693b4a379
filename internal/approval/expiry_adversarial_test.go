package approval

// Attack (commit a5be343): index entries now keep expiries as RFC3339Nano;
// entries an older version wrote (RFC3339, whole seconds) stay in storage
// across an upgrade. Mixed entries under one requester: is one of either
// format misread (time.Parse with time.RFC3339 must read both), counted
// past its expiry, or dropped before it?
// Holds: an old entry counts until its (whole-second) expiry, a new one
// until its exact expiry; each is dropped once past it.
// (TestCountPendingMixedOldAndNewEntries)

import (
	"context"
	"path"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

func TestCountPendingMixedOldAndNewEntries(t *testing.T) {
	ctx := context.Background()
	clock := time.Date(2026, 12, 3, 1, 0, 10, 200_000_000, time.UTC)
	orig := now
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = orig })
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	s := testStore(storage)
	mk := func(id string, ttl time.Duration) *Approval {
		a := &Approval{ID: id, State: StatePending, Requester: "alice", Approvers: []string{"bob"}, Scopes: []string{ScopeOnce},
			CreatedAt: clock, ExpiresAt: clock.Add(ttl)}
		if err := s.Create(ctx, a, Contents{Arguments: []byte(`{"x":1}`)}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	old := mk("old", 2*time.Second)           // expires 01:00:12.2; an older version wrote 01:00:12Z
	fresh := mk("new", 1500*time.Millisecond) // expires 01:00:11.7
	if err := storage.Store(ctx, path.Join(pendingOfPrefix, hashOf("alice"), old.ID),
		[]byte(old.ExpiresAt.UTC().Truncate(time.Second).Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		at   time.Time
		want int
	}{
		{clock.Add(time.Second), 2},                // 01:00:11.2: both pending
		{fresh.ExpiresAt.Add(-time.Nanosecond), 2}, // the new entry's last instant
		{fresh.ExpiresAt, 1},                       // the new one expired, to the nanosecond
		{old.ExpiresAt.Truncate(time.Second), 0},   // the old entry's whole-second expiry
	} {
		clock = c.at
		if n, err := s.CountPending(ctx, "alice"); err != nil || n != c.want {
			t.Errorf("CountPending at %s with an old (RFC3339) and a new (RFC3339Nano) entry = %d, %v; want %d",
				c.at.Format(time.RFC3339Nano), n, err, c.want)
		}
	}
}
