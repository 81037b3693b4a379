package gateway

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
)

// A call may outlive the configuration it began under: held for an
// approval (approval_wait), or a stream open for hours. A reload that
// takes a caller's key away, takes them off a service, removes the
// service or a tool, or points the service elsewhere then says nothing to
// it: the handlers serving it belong to the App the reload stopped. What
// such a call does after the reload it does under the configuration in
// force (InForce), checked by StillAuthorized.

// started is the App whose Start ran last and has not been stopped: the
// configuration in force.
var started atomic.Pointer[App]

// startedNow records a as the configuration in force (end of Start),
// remembering the one it follows should a be abandoned.
func (a *App) startedNow() { a.follows = started.Swap(a) }

// stoppedNow records that a no longer serves new requests (Stop): a
// newer configuration replaced it, or Caddy abandoned its load (then the
// one before it goes on, and is in force again).
func (a *App) stoppedNow() {
	if a.stopped == nil {
		return // never provisioned
	}
	if a.stopping != nil {
		a.stopping.Lock() // after what WhileInForce runs
		a.stopped.Store(true)
		a.stopping.Unlock()
	} else {
		a.stopped.Store(true)
	}
	prev := a.follows
	if prev != nil && prev.stopped.Load() {
		prev = nil // Caddy is exiting: no configuration is in force after a
	}
	started.CompareAndSwap(a, prev)
	a.follows = nil // or every configuration ever loaded stays reachable from the one in force
	a.stopCancel()
}

// InForce returns the App whose configuration a call begun under a
// answers to now: a while it runs; once a reload stopped it, the App
// started since.
func (a *App) InForce() *App {
	if a.stopped != nil && a.stopped.Load() {
		if now := started.Load(); now != nil {
			return now
		}
	}
	return a
}

// WhileInForce runs f unless a reload stopped a, and keeps a reload from
// stopping a until f returns; it reports whether f ran. A step that acts
// on what a's configuration decided (a held call taking its approval)
// does so in it, so that no reload lands between its check and its act.
// f must be short: the reload waits for it.
func (a *App) WhileInForce(f func()) bool {
	if a.stopping != nil {
		a.stopping.RLock()
		defer a.stopping.RUnlock()
	}
	if a.InForce() != a {
		return false
	}
	f()
	return true
}

// WhileAuthorized calls cancel when a reload stops the configuration
// call began under (r is its request) and the one in force no longer lets
// it go on (StillAuthorized), at that reload or any after it: what a
// stream carries after such a reload would reach a caller the gateway no
// longer serves. The returned function stops watching.
func (a *App) WhileAuthorized(r *http.Request, call *Call, cancel func()) (stop func() bool) {
	w := &authWatch{from: a, r: r, call: call, cancel: cancel}
	w.arm(a)
	return w.stop
}

// authWatch follows one call from reload to reload (WhileAuthorized).
type authWatch struct {
	from   *App
	r      *http.Request
	call   *Call
	cancel func()

	mu      sync.Mutex
	done    bool        // stop was called
	current func() bool // stops the wait on the App in force
}

// arm waits for app, the App in force, to stop: then the call is checked
// against the one started since, and watched through it in turn.
func (w *authWatch) arm(app *App) {
	if app.stopCtx == nil {
		return // never provisioned (tests of a handler alone)
	}
	stop := context.AfterFunc(app.stopCtx, func() {
		if w.from.StillAuthorized(w.r, w.call) != "" {
			w.cancel()
			return
		}
		if next := w.from.InForce(); next != app && !next.stopped.Load() {
			w.arm(next)
		} // else Caddy is exiting: no configuration comes after
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		stop()
		return
	}
	w.current = stop
}

func (w *authWatch) stop() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	if w.current == nil {
		return false
	}
	return w.current()
}

// StillAuthorized says why the configuration in force no longer lets
// call, begun with the request r, go on ("" while it does): its caller
// authenticates as the same user with what r carries (an API key revoked
// or given to someone else, a JWT of an issuer removed or whose key the
// issuer retired, do not; a JWT that merely expired since does, as
// without a reload), its service is still defined with the same upstream
// and allows them, and a tools/call's tool is still on its allowlist.
// Under the configuration the call began with, that is always so: a's
// handlers checked it.
func (a *App) StillAuthorized(r *http.Request, call *Call) string {
	now := a.InForce()
	if now == a || call.Caller == nil || call.Service == nil {
		return ""
	}
	if outer := OuterRequest(r.Context()); outer != nil {
		r = outer // a federated message's call of a service carries no credential of its own
	}
	caller, err := now.authenticateEndpoint(r, true)
	if err != nil || caller.User != call.Caller.User {
		return "the gateway's configuration changed while the call waited, and your credential no longer authenticates you; send the call again"
	}
	svc := now.Registry().Lookup(call.Service.ID)
	switch {
	case svc == nil || !svc.AllowsUser(call.Caller.User):
		return "the gateway's configuration changed while the call waited: the service is no longer available to you"
	case svc.Endpoint() != call.Service.Endpoint():
		return "the gateway's configuration changed while the call waited: the service's upstream is another now; initialize a new MCP session and send the call again"
	case call.Method == "tools/call" && !svc.AllowsTool(call.Message.Name):
		return "the gateway's configuration changed while the call waited: the tool is no longer allowed on the service"
	}
	return ""
}
