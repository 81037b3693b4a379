package integration

// An adversarial look at a caller connecting again (auth bearer: another
// personal token stored; auth oauth: a new consent) under a running
// stateful MCP session. The review attacked a first design, in which the
// registry had toolgate_proxy open a new upstream session through the new
// connection and list the tools through it, the runner's session going
// on; it found the six holes below. Now the registry (current) ends a
// session whose caller's connection is another since its upstream session
// was opened (Upstream.Grant): 404, the runner initializes a new one; the
// session's streams, listings in progress and stored record end with it,
// on every replica; attempt refuses to send a session id with another
// connection's credential (a call decided for the old connection is not
// sent through the new); a DELETE of such a session is answered 204
// without anything opened upstream. Each test below asserts that.
//
// The upstream of most tests here (rcUpstream) is a hand-written
// Streamable HTTP server that tells the accounts apart by the bearer
// token ("token-one" is account one), defines echo read-only for account
// one only (the test policy sends any other tools/call for approval), and
// can hold a tools/list of one account until the test lets it go.
//
// FINDINGS (of the first design; each fixed by ending the session)
//
// Attack: a tool listing through the old connection that is still running
// when the session renews (a refresh after notifications/tools/list_changed)
// ends after the renewal's own listing and replaces the new account's
// catalog with the old account's: the next call, made as the new account,
// is decided with the old account's definition (read-only: allowed, where
// the new account's echo is sent for approval). It should be dropped (a
// listing counts only for the upstream session, and the connection, it ran
// through). Cause: mcpproxy.(*Handler).fetchCatalog / refreshCatalog hand
// their result to MCPSession.CatalogListed, which takes any listing
// (internal/mcpsession/sessions.go, no generation or grant check), and
// reinitialize ignores ListingTools' false (a listing already running).
// (TestReconnectAttackStaleListingReplacesNewAccountsCatalog)
//
// Attack: a call that passed the registry's check (current) while the
// caller was still on the old connection, and waited there for a tool
// listing in progress (WaitCatalog), is decided by the policy with the old
// account's catalog; the credentials step then reads the new connection,
// attempt sees the grant differ, re-initializes through the new
// connection and sends the call, decided for the old account, as the new
// one: it runs without the approval the new account's echo needs. It
// should be decided again (or answered "retry") when the credential's
// grant is not the one the session was checked with. Cause:
// modules/registry/registry.go current checks the grant before
// WaitCatalog and the policy, modules/gateway credentials step reads the
// connection afresh, and modules/mcpproxy/upstream.go attempt turns the
// mismatch into kindSessionGone, which post re-initializes and resends
// (the decision is not taken again).
// (TestReconnectAttackCallDecidedForOldAccountRunsAsNewOne)
//
// Attack: the runner's standalone GET stream opened before the caller
// connected again stays open across the renewal, with the old
// connection's credential and upstream session: the old account's
// notifications and server→client requests go on reaching the runner
// after its session moved to the new account, and the runner's answer to
// such a request is posted, with the new token, into the new account's
// upstream session (which never asked). The renewal should end the
// streams of the replaced upstream session, as a reload that moves the
// service ends them. Cause: mcpproxy.(*Handler).renew only re-initializes;
// stream() ends with the MCP session's context alone, and forward posts
// answers to the session's current upstream.
// (TestReconnectAttackOldStreamRelaysOldAccountAfterRenewal)
//
// Attack: a stateful session translated onto an upstream of the stateless
// revision (2026-07-28, no upstream session) cannot go on after the caller
// connects again: renew sends a legacy initialize to the modern-only
// upstream; the runner's next call is answered 503 "retry" while the MCP
// session is ended behind it (reinitialize's protocol-version check), so
// the retry gets 404 "initialize a new one", although nothing needs an
// upstream session: the tools only need listing through the new
// connection. Cause: mcpproxy.(*Handler).renew calls reinitialize for
// every session, translated ones included (handshake.go).
// (TestReconnectAttackTranslatedSessionBrokenByReconnect)
//
// Attack: after the caller connects again, the runner's DELETE of its MCP
// session first opens a new upstream session through the new connection
// and lists the tools through it (current runs for DELETE too), only to
// end it; and when the new connection's upstream fails the initialize the
// DELETE is refused ("retry"), so the runner cannot end its session. A
// DELETE should end the session without opening anything upstream.
// Cause: modules/registry/registry.go ServeHTTP calls current for every
// method. (TestReconnectAttackDeleteOpensUpstreamSessionToEndIt)
//
// Attack: two replicas on PostgreSQL. Replica a renews the session (the
// stored record names the new upstream session and grant at once) and
// lists the tools through the new connection; until that listing ends,
// replica b decides alice's calls with the catalog the record still names,
// the old account's, and runs them as the new account (echo allowed
// instead of sent for approval). The stored record should say a listing
// is pending (or carry no catalog) from the moment it names the new
// upstream session. Cause: internal/mcpsession Reinitialize stores the
// new upstream with the old r.Catalog; WaitCatalog on another replica
// knows only of the first listing (listingWait).
// (TestReconnectAttackReplicaDecidesWithOldCatalogDuringRenewal)
//
// HOLDS
//
// Holds: the new token never travels with the old upstream session's id,
// and the old one never with the new session's, across a reconnect with
// several calls in flight and after it; no upstream session is opened with
// a credential other than the one it is then used with.
// (TestReconnectHoldsNoTokenSessionMixUnderConcurrentCalls)
//
// Holds: an upstream that refuses the new connection's initialize (HTTP
// 500) gets the runner a clear, retryable error, the old upstream session
// is not used with the new token, the session goes on once the upstream
// accepts, and neither token reaches the log.
// (TestReconnectHoldsFailedRenewalIsClearAndRecovers)
//
// Holds: disconnecting answers needs_sign_in on the running session and
// opens nothing upstream; connecting again then renews it.
// (TestReconnectHoldsDisconnectThenReconnect)

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// rcRequest is one request rcUpstream received.
type rcRequest struct {
	HTTPMethod string
	Session    string // the Mcp-Session-Id header
	Account    string // from the bearer token
	RPCMethod  string
	ID         string // the JSON-RPC id (raw), for requests and responses
	Body       string
}

