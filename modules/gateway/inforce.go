package gateway

import (
	"context"
	"net/http"
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
	a.stopped.Store(true)
	prev := a.follows
	if prev != nil && prev.stopped.Load() {
		prev = nil // Caddy is exiting: no configuration is in force after a
	}
	started.CompareAndSwap(a, prev)
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

// WhileAuthorized calls cancel when a reload stops the configuration
// call began under (r is its request) and the one in force no longer lets
// it go on (StillAuthorized): what a stream carries after such a reload
// would reach a caller the gateway no longer serves. The returned
// function stops watching.
func (a *App) WhileAuthorized(r *http.Request, call *Call, cancel func()) (stop func() bool) {
	if a.stopCtx == nil {
		return func() bool { return false } // never provisioned (tests of a handler alone)
	}
	return context.AfterFunc(a.stopCtx, func() {
		if a.StillAuthorized(r, call) != "" {
			cancel()
		}
	})
}

// StillAuthorized says why the configuration in force no longer lets
// call, begun with the request r, go on ("" while it does): its caller
// authenticates as the same user with what r carries (an API key revoked
// or given to someone else, a JWT expired or of an issuer removed, do
// not), its service is still defined with the same upstream and allows
// them, and a tools/call's tool is still on its allowlist. Under the
// configuration the call began with, that is always so: a's handlers
// checked it.
func (a *App) StillAuthorized(r *http.Request, call *Call) string {
	now := a.InForce()
	if now == a || call.Caller == nil || call.Service == nil {
		return ""
	}
	caller, err := now.AuthenticateEndpoint(r)
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
