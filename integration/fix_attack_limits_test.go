package integration

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/pgtest"
)

// fixHeldRecords is the keys of the replicas' records of their local MCP
// sessions in the storage table of dsn.
func fixHeldRecords(t *testing.T, dsn string) []string {
	t.Helper()
	var out []string
	for k := range soRows(t, dsn) {
		if strings.Contains(k, "/initializing/") && strings.Contains(k, "/held-") {
			out = append(out, k)
		}
	}
	return out
}

// Attack (fixed): the record a replica keeps of its local (stateless-implied)
// MCP sessions is "removed on stop" (commit 1fa1930; Sessions.Destruct).
// Alice (max_mcp_sessions_per_caller 5) makes one stateless call through
// a replica, which then stops gracefully (SIGTERM), as in a rolling
// deploy; five such replicas, each stopped (the cleanup order is random:
// one stop in two shows it, so 31 runs in 32 fail). Expected:
// after each stop no record of the replica's is left, and alice, holding
// no session anywhere, may start her five through replica b at once. What
// happened: records are left after graceful stops, each counting a session
// alice no longer holds on every other replica
// (max_mcp_sessions_per_caller) until it runs out (5 minutes): Caddy
// cleans up the modules of a stopped config in map order
// (caddy context.go: range newCtx.moduleInstances), so PostgreSQL's
// storage module often closes the shared pool (its Cleanup,
// storage/postgres/database.go Destruct) before the toolgate app's
// Cleanup destroys the MCP sessions, whose Destruct then fails to delete
// the record (internal/mcpsession/sessions.go:150-157, its error
// dropped).
// Fixed: gateway.App.Stop removes the records when the process exits
// (Sessions.Leaving), while the storage is still open.
func TestFixAttackHeldRecordLeftAfterGracefulStop(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	up := startUpstream(t)
	bin := toolgateBinary(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	data := t.TempDir()
	block := soBlock("storage postgres "+dsn, data, up.URL, "echo", "", "max_mcp_sessions_per_caller 5")
	policy := testdataPath(t, "policy")
	b := startReplicaWith(t, bin, block, data, policy)
	sess := b.createSession(t, aliceKey, "svc")
	const n = 5
	var stopped []*replica
	for i := 0; i < n; i++ {
		a := startReplicaWith(t, bin, block, data, policy)
		if status, ans := rpaStatelessCall(t, a.gateway, sess, `{}`); status != http.StatusOK || !strings.Contains(ans, `"result"`) {
			t.Fatalf("alice's stateless call through replica %d: %d %s", i, status, ans)
		}
		stopped = append(stopped, a)
	}
	if got := len(fixHeldRecords(t, dsn)); got != n {
		t.Fatalf("the test's own check: %d records of local sessions, want %d", got, n)
	}
	for _, a := range stopped {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, a := range stopped {
		select {
		case <-a.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("replica %d did not stop within 10 s of SIGTERM", i)
		}
	}
	if left := fixHeldRecords(t, dsn); len(left) > 0 {
		granted := 0
		for _, c := range []string{`{}`, `{"roots":{}}`, `{"sampling":{}}`, `{"elicitation":{}}`, `{"roots":{"listChanged":true}}`} {
			if status, ans := rpaStatelessCall(t, b.gateway, sess, c); status == http.StatusOK && strings.Contains(ans, `"result"`) {
				granted++
			}
		}
		t.Errorf("%d of %d replicas that stopped gracefully left their record of alice's local session (%v); b then grants alice %d of her 5 sessions",
			len(left), n, left, granted)
	}
}
