// Tests whose comment starts with "Attack" reproduce a flaw (they fail until it is fixed); those whose comment starts with "Holds" check an attack that toolgate withstands.
package integration

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// ---- helpers ---------------------------------------------------------------

// lsStreams takes over the standalone (GET) streams of an upstream of the
// earlier revisions: each GET gets an event stream the test writes to
// (broadcast), and the test sees how many are open and with which
// credential and upstream session each was opened. POSTs go on to the
// go-sdk server, their Authorization recorded.
type lsStreams struct {
	mu     sync.Mutex
	open   map[chan string]lsGet
	opened []lsGet
	posts  []string // the Authorization of each POST
}

type lsGet struct {
	auth, session string
}

func lsHijackStreams(up *upstream) *lsStreams {
	s := &lsStreams{open: map[chan string]lsGet{}}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.Method != http.MethodGet {
			s.mu.Lock()
			s.posts = append(s.posts, r.Header.Get("Authorization"))
			s.mu.Unlock()
			return false
		}
		ch := make(chan string, 256)
		g := lsGet{auth: r.Header.Get("Authorization"), session: r.Header.Get("Mcp-Session-Id")}
		s.mu.Lock()
		s.open[ch] = g
		s.opened = append(s.opened, g)
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.open, ch)
			s.mu.Unlock()
		}()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case d := <-ch:
				if _, err := io.WriteString(w, "event: message\ndata: "+d+"\n\n"); err != nil {
					return true
				}
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return true
			}
		}
	})
	return s
}

// broadcast writes data as one event on every open GET stream; it
// returns how many got it.
func (s *lsStreams) broadcast(data string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.open {
		ch <- data
	}
	return len(s.open)
}

// sendTo writes data as one event on the open GET streams of the upstream
// session id; it returns how many got it.
func (s *lsStreams) sendTo(id, data string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for ch, g := range s.open {
		if g.session == id {
			ch <- data
			n++
		}
	}
	return n
}

func (s *lsStreams) openNow() []lsGet {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []lsGet
	for _, g := range s.open {
		out = append(out, g)
	}
	return out
}

func (s *lsStreams) sawPostWith(auth string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.posts {
		if a == auth {
			return true
		}
	}
	return false
}

