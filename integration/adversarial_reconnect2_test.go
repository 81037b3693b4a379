package integration

// A second adversarial look at a caller connecting again (another personal
// token stored, or a new OAuth consent) under running MCP sessions
// (registry.current ends a session whose
// upstream session's grant is not the caller's connection's; attempt
// refuses to send an upstream session id with another grant's credential;
// idle expiry skips the DELETE on a grant change).
//
// FINDINGS (each test failed before its fix, in the same commit)
//
// Attack: a stateful runner in front of an upstream of the stateless
// revision only (a translated session: no upstream session id). A tool
// listing through account one is in progress; alice's echo passes the
// registry's check (current) as account one and waits for it; she stores
// account two's token; the listing ends. The call is decided with account
// one's read-only echo (allowed) and sent upstream with account two's
// token: attempt's grant check only guards requests that carry an
// upstream session id (modules/mcpproxy/upstream.go attempt; the
// translated session's Upstream.Grant is stamped but never compared for a
// request without Mcp-Session-Id).
// Holds: attempt compares the grant of any upstream session toolgate
// keeps (with an id or not) with the credential's: the call is refused,
// retryable, and never sent. (TestReconnect2AttackTranslatedCallDecidedForOldAccountRunsAsNewOne)
//
// Attack: the same race for a stateless (2026-07-28) runner: its request
// binds the implied session of account one's grant (mcp2026.Runtime.
// Session), the registry opens it and lists the tools through account one;
// alice stores account two's token meanwhile. The call is decided with
// account one's catalog and runs as account two (same cause: attempt
// compares grants only with an upstream session id; the implied session's
// grant, internal/mcp2026 Runtime.Session, is checked only at binding).
// Holds: the same check; a stateless runner is told to send the request
// again. (TestReconnect2AttackStatelessCallDecidedForOldAccountRunsAsNewOne)
//
// Attack: two replicas sharing one file_system storage (no announcements,
// cache_ttl default). Alice stores account two's token through replica a
// and initializes a new session there (account two's). Replica b still
// has her old connection cached: its current() takes the new session for
// one whose caller "connected again" and ends it (404 "you connected to
// the service again", the stored record ended; a follows within
// cache_ttl). A runner spread over replicas gets its sessions of the
// current connection ended for up to cache_ttl after each reconnect. A
// stale read must not end a session opened through a newer connection
// (read the connection afresh, LoadFresh, before ending one).
// modules/registry/registry.go current, modules/gateway GrantFor (cache).
// Holds: a replica whose copy of the connection differs from the
// session's reads it from storage before ending anything (and then serves
// the session with the credential read). (TestReconnect2AttackStaleReplicaEndsNewConnectionsSession)
//
// Attack: a legacy SSE service (transport sse, auth bearer). Each time
// alice stores a token and initializes again, current() ends her old MCP
// session without ending its bridge session (no DELETE, and attempt would
// refuse one carrying the new grant): the GET stream opened at the server
// with the old token stays open until mcp_session_idle_timeout (1h by
// default), outside max_mcp_sessions limits. A user piles up upstream
// streams, each with another old token, by storing tokens in a loop. For
// a transport module the DELETE reaches no server (the bridge closes its
// stream), so nothing forbids ending it. modules/registry/registry.go
// current (End without the bridge's DELETE), modules/mcpproxy/handshake.go
// expired (returns on a grant change before its transport branch).
// Holds: a session ended as outdated goes to the end hook like an expired
// one, and a transport module's is ended there with no credential (the
// module answers the DELETE itself). (TestReconnect2AttackLegacyStreamsOfOldConnectionsPileUp)
//
// Attack: svc (auth bearer) is reloaded with one service-wide credential
// (auth header) at the same url. current() reads grant "" for a service
// without per-user credentials and lets the session through (as for a
// disconnected caller); attempt refuses the service-wide credential with
// account one's upstream session: every request gets -32011 retryable
// "you connected to the service again ...: initialize a new one", but the
// session is never ended (no 404), and the runner's retries keep it from
// idling out. It should end like a session whose caller connected again.
// modules/registry/registry.go current (grant "" conflates "no per-user
// credential" with "disconnected"), modules/mcpproxy/upstream.go attempt.
// Holds: a session opened through a caller's connection on a service that
// has no per-user credentials now ends (404). (TestReconnect2AttackReloadToSharedCredentialStrandsSession)
//
// HOLDS (these pass)
//
// Attack: bob stores another token; alice's session on the same service
// goes on (grants are per user).
// Holds: (TestReconnect2HoldsAnotherUsersReconnectEndsNothingOfMine)
//
// Attack: alice connects again to service svc; her session with service
// other (another per-user service) goes on, with its own token.
// Holds: (TestReconnect2HoldsOtherServiceUnaffected)
//
// Attack: a call in progress on the old upstream session (its answer
// streamed slowly) while alice connects again and her next request ends
// the session: the call's stream ends, nothing of the old session reaches
// the runner afterwards (not even the call's result), and a resume
// (Last-Event-ID) of its stream on the ended session is refused (404); no
// request mixes accounts.
// Holds: (TestReconnect2HoldsInFlightCallAndResumeEndWithSession)
//
// Attack: disconnect, then connect again as another account while the
// session is idle in between (the grant "" window): the session is told
// needs_sign_in, then ended (404); no request carries account two's token
// with account one's upstream session, and the session's GET stream ends.
// Holds: (TestReconnect2HoldsDisconnectWindowNoMix)
//
// Attack: replicas on PostgreSQL; the runner's standalone GET stream is
// held by replica b while alice connects again and ends the session
// through replica a: b's stream ends, its upstream GET is closed, and
// account one's later server request does not reach the runner.
// Holds: (TestReconnect2HoldsStreamOnOtherReplicaEnds)

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// rc2Modern is an upstream of the stateless revision only (2026-07-28)
// telling accounts apart by their bearer token ("token-one" is account
// one): echo is read-only for account one only; a tools/list of an
// account can be held until the test lets it go.
type rc2Modern struct {
	URL string

	mu    sync.Mutex
	calls []string // "tools/call <name> as <account>"
	listHolds
}

