package integration

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// A second look at the tokens a connection no longer sends
// (gateway.Connection.Retired, commit 71fe40b): where a token an upstream
// was sent still reaches the runner.

// r2Upstream is a Streamable HTTP MCP server that remembers every token
// it was sent and quotes them back: its tools/call answers name every
// token it was sent before the request's own; refuse makes the next
// tools/calls answer 401 (toolgate then refreshes an OAuth grant); push
// sends a message on the open standalone GET stream.
type r2Upstream struct {
	URL string

	mu       sync.Mutex
	n        int
	refuse   int
	seen     []string        // every token, in the order first sent
	calls    []string        // the token of each tools/call, in order
	sessions map[string]bool // open upstream sessions
	streams  getStreams
}

func startR2(t *testing.T) *r2Upstream {
	t.Helper()
	u := &r2Upstream{sessions: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	u.URL = srv.URL + "/mcp"
	return u
}

func (u *r2Upstream) tokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

func (u *r2Upstream) callTokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.calls)
}

func (u *r2Upstream) refuseNext(n int) {
	u.mu.Lock()
	u.refuse = n
	u.mu.Unlock()
}

// streamCount is how many GET streams are open.
func (u *r2Upstream) streamCount() int { return u.streams.count() }

// push sends msg on every open GET stream; how many took it.
func (u *r2Upstream) push(msg string) int { return u.streams.pushAll(msg) }

func (u *r2Upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	msg := gjson.ParseBytes(body)
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	session := r.Header.Get("Mcp-Session-Id")
	u.mu.Lock()
	if token != "" && !slices.Contains(u.seen, token) {
		u.seen = append(u.seen, token)
	}
	known := u.sessions[session]
	u.mu.Unlock()

	switch r.Method {
	case http.MethodDelete:
		u.mu.Lock()
		delete(u.sessions, session)
		u.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	case http.MethodGet:
		if !known {
			http.Error(w, "unknown session", http.StatusNotFound)
			return
		}
		u.streams.serve(w, r, session)
		return
	}
	method := msg.Get("method").String()
	if method == "initialize" {
		u.mu.Lock()
		u.n++
		id := "r2-sess-" + strconv.Itoa(u.n)
		u.sessions[id] = true
		u.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", id)
		rcJSON(w, msg.Get("id").Raw, `{"protocolVersion":`+msg.Get("params.protocolVersion").Raw+
			`,"capabilities":{"tools":{},"logging":{}},"serverInfo":{"name":"r2","version":"1"}}`)
		return
	}
	if !known {
		http.Error(w, "unknown session", http.StatusNotFound)
		return
	}
	if !msg.Get("method").Exists() || !msg.Get("id").Exists() {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch method {
	case "tools/list":
		rcJSON(w, msg.Get("id").Raw, `{"tools":[{"name":"echo","description":"Echo.","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}}]}`)
	case "tools/call":
		u.mu.Lock()
		refused := u.refuse > 0
		if refused {
			u.refuse--
		}
		u.calls = append(u.calls, token)
		var before []string
		for _, s := range u.seen {
			if s != token {
				before = append(before, s)
			}
		}
		u.mu.Unlock()
		if refused {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, "invalid token", http.StatusUnauthorized)
			return
		}
		text := "the tokens you sent me before: " + strings.Join(before, ", ")
		rcJSON(w, msg.Get("id").Raw, `{"content":[{"type":"text","text":`+strconv.Quote(text)+`}]}`)
	default:
		rcJSON(w, msg.Get("id").Raw, `{}`)
	}
}

// r2Fresh starts a new MCP session of key's user for svc on g.
func r2Fresh(t *testing.T, g *gateway, key string) *rawMCP {
	t.Helper()
	m := g.raw(t, key, g.createSession(t, key, "svc"), "svc")
	m.initialize()
	return m
}

