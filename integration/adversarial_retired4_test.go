package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// A fourth look at the tokens a connection no longer sends (commits
// 71fe40b, f81dbeb, 914930b): the paths the earlier looks left out — the
// federated endpoint, resumed streams, tasks, results withheld for an
// approval and released later, legacy SSE servers and the bodies of 4xx
// answers — each after the caller's token changed, with a hostile
// upstream quoting the token it was sent before and the one it is sent
// now.

// startRT4 is an r2Upstream (startR2) whose POSTed requests hook may answer
// itself: hook gets the request, the token it came with and every token
// the upstream was sent so far (in order), and returns the HTTP status and
// the whole JSON-RPC answer, or "" to leave the request to r2Upstream
// (initialize, tools/list, its refusals and quotes). Requests are left to
// r2Upstream while it is told to refuse (refuseNext).
func startRT4(t *testing.T, hook func(msg gjson.Result, token string, seen []string) (int, string)) *r2Upstream {
	t.Helper()
	u := &r2Upstream{sessions: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		msg := gjson.ParseBytes(body)
		token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		u.mu.Lock()
		if token != "" && !slices.Contains(u.seen, token) {
			u.seen = append(u.seen, token)
		}
		known := u.sessions[r.Header.Get("Mcp-Session-Id")]
		refusing := u.refuse > 0
		seen := slices.Clone(u.seen)
		u.mu.Unlock()
		if r.Method == http.MethodPost && known && !refusing && hook != nil && msg.Get("id").Exists() && msg.Get("method").Exists() {
			if status, answer := hook(msg, token, seen); answer != "" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, answer)
				return
			}
		}
		u.serve(w, r)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	u.URL = srv.URL + "/mcp"
	return u
}