func startRC2Modern(t *testing.T) *rc2Modern {
	t.Helper()
	u := &rc2Modern{}
	srv := httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		u.releaseAll()
		srv.CloseClientConnections()
		srv.Close()
	})
	u.URL = srv.URL + "/mcp"
	return u
}

func (u *rc2Modern) callsSeen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.calls...)
}

func (u *rc2Modern) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, _ := io.ReadAll(r.Body)
	msg := gjson.ParseBytes(body)
	account := rcAccount(r)
	id := msg.Get("id")
	if !id.Exists() {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	status, payload := http.StatusOK, ""
	switch msg.Get("method").String() {
	case "server/discover":
		payload = `"result":{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}},` +
			`"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"rc2-modern","version":"1"}},"ttlMs":0,"cacheScope":"private"}`
	case "tools/list":
		if !u.waitList(r, account) {
			return
		}
		echo := `{"name":"echo","description":"Echo.",`
		if account == "one" {
			echo += `"annotations":{"readOnlyHint":true},`
		}
		echo += `"inputSchema":{"type":"object"}}`
		payload = `"result":{"resultType":"complete","tools":[` + echo + `],"ttlMs":0,"cacheScope":"private"}`
	case "tools/call":
		name := msg.Get("params.name").String()
		u.mu.Lock()
		u.calls = append(u.calls, "tools/call "+name+" as "+account)
		u.mu.Unlock()
		payload = `"result":{"resultType":"complete","content":[{"type":"text","text":` + strconv.Quote("ran as "+account) + `}]}`
	default:
		status, payload = http.StatusNotFound, `"error":{"code":-32601,"message":"Method not found"}`
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+id.Raw+`,`+payload+`}`)
}

