package mcp2026

import (
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/toolgate/toolgate/modules/gateway"
)

// A Held is an upstream exchange toolgate keeps open between the rounds of
// a multi round-trip request it translates: a stateless runner's call to
// an upstream of an earlier revision that sent a server→client request
// (elicitation/create, sampling/createMessage, roots/list) on the call's
// stream. The runner got that request as an input request, with a
// requestState toolgate sealed that names the held exchange; its retry
// takes the exchange back (Take), once, and toolgate answers the
// upstream's request with the runner's input response.
type Held interface {
	// Release gives the exchange up: its stream is closed and the upstream
	// is told to stop working on the call. Expiry calls it; so does the
	// owner of an exchange it took and does not continue.
	Release(why string)
}

// Limits of the held exchanges, per configuration, per caller (across
// their toolgate sessions and services, so that a few callers cannot take
// every place) and per owner (caller, toolgate session and service): each
// one holds an upstream stream open.
const (
	maxHeld          = 4096
	maxHeldPerCaller = 64
	maxHeldPerOwner  = 16
)

// ErrStopped is Hold's error once the configuration stopped.
var ErrStopped = errors.New("the gateway's configuration was reloaded meanwhile; send the call again")

// ErrHeldFull is Hold's error when too many exchanges are held already.
var ErrHeldFull = errors.New("too many calls are waiting for their client's input")

type heldEntry struct {
	owner string
	held  Held
	timer *time.Timer
}

// holds are the held exchanges of one configuration, by id. An exchange is
// in it from Hold until Take, or until its deadline, when it is released.
type holds struct {
	mu       sync.Mutex
	stopped  bool // the configuration stopped: nothing is held any more
	byID     map[string]*heldEntry
	byOwner  map[string]int
	byCaller map[string]int
}

// callerOf is the caller part of an owner (Owner).
func callerOf(owner string) string {
	caller, _, _ := strings.Cut(owner, "\x00")
	return caller
}

// afterFunc is the timer holds uses; tests replace it.
var afterFunc = time.AfterFunc

// Hold keeps x until deadline for a retry of owner's, and returns the id
// the requestState names it by. When deadline passes first, x is released.
func (rt *Runtime) Hold(owner string, x Held, deadline time.Time) (string, error) {
	hs := &rt.holds
	hs.mu.Lock()
	defer hs.mu.Unlock()
	caller := callerOf(owner)
	if hs.stopped {
		// A request of a configuration that stopped may still be running
		// (a reload lets them finish): a retry reaches the next one.
		return "", ErrStopped
	}
	if len(hs.byID) >= maxHeld || hs.byOwner[owner] >= maxHeldPerOwner || hs.byCaller[caller] >= maxHeldPerCaller {
		return "", ErrHeldFull
	}
	if hs.byID == nil {
		hs.byID, hs.byOwner, hs.byCaller = map[string]*heldEntry{}, map[string]int{}, map[string]int{}
	}
	id := gateway.NewID()
	e := &heldEntry{owner: owner, held: x}
	hs.byID[id] = e
	hs.byOwner[owner]++
	hs.byCaller[caller]++
	e.timer = afterFunc(time.Until(deadline), func() {
		if hs.take(id, owner) != nil {
			x.Release("the client did not answer the input request in time")
		}
	})
	return id, nil
}

// Take returns the exchange held as id for owner and forgets it: a held
// exchange continues once. It returns nil when there is none (taken
// already, expired, or owner's it is not: an exchange of another owner
// stays where it is).
func (rt *Runtime) Take(id, owner string) Held {
	e := rt.holds.take(id, owner)
	if e == nil {
		return nil
	}
	e.timer.Stop()
	return e.held
}

func (hs *holds) take(id, owner string) *heldEntry {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	e := hs.byID[id]
	if e == nil || e.owner != owner {
		return nil
	}
	delete(hs.byID, id)
	if hs.byOwner[owner]--; hs.byOwner[owner] <= 0 {
		delete(hs.byOwner, owner)
	}
	caller := callerOf(owner)
	if hs.byCaller[caller]--; hs.byCaller[caller] <= 0 {
		delete(hs.byCaller, caller)
	}
	return e
}

// releaseAll gives up every held exchange: the configuration holding them
// stopped, and a retry reaches the next one, which holds none of them.
// Their upstream calls end and their stream places come back now, not at
// their deadlines.
func (rt *Runtime) releaseAll() {
	hs := &rt.holds
	hs.mu.Lock()
	hs.stopped = true
	all := make([]*heldEntry, 0, len(hs.byID))
	for _, e := range hs.byID {
		all = append(all, e)
	}
	clear(hs.byID)
	clear(hs.byOwner)
	clear(hs.byCaller)
	hs.mu.Unlock()
	for _, e := range all {
		e.timer.Stop()
		e.held.Release("the gateway's configuration was reloaded; send the call again")
	}
}

// HeldCount is how many exchanges are held now.
func (rt *Runtime) HeldCount() int {
	rt.holds.mu.Lock()
	defer rt.holds.mu.Unlock()
	return len(rt.holds.byID)
}

// Owner is the key a held exchange is bound to: the caller, the toolgate
// session (by its reference) and the service.
func Owner(call *gateway.Call) string {
	return call.Caller.User + "\x00" + gateway.SessionRef(call.Session.ID) + "\x00" + call.Service.ID
}