// rt4Answer is a JSON-RPC result answering id (JSON text).
func rt4Answer(id, result string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"result":` + result + `}`
}

// rt4Text is a tool result of one text item.
func rt4Text(text string) string {
	return `{"content":[{"type":"text","text":` + strconv.Quote(text) + `}]}`
}

// rt4Quote names the tokens the upstream was sent before the request's and
// the request's own.
func rt4Quote(marker, token string, seen []string) string {
	var before []string
	for _, s := range seen {
		if s != token {
			before = append(before, s)
		}
	}
	return marker + " before: " + strings.Join(before, ", ") + "; now: " + token
}

// rt4Holds reports which of tokens text holds (decoded JSON strings and the
// text as it is).
func rt4Holds(text string, tokens ...string) []string {
	var found []string
	decoded := rdDecoded([]byte(text))
	for _, tok := range tokens {
		if tok != "" && (strings.Contains(text, tok) || strings.Contains(decoded, tok)) {
			found = append(found, tok)
		}
	}
	return found
}

// rt4WaitStream waits for n open standalone streams at up.
func rt4WaitStream(t *testing.T, up *r2Upstream, n int) {
	t.Helper()
	for i := 0; up.streamCount() < n; i++ {
		if i > 250 {
			t.Fatalf("premise: %d standalone streams reached the upstream, want %d", up.streamCount(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Attack (fixed): a result withheld for an approval at the result stage (ask) is
// sealed with the approval as the result policy left it — the policy's
// cleaned result when it gives one ("The policy's cleaned result is the
// one reviewed and released", modules/policy/result.go) — and the
// identical retry after the release gets it written straight to the
// runner (ResultHandler.released: gateway.WriteRPC of res.Result, before
// the route's toolgate_proxy), without the search every other answer gets.
// The withheld cleaned result is searched neither when it is sealed (the
// proxy searches only the tool error announcing the approval) nor when it
// is released. Here the upstream writes alice's personal token in two
// members of structuredContent (no piece of a whole token: nothing to
// redact), the site's result policy asks for an approval with a cleaned
// result that joins them. Alice then replaces her token (PUT) and approves;
// her retry gets the token she replaced whole, and the same for the one
// she sends now. The approval's record (what approvers read in the API and
// console) has it whole too. Breaks README: "An upstream that writes back
// the credential toolgate attached to the call — or a token of that
// person's it was sent before, which toolgate replaced since (… a personal
// token the person replaced …) … has it replaced by `[REDACTED:credential]`
// before any policy or runner sees the message (and again in what the
// result policy writes, should its cleaning put it together)". Fixed:
// what the result policy withholds (its cleaned result, and the masked
// copy approvers see) is searched before it is kept, and the released
// answer again with the retry's call before it is written — the proxy's
// own search, registered with the app (App.SearchAnswer).
func TestRetired4AttackReleasedResultIsNotSearched(t *testing.T) {
	up := startRT4(t, func(msg gjson.Result, token string, seen []string) (int, string) {
		if msg.Get("method").String() != "tools/call" || !strings.HasPrefix(msg.Get("params.arguments.text").String(), "review") {
			return 0, ""
		}
		return http.StatusOK, rt4Answer(msg.Get("id").Raw, `{"content":[{"type":"text","text":"see structuredContent"}],"structuredContent":{"a":`+
			strconv.Quote(token[:10])+`,"b":`+strconv.Quote(token[10:])+`}}`)
	})
	dir := aaPolicies(t, "", `decision := {"action": "ask", "reason": "a person reviews this", "result": {"content": [{"type": "text", "text": concat("", ["joined: ", input.result.structuredContent.a, input.result.structuredContent.b])}]}} if {
	input.result.structuredContent.a
}
`)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo", RequestPolicy: dir, ResultPolicy: dir})
	const old, rotated = "alice-release-token-one-0123456789", "alice-release-token-two-9876543210"
	session := g.createSession(t, aliceKey, "svc")
	fresh := func() *rawMCP {
		m := g.raw(t, aliceKey, session, "svc")
		m.initialize()
		return m
	}
	withhold := func(m *rawMCP, id int, args string) string {
		t.Helper()
		held := m.call(id, "echo", args)
		aid := gjson.GetBytes(held, `result._meta.toolgate/approval.id`).String()
		if aid == "" {
			t.Fatalf("premise: the result was not withheld for an approval: %s", held)
		}
		if found := rt4Holds(string(held), old, rotated); len(found) != 0 {
			t.Fatalf("premise: the answer announcing the approval holds a token: %s", held)
		}
		return aid
	}
	approve := func(aid string) string {
		t.Helper()
		record := g.api(t, http.MethodGet, "/v1/approvals/"+aid, aliceKey, nil)
		if r := g.decide(t, aliceKey, aid, true, "once", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("premise: approving: %d %s", r.StatusCode, r.Body)
		}
		return string(record.Body)
	}

	lsPutToken(t, g, aliceKey, old)
	m := fresh()
	aid := withhold(m, 1, `{"text":"review-one"}`)
	lsPutToken(t, g, aliceKey, rotated) // connecting again: her MCP session ends
	m = fresh()
	record := approve(aid)
	released := m.call(2, "echo", `{"text":"review-one"}`)
	if !strings.Contains(string(released), "joined") {
		t.Fatalf("premise: the retry did not get the released result: %s", released)
	}
	if got := up.tokens(); !slices.Equal(got, []string{old, rotated}) {
		t.Fatalf("premise: the upstream was sent %q, want the old token then the new one", got)
	}
	if found := rt4Holds(string(released), old); len(found) != 0 {
		t.Errorf("alice's runner got the personal token she replaced, in the result released after her approval: %s", released)
	}
	if found := rt4Holds(record, old); len(found) != 0 {
		t.Errorf("the approval's record, which approvers read, holds alice's token whole: %.400s", record)
	}

	aid = withhold(m, 3, `{"text":"review-two"}`)
	approve(aid)
	released = m.call(4, "echo", `{"text":"review-two"}`)
	if !strings.Contains(string(released), "joined") {
		t.Fatalf("premise: the retry did not get the released result: %s", released)
	}
	if found := rt4Holds(string(released), rotated); len(found) != 0 {
		t.Errorf("alice's runner got the personal token toolgate sends for her now, in a released result: %s", released)
	}
}

// Holds: the federated endpoint (/v1/mcp) reaches a member service
// through the whole route (modules/federation subCall), so each message
// of the member is searched as on /v1/mcp/{service}. Alice's federated
// session holds its GET stream open (the member's standalone stream
// under it) with her OAuth access token T1; the upstream refuses her next
// federated call, toolgate refreshes the grant to T2 and sends it again.
// The answer quotes T1; then a notification and a server request
// (elicitation/create) on the federated stream quote T1 and T2. Neither
// reaches the runner. Without the search (or
// with a federated path that relayed a member's messages around
// toolgate_proxy), both would.
func TestRetired4HoldsFederatedSessionAfterRefresh(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startR2(t)
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Tools: "echo", Federation: " "})
	g.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	fm := faRunner(t, g, aliceKey, `{"elicitation":{}}`)
	// A first call opens the member's part of the federated session.
	faRPC(t, fm, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	stream, stop := rcStream(t, fm)
	defer stop()
	rt4WaitStream(t, up, 1)
	up.refuseNext(1)
	ans := faRPC(t, fm, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	calls := up.callTokens()
	if len(calls) != 3 || calls[0] != t1 || calls[1] != t1 || calls[2] == t1 {
		t.Fatalf("premise: the federated call was not refused with T1 and sent again with a refreshed token (%d calls)", len(calls))
	}
	t2 := calls[2]
	if !strings.Contains(string(ans), "before") || !strings.Contains(string(ans), "REDACTED") {
		t.Fatalf("premise: the member's answer quoting T1 did not reach the runner: %s", ans)
	}
	if found := rt4Holds(string(ans), t1, t2); len(found) != 0 {
		t.Errorf("alice's federated runner got an access token in the member's answer after the refresh: %s", ans)
	}
	if n := up.push(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"fed-stream old ` + t1 + ` now ` + t2 + `"}}`); n != 1 {
		t.Fatalf("premise: %d standalone streams took the notification, want the federated stream's", n)
	}
	msg, _ := rcNext(stream, "fed-stream", 5*time.Second)
	if msg == "" {
		t.Fatal("premise: the notification did not reach the federated stream")
	}
	if found := rt4Holds(msg, t1, t2); len(found) != 0 {
		t.Errorf("alice's federated GET stream, opened before the refresh, got an access token: %s", msg)
	}
	if n := up.push(`{"jsonrpc":"2.0","id":"r4-ask","method":"elicitation/create","params":{"message":"fed-request old ` + t1 + ` now ` + t2 +
		`","requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"}}}}}`); n != 1 {
		t.Fatalf("premise: %d standalone streams took the server request, want the federated stream's", n)
	}
	msg, _ = rcNext(stream, "fed-request", 5*time.Second)
	if msg == "" {
		t.Fatal("premise: the server request did not reach the federated stream")
	}
	if found := rt4Holds(msg, t1, t2); len(found) != 0 {
		t.Errorf("alice's federated GET stream got an access token in a member's server request: %s", msg)
	}
}

