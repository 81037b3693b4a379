package mcpsession

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpstate"
)

// Attack (fixed): a runner's initialize that ran across a reload moving
// its service to another upstream recorded the former upstream after the
// reload's EndMoved had looked at the session (it had recorded none yet),
// so the session lived on, its streams relaying the former upstream,
// until a request of its was checked.
// Fixed: SetUpstream looks again once the upstream is recorded, under the
// configuration in force for good, and ends such a session (ErrClosed:
// the runner initializes anew). Under a configuration Caddy may still
// abandon it changes nothing; the reload's EndMoved ends it once that
// configuration is in force for good.
func TestInitializeAcrossAReloadThatMovedItsUpstream(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	state := mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() })
	config := func(endpoint string) *Config { return movedConfig(t, storage, state, endpoint, 100, 100) }
	m := New()
	old := config("http://old")
	if err := m.Attach(old); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destruct() })
	initializing := func() *Session {
		s, err := m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	record := func(s *Session, endpoint string) error {
		return s.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`), Endpoint: endpoint})
	}

	// The reload starts: its configuration is in force, and may still be
	// abandoned.
	early, late, current := initializing(), initializing(), initializing()
	moved := config("http://new")
	if err := m.Attach(moved); err != nil {
		t.Fatal(err)
	}
	if err := record(early, "http://old"); err != nil || early.Closed() {
		t.Fatalf("initialized under a configuration Caddy may still abandon: %v, closed %v (want it kept)", err, early.Closed())
	}
	m.Detach(old) // the reload is in force for good: EndMoved runs
	m.background.Wait()
	if !early.Closed() {
		t.Error("a session recorded with the former upstream before the reload was in force for good: not ended by EndMoved")
	}
	if err := record(late, "http://old"); !errors.Is(err, ErrClosed) || !late.Closed() {
		t.Errorf("initialized with the former upstream, recorded after the reload's EndMoved: %v, closed %v (want ErrClosed, ended)", err, late.Closed())
	}
	if _, err := m.Open(ctx, late.ID, "alice", "s"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the ended session opens: %v", err)
	}
	if err := record(current, "http://new"); err != nil || current.Closed() {
		t.Errorf("initialized with the upstream in force: %v, closed %v", err, current.Closed())
	}
	m.Detach(moved)
}

// A reload's look at its sessions (EndMoved), run in the background, ends
// nothing once another configuration is in force: a reload that moved a
// service back to the upstream its sessions were initialized with would
// otherwise see them ended by the previous configuration's view.
func TestEndMovedOnlyWhileItsConfigurationIsInForce(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	state := mcpstate.New(storage, time.Hour, 12*time.Hour, func() time.Time { return now() })
	config := func(endpoint string) *Config { return movedConfig(t, storage, state, endpoint, 100, 100) }
	m := New()
	t.Cleanup(func() { _ = m.Destruct() })
	away, back := config("http://new"), config("http://old")
	if err := m.Attach(away); err != nil {
		t.Fatal(err)
	}
	s, err := m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`), Endpoint: "http://old"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("initialized with an upstream the configuration in force does not name: %v", err)
	}
	s, err = m.Create(ctx, "alice", "s", time.Now().Add(time.Hour), "svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Attach(back); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUpstream(ctx, Upstream{SessionID: "up", ProtocolVersion: "2025-11-25", InitializeParams: []byte(`{}`), Endpoint: "http://old"}); err != nil {
		t.Fatal(err)
	}
	m.endMovedIfInForce(away) // late, after the service moved back
	if s.Closed() {
		t.Error("a session of the upstream the configuration in force names was ended by the previous configuration's look")
	}
	m.endMovedIfInForce(back)
	if s.Closed() {
		t.Error("a session of the upstream the configuration in force names was ended")
	}
	m.Detach(away)
	m.Detach(back)
}
