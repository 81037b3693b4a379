package mcpsession

// Adversarial review of 26cf628 (SetUpstream ends a session whose recorded
// upstream is not the one the configuration in force for good names:
// Sessions.moved, called after the upstream is recorded).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
)

// movedConfig is a configuration of the gateway as a Caddy reload
// provisions one: its own state store on the shared storage (state nil),
// or the given one, naming endpoint for service "svc".
func movedConfig(t *testing.T, storage certmagic.Storage, state *mcpstate.Store, endpoint string, max, perCaller int) *Config {
	t.Helper()
	if state == nil {
		state = mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() })
	}
	return &Config{State: state, Keys: testKeys(t), Max: max, PerCaller: perCaller, CacheTTL: 10 * time.Second, Idle: time.Hour,
		Logger: zap.NewNop(), Endpoint: func(service string) (string, bool) { return endpoint, service == "svc" }}
}

func movedAttach(t *testing.T, m *Sessions, c *Config) {
	t.Helper()
	if err := m.Attach(c); err != nil {
		t.Fatal(err)
	}
}

func movedRecord(ctx context.Context, s *Session, endpoint string) error {
	return s.SetUpstream(ctx, Upstream{SessionID: "up-" + endpoint, ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`), Endpoint: endpoint})
}

// Attack (fixed): a reload Caddy abandons leaves the sessions initialized with
// ITS upstream alive under the configuration restored for good.
// A initializes svc at http://old; B (a reload pointing svc at http://new)
// is attached, a runner initializes through B's handler and records
// http://new while B may still be abandoned (moved: "changes nothing",
// correct then); another app fails to start, Caddy stops B: Detach(B)
// restores A, which is in force for good and names http://old. Nothing
// looks at the session again: Detach runs EndMoved only when the detached
// configuration was *replaced* (cur != c), not when it is the one in force
// restoring its previous. The session lives on, relaying (its open
// streams, its catalog, its upstream session id) the abandoned
// configuration's upstream — for a transport module, a program B's
// Cleanup stops. The symmetric case (recorded after the restore) is ended
// by moved, so this is only the window the commit's own reasoning
// ("the reload's EndMoved ends it once that configuration is in force for
// good") does not cover: an abandoned configuration never gets there.
// Fix: in Detach, when the CompareAndSwap restores prev (and prev.Endpoint
// != nil), run EndMoved(prev.Endpoint) in the background too.
// Fixed: Detach of an abandoned configuration, restoring the one before
// it, runs EndMoved with the restored configuration's upstreams.
func TestMovedAdversarialAbandonedReloadKeepsItsSessions(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m := New()
	t.Cleanup(func() { _ = m.Destruct() })
	a := movedConfig(t, storage, nil, "http://old", 100, 100)
	movedAttach(t, m, a)
	b := movedConfig(t, storage, nil, "http://new", 100, 100)
	movedAttach(t, m, b)
	s, err := m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := movedRecord(ctx, s, "http://new"); err != nil || s.Closed() {
		t.Fatalf("initialized under a configuration Caddy may still abandon: %v, closed %v (want it kept for now)", err, s.Closed())
	}
	m.Detach(b) // abandoned: A, naming http://old, is in force again, for good
	m.background.Wait()
	if m.cfg() != a {
		t.Fatal("precondition: the abandoned load restored A")
	}
	if !waitClosed(s) {
		t.Errorf("after the load was abandoned, A (in force for good) names http://old, yet the session initialized with the abandoned "+
			"configuration's upstream lives on: upstream %q, closed %v, moved() %v", s.Upstream().Endpoint, s.Closed(), m.moved(s))
	}
	m.Detach(a)
}

// Attack (fixed): an initialize that runs across two reloads in a row — the first
// moving the service (in force for good), the second abandoned — keeps
// the former upstream for good.
// A names http://old; a runner's initialize starts through A. Reload B
// points svc at http://new and is in force for good (Detach(A): EndMoved
// finds the session without an upstream, skips it). A second reload C
// (naming http://new too, another change) is attached; the initialize
// records http://old now: moved sees C, whose previous B is not detached,
// and changes nothing. C is abandoned: Detach(C) restores B — in force for
// good, naming http://new — and runs no EndMoved (cur == C). The session
// lives with A's upstream under B; no later reload looks at it unless it
// happens to move svc again. The fix's premise ("a Detach that saw no
// upstream recorded marked its configuration detached before, so this sees
// it in force for good") fails: the check ran under a configuration that
// was never in force for good, and the one that is ran its EndMoved before.
// Fix: as above — Detach restoring prev runs EndMoved(prev.Endpoint); or
// moved compares against the nearest configuration in force for good
// (walk c.previous to the first whose previous is nil or detached) and
// defers only when that one agrees with the recorded endpoint.
// Fixed: as the abandoned reload above (Detach restoring B runs
// EndMoved with B's upstreams).
func TestMovedAdversarialInitializeAcrossAMoveThenAnAbandonedReload(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m := New()
	t.Cleanup(func() { _ = m.Destruct() })
	a := movedConfig(t, storage, nil, "http://old", 100, 100)
	movedAttach(t, m, a)
	s, err := m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc") // the initialize starts through A
	if err != nil {
		t.Fatal(err)
	}
	b := movedConfig(t, storage, nil, "http://new", 100, 100)
	movedAttach(t, m, b)
	m.Detach(a) // B in force for good: EndMoved finds s without an upstream
	m.background.Wait()
	c := movedConfig(t, storage, nil, "http://new", 100, 100)
	movedAttach(t, m, c) // another reload starts
	if err := movedRecord(ctx, s, "http://old"); err != nil {
		t.Logf("SetUpstream under the pending reload: %v", err)
	}
	m.Detach(c) // abandoned: B, naming http://new, in force for good again
	m.background.Wait()
	if m.cfg() != b {
		t.Fatal("precondition: the abandoned load restored B")
	}
	if !waitClosed(s) {
		t.Errorf("B is in force for good and names http://new, yet the session initialized with A's upstream lives on: upstream %q, closed %v, moved() now %v",
			s.Upstream().Endpoint, s.Closed(), m.moved(s))
	}
	m.Detach(b)
}

// Attack (fixed): the implied session of a stateless runner (CreateLocal) records
// its first upstream through Reinitialize(ctx, 0, …) (modules/mcpproxy
// stateless.go openImplied), never through SetUpstream: the commit's check
// does not run for it. An implied session whose discovery/initialize ran
// across a reload that moved svc records the former endpoint after the
// reload's EndMoved looked at it (no upstream yet), exactly the race the
// commit fixes for SetUpstream; it lives on (its listens, Retiring, relay
// the former upstream) until a later request of its is checked.
// Fix: in Reinitialize's local branch, after setLocalUpstream of a first
// upstream (cur.Generation == 0), apply the same moved check (end the
// session, discard(next), return ErrClosed); or move the check into
// setLocalUpstream's callers through one helper.
// Fixed: Reinitialize of a local session's first upstream looks as
// SetUpstream does (moved), ends it and discards the upstream session.
func TestMovedAdversarialImpliedSessionFirstUpstreamAcrossAReload(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m := New()
	t.Cleanup(func() { _ = m.Destruct() })
	a := movedConfig(t, storage, nil, "http://old", 100, 100)
	movedAttach(t, m, a)
	s, err := m.CreateLocal(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	b := movedConfig(t, storage, nil, "http://new", 100, 100)
	movedAttach(t, m, b)
	m.Detach(a) // in force for good: EndMoved finds s without an upstream
	m.background.Wait()
	discarded := false
	up, err := s.Reinitialize(ctx, 0, func(Upstream) (Upstream, error) {
		return Upstream{SessionID: "up-old", ProtocolVersion: "2025-11-25", Endpoint: "http://old"}, nil
	}, func(Upstream) { discarded = true })
	if !errors.Is(err, ErrClosed) || !s.Closed() {
		t.Errorf("the implied session's first upstream recorded with the former endpoint after the reload was in force for good: "+
			"Reinitialize = %+v, %v; closed %v, discarded %v (want ErrClosed, ended)", up, err, s.Closed(), discarded)
	}
	m.Detach(b)
}

// Attack (fixed): Attach publishes the new configuration (config.Swap) before it
// writes c.previous, and moved — now run by every request's SetUpstream,
// concurrently with Caddy's reload — reads cfg().previous without
// synchronization: a data race (go test -race reports it). In the window
// between the two statements moved sees the new configuration with
// previous == nil, i.e. "in force for good", although Caddy may still
// abandon it: a session recorded with the upstream of the configuration
// that stays is ended by a load that is then abandoned (the race
// detector's report is the reliable failure; the wrongly ended session is
// asserted too, when the window is hit).
// Before the commit c.previous was only read by Detach, on Caddy's own
// goroutine after Attach returned.
// Fix: set c.previous before publishing c (c.previous = m.config.Load();
// then CompareAndSwap / Swap under a mutex serializing Attach/Detach), or
// make previous an atomic.Pointer written before the Swap.
// Fixed: Attach sets previous before it publishes the configuration.
func TestMovedAdversarialAttachRacesMoved(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	state := mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() })
	m := New()
	t.Cleanup(func() { _ = m.Destruct() })
	a := movedConfig(t, storage, state, "http://old", 100, 100)
	movedAttach(t, m, a)
	s, err := m.CreateLocal(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wrongly atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // requests recording their upstream (A's own)
		defer wg.Done()
		for !stop.Load() {
			if err := movedRecord(ctx, s, "http://old"); err != nil {
				wrongly.Add(1)
				return
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; i < 50000 && wrongly.Load() == 0 && time.Now().Before(deadline); i++ { // loads Caddy abandons
		b := movedConfig(t, storage, state, "http://new", 100, 100)
		movedAttach(t, m, b)
		m.Detach(b)
	}
	stop.Store(true)
	wg.Wait()
	m.background.Wait()
	if wrongly.Load() > 0 || s.Closed() {
		t.Errorf("a session recorded with the upstream of the configuration that stayed was ended by loads that were all abandoned (closed %v)", s.Closed())
	}
}

// Holds: the caller's accounting after SetUpstream ends a session that
// moved — the handler's End that follows (handshake.go) finds it ended,
// the reservation is gone, max_mcp_sessions and
// max_mcp_sessions_per_caller (both 1) have room for the runner's next
// initialize at once, and no copy is left here.
func TestMovedAdversarialHoldsSlotsAfterAMovedEnd(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m := New()
	t.Cleanup(func() { _ = m.Destruct() })
	a := movedConfig(t, storage, nil, "http://old", 1, 1)
	movedAttach(t, m, a)
	s, err := m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	b := movedConfig(t, storage, nil, "http://new", 1, 1)
	movedAttach(t, m, b)
	m.Detach(a)
	m.background.Wait()
	if err := movedRecord(ctx, s, "http://old"); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetUpstream with the former upstream: %v, want ErrClosed", err)
	}
	if _, ended, err := m.End(ctx, s); ended || err != nil { // as the handler does
		t.Errorf("the handler's End after SetUpstream's: ended %v, %v", ended, err)
	}
	if data, err := storage.Load(ctx, reservationKey("alice", s.Ref)); err == nil {
		t.Errorf("reservation left: %s", data)
	}
	m.mu.Lock()
	started, held := m.started, len(m.sessions)
	m.mu.Unlock()
	if started != 0 || held != 0 {
		t.Errorf("started %d, held %d after the moved session ended", started, held)
	}
	again, err := m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatalf("the runner's next initialize: %v", err)
	}
	if err := movedRecord(ctx, again, "http://new"); err != nil || again.Closed() {
		t.Errorf("initialized with the upstream in force: %v, closed %v", err, again.Closed())
	}
	m.Detach(b)
}