// Holds: the same with personal tokens: alice replaces her token (PUT)
// under a running federated session; the session renews its part for the
// member (the old upstream session ended with the old connection), and the
// member's answer quoting the token it was sent before has it redacted.
func TestRetired4HoldsFederatedSessionAfterNewPersonalToken(t *testing.T) {
	up := startR2(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo", Federation: " "})
	const old, rotated = "alice-federated-token-one-xxxxxx", "alice-federated-token-two-yyyyyy"
	lsPutToken(t, g, aliceKey, old)
	fm := faRunner(t, g, aliceKey, `{}`)
	faRPC(t, fm, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	lsPutToken(t, g, aliceKey, rotated)
	ans := faRPC(t, fm, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	if got := up.callTokens(); !slices.Equal(got, []string{old, rotated}) {
		t.Fatalf("premise: the federated calls carried %q, want the old token then the new one: %s", got, ans)
	}
	if !strings.Contains(string(ans), "before") {
		t.Fatalf("premise: the member's answer did not reach the runner: %s", ans)
	}
	if found := rt4Holds(string(ans), old); len(found) != 0 {
		t.Errorf("alice's federated runner got the personal token she replaced: %s", ans)
	}
}

// Holds: a stream resumed after a refresh. Alice's call's stream drops
// after an event with an id; toolgate refreshes her OAuth grant (T1 to
// T2, after the upstream refused another call of hers); her runner
// resumes with Last-Event-ID, toolgate resumes the upstream's stream with
// T2 (resumeForRunner: the current credential, the original one kept in
// the response's sent list), and the upstream's answer quotes T1 (the
// token of the call) and T2 (the resume's). Neither reaches the runner.
func TestRetired4HoldsResumedStreamAfterRefresh(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startUpstream(t)
	quit := make(chan struct{})
	var mu sync.Mutex
	var callID, callToken string
	var refuse atomic.Int32
	refuse.Store(1)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch {
		case r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") == "r4-1":
			mu.Lock()
			id, first := callID, callToken
			mu.Unlock()
			rrSSE(w)
			rrEvent(w, "r4-2", rt4Answer(id, rt4Text("resumed: the call's "+first+" the resume's "+tok)))
			return true
		case r.Method == http.MethodPost && strings.Contains(string(body), "resume-me"):
			mu.Lock()
			callID, callToken = rrID(body), tok
			mu.Unlock()
			rrSSE(w)
			rrEvent(w, "r4-1", rrNote("working"))
			select {
			case <-r.Context().Done():
			case <-quit:
			}
			return true
		case r.Method == http.MethodPost && strings.Contains(string(body), "refuse-me") && refuse.Add(-1) >= 0:
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, "invalid token", http.StatusUnauthorized)
			return true
		}
		return false
	})
	t.Cleanup(func() { close(quit) })
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Timeout: "30s"})
	g.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	m := r2Fresh(t, g, aliceKey)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, drop := context.WithCancel(ctx)
	r0, err := m.send(first, http.MethodPost, "application/json, text/event-stream",
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"resume-me"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	text := raRead(t, r0.Body, "the first event", func(s string) bool { return strings.Contains(s, "working") && raHasID(s) })
	lastID := raLastID(text)
	drop()
	r0.Body.Close()

	if ans := m.call(8, "echo", `{"text":"refuse-me"}`); !strings.Contains(string(ans), "refuse-me") {
		t.Fatalf("premise: the refused call was not sent again after a refresh: %s", ans)
	}
	t2 := p.lastIssuedAccess(t)
	if t2 == t1 {
		t.Fatal("premise: toolgate did not refresh the grant")
	}
	status, resumed, err := raGet(ctx, m, lastID)
	if err != nil || status != http.StatusOK || !strings.Contains(resumed, "resumed:") {
		t.Fatalf("premise: the resume got %d %v %.500s", status, err, resumed)
	}
	mu.Lock()
	sentWith := callToken
	mu.Unlock()
	if sentWith != t1 {
		t.Fatal("premise: the call did not go upstream with T1")
	}
	if found := rt4Holds(resumed, t1, t2); len(found) != 0 {
		t.Errorf("alice's resumed stream got an access token (%d of T1, T2): %s", len(found), resumed)
	}
}