// rc2Await waits for a result on c.
func rc2Await(t *testing.T, c <-chan string, what string) string {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return ""
	}
}

// TestReconnect2AttackTranslatedCallDecidedForOldAccountRunsAsNewOne:
// alice's stateful runner in front of a 2026-07-28-only upstream; the
// upstream holds the session's first tool listing (through account one);
// her echo passes the registry's check and waits for it; she stores
// account two's token; the listing ends. What happens: the call is
// decided with account one's read-only echo (allowed) and runs as account
// two. What should happen: as for a stateful upstream (attempt refuses
// another grant's credential), a call decided for one connection is not
// sent through another: refused (initialize a new one) or decided again
// (account two's echo is sent for approval).
func TestReconnect2AttackTranslatedCallDecidedForOldAccountRunsAsNewOne(t *testing.T) {
	up := startRC2Modern(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: "bearer", Extra: "tool_pins off"})
	lsPutToken(t, g, aliceKey, "token-one")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", status, msgs)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	arrived, release := up.holdList("one")
	defer release()
	initialized := make(chan string, 1)
	go func() {
		resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "")
		if err != nil {
			initialized <- err.Error()
			return
		}
		resp.Body.Close()
		initialized <- strconv.Itoa(resp.StatusCode)
	}()
	rcWait(t, arrived, "the session's first tool listing, through account one")

	done := make(chan string, 1)
	go func() { done <- rcCall(m, 2, "echo") }()
	time.Sleep(700 * time.Millisecond) // past the registry's check, waiting for the listing
	lsPutToken(t, g, aliceKey, "token-two")
	release()
	ans := rc2Await(t, done, "alice's echo")
	rc2Await(t, initialized, "notifications/initialized")
	if strings.Contains(ans, "ran as two") {
		t.Errorf("a call decided with account one's catalog (read-only echo) ran as account two: %s; upstream saw %v; "+
			"want it refused (initialize a new one) or decided again (approval)", ans, up.callsSeen())
	}
}

// rc2Stateless posts a stateless (2026-07-28) tools/call of tool without
// failing t: the HTTP status and the answer (the last SSE data line).
func rc2Stateless(g *gateway, key, session string, id int, tool string) string {
	body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":{},` + aaStatelessMeta(`{}`) + `}}`
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/mcp/svc", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Toolgate-Session", session)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	resp, err := (&http.Client{Transport: g.transport(), Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	return fmt.Sprintf("HTTP %d %s", resp.StatusCode, answerBody(resp))
}

// TestReconnect2AttackStatelessCallDecidedForOldAccountRunsAsNewOne: a
// stateless runner's first echo binds the implied session of alice's
// connection to account one, and the registry opens it (discovery, then
// the tool listing, held by the upstream, through account one). Alice
// stores account two's token meanwhile; the listing ends. What happens:
// the call is decided with account one's read-only echo and runs as
// account two. What should happen: refused or decided again as account
// two (sent for approval).
func TestReconnect2AttackStatelessCallDecidedForOldAccountRunsAsNewOne(t *testing.T) {
	up := startRC2Modern(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: "bearer", Extra: "tool_pins off"})
	lsPutToken(t, g, aliceKey, "token-one")
	session := g.createSession(t, aliceKey, "svc")
	arrived, release := up.holdList("one")
	defer release()
	done := make(chan string, 1)
	go func() { done <- rc2Stateless(g, aliceKey, session, 1, "echo") }()
	rcWait(t, arrived, "the implied session's tool listing, through account one")
	lsPutToken(t, g, aliceKey, "token-two")
	release()
	ans := rc2Await(t, done, "alice's stateless echo")
	if strings.Contains(ans, "ran as two") {
		t.Errorf("a stateless call decided with account one's catalog (read-only echo) ran as account two: %s; upstream saw %v; "+
			"want it refused or decided again (approval)", ans, up.callsSeen())
	}
	// Control: the next call is account two's own, decided with its echo.
	if ans := rc2Stateless(g, aliceKey, session, 2, "echo"); strings.Contains(ans, "ran as") {
		t.Errorf("account two's echo (not read-only) in a new implied session: %s; want it sent for approval", ans)
	}
}