// rcUpstream is a Streamable HTTP MCP server telling accounts apart by
// their bearer token.
type rcUpstream struct {
	URL string

	mu       sync.Mutex
	n        int
	sessions map[string]string // upstream session id → account it was opened with
	streams  getStreams        // by session id
	log      []rcRequest
	failInit map[string]bool // account → initialize answers 500
	listHolds
}

func startRC(t *testing.T) *rcUpstream {
	t.Helper()
	u := &rcUpstream{sessions: map[string]string{}, failInit: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		u.releaseAll()
		srv.CloseClientConnections()
		srv.Close()
	})
	u.URL = srv.URL + "/mcp"
	return u
}

func rcAccount(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer token-")
}

// listHolds makes an upstream's next tools/list of an account wait.
type listHolds struct {
	mu      sync.Mutex
	hold    map[string]chan struct{} // account → a tools/list of it waits for close
	arrived map[string]chan struct{} // account → closed when a held tools/list came
}

// holdList makes the next tools/list of account wait; it returns a
// channel closed when one arrived, and the function letting it go.
func (l *listHolds) holdList(account string) (arrived <-chan struct{}, release func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hold == nil {
		l.hold, l.arrived = map[string]chan struct{}{}, map[string]chan struct{}{}
	}
	h, a := make(chan struct{}), make(chan struct{})
	l.hold[account], l.arrived[account] = h, a
	var once sync.Once
	return a, func() { once.Do(func() { close(h) }) }
}

// waitList is where a tools/list of account waits when it is held; false
// when the request ended meanwhile.
func (l *listHolds) waitList(r *http.Request, account string) bool {
	l.mu.Lock()
	h, a := l.hold[account], l.arrived[account]
	delete(l.hold, account)
	delete(l.arrived, account)
	l.mu.Unlock()
	if h == nil {
		return true
	}
	close(a)
	select {
	case <-h:
		return true
	case <-r.Context().Done():
		return false
	}
}

// releaseAll lets every held listing go.
func (l *listHolds) releaseAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.hold {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

func (u *rcUpstream) requests() []rcRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]rcRequest(nil), u.log...)
}

// sessionsOf lists the upstream sessions opened with account's token.
func (u *rcUpstream) sessionsOf(account string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for id, a := range u.sessions {
		if a == account {
			out = append(out, id)
		}
	}
	return out
}

// push sends msg on session's open GET stream; false when it has none.
func (u *rcUpstream) push(session, msg string) bool { return u.streams.push(session, msg) }