// Holds: tasks created under T1, read after toolgate refreshed the grant
// to T2 (the same grant: the MCP session and its tasks go on). The
// upstream's tasks/get status message, its tasks/result and a
// notifications/tasks/status on the standalone stream quote the token it
// was sent before and the one it is sent now: each is searched (as every
// answer and message of the session is, with the connection as it stands),
// and nothing of either reaches the runner.
func TestRetired4HoldsTaskAnswersAfterRefresh(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	const task = "r4-task-1"
	up := startRT4(t, func(msg gjson.Result, token string, seen []string) (int, string) {
		id := msg.Get("id").Raw
		switch msg.Get("method").String() {
		case "tools/call":
			if !msg.Get("params.task").Exists() {
				return 0, ""
			}
			return http.StatusOK, rt4Answer(id, `{"task":{"taskId":"`+task+`","status":"working","createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:00Z","ttl":60000,"pollInterval":100}}`)
		case "tasks/get":
			return http.StatusOK, rt4Answer(id, `{"taskId":"`+task+`","status":"completed","statusMessage":`+strconv.Quote(rt4Quote("task-get", token, seen))+
				`,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:01Z","ttl":60000}`)
		case "tasks/result":
			return http.StatusOK, rt4Answer(id, rt4Text(rt4Quote("task-result", token, seen)))
		}
		return 0, ""
	})
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Tools: "echo"})
	g.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	m := r2Fresh(t, g, aliceKey)
	stream, stop := rcStream(t, m)
	defer stop()
	rt4WaitStream(t, up, 1)
	created := rdRequest(t, m, 1, "tools/call", `{"name":"echo","arguments":{"text":"t"},"task":{"ttl":60000}}`)
	if !strings.Contains(string(created), task) {
		t.Fatalf("premise: no task was created: %s", created)
	}
	up.refuseNext(1)
	rdCall(t, m, 2)
	t2 := p.lastIssuedAccess(t)
	if t2 == t1 || !slices.Contains(up.tokens(), t2) {
		t.Fatal("premise: toolgate did not refresh the grant and send T2")
	}
	for i, method := range []string{"tasks/get", "tasks/result"} {
		ans := rdRequest(t, m, 3+i, method, `{"taskId":"`+task+`"}`)
		if !strings.Contains(string(ans), "before") {
			t.Fatalf("premise: the upstream's %s answer did not reach the runner: %s", method, ans)
		}
		if found := rt4Holds(string(ans), t1, t2); len(found) != 0 {
			t.Errorf("alice's %s of a task created under T1 got an access token after the refresh: %s", method, ans)
		}
	}
	status := `{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"taskId":"` + task + `","status":"working","statusMessage":` +
		strconv.Quote("status-quote old "+t1+" now "+t2) + `,"createdAt":"2026-01-01T00:00:00Z","lastUpdatedAt":"2026-01-01T00:00:02Z","ttl":60000}}`
	if n := up.push(status); n != 1 {
		t.Fatalf("premise: %d standalone streams took the status, want 1", n)
	}
	msg, _ := rcNext(stream, "status-quote", 5*time.Second)
	if msg == "" {
		t.Fatal("premise: the task's status notification did not reach the runner")
	}
	if found := rt4Holds(msg, t1, t2); len(found) != 0 {
		t.Errorf("alice's stream got an access token in a task's status notification after the refresh: %s", msg)
	}
}