// TestReconnect2AttackStaleReplicaEndsNewConnectionsSession: replicas a
// and b on one file_system directory. Alice's session runs through both
// (b caches her connection, account one). She stores account two's token
// through a, her runner is told to initialize again (through a) and calls
// as account two there. Her next call of that new session reaches b. What
// happens: b, still reading account one's connection from its cache,
// takes the new session for one whose caller connected again, and ends
// it: 404 through b, and the session is over on a too. What should
// happen: a session opened through the current connection is not ended
// because a replica has not seen that connection yet (read it afresh
// before ending).
func TestReconnect2AttackStaleReplicaEndsNewConnectionsSession(t *testing.T) {
	up, a, b := rcReplicas(t, "file_system")
	ma, mb := rcConnectedAgainThroughA(t, a, b)
	ma.sessionID = ""
	ma.initialize()
	if ans := rcCall(ma, 4, "change"); !strings.Contains(ans, "ran as two") {
		t.Fatalf("the new session through a: %s", ans)
	}
	mb.sessionID = ma.sessionID
	ansB := rcCall(mb, 5, "change")
	ansA := rcCall(ma, 6, "change")
	if strings.Contains(ansB, "ran as one") {
		t.Errorf("the new session (account two's) through b ran as account one: %s", ansB)
	}
	if strings.Contains(ansB, "HTTP 404") {
		t.Errorf("the session alice initialized through her new connection was ended by replica b's stale copy of the old one: "+
			"through b: %s (then through a: %s); want it to go on", ansB, ansA)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}

// TestReconnect2AttackLegacyStreamsOfOldConnectionsPileUp: a legacy SSE
// service with auth bearer; alice stores a token and initializes, five
// times over (each time her previous session is ended by current() at its
// next request). What happens: each ended session's GET stream to the
// server, opened with an old token, stays open (until the bridge's idle
// sweep, mcp_session_idle_timeout: 1h by default). What should happen: an
// ended session's bridge session ends (a transport module's DELETE reaches
// no server), as for an expired one.
func TestReconnect2AttackLegacyStreamsOfOldConnectionsPileUp(t *testing.T) {
	l := startLegacy(t, legacyHooks{})
	g := legacyGateway(t, l, gatewayConfig{}, "auth bearer")
	put := func(token string) {
		t.Helper()
		if r := g.api(t, http.MethodPut, "/v1/connections/legacy", aliceKey, []byte(`{"token":"`+token+`"}`)); r.StatusCode != http.StatusNoContent {
			t.Fatalf("PUT /v1/connections/legacy: %d %s", r.StatusCode, r.Body)
		}
	}
	session := g.createSession(t, aliceKey, "legacy")
	var prev *rawMCP
	for i := range 5 {
		put(fmt.Sprintf("alice-legacy-token-%d-0123456789", i))
		if prev != nil {
			if status, _, msgs := prev.post(`{"jsonrpc":"2.0","id":9,"method":"ping"}`); status != http.StatusNotFound {
				t.Fatalf("ping on the session of the previous token: %d %s, want 404", status, msgs)
			}
		}
		m := g.raw(t, aliceKey, session, "legacy")
		m.initialize()
		if _, _, msgs := m.post(fmt.Sprintf(legacyEcho, 1, "hi")); len(msgs) != 1 || !strings.Contains(string(msgs[0]), `"hi"`) {
			t.Fatalf("call %d: %s", i, msgs)
		}
		prev = m
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.openGET.Load() > 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := l.openGET.Load(); n > 1 {
		var tokens []string
		for i := range l.streamCount() {
			if s := l.stream(i); s != nil {
				tokens = append(tokens, strings.TrimPrefix(s.header.Get("Authorization"), "Bearer "))
			}
		}
		t.Errorf("one live MCP session, but %d GET streams open at the legacy server 5 s after the older sessions ended "+
			"(opened with tokens %v): the old connections' streams stay open until mcp_session_idle_timeout", n, tokens)
	}
}

// TestReconnect2HoldsAnotherUsersReconnectEndsNothingOfMine: bob stores
// another token (twice); alice's session on the same service goes on as
// her account, and bob's old session ends.
func TestReconnect2HoldsAnotherUsersReconnectEndsNothingOfMine(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	lsPutToken(t, g, bobKey, "token-bob1")
	mb := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	mb.initialize()
	if ans := rcCall(mb, 1, "change"); !strings.Contains(ans, "ran as bob1") {
		t.Fatalf("control: bob's call: %s", ans)
	}
	lsPutToken(t, g, bobKey, "token-bob2")
	lsPutToken(t, g, bobKey, "token-bob3")
	if ans := rcCall(m, 2, "echo"); !strings.Contains(ans, "ran as one") {
		t.Errorf("alice's session after bob connected again: %s; want it to go on as account one", ans)
	}
	if ans := rcCall(mb, 2, "change"); !strings.Contains(ans, "HTTP 404") {
		t.Errorf("bob's old session after he connected again: %s, want 404", ans)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}

// TestReconnect2HoldsOtherServiceUnaffected: alice has sessions with svc
// and other (both auth bearer, the same kind of upstream); she stores a new
// token for svc. Her session with other goes on with other's token.
func TestReconnect2HoldsOtherServiceUnaffected(t *testing.T) {
	up := startRC(t)
	other := startRC(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo change", Extra: "tool_pins off",
		Services: fmt.Sprintf(`service other {
			url %s
			allow_http
			tools echo change
			auth bearer
		}`, other.URL)})
	lsPutToken(t, g, aliceKey, "token-one")
	if r := g.api(t, http.MethodPut, "/v1/connections/other", aliceKey, []byte(`{"token":"token-otherone"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("storing other's token: %d %s", r.StatusCode, r.Body)
	}
	session := g.createSession(t, aliceKey, "svc", "other")
	ms := g.raw(t, aliceKey, session, "svc")
	ms.initialize()
	mo := g.raw(t, aliceKey, session, "other")
	mo.initialize()
	if ans := rcCall(mo, 1, "change"); !strings.Contains(ans, "ran as otherone") {
		t.Fatalf("control: other: %s", ans)
	}
	if ans := rcCall(ms, 1, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: svc: %s", ans)
	}
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := rcCall(mo, 2, "change"); !strings.Contains(ans, "ran as otherone") {
		t.Errorf("alice's session with other after she connected svc again: %s; want it to go on", ans)
	}
	if ans := rcCall(ms, 2, "change"); !strings.Contains(ans, "HTTP 404") {
		t.Errorf("alice's session with svc after she connected it again: %s, want 404", ans)
	}
	for _, r := range other.requests() {
		if r.Account != "otherone" {
			t.Errorf("other's upstream got %s %s with %q's token", r.HTTPMethod, r.RPCMethod, r.Account)
		}
	}
}

// rc2SSE reads an SSE response's events (id and data) into a channel.
func rc2SSE(resp *http.Response) <-chan [2]string {
	out := make(chan [2]string, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var id string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id:"):
				id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
			case strings.HasPrefix(line, "data:"):
				out <- [2]string{id, strings.TrimSpace(strings.TrimPrefix(line, "data:"))}
			}
		}
	}()
	return out
}

// TestReconnect2HoldsInFlightCallAndResumeEndWithSession: alice's call
// of slow runs on account one's upstream session, its answer held by the
// upstream; she stores account two's token and pings: the session ends.
// The call's stream ends without a result; a resume of its stream is
// refused (404); nothing is sent upstream with account two's token in
// account one's session.
func TestReconnect2HoldsInFlightCallAndResumeEndWithSession(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	up := startRC(t)
	// The rc upstream answers tools/call at once; wrap it so that "slow"
	// first sends a progress event (with an event id) and then waits.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && gjson.GetBytes(body, "method").String() == "tools/call" && gjson.GetBytes(body, "params.name").String() == "slow" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, "id: ev-1\nevent: message\ndata: %s\n\n", `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"account `+rcAccount(r)+` working"}}`)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "id: ev-2\nevent: message\ndata: %s\n\n", `{"jsonrpc":"2.0","id":`+gjson.GetBytes(body, "id").Raw+`,"result":{"content":[{"type":"text","text":"slow done as `+rcAccount(r)+`"}]}}`)
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, up.URL, strings.NewReader(string(body)))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(func() { slow.CloseClientConnections(); slow.Close() })
	cfg := gatewayConfig{Upstream: slow.URL + "/mcp", Auth: "bearer", Tools: "echo change slow", Extra: "tool_pins off",
		RequestPolicy: aaPolicies(t, "", "")} // slow, unlisted, is allowed
	g := startGateway(t, cfg)
	lsPutToken(t, g, aliceKey, "token-one")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if ans := rcCall(m, 1, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: %s", ans)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := m.send(ctx, http.MethodPost, "application/json, text/event-stream", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{},"_meta":{"progressToken":"p7"}}}`, "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("slow: %d %s", resp.StatusCode, data)
	}
	events := rc2SSE(resp)
	var lastID string
	for working := false; !working; {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the stream of slow ended before its first message")
			}
			t.Logf("slow event: %v", ev)
			if ev[0] != "" {
				lastID = ev[0]
			}
			if ev[1] == "" {
				continue // a priming event
			}
			if !strings.Contains(ev[1], "account one working") {
				t.Fatalf("first message of slow: %v", ev)
			}
			working = true
		case <-time.After(10 * time.Second):
			t.Fatal("no event of slow")
		}
	}
	lsPutToken(t, g, aliceKey, "token-two")
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":8,"method":"ping"}`); status != http.StatusNotFound {
		t.Fatalf("ping after connecting again: %d %s, want 404", status, msgs)
	}
	releaseOnce.Do(func() { close(release) })
	ended := false
	timeout := time.After(5 * time.Second)
	for !ended {
		select {
		case ev, ok := <-events:
			if !ok {
				ended = true
				break
			}
			if strings.Contains(ev[1], "slow done") {
				t.Errorf("the call of account one's upstream session delivered its result after the session ended: %v", ev)
			}
		case <-timeout:
			t.Errorf("the stream of a call of the ended session is still open 5 s after it ended")
			ended = true
		}
	}
	if lastID != "" {
		r2, err := m.send(context.Background(), http.MethodGet, "text/event-stream", "", lastID)
		if err != nil {
			t.Fatal(err)
		}
		r2.Body.Close()
		if r2.StatusCode != http.StatusNotFound {
			t.Errorf("a resume (Last-Event-ID %s) of the ended session's call: %d, want 404", lastID, r2.StatusCode)
		}
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}

