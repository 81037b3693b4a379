package mcpstate_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/modules/gateway"
)

// sweepGate is a storage that holds the first Stat or the first Delete
// (hold) of a catalog until release: the sweep between looking at a
// catalog and deleting it. It tells locking when a lock is asked for
// meanwhile.
type sweepGate struct {
	certmagic.Storage
	hold    string // "stat" or "delete"
	once    sync.Once
	held    chan struct{}
	release chan struct{}
	locking chan struct{}
	asked   sync.Once
}

func isCatalog(key string) bool { return strings.HasPrefix(key, mcpstate.Prefix+"/catalogs/") }

func (g *sweepGate) wait(op, key string) {
	if g.hold != op || !isCatalog(key) {
		return
	}
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.held)
		select {
		case <-g.release:
		case <-time.After(5 * time.Second):
		}
	}
}

func (g *sweepGate) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	info, err := g.Storage.Stat(ctx, key)
	g.wait("stat", key)
	return info, err
}

func (g *sweepGate) Delete(ctx context.Context, key string) error {
	g.wait("delete", key)
	return g.Storage.Delete(ctx, key)
}

func (g *sweepGate) Lock(ctx context.Context, name string) error {
	select {
	case <-g.held:
		g.asked.Do(func() { close(g.locking) })
	default:
	}
	return g.Storage.Lock(ctx, name)
}

// oldCatalog stores tools as a catalog through storage and dates it back
// past what the sweep keeps (the longest session life plus the refresh
// age), as if no session had used it for two days.
func oldCatalog(t *testing.T, fsys *certmagic.FileStorage, storage certmagic.Storage, tools map[string][]byte) *mcpstate.Catalog {
	t.Helper()
	c, err := mcpstate.New(storage, time.Hour, 12*time.Hour, time.Now).PutCatalog(context.Background(), tools)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(fsys.Filename(mcpstate.Prefix+"/catalogs/"+c.Hash), old, old); err != nil {
		t.Fatal(err)
	}
	return c
}

// A session starting to use an old catalog stores it again (PutCatalog),
// while the sweep, having seen it old, is about to delete it. Every
// replica must still find the catalog afterwards: one that does not
// judges the session's tool calls without their definitions. Two moments
// of the sweep: after it first looked at the catalog, and while it
// deletes it.
func TestCatalogRefreshedDuringSweepSurvives(t *testing.T) {
	for _, hold := range []string{"stat", "delete"} {
		t.Run(hold, func(t *testing.T) {
			ctx := context.Background()
			fsys := &certmagic.FileStorage{Path: t.TempDir()}
			base := gateway.SafeListing(fsys)
			tools := map[string][]byte{"echo": []byte(`{"name":"echo"}`)}
			c := oldCatalog(t, fsys, base, tools)

			g := &sweepGate{Storage: base, hold: hold, held: make(chan struct{}), release: make(chan struct{}), locking: make(chan struct{})}
			sweeper := mcpstate.New(g, time.Hour, 12*time.Hour, time.Now) // replica A
			user := mcpstate.New(g, time.Hour, 12*time.Hour, time.Now)    // replica B
			swept := make(chan error, 1)
			go func() {
				_, err := sweeper.Sweep(ctx, time.Hour, func(string) bool { return false })
				swept <- err
			}()
			select {
			case <-g.held:
			case <-time.After(5 * time.Second):
				t.Fatal("the sweep never reached the catalog")
			}
			put := make(chan error, 1)
			go func() {
				_, err := user.PutCatalog(ctx, tools)
				put <- err
			}()
			// The refresh either ends before the sweep goes on or waits
			// for a lock the sweep may hold: the sweep goes on then.
			var putErr error
			done := false
			select {
			case putErr = <-put:
				done = true
			case <-g.locking:
			case <-time.After(5 * time.Second):
				t.Fatal("PutCatalog neither ended nor waited for a lock")
			}
			close(g.release)
			if err := <-swept; err != nil {
				t.Fatalf("Sweep: %v", err)
			}
			if !done {
				putErr = <-put
			}
			if putErr != nil {
				t.Fatalf("PutCatalog: %v", putErr)
			}
			other := mcpstate.New(base, time.Hour, 12*time.Hour, time.Now) // replica C, nothing in memory
			if _, err := other.Catalog(ctx, c.Hash); err != nil {
				t.Fatalf("another replica reads the catalog a session just started using: %v", err)
			}
		})
	}
}

// failingLocks is a storage whose locks cannot be taken.
type failingLocks struct{ certmagic.Storage }

func (failingLocks) Lock(context.Context, string) error { return errors.New("locks unavailable") }

// Without the lock the sweep deletes no catalog, and a session starting to
// use an old catalog still gets it: it is stored, if not refreshed.
func TestCatalogLockUnavailable(t *testing.T) {
	ctx := context.Background()
	fsys := &certmagic.FileStorage{Path: t.TempDir()}
	base := gateway.SafeListing(fsys)
	tools := map[string][]byte{"echo": []byte(`{"name":"echo"}`)}
	c := oldCatalog(t, fsys, base, tools)
	s := mcpstate.New(failingLocks{base}, time.Hour, 12*time.Hour, time.Now)
	if _, err := s.Sweep(ctx, time.Hour, func(string) bool { return false }); err == nil {
		t.Error("a sweep that could not lock the catalogs reported no error")
	}
	if _, err := base.Stat(ctx, mcpstate.Prefix+"/catalogs/"+c.Hash); err != nil {
		t.Fatalf("a sweep that could not lock the catalogs deleted one: %v", err)
	}
	got, err := s.PutCatalog(ctx, tools)
	if err != nil || got.Hash != c.Hash {
		t.Fatalf("PutCatalog of a stored catalog without the lock = %v, %v", got, err)
	}
}
