package integration

// A fourth adversarial look at connecting again, at the last three
// commits: a runner's DELETE of its MCP session goes on without a
// credential when the caller must sign in (modules/credentials ServeHTTP,
// modules/mcpproxy attempt/endsItself); LoadFresh forgets the cached
// connection when storage has none (modules/gateway/connections.go);
// response.next refuses a message once the MCP session is closed, except
// for toolgate's own requests (modules/mcpproxy/upstream.go); approval
// index entries keep expiries to the nanosecond (internal/approval).
//
// FINDINGS (fixed)
//
// Attack: a stateless (2026-07-28) runner holds a subscriptions/listen
// open on its implied MCP session, which toolgate opened through alice's
// connection to account one (an upstream of an earlier revision: the
// listen is the standalone GET stream of account one's upstream session).
// Alice stores account two's token; her runner's next stateless request
// (same declared capabilities) gets a new implied session of account two
// and retires the old one (mcp2026.Runtime.Session → Sessions.Retire).
// Retire closes a session only once nothing uses it, and the listen uses
// it for as long as it stays open: the old session is never Closed(), so
// response.next's new check (which only looks at MCPSession.Closed())
// lets account one's notifications through, and the listen goes on
// relaying account one's upstream session (opened with the replaced
// token) to the runner indefinitely, after the caller connected another
// account and after the runner's requests already run as account two.
// For a stateful session the same reconnect ends the session "with its
// streams" at the next request (README, "Connecting again"); the
// stateless runner's old session is said to be ended too ("their stateless
// runner's implied session ... are the new connection's, and the old one's
// session is ended").
// Code: internal/mcpsession/sessions.go Retire (deferred while a listen
// uses the session), internal/mcp2026/runtime.go Session,
// modules/mcpproxy/listen.go listenLegacy / openShared (ended only by the
// session's context), modules/mcpproxy/upstream.go response.next (checks
// Closed() only, not retired).
// Holds (fixed: Sessions.Retire ends the retired session's listens at
// once, Session.Retiring; response.next relays nothing more to a listen of
// a retired session): once the implied session is retired because the
// caller's connection changed, its listens end, their upstream stream
// closes, and nothing of the old upstream session reaches the runner.
// (TestReconnect4AttackStatelessListenOutlivesReconnect)
//
// HOLDS (these pass; regression tests)
//
// Attack: alice disconnects from a per-user HTTP service (auth bearer);
// her runner DELETEs its MCP session. The credentials step now lets the
// DELETE go on without a credential: can it reach the server
// unauthenticated (a DELETE without Authorization, or anything else: a
// re-initialize, a listing)?
// Holds: the DELETE is answered 204, the MCP session is over (the next
// request is told 404), and the upstream receives nothing at all (attempt
// refuses an uncredentialed request to a per-user server; endsItself only
// for a transport module). (TestReconnect4HoldsDisconnectedDeleteSendsNothingUpstream)
//
// Attack: alice is disconnected (every request of hers needs sign-in, so
// the credentials step waves a DELETE through); bob sends a DELETE naming
// alice's MCP session id, in his own toolgate session.
// Holds: refused before the credentials step (403, the session step's
// ownership check), alice's session stays (her own request is told to sign
// in, not 404), nothing reaches the upstream.
// (TestReconnect4HoldsForeignDeleteOfDisconnectedSession)

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// r4Listen opens a stateless subscriptions/listen of alice on svc asking
// for tools/list_changed, declaring caps {}: the data lines of its stream
// arrive on the channel until it ends or cancel is called.
func r4Listen(t *testing.T, g *gateway, session string) (<-chan string, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"jsonrpc":"2.0","id":"listen-1","method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
		aaStatelessMeta(`{}`) + `}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/v1/mcp/svc", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	req.Header.Set("X-Toolgate-Session", session)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := (&http.Client{Transport: g.transport()}).Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b := answerBody(resp)
		resp.Body.Close()
		cancel()
		t.Fatalf("subscriptions/listen: HTTP %d %s", resp.StatusCode, b)
	}
	t.Cleanup(cancel)
	return sseData(resp), cancel
}

// r4ListeningAsOne starts a gateway (with extra options) in front of an
// rc upstream, where alice is connected as account one and her stateless
// runner holds a subscriptions/listen: it returns them, her toolgate
// session, the listen's messages and the upstream session whose stream
// the listen relays (checked with a control notification).
func r4ListeningAsOne(t *testing.T, extra string) (up *rcUpstream, g *gateway, session string, listen <-chan string, old string) {
	t.Helper()
	up = startRC(t)
	g = startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo change", Auth: "bearer", Extra: "tool_pins off" + extra})
	lsPutToken(t, g, aliceKey, "token-one")
	session = g.createSession(t, aliceKey, "svc")
	if ans := rc2Stateless(g, aliceKey, session, 1, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control, a stateless call as account one: %s", ans)
	}
	listen, _ = r4Listen(t, g, session)
	if ack, ok := rcNext(listen, "listen-1", 10*time.Second); !ok || ack == "" {
		t.Fatalf("the listen's acknowledgement did not come: %q", ack)
	}
	waitWithin(t, 10*time.Second, "a GET stream of account one's upstream session for the listen", func() bool {
		for _, s := range up.sessionsOf("one") {
			if up.hasStream(s) {
				old = s
				return true
			}
		}
		return false
	})
	if !up.push(old, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"mark":"control"}}}`) {
		t.Fatal("control: cannot push on account one's stream")
	}
	if msg, ok := rcNext(listen, "control", 5*time.Second); !ok || msg == "" {
		t.Fatalf("control: account one's notification did not reach the listen: %q", msg)
	}
	return up, g, session, listen, old
}