func (u *rcUpstream) hasStream(session string) bool { return u.streams.has(session) }

func (u *rcUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	msg := gjson.ParseBytes(body)
	account, session := rcAccount(r), r.Header.Get("Mcp-Session-Id")
	rec := rcRequest{HTTPMethod: r.Method, Session: session, Account: account,
		RPCMethod: msg.Get("method").String(), ID: msg.Get("id").Raw, Body: string(body)}
	u.mu.Lock()
	u.log = append(u.log, rec)
	_, known := u.sessions[session]
	fail := u.failInit[account]
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
	if rec.RPCMethod == "initialize" {
		if fail {
			http.Error(w, "the account's backend is down", http.StatusInternalServerError)
			return
		}
		u.mu.Lock()
		u.n++
		id := "sess-" + account + "-" + strconv.Itoa(u.n)
		u.sessions[id] = account
		u.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", id)
		rcJSON(w, msg.Get("id").Raw, `{"protocolVersion":`+msg.Get("params.protocolVersion").Raw+
			`,"capabilities":{"tools":{"listChanged":true},"logging":{}},"serverInfo":{"name":"rc","version":"1"}}`)
		return
	}
	if session == "" {
		http.Error(w, "no session", http.StatusBadRequest)
		return
	}
	if !known {
		http.Error(w, "unknown session", http.StatusNotFound)
		return
	}
	if !msg.Get("method").Exists() || !msg.Get("id").Exists() { // an answer, or a notification
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch rec.RPCMethod {
	case "tools/list":
		if !u.waitList(r, account) {
			return
		}
		ro := `"annotations":{"readOnlyHint":true},`
		echo := `{"name":"echo","description":"Echo.",`
		if account == "one" {
			echo += ro
		}
		echo += `"inputSchema":{"type":"object"}}`
		rcJSON(w, msg.Get("id").Raw, `{"tools":[`+echo+`,{"name":"change","description":"Changes the tools.",`+ro+`"inputSchema":{"type":"object"}}]}`)
	case "tools/call":
		u.mu.Lock()
		opened := u.sessions[session]
		u.mu.Unlock()
		text := "ran as " + account + " in a session of " + opened
		result := `{"content":[{"type":"text","text":` + strconv.Quote(text) + `}]}`
		if msg.Get("params.name").String() == "change" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			fmt.Fprintf(w, "event: message\ndata: %s\n\n", `{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`)
			fmt.Fprintf(w, "event: message\ndata: %s\n\n", `{"jsonrpc":"2.0","id":`+msg.Get("id").Raw+`,"result":`+result+`}`)
			return
		}
		rcJSON(w, msg.Get("id").Raw, result)
	default:
		rcJSON(w, msg.Get("id").Raw, `{}`)
	}
}

func rcJSON(w http.ResponseWriter, id, result string) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result)
}

// rcCall sends a tools/call without failing t (safe in a goroutine): the
// last message of the answer, or the error.
func rcCall(m *rawMCP, id int, tool string) string {
	body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":{}}}`
	resp, err := m.send(context.Background(), http.MethodPost, "application/json, text/event-stream", body, "")
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	s := string(data)
	if i := strings.LastIndex(s, "data: "); i >= 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		s = strings.TrimSpace(s[i+len("data: "):])
	}
	return fmt.Sprintf("HTTP %d %s", resp.StatusCode, s)
}

// rcReplicas starts an rc upstream and two replicas of the toolgate binary
// whose svc is it with auth bearer (tool_pins off: the accounts'
// definitions differ): on a fresh PostgreSQL database (storage ""), which
// announces changes, or on one file_system directory, which announces
// nothing.
func rcReplicas(t *testing.T, storage string) (up *rcUpstream, a, b *replica) {
	t.Helper()
	up = startRC(t)
	if storage == "" {
		a, b, _ = soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
			return soBlock(storage, data, up.URL, "echo change", "auth bearer", "tool_pins off")
		})
		return up, a, b
	}
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	data := t.TempDir()
	block := soBlock("storage file_system "+t.TempDir(), data, up.URL, "echo change", "auth bearer", "tool_pins off")
	return up, startReplica(t, bin, block, data), startReplica(t, bin, block, data)
}

