package integration

// A third adversarial look at a caller connecting again (commit c587d95:
// attempt refuses a request whose upstream session was opened through
// another grant, except a transport module's DELETE with no credential;
// the end hook runs for sessions ended as outdated or retired; a replica
// reads the connection from storage before ending a session).
//
// Attack: replicas a and b on one file_system directory (no
// announcements). Alice's session S runs through a as account one; she
// stores account two's token through b (b caches it), then disconnects
// through a. S's next request through b: b's cached grant (two) differs
// from S's (one), so outdated() reads the connection from storage
// (GrantFor fresh) and finds none. The fresh read does not update b's
// cache (storecache.Cache.Reload keeps the old entry when load fails with
// ErrNotConnected), although GrantFor documents "the cache updated: the
// credential of the caller's next request is the one read": b goes on
// serving the deleted account-two token from its cache (S is refused
// "you connected again", retryable, rather than needs_sign_in; a new
// session through b runs as account two after b itself read that she is
// disconnected), and every request of S repeats the storage read (and
// cipher decrypt) for as long as the stale entry lives.
// modules/gateway/grants.go GrantFor(fresh) + internal/storecache
// Cache.Reload; modules/registry/registry.go outdated.
// Holds (fixed: ConnectionStore.LoadFresh forgets the cached connection
// when storage has none): a fresh read that finds no connection drops the
// cached one; nothing goes upstream with the deleted token afterwards.
// (TestReconnect3AttackFreshReadOfDisconnectKeepsStaleToken)
//
// Attack: a legacy SSE service (transport sse, auth bearer). Alice
// disconnects; her runner DELETEs its MCP session (attempt has endsItself
// for exactly this: a transport module's DELETE with no credential). The
// credentials step answers needs_sign_in before the proxy is reached: the
// runner's DELETE is refused, its MCP session stays, and the GET stream
// opened at the server with her (now deleted) token stays open until
// mcp_session_idle_timeout. modules/credentials/credentials.go ServeHTTP
// (no case for a DELETE of a transport module's session).
// Holds (fixed: the credentials step lets a DELETE of an MCP session go
// on without a credential when the caller must sign in): the runner's
// DELETE ends the session (2xx) and the bridge closes the stream at once. (TestReconnect3AttackDisconnectedLegacyDeleteKeepsStream)
//
// Attack: a stateless (2026-07-28) runner in front of a stateful upstream:
// its implied session holds account one's upstream session; alice stores
// account two's token; the next request retires the implied session (end
// hook with its upstream session, Sessions.Retire).
// Holds: the new request runs as account two in a new upstream session;
// the retired session's hook sends nothing with account two's token into
// account one's upstream session (no DELETE, no request mixes accounts).
// (TestReconnect3HoldsRetiredImpliedSessionSendsNoMixedDelete)

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestReconnect3AttackFreshReadOfDisconnectKeepsStaleToken: see the
// header.
func TestReconnect3AttackFreshReadOfDisconnectKeepsStaleToken(t *testing.T) {
	up, a, b := rcReplicas(t, "file_system")

	lsPutToken(t, a.gateway, aliceKey, "token-one")
	session := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, session, "svc")
	ma.initialize()
	if ans := rcCall(ma, 1, "echo"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control through a: %s", ans)
	}
	lsPutToken(t, b.gateway, aliceKey, "token-two") // b caches account two
	if r := a.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnect through a: %d %s", r.StatusCode, r.Body)
	}
	disconnectedAt := len(up.requests())

	mb := b.raw(t, aliceKey, session, "svc")
	mb.sessionID = ma.sessionID
	ans1 := rcCall(mb, 2, "change") // b reads storage here (outdated: cached two ≠ one): not connected
	ans2 := rcCall(mb, 3, "change")
	t.Logf("S through b after the disconnect: %s | %s", ans1, ans2)
	if !strings.Contains(ans2, "needs_sign_in") && !strings.Contains(ans2, "-32010") && !strings.Contains(ans2, "connect") {
		t.Logf("note: S's request after b read the disconnect is not told to sign in: %s", ans2)
	}

	mb2 := b.raw(t, aliceKey, session, "svc")
	status, hdr, msgs := mb2.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	newAns := ""
	if status == http.StatusOK && hdr.Get("Mcp-Session-Id") != "" {
		mb2.sessionID = hdr.Get("Mcp-Session-Id")
		newAns = rcCall(mb2, 4, "change")
	}
	var afterDisconnect []string
	for _, r := range up.requests()[disconnectedAt:] {
		afterDisconnect = append(afterDisconnect, r.HTTPMethod+" "+r.RPCMethod+" as "+r.Account)
	}
	for _, r := range up.requests()[disconnectedAt:] {
		if r.Account == "two" {
			t.Errorf("replica b read from storage that alice is disconnected (S's request: %s) and still sent her deleted "+
				"account-two token upstream afterwards: initialize through b: %d %s; call: %s; upstream saw since the disconnect %v; "+
				"want needs_sign_in (the fresh read must update b's cache)", ans1, status, msgs, newAns, afterDisconnect)
			break
		}
	}
}