// Attack (fixed): the upstream refuses alice's OAuth access token T1 (401) although
// the provider still honours it; toolgate refreshes, and the provider
// refuses the refresh token (expired, revoked, rotated away: invalid_grant).
// App.refresh then deletes the connection (ConnectionStore.Reject), and
// T1 — sent upstream, unexpired, not revoked — is in no record any more.
// Alice connects again (T2); the upstream answers her next call quoting
// T1, and nothing searches for it: her runner gets a live access token.
// README: "An upstream that writes back … a token of that person's it was
// sent before, which toolgate replaced since (an OAuth token refreshed …
// after the upstream refused it, until it expires …)" is redacted; here
// the refusal ended in a rejection instead of a refresh, and connecting
// again is the replacement. Fixed: the rejection mark keeps the deleted
// grant's access token and retired tokens, sealed, and the next Connect
// keeps them as retired (ConnectionStore.Reject, ConnectionStore.rejected).
func TestRetired2AttackRejectedGrantForgetsItsLiveToken(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startR2(t)
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Tools: "echo"})
	g.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	var refresh string
	for _, c := range p.calls() {
		if c.IssuedAccess == t1 {
			refresh = c.IssuedRefresh
		}
	}
	rdCall(t, r2Fresh(t, g, aliceKey), 1)
	if refresh == "" {
		t.Fatal("premise: no refresh token was issued with the first access token")
	}
	if err := p.manager.RemoveRefreshToken(t.Context(), refresh); err != nil {
		t.Fatalf("revoking the refresh token at the provider: %v", err)
	}
	up.refuseNext(1)
	refused := rdCall(t, r2Fresh(t, g, aliceKey), 2)
	if !strings.Contains(string(refused), "sign") && !strings.Contains(string(refused), "connect") {
		t.Fatalf("premise: the refused call was not answered with needs_sign_in: %s", refused)
	}
	g.connectOAuth(t, aliceKey)
	t2 := p.lastIssuedAccess(t)
	ans := rdCall(t, r2Fresh(t, g, aliceKey), 3)
	if got := up.tokens(); !slices.Equal(got, []string{t1, t2}) || t1 == t2 {
		t.Fatalf("premise: the upstream was sent %d tokens, want T1 then T2", len(got))
	}
	if user, err := p.userOf(t.Context(), "Bearer "+t1); err != nil || user == "" {
		t.Fatalf("premise: the provider no longer honours T1 (%v)", err)
	}
	if !strings.Contains(string(ans), "before") {
		t.Fatalf("premise: the upstream's answer did not reach the runner: %s", ans)
	}
	if strings.Contains(rdDecoded(ans), t1) {
		t.Errorf("alice's runner got her access token T1, which the provider still honours, after the refused refresh deleted her grant and she connected again: %s", ans)
	}
}