// rcConnectedAgainThroughA has alice initialize a session with svc through
// replica a as account one and call echo through both replicas, then
// store account two's token through a, whose next call ends the session
// (404). It returns her session's clients of a and b.
func rcConnectedAgainThroughA(t *testing.T, a, b *replica) (ma, mb *rawMCP) {
	t.Helper()
	lsPutToken(t, a.gateway, aliceKey, "token-one")
	session := a.createSession(t, aliceKey, "svc")
	ma = a.raw(t, aliceKey, session, "svc")
	ma.initialize()
	mb = b.raw(t, aliceKey, session, "svc")
	mb.sessionID = ma.sessionID
	if ans := rcCall(ma, 1, "echo"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control through a: %s", ans)
	}
	if ans := rcCall(mb, 2, "echo"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control through b: %s", ans)
	}
	lsPutToken(t, a.gateway, aliceKey, "token-two")
	if ans := rcCall(ma, 3, "echo"); !strings.Contains(ans, "HTTP 404") {
		t.Fatalf("alice's echo through a after she connected again: %s, want 404", ans)
	}
	return ma, mb
}

// rcStart is alice's MCP session on svc at an rcUpstream, connected as
// account one, with echo called once (control).
func rcStart(t *testing.T, cfg gatewayConfig, caps string) (*rcUpstream, *gateway, *rawMCP) {
	t.Helper()
	up := startRC(t)
	cfg.Upstream, cfg.Auth = up.URL, "bearer"
	if cfg.Tools == "" {
		cfg.Tools = "echo change"
	}
	if cfg.Extra == "" {
		cfg.Extra = "tool_pins off" // the accounts' definitions differ
	}
	g := startGateway(t, cfg)
	lsPutToken(t, g, aliceKey, "token-one")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initializeWith(caps)
	if ans := rcCall(m, 1, "echo"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: account one's read-only echo: %s", ans)
	}
	return up, g, m
}

func rcWait(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// rcMixes reports requests that carried one account's token with an
// upstream session opened by another.
func rcMixes(up *rcUpstream, opened map[string]string) []string {
	var out []string
	for _, r := range up.requests() {
		if r.Session == "" {
			continue
		}
		if a, ok := opened[r.Session]; ok && a != r.Account {
			out = append(out, fmt.Sprintf("%s %s with %s's token in %s", r.HTTPMethod, r.RPCMethod, r.Account, r.Session))
		}
	}
	return out
}

func rcOpened(up *rcUpstream) map[string]string {
	opened := map[string]string{}
	for _, r := range up.requests() {
		if r.RPCMethod == "initialize" {
			// The session id is the answer's; sess-<account>-<n>.
			continue
		}
		if r.Session != "" {
			parts := strings.SplitN(r.Session, "-", 3)
			if len(parts) == 3 {
				opened[r.Session] = parts[1]
			}
		}
	}
	return opened
}

// TestReconnectAttackStaleListingReplacesNewAccountsCatalog: alice's call
// of change makes the upstream announce notifications/tools/list_changed;
// toolgate lists the tools again through account one, and the upstream
// holds that listing. Alice stores account two's token; her next call
// renews the session (account two's listing: echo is not read-only, sent
// for approval). Then the old listing ends. What happens: it replaces the
// catalog, and alice's next echo, run as account two, is decided with
// account one's read-only definition: allowed. What should happen: the
// old connection's listing is dropped; the call is sent for approval.
func TestReconnectAttackStaleListingReplacesNewAccountsCatalog(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	arrived, release := up.holdList("one")
	defer release()
	if ans := rcCall(m, 2, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: change: %s", ans)
	}
	rcWait(t, arrived, "the refresh listing through account one")

	lsPutToken(t, g, aliceKey, "token-two")
	ans := rcCall(m, 3, "echo")
	if !strings.Contains(ans, "HTTP 404") || !strings.Contains(ans, "initialize a new one") {
		t.Fatalf("account two's echo on account one's session: %s, want 404 (initialize a new one)", ans)
	}
	release()
	time.Sleep(500 * time.Millisecond) // the old listing's answer is read
	if ans = rcCall(m, 4, "echo"); strings.Contains(ans, "ran as") {
		t.Errorf("alice's echo on the ended session after account one's late listing: %s", ans)
	}
	m.sessionID = ""
	m.initialize()
	if ans = rcCall(m, 5, "echo"); strings.Contains(ans, "ran as two") || !strings.Contains(ans, "approval") {
		t.Errorf("alice's echo, as account two, in a new session: %s; want it sent for approval", ans)
	}
}

// TestReconnectAttackCallDecidedForOldAccountRunsAsNewOne: a listing
// through account one is in progress (held by the upstream); alice's echo
// passes the registry's check, still as account one, and waits for the
// listing. Meanwhile she stores account two's token; then the listing
// ends. What happens: the call is decided with account one's read-only
// echo (allowed), and the proxy, finding account two's credential,
// re-initializes through it and runs the call as account two. What should
// happen: a call decided for one connection is not sent through another
// (decided again, or answered retry).
func TestReconnectAttackCallDecidedForOldAccountRunsAsNewOne(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	arrived, release := up.holdList("one")
	defer release()
	if ans := rcCall(m, 2, "change"); !strings.Contains(ans, "ran as one") {
		t.Fatalf("control: change: %s", ans)
	}
	rcWait(t, arrived, "the refresh listing through account one")

	done := make(chan string, 1)
	go func() { done <- rcCall(m, 3, "echo") }()
	time.Sleep(700 * time.Millisecond) // the call is past the registry's check, waiting for the listing
	lsPutToken(t, g, aliceKey, "token-two")
	release()
	var ans string
	select {
	case ans = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not end")
	}
	if strings.Contains(ans, "ran as two") {
		t.Errorf("a call decided with account one's catalog ran as account two: %s; want it decided again (approval) or answered retry", ans)
	}
}

// rcStream reads the runner's GET stream's messages into a channel.
func rcStream(t *testing.T, m *rawMCP) (<-chan string, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET stream: %d %s", resp.StatusCode, data)
	}
	return sseData(resp), cancel
}

