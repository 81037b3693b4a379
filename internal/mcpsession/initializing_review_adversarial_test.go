package mcpsession

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpstate"
	"github.com/toolgate/toolgate/internal/storetest"
)

// Holds: one caller's lock held (a replica busy with alice's initializes,
// or one that died holding it) neither delays nor fails another caller's
// initialize, and alice's own initialize gives up with her request's
// context (ErrStorageUnavailable), not after the 30-second lock timeout.
func TestReviewHoldsCallerLockIsPerCaller(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m, _ := replicaOf(t, storage, time.Hour, 100, 2)
	ctx := context.Background()
	name := "toolgate_mcp_caller_" + callerHash("alice")
	if err := storage.Lock(ctx, name); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = storage.Unlock(ctx, name) }()
	start := time.Now()
	bob, err := m.Create(ctx, "bob", "b", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatalf("bob's initialize while alice's lock is held: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("bob's initialize waited %s for alice's lock", d)
	}
	if err := bob.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := m.Create(actx, "alice", "a", time.Now().Add(time.Hour), "svc"); !errors.Is(err, ErrStorageUnavailable) {
		t.Errorf("alice's initialize with her lock held elsewhere: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("alice's initialize took %s to give up, past her request's context", d)
	}
}

// reloadedConfig is a configuration reloaded on storage: a new state
// store (as every Caddy reload provisions one), the same limits.
func reloadedConfig(t *testing.T, storage certmagic.Storage, perCaller int) *Config {
	return &Config{State: mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() }),
		Keys: testKeys(t), Max: 100, PerCaller: perCaller, CacheTTL: 10 * time.Second, Idle: time.Hour, Logger: zap.NewNop()}
}

func waitClosed(s *Session) bool {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s.Closed() {
			return true
		}
	}
	return false
}

// Attack (fixed): any configuration reload ends every initialize in flight on the
// replica. Attach of the new configuration (a new state store) resets
// the copies: each session in use or awaiting its first listing — every
// initialize in flight is both — is read again from storage, where an
// initialize's session is not yet (SetUpstream stores it), so it is taken
// for "ended elsewhere" and closed. The runner's initialize then fails
// (SetUpstream: ErrClosed) although nothing ended it; reservedStill's
// "a reload replaced the store" branch is never reached.
//
// Fixed: reload leaves a session initialized here and not stored yet
// alone (it has no record to read), so SetUpstream goes on and
// reservedStill counts the caller again in the new store.
func TestReviewReloadEndsInitializesInFlight(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	m, _ := replicaOf(t, storage, time.Hour, 100, 2)
	ctx := context.Background()
	s, err := m.Create(ctx, "alice", "a", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Begin()() // as the initialize handler holds it
	c2 := reloadedConfig(t, storage, 2)
	if err := m.Attach(c2); err != nil {
		t.Fatal(err)
	}
	defer m.Detach(c2)
	waitClosed(s) // the reset's read in the background
	if err := s.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)}); err != nil {
		t.Errorf("an initialize in flight across a configuration reload failed: %v", err)
	}
}

// Attack (fixed): a reload while an initialize is storing its session leaves a
// stored session nobody holds, counted in the caller's
// max_mcp_sessions_per_caller until the idle sweep. The reset's read finds
// no record yet and closes the session (closeLocal: the reservation goes);
// SetUpstream, past its Closed check, stores the record anyway, then sees
// the session closed and returns ErrClosed; the handler's End sees an
// unstored session and deletes nothing. Alice, at a limit of one, holds no
// usable session and cannot open one.
//
// Fixed: the reset no longer closes an unstored session, and SetUpstream
// marks the session stored in one step with its closed check, ending under
// the caller's lock a record stored for a session closed meanwhile (see
// TestReviewEndWhileStoringLeavesNoRecord).
func TestReviewReloadWhileStoringLeavesAZombieHoldingTheSlot(t *testing.T) {
	base := &certmagic.FileStorage{Path: t.TempDir()}
	gate := storetest.NewGate(base, func(key string) bool {
		return strings.HasPrefix(key, mcpstate.Prefix+"/sessions/") && strings.HasSuffix(key, "/state")
	})
	m, _ := replicaOf(t, gate, time.Hour, 100, 1)
	ctx := context.Background()
	s, err := m.Create(ctx, "alice", "a", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	end := s.Begin()
	stored := make(chan error, 1)
	go func() {
		stored <- s.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)})
	}()
	gate.Wait(t) // the index entry and mark are stored, the record on its way
	c2 := reloadedConfig(t, base, 1)
	if err := m.Attach(c2); err != nil {
		t.Fatal(err)
	}
	defer m.Detach(c2)
	closed := waitClosed(s)
	gate.Open()
	err = <-stored
	end()
	if err != nil { // the handler: not stored, so End the session, end the upstream, answer the error
		_, _, _ = m.End(ctx, s)
	}
	t.Logf("closed by the reload: %v; SetUpstream: %v", closed, err)
	if _, lerr := c2.State.Load(ctx, s.Ref); err != nil && lerr == nil {
		t.Errorf("SetUpstream failed (%v) and the handler ended the session, but its record is stored", err)
	}
	if err != nil {
		if _, cerr := m.Create(ctx, "alice", "a", time.Now().Add(time.Hour), "svc"); cerr != nil {
			t.Errorf("alice holds no usable session and cannot open one: %v", cerr)
		}
	}
}

// Holds: a session ended while SetUpstream stores it (EndOrphans: its
// toolgate session ended; End finds nothing stored to delete) leaves no
// record behind: SetUpstream ends the one it stored, under the caller's
// lock, and alice, at a limit of one, can initialize again.
func TestReviewEndWhileStoringLeavesNoRecord(t *testing.T) {
	base := &certmagic.FileStorage{Path: t.TempDir()}
	gate := storetest.NewGate(base, func(key string) bool {
		return strings.HasPrefix(key, mcpstate.Prefix+"/sessions/") && strings.HasSuffix(key, "/state")
	})
	m, _ := replicaOf(t, gate, time.Hour, 100, 1)
	ctx := context.Background()
	s, err := m.Create(ctx, "alice", "a", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	end := s.Begin()
	stored := make(chan error, 1)
	go func() {
		stored <- s.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`)})
	}()
	gate.Wait(t) // the index entry and mark are stored, the record on its way
	if _, ok, err := m.End(ctx, s); err != nil || !ok {
		t.Fatalf("End while storing: %v, %v", ok, err)
	}
	gate.Open()
	err = <-stored
	end()
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("SetUpstream of a session ended meanwhile: %v", err)
	}
	_, _, _ = m.End(ctx, s) // the handler's
	if _, err := m.state().Load(ctx, s.Ref); !errors.Is(err, mcpstate.ErrNotFound) {
		t.Errorf("the record of a session ended while it was stored: %v", err)
	}
	if _, err := m.Create(ctx, "alice", "a", time.Now().Add(time.Hour), "svc"); err != nil {
		t.Errorf("alice cannot initialize again: %v", err)
	}
}