// Attack (fixed): alice's runner opens its standalone GET stream (gateway.Call
// with her OAuth access token T1: the stream's search is fixed to that
// credential, modules/mcpproxy/stream.go). Her next tools/call is refused
// by the upstream (401); toolgate refreshes the grant (the same grant:
// the stream stays open) and sends the call again with T2. The upstream
// then writes T2 — the token toolgate sends for alice now — in a
// notification on the standalone stream. The stream searches for T1 and
// T1's connection's retired tokens only (Credential.EachSecret of the
// credential it opened with): T2 reaches the runner. The commit's
// mechanism keeps tokens of the past for later calls; a long-lived stream
// never learns of tokens of its future. README: "An upstream that writes
// back the credential toolgate attached to the call … (in a result, an
// error, a notification …) has it replaced by `[REDACTED:credential]`";
// "Upstream URLs and credentials never leave the gateway". (The listens of
// a stateless runner were fixed for this, TestListenShareAttackRotatedTokenReachesJoinedListen,
// each listen searching its own call's credential; the stateful stream
// has no later call.) Fixed: every search of what an upstream sends looks
// for the connection's tokens as they stand now too (App.EachCallSecret:
// its current token and retired ones), besides the call's own credential.
func TestRetired2AttackStandaloneStreamMissesTheRefreshedToken(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startR2(t)
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Tools: "echo"})
	g.connectOAuth(t, aliceKey)
	m := r2Fresh(t, g, aliceKey)
	stream, stop := rcStream(t, m)
	defer stop()
	for i := 0; up.streamCount() == 0; i++ {
		if i > 200 {
			t.Fatal("premise: the runner's GET did not reach the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t1 := p.lastIssuedAccess(t)
	// Control: T1, the stream's own, written back on it, is redacted.
	up.push(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"control ` + t1 + `"}}`)
	if msg, _ := rcNext(stream, "control", 5*time.Second); msg == "" || strings.Contains(msg, t1) {
		t.Fatalf("premise: the stream's own token on the stream: %q", msg)
	}
	up.refuseNext(1)
	rdCall(t, m, 1)
	calls := up.callTokens()
	if len(calls) != 2 || calls[0] != t1 || calls[1] == t1 {
		t.Fatalf("premise: the call was not refused with T1 and sent again with a refreshed token (%d calls)", len(calls))
	}
	t2 := calls[1]
	if n := up.push(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"now ` + t2 + `"}}`); n != 1 {
		t.Fatalf("premise: the standalone stream closed at the refresh (%d open)", n)
	}
	msg, _ := rcNext(stream, "now", 5*time.Second)
	if msg == "" {
		t.Fatalf("premise: the notification did not reach the runner's stream")
	}
	if strings.Contains(msg, t2) {
		t.Errorf("alice's runner got her current access token on its standalone stream, opened before the refresh: %s", msg)
	}
}

