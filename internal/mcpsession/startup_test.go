package mcpsession

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Regression (found while adding a database check to the gateway's
// Start): Caddy starts its apps in map order, so the HTTP server may
// listen while the toolgate app's Start still runs (the cipher, the
// canary's storage round trip, and only then the MCP sessions' Attach).
// An initialize taken in that window reached Create before any
// configuration was attached, and Create dereferenced nil (net/http
// recovered the panic; the runner got EOF). The gateway's handlers now
// wait for Start (gateway.App.Started, tested in integration
// TestStartingGatewayAnswersRequestsTakenBeforeStart); Create and Open
// refuse as the storage being unavailable rather than panic.
func TestCreateAndOpenBeforeAttachRefuse(t *testing.T) {
	m := New()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("used before any configuration was attached: panicked: %v", r)
		}
	}()
	if _, err := m.Create(context.Background(), "alice", "session", time.Now().Add(time.Hour), "svc"); !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("Create before any configuration was attached: %v, want an error wrapping ErrStorageUnavailable", err)
	}
	if _, err := m.Open(context.Background(), "some-id", "alice", "session"); !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("Open before any configuration was attached: %v, want an error wrapping ErrStorageUnavailable", err)
	}
}
