// Package storetest holds what tests of toolgate's stores share: a
// storage that makes the moment between two writes of a replica last, so
// that what another replica does in that moment is tested every time
// instead of once in a thousand runs.
package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// Gate is a storage that holds the first Store of a key match accepts
// until Open is called.
type Gate struct {
	certmagic.Storage
	mu      sync.Mutex
	match   func(key string) bool
	paused  chan struct{}
	release chan struct{}
}

// NewGate returns s with its first Store of a key match accepts held.
func NewGate(s certmagic.Storage, match func(key string) bool) *Gate {
	return &Gate{Storage: s, match: match, paused: make(chan struct{}), release: make(chan struct{})}
}

// Store holds the first write match accepts until Open (5 s at most),
// and writes.
func (g *Gate) Store(ctx context.Context, key string, value []byte) error {
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

// Wait waits (5 s at most) until the held write has come.
func (g *Gate) Wait(t testing.TB) {
	t.Helper()
	select {
	case <-g.paused:
	case <-time.After(5 * time.Second):
		t.Fatal("the gated write never came")
	}
}

// Open lets the held write go on.
func (g *Gate) Open() { close(g.release) }