// TestReconnect4AttackStatelessListenOutlivesReconnect: see the header.
func TestReconnect4AttackStatelessListenOutlivesReconnect(t *testing.T) {
	up, g, session, listen, old := r4ListeningAsOne(t, "")
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := rc2Stateless(g, aliceKey, session, 2, "change"); !strings.Contains(ans, "ran as two") {
		t.Fatalf("the stateless call after connecting account two: %s, want it to run as account two", ans)
	}
	// The old implied session is retired now. Account one's upstream
	// session speaks on the stream the listen holds.
	pushed := up.push(old, `{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"mark":"after-reconnect"}}}`)
	msg, open := rcNext(listen, "after-reconnect", 4*time.Second)
	if pushed && msg != "" {
		t.Errorf("alice connected account two and her stateless runner's requests run as account two, yet her open "+
			"subscriptions/listen still relays account one's upstream session %s (opened with the replaced token): got %s "+
			"(listen still open: %v); want the retired implied session's listens ended, nothing of account one reaching the runner",
			old, msg, open)
	}
	if open {
		if _, open = rcNext(listen, "never sent", 5*time.Second); open {
			t.Errorf("the listen of the retired implied session is still open 5 s after the reconnect")
		}
	}
	waitWithin(t, 10*time.Second, "the GET of account one's upstream session to close", func() bool { return !up.hasStream(old) })
}

// TestReconnect4HoldsDisconnectedDeleteSendsNothingUpstream: see the
// header.
func TestReconnect4HoldsDisconnectedDeleteSendsNothingUpstream(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnect: %d %s", r.StatusCode, r.Body)
	}
	before := len(up.requests())
	// Control: a request of the session is told to sign in.
	if ans := rcCall(m, 2, "echo"); !strings.Contains(ans, "-32010") && !strings.Contains(ans, "connect") {
		t.Fatalf("control: a call after the disconnect: %s, want needs_sign_in", ans)
	}
	resp, err := m.send(context.Background(), http.MethodDelete, "application/json, text/event-stream", `{"jsonrpc":"2.0","id":9,"method":"initialize"}`, "")
	if err != nil {
		t.Fatal(err)
	}
	body := answerBody(resp)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Errorf("alice disconnected, then DELETEd her MCP session: HTTP %d %s; want 204 (ending needs no connection)", resp.StatusCode, body)
	}
	time.Sleep(300 * time.Millisecond) // an end hook runs in the background
	for _, r := range up.requests()[before:] {
		t.Errorf("the upstream got %s %s (session %q) with account %q's token after alice disconnected; want nothing: "+
			"a server of a per-user service never gets a request without the caller's credential", r.HTTPMethod, r.RPCMethod, r.Session, r.Account)
	}
	if ans := rcCall(m, 3, "echo"); !strings.Contains(ans, "HTTP 404") {
		t.Errorf("the session after its DELETE: %s, want 404", ans)
	}
}

// TestReconnect4HoldsForeignDeleteOfDisconnectedSession: see the header.
func TestReconnect4HoldsForeignDeleteOfDisconnectedSession(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnect: %d %s", r.StatusCode, r.Body)
	}
	before := len(up.requests())
	bob := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bob.sessionID = m.sessionID
	resp, err := bob.send(context.Background(), http.MethodDelete, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	body := answerBody(resp)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("bob's DELETE of alice's MCP session (alice disconnected): HTTP %d %s; want 403", resp.StatusCode, body)
	}
	if ans := rcCall(m, 2, "echo"); strings.Contains(ans, "HTTP 404") {
		t.Errorf("alice's session after bob's DELETE: %s; want it still there (needs_sign_in)", ans)
	}
	for _, r := range up.requests()[before:] {
		t.Errorf("the upstream got %s %s (session %q, account %q) after bob's DELETE", r.HTTPMethod, r.RPCMethod, r.Session, r.Account)
	}
}
