package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Caddy starts a configuration's apps one after another in no set order,
// so its HTTP server may take requests while the toolgate app's Start is
// still opening the cipher, checking the storage and attaching the MCP
// sessions' configuration; and on a reload the new configuration's
// server shares the listeners with the old one from its start. A handler
// asks Started before it uses anything Start sets up.

// startWait bounds how long a request taken before Start finished waits
// for it: a cipher backend or a database slow to answer is worth a wait,
// not a hung runner.
const startWait = 10 * time.Second

// StartingText is the message of the 503 a handler answers while the app
// has not started (Started returned false).
const StartingText = "toolgate is starting and cannot serve this yet; try again in a moment"

// startGate is Started's: closed once Start returned, or once the
// configuration was unloaded without Start (another app failed to
// start first).
type startGate struct {
	ready atomic.Bool
	ended chan struct{}
	once  sync.Once
}

func newStartGate() *startGate { return &startGate{ended: make(chan struct{})} }

// end records how Start ended (once; later calls change nothing).
func (g *startGate) end(ok bool) {
	g.once.Do(func() {
		g.ready.Store(ok)
		close(g.ended)
	})
}

// Started reports whether a's Start finished, waiting for it (for as long
// as ctx lasts, and at most startWait) while it runs. A request it
// returns false for must be answered 503 with Retry-After (see
// WriteStarting): nothing Start sets up may be used by it.
func (a *App) Started(ctx context.Context) bool {
	g := a.starting
	if g == nil || g.ready.Load() {
		return true // never provisioned: tests of a handler alone
	}
	t := time.NewTimer(startWait)
	defer t.Stop()
	select {
	case <-g.ended:
	case <-t.C:
	case <-ctx.Done():
	}
	return g.ready.Load()
}

// WriteStarting answers an MCP request that came before the app started
// (Started): a retryable JSON-RPC error, 503 with Retry-After.
func WriteStarting(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	WriteRPCError(w, http.StatusServiceUnavailable, nil, CodeUnavailable, StartingText, Retryable)
}