// lsWaitOpen waits (bounded) until n upstream GET streams are open.
func lsWaitOpen(t *testing.T, s *lsStreams, n int) []lsGet {
	t.Helper()
	for range 200 {
		if g := s.openNow(); len(g) == n {
			return g
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("the upstream has %d standalone streams open, want %d", len(s.openNow()), n)
	return nil
}

// lsListen opens a stateless subscriptions/listen of key in session
// naming uris (a JSON list, "" for none) and returns its stream once
// acknowledged, and the acknowledgement.
func lsListen(t *testing.T, g *gateway, key, session, uris string) (*bufio.Reader, string, context.CancelFunc) {
	t.Helper()
	return lsListenFor(t, g, key, session, uris, 60*time.Second)
}

// lsListenFor is lsListen whose stream is closed after d at the latest
// (a bound on the waits for what it should carry).
func lsListenFor(t *testing.T, g *gateway, key, session, uris string, d time.Duration) (*bufio.Reader, string, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	filter := `"toolsListChanged":true`
	if uris != "" {
		filter += `,"resourceSubscriptions":` + uris
	}
	resp := aaStatelessSend(t, ctx, g, key, session, "subscriptions/listen",
		`{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"notifications":{`+filter+`},`+aaStatelessMeta(`{}`)+`}}`)
	br := bufio.NewReader(resp.Body)
	ack := trReadUntil(br, "notifications/subscriptions/acknowledged")
	if resp.StatusCode != http.StatusOK || ack == "" {
		cancel()
		t.Fatalf("the listen did not open: HTTP %d", resp.StatusCode)
	}
	t.Cleanup(cancel)
	return br, ack, cancel
}

// lsLines reads a listen's data lines in the background; the channel is
// closed when the stream ends.
func lsLines(br *bufio.Reader) <-chan string {
	ch := make(chan string, 1024)
	go func() {
		defer close(ch)
		for {
			line, err := br.ReadString('\n')
			if d, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data:"); ok {
				ch <- strings.TrimSpace(d)
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// lsAwait returns the lines of ch up to the first holding want, waiting
// at most d for it; ok is false when it did not come.
func lsAwait(ch <-chan string, want string, d time.Duration) (lines []string, ok bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, open := <-ch:
			if !open {
				return lines, false
			}
			lines = append(lines, l)
			if strings.Contains(l, want) {
				return lines, true
			}
		case <-timer.C:
			return lines, false
		}
	}
}

// lsJoined waits until every listen of lines reads the shared stream: a
// listen joins it only after its acknowledgement. It writes numbered
// updates of uri until each listen got one.
func lsJoined(t *testing.T, s *lsStreams, uri string, lines ...<-chan string) {
	t.Helper()
	joined := make([]bool, len(lines))
	for i := range 40 {
		s.broadcast(lsUpdated(uri, `"_meta":{"warm":`+aaItoa(i)+`}`))
		all := true
		for j, ch := range lines {
			if !joined[j] {
				_, joined[j] = lsAwait(ch, `"warm"`, 250*time.Millisecond)
			}
			all = all && joined[j]
		}
		if all {
			// Drain the warm-ups still on their way.
			s.broadcast(lsUpdated(uri, `"_meta":{"warmed":true}`))
			for _, ch := range lines {
				if _, ok := lsAwait(ch, `"warmed"`, 10*time.Second); !ok {
					t.Fatalf("a listen's stream ended while warming up")
				}
			}
			return
		}
	}
	t.Fatalf("the listens never all read the shared stream: %v", joined)
}

func lsPutToken(t *testing.T, g *gateway, key, token string) {
	t.Helper()
	if r := g.api(t, http.MethodPut, "/v1/connections/svc", key, []byte(`{"token":"`+token+`"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("storing a personal token: %d %s", r.StatusCode, r.Body)
	}
}

// lsUpdated is a notifications/resources/updated of uri with extra
// members in its params.
func lsUpdated(uri, extra string) string {
	p := `"uri":` + aaJSON(uri)
	if extra != "" {
		p += "," + extra
	}
	return `{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{` + p + `}}`
}

// ---- attacks ---------------------------------------------------------------

// Attack: credential rotation under a shared stream. An upstream that
// writes back a credential toolgate attached is redacted on every stream,
// for the credential of the call the stream serves. Alice's first listen
// opens the shared standalone stream with her token T1; she then replaces
// the token (a leaked one) with T2, and a second listen of the same
// implied session, sent with T2 (its resources/subscribe carries T2
// upstream), joins the shared stream. The upstream writes T2 back on that
// stream in a notification the second listen asked for. Each listen's
// stream should redact its own call's credential, as it did when each
// listen opened a stream of its own: the second listen must not receive
// T2. Now the shared stream redacts only the first listen's T1, and T2
// reaches the runner in the clear.
// (A personal token stored again is a new connection since, and the
// second listen runs in the implied session of that connection, with a
// stream of its own: what the upstream said through one connection is not
// said through another. Within one connection the token changes when an
// OAuth grant is refreshed, and the listens share the stream: each still
// redacts its own call's credential.)
func TestListenShareAttackRotatedTokenReachesJoinedListen(t *testing.T) {
	up := startUpstream(t)
	s := lsHijackStreams(up)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer"})
	const t1, t2 = "alice-first-token-0123456789", "alice-rotated-token-9876543210"
	lsPutToken(t, g, aliceKey, t1)
	session := g.createSession(t, aliceKey, "svc")
	firstBr, _, _ := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	first := lsLines(firstBr)
	lsWaitOpen(t, s, 1)
	lsJoined(t, s, "test://watched", first)
	// The mechanism works: T1 written back reaches the first listen redacted.
	s.broadcast(lsUpdated("test://watched", `"_meta":{"echo":`+aaJSON(t1)+`}`))
	if lines, ok := lsAwait(first, "echo", 10*time.Second); !ok || strings.Contains(lines[len(lines)-1], t1) || !strings.Contains(lines[len(lines)-1], "REDACTED") {
		t.Fatalf("the first listen's own credential, written back: %q", lines)
	}
	lsPutToken(t, g, aliceKey, t2)
	secondBr, _, _ := lsListen(t, g, aliceKey, session, `["test://watched","test://other"]`)
	second := lsLines(secondBr)
	lsWaitOpen(t, s, 2) // the new connection's implied session has its own stream
	lsJoined(t, s, "test://watched", second)
	if !s.sawPostWith("Bearer " + t2) {
		t.Fatalf("the second listen's subscription did not carry the rotated token upstream")
	}
	s.broadcast(lsUpdated("test://watched", `"_meta":{"echo":`+aaJSON(t2)+`}`))
	lines, ok := lsAwait(second, "echo", 10*time.Second)
	if !ok {
		t.Fatalf("the second listen got no update: %q", lines)
	}
	line := lines[len(lines)-1]
	if strings.Contains(line, t2) {
		t.Fatalf("the rotated credential the second listen's call carried reached its runner unredacted: %s", line)
	}
}

// Attack: a listen after the upstream session was re-initialized. The
// upstream forgets alice's upstream session (a restart behind a balancer
// that kept the old stream's connection); her next request is answered 404
// and toolgate re-initializes transparently (generation 2). A listen sent
// now subscribes test://watched in the new upstream session (the
// subscription is keyed by generation), but joins the shared standalone
// stream still open on the forgotten session (the stream is keyed by the
// MCP session alone). The update of test://watched, sent in the new
// session, must reach the listen — it did when each listen opened its own
// stream in the session's current upstream session. Now the listen reads
// a dead session's stream and never gets it.
func TestListenShareAttackStreamOutlivesItsUpstreamSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	session := g.createSession(t, aliceKey, "svc")
	touch := func(id string) {
		t.Helper()
		if status, msg := statelessPost(t, g, aliceKey, session,
			`{"jsonrpc":"2.0","id":`+id+`,"method":"tools/call","params":{"name":"touch_resource","arguments":{},`+aaStatelessMeta(`{}`)+`}}`, nil); status != http.StatusOK || msg["error"] != nil {
			t.Fatalf("touch_resource: HTTP %d %v", status, msg)
		}
	}
	first, _, _ := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	touch("1")
	if line := trReadUntil(first, "resources/updated"); line == "" {
		t.Fatalf("the first listen got no update")
	}
	initializes := func() int {
		n := 0
		for _, r := range up.requestLog() {
			if strings.Contains(r.Body, `"method":"initialize"`) {
				n++
			}
		}
		return n
	}
	before := initializes()
	up.reset() // sessions forgotten; the open GET of the old handler stays
	touch("2") // 404, re-initialized
	if initializes() != before+1 {
		t.Fatalf("the upstream session was not re-initialized")
	}
	secondBr, _, _ := lsListenFor(t, g, aliceKey, session, `["test://watched"]`, 30*time.Second)
	second := lsLines(secondBr)
	got := false
	for i := 0; i < 5 && !got; i++ { // (the listen joins its stream after its acknowledgement)
		touch(aaItoa(3 + i))
		_, got = lsAwait(second, "resources/updated", 2*time.Second)
	}
	if !got {
		gets, subs := 0, 0
		for _, r := range up.requestLog() {
			if r.Method == http.MethodGet {
				gets++
			}
			if strings.Contains(r.Body, `"resources/subscribe"`) {
				subs++
			}
		}
		t.Fatalf("a listen opened after the upstream session was re-initialized never got the update of the resource it subscribed to in the new session: the upstream got %d GETs in all (the second listen joined the forgotten session's stream) and %d resources/subscribe", gets, subs)
	}
}

// Holds: a discovery decided for one caller is not marked for everyone.
// A runner of 2026-07-28 in front of an upstream of that revision asks
// server/discover; the result policy now decides it also as the initialize
// result it stands for, per caller: here it keeps the upstream's
// instructions from bob (a rule on initialize), and alice's discovery keeps
// them. Neither answer may carry cacheScope "public" (a shared cache of the
// revision would serve alice's discovery, instructions and all, to bob):
// both are "private", as every result the policies decided for a caller.
func TestListenShareHoldsDiscoveryDecidedPerCallerIsPrivate(t *testing.T) {
	up := startModernOnlyUpstream(t)
	policies := aaPolicies(t, "", `decision := {"action": "allow", "result": object.remove(input.result, ["instructions"])} if {
	input.method == "initialize"
	input.caller.user == "`+bob+`"
}
`)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
	discover := func(key string) gjson.Result {
		t.Helper()
		status, msg := statelessPost(t, g, key, g.createSession(t, key, "svc"),
			`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{`+aaStatelessMeta(`{}`)+`}}`, nil)
		res := gjson.Parse(aaJSON(msg)).Get("result")
		if status != http.StatusOK || !res.Exists() {
			t.Fatalf("server/discover: %d %s", status, aaJSON(msg))
		}
		return res
	}
	a, b := discover(aliceKey), discover(bobKey)
	if !a.Get("instructions").Exists() || b.Get("instructions").Exists() {
		t.Fatalf("control: the policy did not decide the discoveries per caller: alice %s, bob %s", a.Raw, b.Raw)
	}
	for who, res := range map[string]gjson.Result{"alice": a, "bob": b} {
		if scope := res.Get("cacheScope").String(); scope != "private" {
			t.Errorf("%s's discovery, decided by the policy for %s alone, is marked cacheScope %q (ttlMs %s)", who, who, scope, res.Get("ttlMs").Raw)
		}
	}
}

// Holds: server→client requests on the shared stream. An upstream writes a
// roots/list request on the standalone stream two listens of one implied
// session share. A stateless runner takes no requests on a stream: neither
// listen gets it, and the upstream is refused once (not once per listen,
// which would answer one request id twice).
func TestListenShareHoldsServerRequestRefusedOnce(t *testing.T) {
	up := startUpstream(t)
	s := lsHijackStreams(up)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	session := g.createSession(t, aliceKey, "svc")
	firstBr, _, _ := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	secondBr, _, _ := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	first, second := lsLines(firstBr), lsLines(secondBr)
	lsWaitOpen(t, s, 1)
	lsJoined(t, s, "test://watched", first, second)
	s.broadcast(`{"jsonrpc":"2.0","id":"srv-roots-1","method":"roots/list"}`)
	s.broadcast(lsUpdated("test://watched", `"_meta":{"marker":"sentinel"}`))
	for i, ch := range []<-chan string{first, second} {
		lines, ok := lsAwait(ch, "sentinel", 10*time.Second)
		if !ok {
			t.Fatalf("listen %d got no update after the server request: %q", i+1, lines)
		}
		for _, l := range lines {
			if strings.Contains(l, "roots/list") || strings.Contains(l, "srv-roots-1") {
				t.Fatalf("listen %d got the upstream's server request: %s", i+1, l)
			}
		}
	}
	answers := func() int {
		n := 0
		for _, r := range up.requestLog() {
			if r.Method == http.MethodPost && strings.Contains(r.Body, `"srv-roots-1"`) {
				n++
			}
		}
		return n
	}
	for i := 0; answers() == 0; i++ {
		if i > 200 {
			t.Fatalf("the upstream's server request was never refused")
		}
		time.Sleep(25 * time.Millisecond)
	}
	if n := answers(); n != 1 {
		t.Fatalf("the upstream's server request was answered %d times", n)
	}
}

// Holds: listens of different users and sessions share nothing. Alice's
// listens in two toolgate sessions and bob's (personal tokens) are three
// implied MCP sessions: three upstream standalone streams, each carrying
// its session's notifications to its own listen only. Each stream's
// update is written before the next stream's, and each listen's first
// update is its own.
func TestListenShareHoldsNoSharingAcrossUsersOrSessions(t *testing.T) {
	up := startUpstream(t)
	s := lsHijackStreams(up)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Auth: "bearer"})
	lsPutToken(t, g, aliceKey, "alice-personal-token-1")
	lsPutToken(t, g, bobKey, "bob-personal-token-22")
	type one struct {
		name string
		br   *bufio.Reader
		up   string
	}
	var all []*one
	for i, who := range []struct{ name, key string }{{"alice-1", aliceKey}, {"alice-2", aliceKey}, {"bob", bobKey}} {
		br, _, _ := lsListen(t, g, who.key, g.createSession(t, who.key, "svc"), `["test://watched"]`)
		o := &one{name: who.name, br: br}
		for _, gt := range lsWaitOpen(t, s, i+1) {
			known := false
			for _, p := range all {
				known = known || p.up == gt.session
			}
			if !known {
				o.up = gt.session
			}
		}
		all = append(all, o)
	}
	for _, o := range all {
		if s.sendTo(o.up, lsUpdated("test://watched", `"_meta":{"marker":"for-`+o.name+`"}`)) != 1 {
			t.Fatalf("no stream of %s's upstream session", o.name)
		}
	}
	for _, o := range all {
		line := trReadUntil(o.br, "resources/updated")
		if !strings.Contains(line, `"for-`+o.name+`"`) {
			t.Fatalf("%s's listen got another session's update first: %s", o.name, line)
		}
	}
}

// Holds: the shared stream does not outlive its listens. Two listens of
// alice's implied session share one upstream standalone stream; a third
// joins and leaves, then all end. The upstream stream is closed after the
// last one left (ListenLinger), not left open with no listen, and a listen
// after that opens a stream anew.
func TestListenShareHoldsStreamClosedAfterLastListen(t *testing.T) {
	up := startUpstream(t)
	s := lsHijackStreams(up)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	session := g.createSession(t, aliceKey, "svc")
	_, _, end1 := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	_, _, end2 := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	_, _, end3 := lsListen(t, g, aliceKey, session, "")
	lsWaitOpen(t, s, 1)
	end3()
	end1()
	end2()
	lsWaitOpen(t, s, 0)
	br, _, _ := lsListen(t, g, aliceKey, session, `["test://watched"]`)
	lines := lsLines(br)
	lsWaitOpen(t, s, 1)
	lsJoined(t, s, "test://watched", lines)
}
