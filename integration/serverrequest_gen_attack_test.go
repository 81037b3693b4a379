package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed): a call's stream opened in upstream session S1; another
// call of the runner's (a ping) finds S1 expired and toolgate
// re-initializes it (S2). The upstream then asks roots/list on the call's
// stream, which belongs to S1. toolgate named the request with S2's
// generation (Session.ServerRequestID / ServerRequestSent read
// s.Upstream().Generation at relay time, not the generation of the
// upstream session whose stream carried the request), so relayAnswer's
// generation check passed and the answer was POSTed into S2 under id 1:
// an upstream session that never asked it (whose own request 1 may be
// another). Fixed: mcpproxy.deliver takes the upstream session whose
// exchange carried the message, and names the request by its generation;
// the answer is refused as one to a replaced session.
func TestServerRequestGenAttackStreamOfReplacedSessionAnswerReachesNewSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	gu := srAskUpstream(up, srAskOptions{})
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	gu.waitCall()
	srPing(t, m, 2, "ping")
	close(gu.ask)
	id := srAskedID(t, c, "roots/list")
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	for range c {
	}
	srCheckAnswered(t, gu.state(), status, body)
}

// srCheckAnswered fails t unless the runner's answer (HTTP status, body)
// to the request of the call's upstream session, replaced meanwhile,
// reached that session or none.
func srCheckAnswered(t *testing.T, st srAskState, status int, body string) {
	t.Helper()
	t.Logf("answer: HTTP %d %s; call in %s; answers in %v", status, body, st.callSess, st.answers)
	if !st.expired {
		t.Fatal("no re-initialization")
	}
	for _, s := range st.strays() {
		t.Errorf("the answer to a request upstream session %s asked reached upstream session %s (HTTP %d): a session that never asked it", st.callSess, s, status)
	}
}

// Attack (fixed): the upstream asks roots/list (id 1) on a call's stream of
// upstream session S1; the runner is told of it under S1's generation.
// Another call re-initializes the upstream session (S2). The upstream then
// cancels request 1 on the same stream: toolgate named the cancellation
// with S2's generation (cancelledAsRelayed read the current generation),
// an id the runner was never asked under: the runner never learned its
// request was cancelled. Fixed with the one above: the cancellation is
// named by the generation of the session whose stream carried it.
func TestServerRequestGenAttackCancellationAfterReinitNamesAnotherRequest(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	gu := srAskUpstream(up, srAskOptions{cancel: true})
	close(gu.ask)
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	asked := srAskedID(t, c, "roots/list")
	srPing(t, m, 2, "ping")
	close(gu.cancelNow)
	cancelled := ""
	for msg := range c {
		if gjson.GetBytes(msg, "method").String() == "notifications/cancelled" {
			cancelled = gjson.GetBytes(msg, "params.requestId").Raw
		}
	}
	if !strings.HasPrefix(asked, `"toolgate-request:`) || cancelled != asked {
		t.Errorf("asked under %s; told of the cancellation of %s", asked, cancelled)
	}
}

// Attack (federation, fixed): the same as
// TestServerRequestGenAttackStreamOfReplacedSessionAnswerReachesNewSession
// through the federated endpoint. A federated tools/call of svc runs in
// svc's upstream session S1; another federated call of svc finds S1
// expired and toolgate re-initializes it (S2); S1's stream then asks
// roots/list. The runner's answer was POSTed into S2, which never asked it.
func TestServerRequestGenAttackFederatedStreamOfReplacedSessionAnswerReachesNewSession(t *testing.T) {
	up := startUpstream(t)
	beta := startUpstream(t)
	g := startGateway(t, faConfig(t, up, beta, gatewayConfig{Tools: "echo"}))
	m := faRunner(t, g, aliceKey, `{"roots":{}}`)
	// The second federated call of svc, with the text "expire", finds
	// the call's upstream session expired.
	gu := srAskUpstream(up, srAskOptions{expires: func(b []byte, _ bool) bool {
		return gjson.GetBytes(b, "method").String() == "tools/call" && gjson.GetBytes(b, "params.arguments.text").String() == "expire"
	}})
	start := time.Now()
	cc := make(chan (<-chan json.RawMessage), 1)
	go func() {
		cc <- faStream(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	}()
	gu.waitCall()
	t.Logf("%v call in %s", time.Since(start), gu.state().callSess)
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"expire"}}}`) {
		t.Logf("%v second call: %s", time.Since(start), msg)
	}
	close(gu.ask)
	c := <-cc
	id := ""
	for id == "" {
		msg, ok := <-c
		if !ok {
			t.Fatal("the stream ended early")
		}
		t.Logf("%v first call: %s", time.Since(start), msg)
		if gjson.GetBytes(msg, "method").String() == "roots/list" {
			id = gjson.GetBytes(msg, "id").Raw
		}
	}
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	for range c {
	}
	srCheckAnswered(t, gu.state(), status, body)
}

// Attack (fixed): a runner drops the stream of a call sent in upstream
// session S1; a ping finds S1 forgotten and toolgate re-initializes it
// (S2); the runner then resumes the call's stream with its Last-Event-ID.
// toolgate resumed it in S2 (resumeForRunner read the session's current
// upstream): a GET naming an event of S1's to a session that never sent
// it, whose events — another stream's, should the upstream number them
// alike — would reach the runner as its call's. Fixed: a stream remembers
// the upstream session whose exchange it relays, and one whose session was
// replaced is not resumed (400: the runner's call is lost with it).
func TestResumeOfAStreamOfAReplacedUpstreamSessionIsRefused(t *testing.T) {
	key, _, auth := acctUser("gen-resume")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "5s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	lastID, first := srDroppedWaitCall(t, up, m, "")
	srForgetSessions(t, up, m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, body, err := raGet(ctx, m, lastID)
	if err != nil || status != http.StatusBadRequest || !strings.Contains(body, "replaced") {
		t.Errorf("the resume of a stream of a replaced upstream session: HTTP %d %v %.300s, want 400 saying the session was replaced", status, err, body)
	}
	for _, r := range up.requestLog() {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") != "" && r.Header.Get("Mcp-Session-Id") != first {
			t.Errorf("a stream of upstream session %s was resumed in %s", first, r.Header.Get("Mcp-Session-Id"))
		}
	}
}