// Holds: the JSON body of an upstream's 4xx answer (rejectedResponse) is
// searched like any answer: after alice replaced her personal token, a 400
// quoting the one it was sent before and the one it is sent now reaches
// her runner with both redacted; and a 401 with a JSON-RPC body quoting
// both, answered to the refreshed OAuth token within a minute of the
// refresh (the runner gets needs_sign_in), gives her runner neither.
func TestRetired4HoldsRejectedBodiesAfterTheTokenChanged(t *testing.T) {
	var refusals atomic.Int32
	hook := func(msg gjson.Result, token string, seen []string) (int, string) {
		if msg.Get("method").String() != "tools/call" {
			return 0, ""
		}
		id := msg.Get("id").Raw
		switch msg.Get("params.arguments.text").String() {
		case "bad-request":
			return http.StatusBadRequest, `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32602,"message":` + strconv.Quote(rt4Quote("rejected", token, seen)) + `}}`
		case "refuse-json":
			if refusals.Add(1) <= 2 {
				return http.StatusUnauthorized, `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32001,"message":` + strconv.Quote(rt4Quote("unauthorized", token, seen)) + `}}`
			}
		}
		return 0, ""
	}

	up := startRT4(t, hook)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo"})
	const old, rotated = "alice-rejected-token-one-xxxxxx", "alice-rejected-token-two-yyyyyy"
	lsPutToken(t, g, aliceKey, old)
	rdCall(t, r2Fresh(t, g, aliceKey), 1)
	lsPutToken(t, g, aliceKey, rotated)
	ans := rdRequest(t, r2Fresh(t, g, aliceKey), 2, "tools/call", `{"name":"echo","arguments":{"text":"bad-request"}}`)
	if got := up.tokens(); !slices.Equal(got, []string{old, rotated}) {
		t.Fatalf("premise: the upstream was sent %q, want the old token then the new one", got)
	}
	if !strings.Contains(string(ans), "rejected before") {
		t.Fatalf("premise: the 400's body did not reach the runner: %s", ans)
	}
	if found := rt4Holds(string(ans), old, rotated); len(found) != 0 {
		t.Errorf("alice's runner got a personal token in the body of a 400 answer: %s", ans)
	}

	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	upo := startRT4(t, hook)
	og := oauthGatewayAt(t, p, upo.URL, gatewayConfig{Tools: "echo"})
	og.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	ans = rdRequest(t, r2Fresh(t, og, aliceKey), 3, "tools/call", `{"name":"echo","arguments":{"text":"refuse-json"}}`)
	t2 := p.lastIssuedAccess(t)
	if got := upo.tokens(); len(got) != 2 || got[0] != t1 || got[1] != t2 || t1 == t2 {
		t.Fatalf("premise: the upstream was sent %d tokens, want T1 then the refreshed T2", len(got))
	}
	if refusals.Load() != 2 {
		t.Fatalf("premise: the upstream refused %d times, want 2", refusals.Load())
	}
	if found := rt4Holds(string(ans), t1, t2); len(found) != 0 {
		t.Errorf("alice's runner got an access token from a refusal's body: %s", ans)
	}
}

