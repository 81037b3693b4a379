package websession

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/modules/gateway"
)

// raceGate is a storage that holds the first Store of a key match
// accepts until open is called: the moment a replica is between two of
// its writes, made to last.
type raceGate struct {
	certmagic.Storage
	mu      sync.Mutex
	match   func(key string) bool
	paused  chan struct{}
	release chan struct{}
}

func newRaceGate(s certmagic.Storage, match func(string) bool) *raceGate {
	return &raceGate{Storage: s, match: match, paused: make(chan struct{}), release: make(chan struct{})}
}

func (g *raceGate) Store(ctx context.Context, key string, value []byte) error {
	g.mu.Lock()
	hold := g.match != nil && g.match(key)
	if hold {
		g.match = nil
	}
	g.mu.Unlock()
	if hold {
		close(g.paused)
		select {
		case <-g.release:
		case <-time.After(5 * time.Second):
		}
	}
	return g.Storage.Store(ctx, key, value)
}

func (g *raceGate) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.paused:
	case <-time.After(5 * time.Second):
		t.Fatal("the gated write never came")
	}
}

func (g *raceGate) open() { close(g.release) }

// Attack (fixed): a person signing in through two replicas at once (two tabs, or
// a retried callback) loses the first sign-in: Create stores the index
// entry before the record, and the other replica's makeRoom, which takes
// no lock, deletes every entry whose record it cannot load yet as dead —
// so the new session's record is written under no index entry, and Get
// refuses it (and deletes it) at the very next request. The grace the
// Sweep gives young entries (seenEvery) is missing here.
// Fixed: makeRoom leaves an entry whose record is missing while it is younger than written.Grace (a sign-in under way).
func TestRaceSignInOnAnotherReplicaEndsFreshSignIn(t *testing.T) {
	ctx := context.Background()
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	gate := newRaceGate(base, func(key string) bool { return strings.HasPrefix(key, prefix+"/") })
	a := NewStore(gate, 5, nil) // replica A
	b := NewStore(base, 5, nil) // replica B

	type made struct {
		s   *Session
		err error
	}
	done := make(chan made, 1)
	go func() {
		s, err := a.Create(ctx, "alice", nil, "oidc", "", time.Hour, 8*time.Hour)
		done <- made{s, err}
	}()
	gate.wait(t) // A stored the index entry; the record is on its way
	other, err := b.Create(ctx, "alice", nil, "oidc", "", time.Hour, 8*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	gate.open()
	m := <-done
	if m.err != nil {
		t.Fatalf("Create on replica A: %v", m.err)
	}
	if _, err := b.Get(ctx, other.ID); err != nil {
		t.Fatalf("the second sign-in: %v", err)
	}
	if _, err := b.Get(ctx, m.s.ID); errors.Is(err, ErrNotSignedIn) {
		t.Errorf("the first sign-in (told it succeeded) is not signed in: a concurrent sign-in of the same person under a limit of 5 deleted it")
	} else if err != nil {
		t.Fatal(err)
	}
}

// Holds: a sign-out on one replica is seen on every replica at once, even
// while another replica is recording the session's use (Get writes
// SeenAt back without a lock, but a record without its index entry is no
// session).
func TestRaceSignOutWhileUseIsRecorded(t *testing.T) {
	ctx := context.Background()
	clock := setClock(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	base := gateway.SafeListing(&certmagic.FileStorage{Path: t.TempDir()})
	a := NewStore(base, 0, nil)
	s, err := a.Create(ctx, "alice", nil, "oidc", "", time.Hour, 8*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	*clock = clock.Add(2 * seenEvery) // the next Get writes SeenAt back
	gate := newRaceGate(base, func(key string) bool { return strings.HasPrefix(key, prefix+"/") })
	b := NewStore(gate, 0, nil)
	done := make(chan error, 1)
	go func() { _, err := b.Get(ctx, s.ID); done <- err }()
	gate.wait(t) // B checked the index and is writing SeenAt back
	if _, err := a.DeleteAll(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	gate.open()
	<-done
	for _, st := range []*Store{a, b} {
		if _, err := st.Get(ctx, s.ID); !errors.Is(err, ErrNotSignedIn) {
			t.Errorf("after signing out everywhere: %v", err)
		}
	}
}