// sseData reads the data lines of an event stream into a channel, closed
// (and the body with it) when the stream ends.
func sseData(resp *http.Response) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "data:") {
				out <- strings.TrimSpace(strings.TrimPrefix(line, "data:"))
			}
		}
	}()
	return out
}

// rcNext waits for a message containing want on c; "" when the stream
// ended or nothing came within d.
func rcNext(c <-chan string, want string, d time.Duration) (string, bool) {
	t := time.After(d)
	for {
		select {
		case msg, ok := <-c:
			if !ok {
				return "", false // ended
			}
			if strings.Contains(msg, want) {
				return msg, true
			}
		case <-t:
			return "", true
		}
	}
}

// TestReconnectAttackOldStreamRelaysOldAccountAfterRenewal: alice's runner
// has its standalone GET stream open (account one's upstream session);
// she stores account two's token and her next request renews the session.
// Then account one's upstream session sends a notification and a
// roots/list request on its stream. What happens: both reach alice's
// runner on the old stream, and her answer to roots/list is posted with
// account two's token into account two's upstream session. What should
// happen: the renewal ends the old upstream session's streams (the runner
// opens its GET again, on the new one); nothing of account one's session
// reaches the runner afterwards.
func TestReconnectAttackOldStreamRelaysOldAccountAfterRenewal(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{"roots":{"listChanged":true}}`)
	old := up.sessionsOf("one")
	if len(old) != 1 {
		t.Fatalf("account one's upstream sessions: %v", old)
	}
	stream, stop := rcStream(t, m)
	defer stop()
	for i := 0; !up.hasStream(old[0]); i++ {
		if i > 200 {
			t.Fatal("the runner's GET did not reach the upstream")
		}
		time.Sleep(20 * time.Millisecond)
	}

	lsPutToken(t, g, aliceKey, "token-two")
	if status, _, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"ping"}`); status != http.StatusNotFound {
		t.Fatalf("ping after connecting again: %d %s, want 404", status, msgs)
	}
	if _, open := rcNext(stream, "never sent", 3*time.Second); open {
		t.Errorf("the runner's GET stream of the ended session is still open")
	}
	if !up.push(old[0], `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"from account one after the reconnect"}}`) {
		t.Log("account one's stream was closed at the renewal")
		return
	}
	if msg, open := rcNext(stream, "from account one", 3*time.Second); msg != "" {
		t.Errorf("account one's notification reached alice's runner after her session moved to account two: %s", msg)
	} else if !open {
		return // the stream ended: holds
	}
	up.push(old[0], `{"jsonrpc":"2.0","id":"old-account-asks","method":"roots/list"}`)
	msg, _ := rcNext(stream, "old-account-asks", 3*time.Second)
	if msg == "" {
		return
	}
	t.Errorf("account one's roots/list reached alice's runner after her session moved to account two: %s", msg)
	id := gjson.Get(msg, "id").Raw
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":` + id + `,"result":{"roots":[{"uri":"file:///home/alice/account-two-project"}]}}`); status != http.StatusAccepted {
		return
	}
	for _, r := range up.requests() {
		if r.ID == id && r.RPCMethod == "" && r.HTTPMethod == http.MethodPost {
			if r.Session != old[0] {
				t.Errorf("alice's answer to account one's roots/list went to %s's session %s with %s's token", r.Session, r.Session, r.Account)
			}
		}
	}
}

