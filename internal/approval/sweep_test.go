package approval

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// noModTimeStorage is a storage that cannot tell when a key was written:
// certmagic.KeyInfo's Modified is optional ("optional if the storage
// implementation is not able to get that information"). beforeStore, when
// set, runs before a key is stored.
type noModTimeStorage struct {
	*certmagic.FileStorage
	beforeStore func(key string)
}

func (s *noModTimeStorage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	info, err := s.FileStorage.Stat(ctx, key)
	info.Modified = time.Time{}
	return info, err
}

func (s *noModTimeStorage) Store(ctx context.Context, key string, value []byte) error {
	if f := s.beforeStore; f != nil {
		f(key)
	}
	return s.FileStorage.Store(ctx, key, value)
}

// A sweep between an approval's contents and its record being written
// (a slow record write: PostgreSQL stalling, the approvals' key being
// unsealed) keeps the contents: it once deleted contents without a record
// whose Stat time looked old, and a storage may not know that time (it is
// optional in certmagic.KeyInfo) or keep it on its own clock (PostgreSQL's
// now()), so the approval existed, was counted and announced, but its page
// and release failed until it expired. Now only contents two sweeps in a
// row find without a record go, whatever the storage says of times.
func TestSweepKeepsContentsBeingCreated(t *testing.T) {
	ctx := context.Background()
	storage := &noModTimeStorage{FileStorage: &certmagic.FileStorage{Path: t.TempDir()}}
	s := testStore(storage)
	// An earlier approval: the records' directory exists, so Sweep runs.
	first := &Approval{ID: "first", State: StatePending, Requester: "bob", Approvers: []string{"carol"}, Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
	if err := s.Create(ctx, first, Contents{Arguments: []byte(`{"x":0}`)}); err != nil {
		t.Fatal(err)
	}
	// Another replica sweeps while this one is between writing the new
	// approval's contents and its record.
	swept := false
	storage.beforeStore = func(key string) {
		if key == recordKey("a2") && !swept {
			swept = true
			if _, err := s.Sweep(ctx); err != nil {
				t.Errorf("sweep: %v", err)
			}
		}
	}
	a := &Approval{ID: "a2", State: StatePending, Requester: "alice", Approvers: []string{"carol"}, Scopes: []string{ScopeOnce},
		CreatedAt: now().UTC(), ExpiresAt: now().Add(time.Hour).UTC()}
	if err := s.Create(ctx, a, Contents{Arguments: []byte(`{"deploy":"prod"}`)}); err != nil {
		t.Fatal(err)
	}
	storage.beforeStore = nil
	if !swept {
		t.Fatal("the sweep did not run between the writes")
	}
	got, err := s.Get(ctx, "a2")
	if err != nil {
		t.Fatalf("the approval just created: %v", err)
	}
	c, err := s.Open(ctx, got)
	if err != nil || !strings.Contains(string(c.Arguments), "prod") {
		t.Fatalf("an approval created while a sweep ran cannot be shown (its contents were swept): %v", err)
	}
}