// TestReconnect2HoldsDisconnectWindowNoMix: alice disconnects, stays
// disconnected over a few requests (needs_sign_in), then stores account
// two's token: the session is then ended (404), and the new one runs as
// account two; nothing mixes accounts and sessions.
func TestReconnect2HoldsDisconnectWindowNoMix(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	stream, stop := rcStream(t, m)
	defer stop()
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnect: %d %s", r.StatusCode, r.Body)
	}
	for i := range 3 {
		if ans := rcCall(m, 10+i, "change"); strings.Contains(ans, "ran as") {
			t.Errorf("a call while disconnected ran: %s", ans)
		}
	}
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := rcCall(m, 20, "change"); !strings.Contains(ans, "HTTP 404") {
		t.Errorf("the old session after connecting again: %s, want 404", ans)
	}
	if _, open := rcNext(stream, "never sent", 3*time.Second); open {
		t.Errorf("the ended session's GET stream is still open")
	}
	m.sessionID = ""
	m.initialize()
	if ans := rcCall(m, 21, "change"); !strings.Contains(ans, "ran as two") {
		t.Errorf("the new session: %s", ans)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}

// TestReconnect2HoldsStreamOnOtherReplicaEnds: replicas a and b on
// PostgreSQL; alice's runner holds its standalone GET stream through b
// (account one's upstream session). She stores account two's token through
// a, and her next request (through a) ends the session. b's stream ends,
// its upstream GET is closed, and nothing account one's upstream session
// sends afterwards reaches the runner.
func TestReconnect2HoldsStreamOnOtherReplicaEnds(t *testing.T) {
	up, a, b := rcReplicas(t, "")
	lsPutToken(t, a.gateway, aliceKey, "token-one")
	session := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, session, "svc")
	ma.initializeWith(`{"roots":{"listChanged":true}}`)
	if ans := rcCall(ma, 1, "echo"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control through a: %s", ans)
	}
	old := up.sessionsOf("one")
	if len(old) != 1 {
		t.Fatalf("account one's upstream sessions: %v", old)
	}
	mb := b.raw(t, aliceKey, session, "svc")
	mb.sessionID = ma.sessionID
	stream, stop := rcStream(t, mb)
	defer stop()
	waitWithin(t, 10*time.Second, "b's GET to reach the upstream", func() bool { return up.hasStream(old[0]) })

	lsPutToken(t, a.gateway, aliceKey, "token-two")
	if status, _, msgs := ma.post(`{"jsonrpc":"2.0","id":5,"method":"ping"}`); status != http.StatusNotFound {
		t.Fatalf("ping through a after connecting again: %d %s, want 404", status, msgs)
	}
	if _, open := rcNext(stream, "never sent", 5*time.Second); open {
		t.Errorf("the runner's GET stream through b of the ended session is still open 5 s later")
	}
	if up.push(old[0], `{"jsonrpc":"2.0","id":"old-account-asks","method":"roots/list"}`) {
		if msg, _ := rcNext(stream, "old-account-asks", 2*time.Second); msg != "" {
			t.Errorf("account one's roots/list reached alice's runner through b after her session ended: %s", msg)
		}
	}
	waitWithin(t, 10*time.Second, "b to close its GET to account one's upstream session", func() bool { return !up.hasStream(old[0]) })
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}

