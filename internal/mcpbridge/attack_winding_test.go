package mcpbridge

// Review of 95b3fab: a session whose runner's credential changed
// (LinkConfig.OnRequest false) winds down — it stays in the bridge's map
// and takes its calls' answers and cancellations, and refuses the rest.

import (
	"net/http"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpbridge/bridgetest"
)

// windingFixture is the fixture whose link was made with the credential
// "old": a request carrying another (X-Cred) is for another link.
func windingFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.link.cfg.OnRequest = func(r *http.Request) bool { return r.Header.Get("X-Cred") == "old" }
	return f
}

func credRunner(f *fixture, user, cred string) *bridgetest.Runner {
	f.t.Helper()
	r := &bridgetest.Runner{T: f.t, RT: f.bridge, User: user, Header: http.Header{"X-Cred": {cred}}}
	r.Initialize(noCapabilities)
	return r
}

func status(r *bridgetest.Runner, method, body string) int {
	resp := r.Send(method, body)
	resp.Body.Close()
	return resp.StatusCode
}

// Attack (held): a winding session used to start new work, or reached by
// someone else. alice's call is in progress (block "alice") on a link
// bob's call shares (block "bob"); her credential changes and her runner
// is told her session is gone. She then sends, on that session: a
// tools/call with the old credential and with the new one, a GET, a
// notification other than cancelled, and a notifications/cancelled
// naming bob's call's id; bob sends alice's session id. Expected (README
// "One process per service, or per user": until its calls end, only
// "the runner's answers to those calls' sampling or elicitation
// requests, and its cancellations of them" reach it): each is refused as
// gone (404) or reaches nothing; bob's call goes on; alice's cancellation
// of her own call, with the new credential, reaches the server. Holds.
func TestWindingSessionStartsNothingNew(t *testing.T) {
	f := windingFixture(t)
	alice, bob := credRunner(f, "alice", "old"), credRunner(f, "bob", "old")
	for _, c := range []struct {
		r  *bridgetest.Runner
		id string
	}{{alice, "1"}, {bob, "2"}} {
		resp := c.r.Send(http.MethodPost, `{"jsonrpc":"2.0","id":`+c.id+`,"method":"tools/call","params":{"name":"block","arguments":{"name":"`+c.r.User+`"}}}`)
		t.Cleanup(func() { resp.Body.Close() })
		receive(t, f.running)
	}
	alice.Header.Set("X-Cred", "new")
	if got := status(alice, http.MethodPost, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); got != http.StatusNotFound {
		t.Fatalf("control: a request with the new credential: HTTP %d, want 404", got)
	}
	f.bridge.mu.Lock()
	s := f.bridge.sessions[alice.Session]
	f.bridge.mu.Unlock()
	if s == nil || !s.winding() {
		t.Fatal("control: alice's session does not wind down")
	}
	tries := []struct {
		what, cred, method, body string
	}{
		{"a call with the old credential", "old", http.MethodPost, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"block","arguments":{"name":"alice-old"}}}`},
		{"a call with the new credential", "new", http.MethodPost, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"block","arguments":{"name":"alice-new"}}}`},
		{"a GET with the old credential", "old", http.MethodGet, ""},
		{"a notification with the old credential", "old", http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`},
		{"a subscription with the old credential", "old", http.MethodPost, `{"jsonrpc":"2.0","id":6,"method":"resources/subscribe","params":{"uri":"test://r"}}`},
	}
	for _, try := range tries {
		alice.Header.Set("X-Cred", try.cred)
		if got := status(alice, try.method, try.body); got != http.StatusNotFound {
			t.Errorf("%s on the winding session: HTTP %d, want 404", try.what, got)
		}
	}
	alice.Header.Set("X-Cred", "new")
	status(alice, http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`)
	thief := &bridgetest.Runner{T: t, RT: f.bridge, User: "bob", Header: http.Header{"X-Cred": {"old"}}, Session: alice.Session}
	if got := status(thief, http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`); got != http.StatusNotFound {
		t.Errorf("bob on alice's winding session: HTTP %d, want 404", got)
	}
	select {
	case name := <-f.running:
		t.Errorf("the winding session started a call: %s", name)
	case name := <-f.blocked:
		t.Errorf("%s's call was cancelled by a cancellation that was not its runner's", name)
	case <-time.After(300 * time.Millisecond):
	}
	status(alice, http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`)
	if name := receive(t, f.blocked); name != "alice" {
		t.Errorf("alice cancelled her call in progress; the server cancelled %q", name)
	}
}

// Attack (fixed): a winding session's own retire ends its runner's standalone
// stream (session.go retire: s.get.finish), and the runner opens it again
// at once — with the credential it has now, the new one. alice's call is
// in progress when her credential changes; her runner's next POST is
// answered as gone (the session winds down), its GET stream ends, and
// the GET it opens again carries the new credential. Then she cancels her
// call. Expected (README "One process per service, or per user": until
// its requests are answered, "the runner's answers to those calls'
// sampling or elicitation requests, and its cancellations of them, still
// reach it whatever credential they carry"): the cancellation reaches the
// server. Happens: Bridge.RoundTrip (internal/mcpbridge/bridge.go:
// 236-239) forgets the winding session on any GET or DELETE with the new
// credential, so the cancellation (and any answer to the call's server
// requests) finds no session: 404, and the call runs on unstoppable (the
// old process with it, beside max_processes). Fix: answer such a GET as
// gone without forgetting the session (it leaves the map when it ends:
// have Session.end, or dropLocked's end, call bridge.forgetSession);
// forget it only on a DELETE.
//
// Fixed: a GET with another credential on a winding session is answered as
// gone without forgetting it (a DELETE still forgets it).
func TestWindingSessionForgottenByItsRunnersGETReconnect(t *testing.T) {
	f := windingFixture(t)
	alice := credRunner(f, "alice", "old")
	get := alice.Send(http.MethodGet, "")
	t.Cleanup(func() { get.Body.Close() })
	if get.StatusCode != http.StatusOK {
		t.Fatalf("control: GET: HTTP %d", get.StatusCode)
	}
	resp := alice.Send(http.MethodPost, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"block","arguments":{"name":"alice"}}}`)
	t.Cleanup(func() { resp.Body.Close() })
	receive(t, f.running)

	alice.Header.Set("X-Cred", "new") // refreshed
	if got := status(alice, http.MethodPost, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); got != http.StatusNotFound {
		t.Fatalf("control: a request with the new credential: HTTP %d, want 404", got)
	}
	status(alice, http.MethodGet, "") // the runner opens its stream again, with the token it has now
	got := status(alice, http.MethodPost, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`)
	select {
	case name := <-f.blocked:
		if name != "alice" {
			t.Errorf("the server cancelled %q", name)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("alice's cancellation of her call in progress on her winding session did not reach the server (HTTP %d): the GET she opened again with her new credential made the bridge forget the session", got)
	}
}