// Holds: a legacy SSE server (2024-11-05, modules/upstreams/sse) quoting,
// on its stream, the personal token it was sent before alice replaced it
// (connecting again ends her legacy sessions; the next opens a stream
// with the new one) and the one it is sent now: the bridged answer passes
// toolgate_proxy's search, and neither reaches her runner.
func TestRetired4HoldsLegacyServerAfterNewPersonalToken(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	l := startLegacy(t, legacyHooks{post: func(s *legacyStream, m legacyMsg, w http.ResponseWriter) bool {
		tok := strings.TrimPrefix(m.Header.Get("Authorization"), "Bearer ")
		mu.Lock()
		if tok != "" && !slices.Contains(seen, tok) {
			seen = append(seen, tok)
		}
		all := slices.Clone(seen)
		mu.Unlock()
		if m.Method != "tools/call" {
			return false
		}
		s.send(rt4Answer(string(m.ID), rt4Text(rt4Quote("legacy", tok, all))))
		w.WriteHeader(http.StatusAccepted)
		return true
	}})
	g := legacyGateway(t, l, gatewayConfig{}, "auth bearer")
	const old, rotated = "alice-legacy-token-one-xxxxxxxx", "alice-legacy-token-two-yyyyyyyy"
	put := func(tok string) {
		t.Helper()
		if r := g.api(t, http.MethodPut, "/v1/connections/legacy", aliceKey, []byte(`{"token":"`+tok+`"}`)); r.StatusCode != http.StatusNoContent {
			t.Fatalf("PUT /v1/connections/legacy: %d %s", r.StatusCode, r.Body)
		}
	}
	session := func() *rawMCP {
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "legacy"), "legacy")
		m.initialize()
		return m
	}
	put(old)
	_, _, msgs := session().post(fmt.Sprintf(legacyEcho, 1, "hi"))
	if len(msgs) == 0 {
		t.Fatal("premise: no answer to the first call")
	}
	put(rotated)
	_, _, msgs = session().post(fmt.Sprintf(legacyEcho, 2, "hi"))
	mu.Lock()
	got := slices.Clone(seen)
	mu.Unlock()
	if !slices.Equal(got, []string{old, rotated}) {
		t.Fatalf("premise: the legacy server was sent %q, want the old token then the new one", got)
	}
	if !bytesContain(msgs, "legacy before") {
		t.Fatalf("premise: the server's answer did not reach the runner: %s", msgs)
	}
	for _, msg := range msgs {
		if found := rt4Holds(string(msg), old, rotated); len(found) != 0 {
			t.Errorf("alice's runner got a personal token from the legacy server: %s", msg)
		}
	}
}