// TestReconnect2AttackReloadToSharedCredentialStrandsSession: svc has auth
// bearer; alice's session runs on account one's upstream session. A
// reload gives svc one service-wide credential (auth header) at the same
// url. What happens: current() reads no grant for a service without
// per-user credentials ("" is taken for "disconnected", left to the
// credentials step), so the session is not ended; attempt then refuses
// the service-wide credential (grant "") with the session's upstream id
// (grant of account one) with a 503 "retry" — on every request, for as
// long as the runner retries (which keeps the session from idling out).
// What should happen: the session is over (404, initialize a new one),
// as when the caller's own connection changes.
func TestReconnect2AttackReloadToSharedCredentialStrandsSession(t *testing.T) {
	up := startRC(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: up.URL, Auth: "bearer", Tools: "echo change", Extra: "tool_pins off", DataDir: t.TempDir()}
	g := startGatewayOnPort(t, port, cfg)
	lsPutToken(t, g, aliceKey, "token-one")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if ans := rcCall(m, 1, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: %s", ans)
	}
	cfg.Auth = `header Authorization "Bearer token-shared"`
	g2 := startGatewayOnPort(t, port, cfg)
	m.transport = g2.transport()
	var answers []string
	for i := range 3 {
		answers = append(answers, rcCall(m, 10+i, "change"))
	}
	ended := false
	for _, a := range answers {
		if strings.Contains(a, "HTTP 404") {
			ended = true
		}
	}
	if !ended {
		t.Errorf("alice's session of her personal connection after a reload gave svc a service-wide credential, three calls: %v; "+
			"want the session ended (404, initialize a new one), not refused with a retryable error for good", answers)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed credentials and sessions: %v", mixes)
	}
}