// TestReconnectAttackTranslatedSessionBrokenByReconnect: alice's stateful
// runner works through toolgate's translation with an upstream of the
// stateless revision only; she stores another token. What happens: her
// next call fails (the session is renewed with a legacy initialize the
// upstream does not take). What should happen: the session goes on (the
// tools listed through the new connection; there is no upstream session
// to open).
func TestReconnectAttackTranslatedSessionBrokenByReconnect(t *testing.T) {
	up := startModernOnlyUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "token-one")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	if ans := m.call(1, "echo", `{"text":"before"}`); !strings.Contains(string(ans), "echo before") {
		t.Fatalf("control: echo before the reconnect: %s", ans)
	}
	lsPutToken(t, g, aliceKey, "token-two")
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"after"}}}`)
	if status != http.StatusNotFound || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "initialize a new one") {
		t.Errorf("echo after the reconnect: HTTP %d %s; want 404 (initialize a new one)", status, msgs)
	}
	m.sessionID = ""
	m.initialize()
	if ans := m.call(3, "echo", `{"text":"after"}`); !strings.Contains(string(ans), "echo after") {
		t.Errorf("echo in a new session after the reconnect: %s", ans)
	}
}

// TestReconnectAttackDeleteOpensUpstreamSessionToEndIt: alice stores
// account two's token, whose upstream initialize fails for now; her runner
// ends its MCP session with DELETE. What happens: the DELETE tries to open
// an upstream session through account two first, and is refused. What
// should happen: the session ends (204), nothing is opened upstream.
func TestReconnectAttackDeleteOpensUpstreamSessionToEndIt(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	up.mu.Lock()
	up.failInit["two"] = true
	up.mu.Unlock()
	lsPutToken(t, g, aliceKey, "token-two")
	before := len(up.requests())
	status := m.delete()
	if status != http.StatusNoContent {
		t.Errorf("DELETE of alice's MCP session after she connected again: HTTP %d, want 204", status)
	}
	for _, r := range up.requests()[before:] {
		if r.RPCMethod == "initialize" {
			t.Errorf("ending the session sent an initialize upstream as %s", r.Account)
		}
	}
	// And with an upstream that accepts: nothing but a DELETE either.
	up2, g2, m2 := rcStart(t, gatewayConfig{}, `{}`)
	lsPutToken(t, g2, aliceKey, "token-two")
	before = len(up2.requests())
	if status := m2.delete(); status != http.StatusNoContent {
		t.Errorf("DELETE (accepting upstream): %d", status)
	}
	for _, r := range up2.requests()[before:] {
		if r.RPCMethod == "initialize" || r.RPCMethod == "tools/list" {
			t.Errorf("ending the session sent %s upstream as %s", r.RPCMethod, r.Account)
		}
	}
}

// TestReconnectAttackReplicaDecidesWithOldCatalogDuringRenewal: replicas a
// and b on PostgreSQL; alice's session was listed through account one.
// She stores account two's token; her call through a renews the session
// and lists through account two (the upstream holds that listing). What
// happens: her echo through b meanwhile runs as account two, decided with
// account one's read-only definition. What should happen: b waits for the
// listing (or decides without a definition: approval).
func TestReconnectAttackReplicaDecidesWithOldCatalogDuringRenewal(t *testing.T) {
	up, a, b := rcReplicas(t, "")
	_, mb := rcConnectedAgainThroughA(t, a, b)
	var ans string
	for i := 0; i < 30; i++ {
		ans = rcCall(mb, 10+i, "echo")
		if !strings.Contains(ans, "ran as one") {
			break
		}
		time.Sleep(100 * time.Millisecond) // b has not heard of the new token yet
	}
	t.Logf("account two's upstream sessions: %v", up.sessionsOf("two"))
	if strings.Contains(ans, "ran as two") || !strings.Contains(ans, "HTTP 404") {
		t.Errorf("alice's echo through replica b once the session ended through a: %s; want 404", ans)
	}
}

// TestReconnectHoldsNoTokenSessionMixUnderConcurrentCalls: calls in
// flight from several goroutines while alice stores new tokens: no
// request carries one account's token with another's upstream session.
func TestReconnectHoldsNoTokenSessionMixUnderConcurrentCalls(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rcCall(m, 1000*(w+1)+i, "change") // read-only for every account
			}
		}()
	}
	for _, tok := range []string{"token-two", "token-three", "token-four"} {
		time.Sleep(200 * time.Millisecond)
		lsPutToken(t, g, aliceKey, tok)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	m.sessionID = "" // ended by the first token change: the runner initializes a new one
	m.initialize()
	if ans := rcCall(m, 99, "change"); !strings.Contains(ans, "ran as four") {
		t.Errorf("after the last token: %s", ans)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("%d requests mixed accounts, e.g. %s", len(mixes), mixes[0])
	}
}

// TestReconnectHoldsFailedRenewalIsClearAndRecovers: the upstream fails
// account two's initialize: alice is told to retry, the old session is
// not used with the new token, the session goes on once it accepts, and
// no token reaches the log.
func TestReconnectHoldsFailedRenewalIsClearAndRecovers(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "toolgate.log")
	up, g, m := rcStart(t, gatewayConfig{Log: "output file " + logFile + "\n\t\tlevel DEBUG"}, `{}`)
	up.mu.Lock()
	up.failInit["two"] = true
	up.mu.Unlock()
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := rcCall(m, 2, "change"); !strings.Contains(ans, "HTTP 404") || !strings.Contains(ans, "connected to the service again") {
		t.Errorf("the call after connecting again: %s; want 404 saying why", ans)
	}
	m.sessionID = ""
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if status == http.StatusOK && len(msgs) == 1 && !strings.Contains(string(msgs[0]), `"error"`) {
		t.Errorf("initialize while the upstream refuses the new connection: %d %s; want an error", status, msgs)
	}
	up.mu.Lock()
	up.failInit["two"] = false
	up.mu.Unlock()
	m.initialize()
	if ans := rcCall(m, 3, "change"); !strings.Contains(ans, "ran as two") {
		t.Errorf("the call once the upstream accepts: %s", ans)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
	data, _ := os.ReadFile(logFile)
	for _, secret := range []string{"token-one", "token-two"} {
		if strings.Contains(string(data), secret) {
			t.Errorf("%s is in the log", secret)
		}
	}
	if !strings.Contains(string(data), "ended an outdated MCP session") {
		t.Errorf("the log does not say the session was ended")
	}
}

// TestReconnectHoldsDisconnectThenReconnect: alice disconnects: her
// running session is answered needs_sign_in, nothing is sent upstream;
// she connects again: the session goes on as the new account.
func TestReconnectHoldsDisconnectThenReconnect(t *testing.T) {
	up, g, m := rcStart(t, gatewayConfig{}, `{}`)
	if r := g.api(t, http.MethodDelete, "/v1/connections/svc", aliceKey, nil); r.StatusCode/100 != 2 {
		t.Fatalf("disconnect: %d %s", r.StatusCode, r.Body)
	}
	before := len(up.requests())
	ans := rcCall(m, 2, "change")
	if !strings.Contains(ans, "needs_sign_in") && !strings.Contains(ans, "sign in") && !strings.Contains(ans, "connect") {
		t.Errorf("a call after disconnecting: %s; want needs_sign_in", ans)
	}
	if n := len(up.requests()); n != before {
		t.Errorf("%d requests reached the upstream after disconnecting", n-before)
	}
	lsPutToken(t, g, aliceKey, "token-two")
	if ans := rcCall(m, 3, "change"); !strings.Contains(ans, "HTTP 404") {
		t.Errorf("after connecting again, on the old session: %s, want 404", ans)
	}
	m.sessionID = ""
	m.initialize()
	if ans := rcCall(m, 4, "change"); !strings.Contains(ans, "ran as two") {
		t.Errorf("after connecting again, in a new session: %s", ans)
	}
	if mixes := rcMixes(up, rcOpened(up)); len(mixes) > 0 {
		t.Errorf("requests mixed accounts: %v", mixes)
	}
}
