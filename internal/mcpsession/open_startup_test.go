//go:build open_findings

package mcpsession

import (
	"context"
	"testing"
	"time"
)

// Attack (found while adding a database check to the gateway's Start,
// 7f9b0f6, reverted): Caddy starts its apps in map order, so the HTTP
// server may listen while the toolgate app's Start still runs (the cipher,
// the canary's storage round trip, and only then the MCP sessions'
// Attach). An initialize taken in that window reaches Create before any
// configuration is attached: cfg() is nil and Create panics (net/http
// recovers it; the runner gets EOF). With the check's database connection
// lengthening Start, three replica tests got EOF in .ci/run
// (TestScaleoutGrantChangeOnOneReplicaNotStaleOnTheOther,
// TestFixAttackHeldRecordLeftAfterGracefulStop,
// TestPinRegistry3AttackOldReplicaRefusesAcceptedToFreshSession).
// Severity: low–medium (the first requests of a starting gateway, on a
// postgres storage or a slow cipher backend, fail with a dropped
// connection and a panic in the log).
// Fix: answer every toolgate route with a retryable 503 until Start has
// attached its configuration (a ready flag the first pipeline step and
// the API read), and have Create refuse without a configuration rather
// than dereference it; then bring back the database check.
func TestOpenCreateBeforeAttachPanics(t *testing.T) {
	m := New()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Create before any configuration was attached panicked: %v", r)
		}
	}()
	if _, err := m.Create(context.Background(), "alice", "session", time.Now().Add(time.Hour), "svc"); err == nil {
		t.Fatal("Create before any configuration was attached succeeded")
	}
}