// Holds: two replicas on one PostgreSQL storage, which announces every
// change. Replica b has alice's connection cached with her first personal
// token; she stores a second through replica a (the answer waits until
// every replica was sent the change) and calls through a. Her session
// through b ends (b drops its copy as the change arrives); her next call
// through b carries the second token, and the upstream's answer
// quoting the first has it redacted.
// (On a storage that announces nothing, file_system across replicas, b
// would send the first token for up to cache_ttl, and not know the second
// if the upstream quoted it: README, "Running several replicas".)
func TestRetired2HoldsCurrentTokenThroughAnotherReplica(t *testing.T) {
	up := startR2(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo", "auth bearer", "")
	})
	const first, second = "alice-personal-token-first-0001", "alice-personal-token-second-0002"
	lsPutToken(t, a.gateway, aliceKey, first)
	mb := b.raw(t, aliceKey, b.createSession(t, aliceKey, "svc"), "svc")
	mb.initialize()
	rdCall(t, mb, 1) // b reads alice's connection: the first token, cached
	lsPutToken(t, a.gateway, aliceKey, second)
	ma := a.raw(t, aliceKey, a.createSession(t, aliceKey, "svc"), "svc")
	ma.initialize()
	rdCall(t, ma, 2)
	// b drops its copy as the announcement arrives there, a moment after
	// the PUT was answered: its old session ends then (404).
	for id := 3; ; id++ {
		got := rcCall(mb, id, "echo")
		if strings.Contains(got, "HTTP 404") {
			break
		}
		if id == 50 {
			t.Fatalf("alice's session through b after she connected another token: %s, want 404 (b learned of the change)", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mb = b.raw(t, aliceKey, b.createSession(t, aliceKey, "svc"), "svc")
	mb.initialize()
	ans := rdCall(t, mb, 100)
	if calls := up.callTokens(); len(calls) < 3 || calls[len(calls)-1] != second {
		t.Fatalf("the calls carried %q, want the last through b with the second token (b's copy dropped as the change arrived)", calls)
	}
	if !strings.Contains(string(ans), "before") {
		t.Fatalf("premise: the upstream's answer did not reach the runner: %s", ans)
	}
	if d := rdDecoded(ans); strings.Contains(d, first) || strings.Contains(d, second) {
		t.Errorf("alice's runner got one of her personal tokens through the other replica: %s", ans)
	}
}

// Holds: the retired tokens of one user are never searched for in
// another's answers, nor revealed: bob's calls after alice replaced her
// token are answered with alice's tokens as the upstream wrote them
// (nothing of alice's is looked for in bob's answers: a redaction there
// would tell bob which of his text is alice's token), and alice's own
// answers have her replaced token redacted.
func TestRetired2HoldsRetiredTokensArePerUser(t *testing.T) {
	up := startR2(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo"})
	const aliceOld, aliceNew, bobs = "alice-token-old-xxxxxxxx", "alice-token-new-yyyyyyyy", "bob-token-zzzzzzzzzzzz"
	lsPutToken(t, g, aliceKey, aliceOld)
	rdCall(t, r2Fresh(t, g, aliceKey), 1)
	lsPutToken(t, g, aliceKey, aliceNew)
	lsPutToken(t, g, bobKey, bobs)
	ans := rdCall(t, r2Fresh(t, g, bobKey), 2)
	if !strings.Contains(rdDecoded(ans), aliceOld) {
		t.Errorf("bob's answer had alice's retired token searched for (or the premise failed): %s", ans)
	}
	ans = rdCall(t, r2Fresh(t, g, aliceKey), 3)
	if d := rdDecoded(ans); strings.Contains(d, aliceOld) || !strings.Contains(d, "REDACTED") {
		t.Errorf("alice's answer did not have her replaced token redacted: %s", ans)
	}
}

// Attack (fixed): the same on a 2026-07-28 runner's subscriptions/listen. Alice's
// listen opens while her OAuth access token T1 is fresh; the listen's
// messages are searched for the credential of its own call
// (listenLegacy: redactCredential(call, msg)), T1 and what T1's
// connection had retired. T1 nears its expiry and a call of hers through
// another MCP session makes toolgate refresh it to T2 (the same grant: the
// listen goes on). The upstream writes T2 in a notification the listen
// asked for, on the standalone stream it reads: T2 — the token toolgate
// sends for alice now — reaches the runner. README: "An upstream that
// writes back the credential toolgate attached to the call … (in … a
// notification …) has it replaced by `[REDACTED:credential]`";
// "Upstream URLs and credentials never leave the gateway". Fixed as the
// standalone stream was.
func TestRetired2AttackListenMissesTheRefreshedToken(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: 4 * time.Second, RefreshedAccessTTL: time.Hour})
	up := startUpstream(t)
	s := lsHijackStreams(up)
	auth := strings.Replace(oauthBlock(p, ""), "refresh_skew 200ms", "refresh_skew 1500ms", 1)
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Auth: auth})
	g.connectOAuth(t, aliceKey)
	t1 := p.lastIssuedAccess(t)
	br, _, _ := lsListen(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `["test://watched"]`)
	lines := lsLines(br)
	lsWaitOpen(t, s, 1)
	lsJoined(t, s, "test://watched", lines)

	m := r2Fresh(t, g, aliceKey)
	deadline := time.Now().Add(15 * time.Second)
	for id := 1; p.lastIssuedAccess(t) == t1; id++ {
		if time.Now().After(deadline) {
			t.Fatal("premise: toolgate never refreshed the token")
		}
		rdCall(t, m, id)
		time.Sleep(100 * time.Millisecond)
	}
	t2 := p.lastIssuedAccess(t)
	if !s.sawPostWith("Bearer " + t2) {
		t.Fatal("premise: the refreshed token did not go upstream")
	}
	if n := s.broadcast(lsUpdated("test://watched", `"_meta":{"echo":`+aaJSON(t2)+`}`)); n != 1 {
		t.Fatalf("premise: %d standalone streams open, want the listen's", n)
	}
	got, ok := lsAwait(lines, "echo", 10*time.Second)
	if !ok {
		t.Fatalf("premise: the listen got no update: %q", got)
	}
	if line := got[len(got)-1]; strings.Contains(line, t2) {
		t.Errorf("alice's listen, opened before the refresh, got her current access token: %s", line)
	}
}
