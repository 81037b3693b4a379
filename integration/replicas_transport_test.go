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

// A per_user program holding its user's token (credential_env) on one
// replica stops when they disconnect through another: the replicas share
// PostgreSQL, whose announcement tells the one that runs it.
func TestStdioPerUserProcessOnAnotherReplicaStopsWhenItsUserDisconnects(t *testing.T) {
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, "http://127.0.0.1:9/unused", "echo", "",
			goSDKStdioService(t, "mine", "per_user\n\t\t\tcredential_env TOKEN\n\t\t\tauth bearer\n\t\t\tidle_timeout 10m"))
	})
	if r := a.api(t, http.MethodPut, "/v1/connections/mine", aliceKey, []byte(`{"token":"alice-upstream-token"}`)); r.StatusCode/100 != 2 {
		t.Fatalf("storing a token through a: %d %s", r.StatusCode, r.Body)
	}
	proc := whoIs(t, b.connect(t, aliceKey, b.createSession(t, aliceKey, "mine"), "mine", nil))
	if r := a.api(t, http.MethodDelete, "/v1/connections/mine", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnecting through a: %d %s", r.StatusCode, r.Body)
	}
	assertProcessGone(t, proc.PID)
}
