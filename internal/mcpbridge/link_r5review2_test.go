package mcpbridge

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// FINDING: bob's call answered and the shared program works on for him;
// bob then ends his session (DELETE; the idle sweep does the same). alice
// is now the only user connected, so the program's log of bob's work —
// which names no request — goes to her. routeLocked counts only users
// with a session on the link or a call in progress, though its own
// comment says the message may be about "one that answered and works on
// in the background". (Fix: a user who was connected to the shared
// program keeps counting — e.g. for the program's lifetime, or until it
// restarts — not only while their session lasts.)
func TestR5Review2BobLeavesAndHisBackgroundLogReachesAlice(t *testing.T) {
	f := newFixture(t)
	alice, bob := f.runner("alice", sampling), f.runner("bob", noCapabilities)
	if msgs := bob.Call(`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}`); len(msgs) != 1 || !gjson.Get(msgs[0], "result").Exists() {
		t.Fatalf("bob's logging/setLevel: %q", msgs)
	}
	if msgs := bob.Call(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"background","arguments":{"text":"BOB-PAYROLL-2026"}}}`); len(msgs) != 1 || toolText(msgs[0]) != "started" {
		t.Fatalf("bob's background call: %q", msgs)
	}
	if resp := bob.Send(http.MethodDelete, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("ending bob's session: %d", resp.StatusCode)
	}
	msgs := alice.Call(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"finish","arguments":{}}}`)
	if len(msgs) == 0 || toolText(msgs[len(msgs)-1]) != "finished 1" {
		t.Fatalf("alice's finish: %q", msgs)
	}
	if strings.Contains(strings.Join(msgs, "\n"), "BOB-PAYROLL-2026") {
		t.Errorf("the program's log of bob's background work reached alice once bob's session ended: %q", msgs)
	}
}

// Same, with bob's session ended and bob back with a new one (a runner
// reconnecting at the edge): both users connected, nothing relayed. HELD
// (passes): the new session counts.
func TestR5Review2BobReconnectsHeld(t *testing.T) {
	f := newFixture(t)
	alice, bob := f.runner("alice", sampling), f.runner("bob", noCapabilities)
	bob.Call(`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}`)
	bob.Call(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"background","arguments":{"text":"BOB-PAYROLL-2026"}}}`)
	bob.Send(http.MethodDelete, "")
	bob2 := f.runner("bob", noCapabilities)
	_ = bob2
	msgs := alice.Call(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"finish","arguments":{}}}`)
	if strings.Contains(strings.Join(msgs, "\n"), "BOB-PAYROLL-2026") {
		t.Errorf("bob's log reached alice while bob is connected again: %q", msgs)
	}
}

// FINDING: notifications the link broadcasts (list_changed, and
// resources/updated without a uri, which goes to every session whatever it
// subscribed to) are relayed with everything the program put in them to
// every user connected, though they name no request and may be about one
// person's work. (Fix: relay them rebuilt — list_changed without params,
// resources/updated only with a string uri, and only {uri} — or route
// their params like other unattributed messages.)
func TestR5Review2BroadcastNotificationsCarryDataToEveryUser(t *testing.T) {
	f := newFixture(t)
	alice, bob := f.runner("alice", noCapabilities), f.runner("bob", noCapabilities)
	aliceGet, bobGet := alice.Send(http.MethodGet, ""), bob.Send(http.MethodGet, "")
	defer aliceGet.Body.Close()
	defer bobGet.Body.Close()
	aliceEvents, bobEvents := events(aliceGet.Body), events(bobGet.Body)
	_ = bobEvents
	for _, n := range []string{
		`{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"title":"BOB-PAYROLL-2026 ready"}}`,
		`{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"note":"BOB-PAYROLL-2026 ready"}}}`,
	} {
		f.link.Receive([]byte(n))
		select {
		case m := <-aliceEvents:
			if strings.Contains(m, "BOB-PAYROLL-2026") {
				t.Errorf("a broadcast notification carried the program's data to alice while bob is connected: %s", m)
			}
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// FINDING (same root): routeLocked says "a call whose runner went away, or
// whose session ended, may still run in the server: its user counts", but
// Session.end drops the session's calls in progress (dropLocked), so once
// bob ends his session his call no longer counts. A program that keeps
// working on bob's call after the cancellation (MCP's cancellation is
// advisory) logs about it, and the log goes to alice.
func TestR5Review2BobsEndedSessionCallStillRunningLogsToAlice(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	mcp.AddTool(f.server, &mcp.Tool{Name: "stubborn", Description: "Ignores cancellation; logs its work when released."},
		func(_ context.Context, req *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, any, error) {
			started <- struct{}{}
			<-release
			_ = req.Session.Log(context.Background(), &mcp.LoggingMessageParams{Level: "info", Data: "still working on " + in.Text})
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	alice, bob := f.runner("alice", noCapabilities), f.runner("bob", noCapabilities)
	if msgs := bob.Call(`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}`); len(msgs) != 1 {
		t.Fatalf("bob's logging/setLevel: %q", msgs)
	}
	aliceGet := alice.Send(http.MethodGet, "")
	defer aliceGet.Body.Close()
	aliceEvents := events(aliceGet.Body)
	call := bob.Send(http.MethodPost, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stubborn","arguments":{"text":"BOB-PAYROLL-2026"}}}`)
	defer call.Body.Close()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("stubborn never started")
	}
	if resp := bob.Send(http.MethodDelete, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("ending bob's session: %d", resp.StatusCode)
	}
	close(release)
	for {
		select {
		case m := <-aliceEvents:
			if strings.Contains(m, "BOB-PAYROLL-2026") {
				t.Fatalf("the log of bob's call, still running after his session ended, reached alice: %s", m)
			}
			continue
		case <-time.After(500 * time.Millisecond):
		}
		break
	}
}
