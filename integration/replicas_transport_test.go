package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A transport module's session (here a legacy SSE stream) held by a
// replica other than the one that ends the MCP session ends at once, not
// at that replica's idle timeout: alice's session is used through a and
// b, each holding a stream of its own at the legacy server; her DELETE
// through a closes both. The replicas share PostgreSQL, whose
// announcements tell b.
func TestTransportSessionOnAnotherReplicaEndsWithTheSession(t *testing.T) {
	l := startLegacy(t, legacyHooks{})
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, "http://127.0.0.1:9/unused", "echo", "", legacyService("legacy", l.srv.URL+"/sse", ""))
	})
	session := a.createSession(t, aliceKey, "legacy")
	ma := a.raw(t, aliceKey, session, "legacy")
	ma.initialize()
	mb := b.raw(t, aliceKey, session, "legacy")
	mb.sessionID = ma.sessionID
	for i, m := range []*rawMCP{ma, mb} {
		if _, _, msgs := m.post(fmt.Sprintf(legacyEcho, i+1, "hi")); len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"hi"`) {
			t.Fatalf("echo through replica %d: %s", i, msgs)
		}
	}
	waitWithin(t, 10*time.Second, "a stream of each replica at the legacy server", func() bool { return l.openGET.Load() == 2 })
	if status := ma.delete(); status != http.StatusNoContent {
		t.Fatalf("DELETE through a: %d", status)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.openGET.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := l.openGET.Load(); n > 0 {
		t.Errorf("%d streams still open at the legacy server 10 s after the MCP session ended through a, want none "+
			"(b's stays until its mcp_session_idle_timeout)", n)
	}
	if status, _, msgs := mb.post(`{"jsonrpc":"2.0","id":9,"method":"ping"}`); status != http.StatusNotFound {
		t.Errorf("ping through b after the session ended: %d %s, want 404", status, msgs)
	}
}