// Holds: a stateless (2026-07-28) runner's call held between rounds
// (modules/mcpproxy/rounds.go) across a refresh. The call goes upstream
// with alice's OAuth access token T1 and the upstream asks her client
// something (elicitation/create): toolgate holds the call and answers
// input_required. A call of hers is refused meanwhile, and toolgate
// refreshes the grant to T2. Her retry continues the held call: her input
// goes upstream with T2 (continueHeld: the current credential), and the
// upstream's answer on the held call's stream quotes T1 and T2. Neither
// reaches the runner (the held call's stream is searched for the call's
// credential, those sent since and the connection as it stands).
func TestRetired4HoldsHeldStatelessCallAcrossRefresh(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startUpstream(t)
	quit := make(chan struct{})
	answered := make(chan string, 1)
	var mu sync.Mutex
	var callToken string
	var refuse atomic.Int32
	refuse.Store(1)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		msg := gjson.ParseBytes(body)
		switch {
		case r.Method != http.MethodPost:
			return false
		case msg.Get("method").String() == "tools/call" && msg.Get("params.arguments.text").String() == "held-r4":
			mu.Lock()
			callToken = tok
			mu.Unlock()
			rrSSE(w)
			rrEvent(w, "", `{"jsonrpc":"2.0","id":"el-r4","method":"elicitation/create","params":{"message":"go on?","requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"}}}}}`)
			var with string
			select {
			case with = <-answered:
			case <-r.Context().Done():
				return true
			case <-quit:
				return true
			}
			rrEvent(w, "", rt4Answer(msg.Get("id").Raw, rt4Text("held-answer: the call's "+callToken+" the input's "+with)))
			return true
		case msg.Get("id").String() == "el-r4" && msg.Get("result").Exists():
			select {
			case answered <- tok:
			default:
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		case msg.Get("params.arguments.text").String() == "refuse-me" && refuse.Add(-1) >= 0:
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, "invalid token", http.StatusUnauthorized)
			return true
		}
		return false
	})
	t.Cleanup(func() { close(quit) })
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Timeout: "30s", Extra: "tool_pins off"})
	g.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	session := g.createSession(t, aliceKey, "svc")
	status, ans := saSend(t, g, "/v1/mcp/svc", aliceKey, session, "tools/call", "ask",
		saCall(1, "ask", `{"text":"held-r4"}`, `{"elicitation":{}}`, ""), nil)
	res := aaResult(ans)
	state, _ := res["requestState"].(string)
	requests, _ := res["inputRequests"].(map[string]any)
	if status != http.StatusOK || res["resultType"] != "input_required" || state == "" || len(requests) != 1 {
		t.Fatalf("premise: the first round was not held for input: HTTP %d %v", status, ans)
	}
	var key string
	for k := range requests {
		key = k
	}
	if status, ans := saSend(t, g, "/v1/mcp/svc", aliceKey, session, "tools/call", "echo",
		saCall(2, "echo", `{"text":"refuse-me"}`, `{}`, ""), nil); status != http.StatusOK || !strings.Contains(aaJSON(ans), "refuse-me") {
		t.Fatalf("premise: the refused call was not sent again after a refresh: HTTP %d %v", status, ans)
	}
	t2 := p.lastIssuedAccess(t)
	if t2 == t1 {
		t.Fatal("premise: toolgate did not refresh the grant")
	}
	status, ans = saSend(t, g, "/v1/mcp/svc", aliceKey, session, "tools/call", "ask",
		saCall(3, "ask", `{"text":"held-r4"}`, `{"elicitation":{}}`,
			`,"inputResponses":{`+aaJSON(key)+`:{"action":"accept","content":{"ok":true}}},"requestState":`+aaJSON(state)), nil)
	text := aaJSON(ans)
	if status != http.StatusOK || !strings.Contains(text, "held-answer") {
		t.Fatalf("premise: the retry did not get the held call's answer: HTTP %d %s", status, text)
	}
	mu.Lock()
	first := callToken
	mu.Unlock()
	if first != t1 {
		t.Fatal("premise: the held call did not go upstream with T1")
	}
	if found := rt4Holds(text, t1, t2); len(found) != 0 {
		t.Errorf("alice's stateless runner got an access token in the answer of a call held across a refresh: %s", text)
	}
}
