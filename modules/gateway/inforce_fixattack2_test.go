package gateway

import (
	"context"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"weak"
)

// fixattack2App is an App as Provision leaves it for InForce and
// WhileAuthorized (nothing else of it is used here).
func fixattack2App() *App {
	a := &App{stopped: new(atomic.Bool)}
	a.stopCtx, a.stopCancel = context.WithCancel(context.Background())
	return a
}

// fixattack2Reloads keeps the App in force (the package's global) as it
// was before the test.
func fixattack2Reloads(t *testing.T) {
	prev := started.Load()
	t.Cleanup(func() { started.Store(prev) })
	started.Store(nil)
}

func fixattack2Collected(p weak.Pointer[App]) bool {
	for range 5 {
		runtime.GC()
		if p.Value() == nil {
			return true
		}
	}
	return false
}

// Attack: reload many times. Every App remembers the one in force when it
// started (follows, for an abandoned load), and nothing ever forgets it:
// the App in force reaches the one before it, which reaches the one
// before that, ... back to the first configuration of the process. Every
// configuration ever loaded (registry, policies, auth, stores, caches)
// stays in memory for as long as the process runs: a leak per reload.
// Once a newer App is in force and the older one stopped, the older one
// should be collectable (no stream or held call of it open).
func TestFixAttack2StoppedConfigurationsNeverCollected(t *testing.T) {
	fixattack2Reloads(t)
	first := fixattack2App()
	first.startedNow()
	p := weak.Make(first)
	cur := first
	first = nil
	for range 10 {
		next := fixattack2App()
		next.startedNow()
		cur.stoppedNow()
		cur = next
	}
	if started.Load() != cur {
		t.Fatal("control: the last App is not in force")
	}
	if !fixattack2Collected(p) {
		t.Error("10 reloads later, the first configuration (stopped, nothing of it open) is still reachable from the one in force: every reload leaks the configuration it replaced")
	}
	runtime.KeepAlive(cur)
}

// Holds: a watch (WhileAuthorized) on a stream follows it through many
// reloads without a goroutine per reload, and once the stream stops
// watching, nothing of it stays registered on the App in force (it is
// collectable), also when the stream ends at the moment of a reload.
func TestFixAttack2HoldsAuthWatchReleasedAfterManyReloads(t *testing.T) {
	fixattack2Reloads(t)
	app := fixattack2App()
	app.startedNow()
	r := httptest.NewRequest("GET", "/mcp", nil)
	const streams = 200
	stops := make([]func() bool, streams)
	cancelled := new(atomic.Int32)
	var watches []weak.Pointer[Call]
	for i := range streams {
		call := &Call{} // no caller: the configuration in force always lets it go on
		watches = append(watches, weak.Make(call))
		stops[i] = app.WhileAuthorized(r, call, func() { cancelled.Add(1) })
	}
	base := runtime.NumGoroutine()
	cur := app
	for range 30 {
		next := fixattack2App()
		next.startedNow()
		cur.stoppedNow()
		cur = next
	}
	for i, stop := range stops {
		stop()
		stops[i] = nil
	}
	if n := cancelled.Load(); n != 0 {
		t.Errorf("%d streams cut though nothing was taken away", n)
	}
	// The callbacks of the last reload may still be finishing.
	for range 100 {
		if runtime.NumGoroutine() <= base+2 {
			break
		}
		runtime.Gosched()
		runtime.GC()
	}
	if n := runtime.NumGoroutine(); n > base+2 {
		t.Errorf("%d goroutines after 30 reloads with %d streams watched and stopped, %d before", n, streams, base)
	}
	kept := 0
	for _, w := range watches {
		if !collected(w) {
			kept++
		}
	}
	if kept > 0 {
		t.Errorf("%d of %d stopped watches still reachable from the App in force", kept, streams)
	}
	runtime.KeepAlive(cur)
}

func collected[T any](p weak.Pointer[T]) bool {
	for range 5 {
		runtime.GC()
		if p.Value() == nil {
			return true
		}
	}
	return false
}
