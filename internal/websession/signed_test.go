package websession

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/seal"
)

// Someone who can write the storage but holds none of toolgate's keys signs
// no one in: a record they write under a cookie of their choosing, one of
// theirs edited to name another person or group, or another person's
// record copied under their own cookie. A store with keys from the same
// secret (another replica) reads a genuine record; one with other keys
// does not.
func TestRecordsOfOthersSignNoOneIn(t *testing.T) {
	ctx := context.Background()
	storage, _ := fileStorage(t)
	keys, err := seal.New(Purpose, []byte("a secret of at least thirty-two bytes, really"))
	if err != nil {
		t.Fatal(err)
	}
	st := NewStore(storage, 0, nil, keys)
	carol, err := st.Create(ctx, "carol@example.com", []string{"admins"}, "oidc", "", time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := st.Create(ctx, "mallory@example.com", []string{}, "oidc", "", time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, mallory.ID); err != nil {
		t.Fatalf("a sign-in with no groups (an empty list, as a provider's claim gives): %v", err)
	}
	replica := NewStore(storage, 0, nil, func() *seal.Keyring {
		k, _ := seal.New(Purpose, []byte("a secret of at least thirty-two bytes, really"))
		return k
	}())
	if got, err := replica.Get(ctx, carol.ID); err != nil || got.User != carol.User {
		t.Fatalf("another replica with the same secret: %+v, %v", got, err)
	}
	if _, err := NewStore(storage, 0, nil, nil).Get(ctx, carol.ID); !errors.Is(err, ErrNotSignedIn) {
		t.Errorf("a store with other keys reads carol's record: %v", err)
	}

	load := func(s *Session) map[string]any {
		data, err := storage.Load(ctx, recordKey(s.ID))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	store := func(id string, m map[string]any) {
		data, _ := json.Marshal(m)
		if err := storage.Store(ctx, recordKey(id), data); err != nil {
			t.Fatal(err)
		}
		ref := hashOf(id)
		if err := storage.Store(ctx, indexKey(m["user"].(string), ref), []byte(time.Now().Add(time.Hour).Format(time.RFC3339))); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		id   string
		rec  func() map[string]any
	}{
		{"a record written under a cookie of the writer's", "chosen-by-the-writer", func() map[string]any {
			m := load(mallory)
			m["user"], m["groups"] = "carol@example.com", []string{"admins"}
			return m
		}},
		{"the writer's own record edited to name carol", mallory.ID, func() map[string]any {
			m := load(mallory)
			m["user"], m["groups"] = "carol@example.com", []string{"admins"}
			return m
		}},
		{"the writer's own record given carol's group", mallory.ID, func() map[string]any {
			m := load(mallory)
			m["groups"] = []string{"admins"}
			return m
		}},
		{"carol's record copied under the writer's cookie", mallory.ID, func() map[string]any { return load(carol) }},
		{"a record without a MAC (an earlier version's)", "chosen-too", func() map[string]any {
			m := load(carol)
			delete(m, "mac")
			return m
		}},
	} {
		store(c.id, c.rec())
		if got, err := st.Get(ctx, c.id); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("%s signs in as %+v (%v)", c.name, got, err)
		}
	}
}
