package websession

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/seal"
)

// Attack (fixed): someone who can write the storage keeps a browser sign-in alive
// past its idle time (and brings back a signed-out one that had gone idle).
// README ("state_secret": "someone who can write the storage signs no one
// in"; the package doc: "A session ends when unused for its idle time")
// promises a record's writer cannot sign a browser in. But the MAC covers
// everything but SeenAt (websession.go signed(), 131-148: "not SeenAt,
// which each use writes back"), and alive() (websession.go 229-232) reads
// the idle expiry from SeenAt: a genuine record whose seen_at is moved to
// just before its absolute expiry passes genuine() (websession.go 251) and
// signs its browser in hours after it went idle; Get never writes such a
// SeenAt back (now-SeenAt is negative). The same holds for a record the
// person signed out of, restored with a later seen_at. Fix: cover SeenAt
// by the MAC and sign the record again when Get writes a use back (one
// AES-GCM operation a minute per browser); a restored record then carries
// the SeenAt it had, and ends idle.
//
// Fixed: the MAC covers SeenAt, and Get signs the record again as it writes a use back.
func TestFixReview2AttackSeenAtEditedOutlivesIdle(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC))
	storage, _ := fileStorage(t)
	keys, err := seal.New(Purpose, []byte("a secret of at least thirty-two bytes, really"))
	if err != nil {
		t.Fatal(err)
	}
	st := NewStore(storage, 0, nil, keys)
	s, err := st.Create(ctx, "carol@example.com", []string{"admins"}, "oidc", "", 30*time.Minute, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Control: unused past its idle time, the sign-in ends.
	*clock = clock.Add(31 * time.Minute)
	if _, err := st.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Fatalf("control: a sign-in unused past its idle time: %v", err)
	}

	*clock = time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	s, err = st.Create(ctx, "carol@example.com", []string{"admins"}, "oidc", "", 30*time.Minute, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	data, err := storage.Load(ctx, recordKey(s.ID))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	// The writer moves the last use to just before the absolute expiry.
	m["seen_at"] = s.ExpiresAt.Add(-time.Second).Format(time.RFC3339Nano)
	data, _ = json.Marshal(m)
	if err := storage.Store(ctx, recordKey(s.ID), data); err != nil {
		t.Fatal(err)
	}
	*clock = clock.Add(6 * time.Hour) // unused for six hours: twelve idle times
	if got, err := st.Get(ctx, s.ID); err == nil {
		t.Fatalf("a record whose seen_at a storage writer edited signs %s in six hours after it went idle (idle 30m)", got.User)
	}
}

// Attack (held): a storage writer swaps the records of two sign-ins (each
// under the other's id), and the state_secret is rotated (the new secret
// first, the old one after it) and then reloaded (a store made again from
// the same secrets). Expected (README, state_secret): a record signs in
// only under its own id; a rotation keeps sign-ins while the old secret is
// kept, and a reload keeps them. Holds: the MAC covers the id's hash
// (websession.go signed()), and a ring opens what any of its secrets
// signed.
func TestFixReview2HeldSwapsRotationAndReload(t *testing.T) {
	ctx := context.Background()
	storage, _ := fileStorage(t)
	oldSecret := []byte("the old secret of at least thirty-two bytes")
	newSecret := []byte("the new secret of at least thirty-two bytes")
	ring := func(secrets ...[]byte) *seal.Keyring {
		k, err := seal.New(Purpose, secrets...)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	st := NewStore(storage, 0, nil, ring(oldSecret))
	carol, err := st.Create(ctx, "carol@example.com", []string{"admins"}, "oidc", "", time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := st.Create(ctx, "mallory@example.com", nil, "oidc", "", time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rotated := NewStore(storage, 0, nil, ring(newSecret, oldSecret))
	for _, s := range []*Session{carol, mallory} {
		if got, err := rotated.Get(ctx, s.ID); err != nil || got.User != s.User {
			t.Fatalf("%s after the rotation: %+v, %v", s.User, got, err)
		}
	}
	dave, err := rotated.Create(ctx, "dave@example.com", nil, "oidc", "", time.Hour, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	reloaded := NewStore(storage, 0, nil, ring(newSecret, oldSecret))
	if got, err := reloaded.Get(ctx, dave.ID); err != nil || got.User != dave.User {
		t.Fatalf("a sign-in after a reload: %+v, %v", got, err)
	}
	if _, err := NewStore(storage, 0, nil, ring(newSecret)).Get(ctx, dave.ID); err != nil {
		t.Errorf("a sign-in made with the new secret, once the old one is removed: %v", err)
	}
	// The swap: carol's record under mallory's id and the reverse.
	c, _ := storage.Load(ctx, recordKey(carol.ID))
	m, _ := storage.Load(ctx, recordKey(mallory.ID))
	_ = storage.Store(ctx, recordKey(carol.ID), m)
	_ = storage.Store(ctx, recordKey(mallory.ID), c)
	_ = storage.Store(ctx, indexKey(carol.User, hashOf(mallory.ID)), []byte("x"))
	for _, id := range []string{carol.ID, mallory.ID} {
		if got, err := reloaded.Get(ctx, id); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("a record swapped under another id signs in %+v (%v)", got, err)
		}
	}
}