// TestReconnect3AttackDisconnectedLegacyDeleteKeepsStream: see the header.
func TestReconnect3AttackDisconnectedLegacyDeleteKeepsStream(t *testing.T) {
	l := startLegacy(t, legacyHooks{})
	g := legacyGateway(t, l, gatewayConfig{}, "auth bearer")
	if r := g.api(t, http.MethodPut, "/v1/connections/legacy", aliceKey, []byte(`{"token":"alice-legacy-token-0123456789"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /v1/connections/legacy: %d %s", r.StatusCode, r.Body)
	}
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
	m.initialize()
	if _, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`); len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"hi"`) {
		t.Fatalf("control: %s", msgs)
	}
	waitWithin(t, 5*time.Second, "the session's GET stream at the legacy server", func() bool { return l.openGET.Load() == 1 })
	if r := g.api(t, http.MethodDelete, "/v1/connections/legacy", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnect: %d %s", r.StatusCode, r.Body)
	}
	resp, err := m.send(context.Background(), http.MethodDelete, "application/json, text/event-stream", "", "")
	if err != nil {
		t.Fatal(err)
	}
	body := answerBody(resp)
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for l.openGET.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if resp.StatusCode/100 != 2 || l.openGET.Load() > 0 {
		t.Errorf("alice disconnected, then her runner DELETEd its legacy session: HTTP %d %s; GET streams still open at the server "+
			"(opened with her deleted token) 5 s later: %d; want the session ended (a transport module's DELETE needs no credential) "+
			"and its stream closed", resp.StatusCode, body, l.openGET.Load())
	}
}

// TestReconnect3HoldsRetiredImpliedSessionSendsNoMixedDelete: see the
// header.
func TestReconnect3HoldsRetiredImpliedSessionSendsNoMixedDelete(t *testing.T) {
	up := startRC(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo change", Auth: "bearer", Extra: "tool_pins off"})
	lsPutToken(t, g, aliceKey, "token-one")
	session := g.createSession(t, aliceKey, "svc")
	if ans := rc2Stateless(g, aliceKey, session, 1, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: %s", ans)
	}
	old := up.sessionsOf("one")
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := rc2Stateless(g, aliceKey, session, 2, "change"); !strings.Contains(ans, "ran as two") {
		t.Errorf("the stateless call after connecting again: %s, want it to run as account two", ans)
	}
	time.Sleep(time.Second) // the retired session's end hook runs in the background
	for _, r := range up.requests() {
		for _, s := range old {
			if r.Session == s && r.Account != "one" {
				t.Errorf("%s %s with account %s's token in account one's upstream session %s", r.HTTPMethod, r.RPCMethod, r.Account, s)
			}
		}
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}
