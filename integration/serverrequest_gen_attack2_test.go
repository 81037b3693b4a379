package integration

// A second look at 2e38faa (server requests named by the upstream session
// whose stream carried them; a stream of a replaced upstream session is
// not resumed).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// ga2ProgramEnv puts this test binary in the mode of ga2Serve, a program
// speaking MCP over stdin and stdout. It takes over in init.
const ga2ProgramEnv = "TOOLGATE_GA2_PROGRAM"

func init() {
	if os.Getenv(ga2ProgramEnv) != "" {
		ga2Serve()
		os.Exit(0)
	}
}

// ga2Serve is an MCP server on stdin/stdout. Tools: pid answers the
// process id; ask waits until the file GA2_SIGNAL exists, then asks its
// client sampling/createMessage and answers with what it got (and its
// process id).
func ga2Serve() {
	var outMu sync.Mutex
	write := func(s string) {
		outMu.Lock()
		defer outMu.Unlock()
		_, _ = os.Stdout.WriteString(s + "\n")
	}
	result := func(id, text string) {
		q, _ := json.Marshal(text)
		write(`{"jsonrpc":"2.0","id":` + id + `,"result":{"content":[{"type":"text","text":` + string(q) + `}]}}`)
	}
	var waitMu sync.Mutex
	waiting := map[string]chan string{}
	signal := os.Getenv("GA2_SIGNAL")
	pid := strconv.Itoa(os.Getpid())
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for in.Scan() {
		line := string(in.Bytes())
		id := gjson.Get(line, "id")
		method := gjson.Get(line, "method").String()
		if method == "" && id.Exists() {
			waitMu.Lock()
			ch := waiting[id.String()]
			waitMu.Unlock()
			if ch != nil {
				ch <- line
			}
			continue
		}
		switch method {
		case "initialize":
			pv := gjson.Get(line, "params.protocolVersion").Raw
			if pv == "" {
				pv = `"2025-06-18"`
			}
			write(`{"jsonrpc":"2.0","id":` + id.Raw + `,"result":{"protocolVersion":` + pv + `,"capabilities":{"tools":{}},"serverInfo":{"name":"ga2","version":"1"}}}`)
		case "ping":
			write(`{"jsonrpc":"2.0","id":` + id.Raw + `,"result":{}}`)
		case "tools/list":
			write(`{"jsonrpc":"2.0","id":` + id.Raw + `,"result":{"tools":[` +
				`{"name":"pid","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}},` +
				`{"name":"ask","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}}]}}`)
		case "tools/call":
			switch gjson.Get(line, "params.name").String() {
			case "pid":
				result(id.Raw, pid)
			case "ask":
				n++
				sid := "s-" + pid + "-" + strconv.Itoa(n)
				ch := make(chan string, 1)
				waitMu.Lock()
				waiting[sid] = ch
				waitMu.Unlock()
				go func(callID string) {
					for end := time.Now().Add(20 * time.Second); signal != "" && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
						if _, err := os.Stat(signal); err == nil {
							break
						}
					}
					write(`{"jsonrpc":"2.0","id":"` + sid + `","method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"hi"}}],"maxTokens":5}}`)
					select {
					case a := <-ch:
						if t := gjson.Get(a, "result.content.text"); t.Exists() {
							result(callID, "sampled by "+pid+": "+t.String())
						} else {
							result(callID, "refused in "+pid+": "+gjson.Get(a, "error.message").String())
						}
					case <-time.After(8 * time.Second):
						result(callID, "no answer in "+pid)
					}
				}(id.Raw)
			default:
				write(`{"jsonrpc":"2.0","id":` + id.Raw + `,"error":{"code":-32602,"message":"unknown tool"}}`)
			}
		default:
			if id.Exists() {
				write(`{"jsonrpc":"2.0","id":` + id.Raw + `,"error":{"code":-32601,"message":"unknown method"}}`)
			}
		}
	}
}

// Attack (fixed): a legitimate answer is refused. A per_user program service with
// credential_env and OAuth: when the caller's access token is refreshed,
// the stdio transport sends new requests to a new process holding the new
// token and lets the old process finish its calls in progress (the
// mcpbridge "winding" session, which "takes what those calls wait for —
// the runner's answers to their requests"; Bridge.ownerOf). toolgate sees
// the old bridge session answer 404 and re-initializes: generation 2, the
// same bridge session id (the MCP session's ref). The old process's call
// then asks sampling/createMessage on its stream: since 2e38faa it is
// named by generation 1 (the stream's), and the runner's answer is
// refused by registry.relayAnswer with 400 ("replaced"): the old process,
// which is alive and waiting for exactly that answer, never gets it, and
// the runner's call fails. At ff952ea, before 2e38faa, this test passes:
// the request was named by the current generation, and the bridge routed
// the answer to the winding session. README, on stdio programs: "a
// runner's answer to a call's server request sent with a refreshed token
// dropped (the old session winds down: it takes its calls' answers and
// cancellations)" — fixed before, broken again by 2e38faa. The runner is
// also asked (a sampling it pays for, an elicitation its user fills in)
// for an answer toolgate then throws away; on replicas the same answer is
// taken on one whose copy is older and refused on the one that
// re-initialized (see TestServerRequestGenAttack2HoldsReinitOnOtherReplica's
// logs).
// The generation says "toolgate re-initialized", not "the upstream session
// that asked is gone". Severity: medium (availability: every sampling or
// elicitation of a long call of an OAuth program service breaks across a
// token refresh; fail-closed, nothing leaks). Fix: keep the asking
// upstream session's id (gateway.Upstream.SessionID) with the pending
// request and post the answer into that session, without re-initializing
// on 404 (a 404 then means it is gone: refuse); refuse on the generation
// only when the session ids differ.
// Fixed: a pending request keeps the asking upstream session's Ref (a
// digest of its id); an answer to an older generation of the same
// upstream session (the bridge keeps its id) goes there.
func TestServerRequestGenAttack2WindingProgramAnswerRefused(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: 3 * time.Second})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	signal := filepath.Join(t.TempDir(), "ask-now")
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Extra: "state_secret " + testStateSecret,
		Services: fmt.Sprintf(`service prog {
			command %s -test.run=^$
			env %s 1
			env GA2_SIGNAL %s
			per_user
			credential_env TOKEN
			tools pid ask
			timeout 30s
			stop_timeout 2s
			allow_http
			auth %s
		}`, exe, ga2ProgramEnv, signal, oauthBlock(p, ""))})
	p.allowRedirect(g.URL + "/v1/connections/prog/callback")
	if status, page := g.signedIn(t, aliceKey).connect("prog"); status != http.StatusOK || !strings.Contains(page, "is connected") {
		t.Fatalf("connecting: %d %.300s", status, page)
	}
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "prog"), "prog")
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"runner","version":"1"}}}`)
	if status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", status, msgs)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	if status, _, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", status)
	}
	pidOf := func(id int) string {
		status, msgs, err := faPost(m, `{"jsonrpc":"2.0","id":`+strconv.Itoa(id)+`,"method":"tools/call","params":{"name":"pid","arguments":{}}}`)
		if err != nil || len(msgs) == 0 {
			t.Fatalf("pid: HTTP %d %v", status, err)
		}
		return gjson.GetBytes(msgs[len(msgs)-1], "result.content.0.text").String()
	}
	pid1 := pidOf(1)
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ask","arguments":{}}}`)
	pid2 := pid1
	for i := 10; pid2 == pid1 && i < 60; i++ {
		time.Sleep(250 * time.Millisecond)
		pid2 = pidOf(i)
	}
	if pid1 == "" || pid2 == pid1 {
		t.Fatalf("premise: no new process after the token's lifetime (pids %q, %q)", pid1, pid2)
	}
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	id := ""
	for id == "" {
		msg := faNext(t, c)
		t.Logf("call: %s", msg)
		if gjson.GetBytes(msg, "method").String() == "sampling/createMessage" {
			id = gjson.GetBytes(msg, "id").Raw
		}
	}
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"role":"assistant","content":{"type":"text","text":"fine"},"model":"m"}}`, nil)
	final := ""
	for msg := range c {
		t.Logf("call: %s", msg)
		final = gjson.GetBytes(msg, "result.content.0.text").String()
	}
	t.Logf("pids %s then %s; answer HTTP %d %s; call answered %q", pid1, pid2, status, body, final)
	if status != http.StatusAccepted || final != "sampled by "+pid1+": fine" {
		t.Errorf("the answer to the sampling request of the process still running the call (pid %s, winding down after the token refresh): HTTP %d %.200s; the call answered %q, want it sampled", pid1, status, body, final)
	}
}

// Attack (fixed): the runner's own cancellation of its call goes to the wrong
// upstream session. A call runs on a stream of upstream session S1;
// another call of the runner's (a ping) finds S1 expired and toolgate
// re-initializes it (S2), while S1's stream goes on (the same situation
// 2e38faa handles for the upstream's requests and cancellations on that
// stream). The runner then cancels its call (notifications/cancelled,
// requestId 5): forward → post sends it into the current upstream session
// S2, which never had request 5 (or has another request 5), and S1, where
// the call runs, is never told: the call the runner stopped goes on
// upstream until it ends by itself. Severity: low to medium (a runner
// cannot stop a long or costly tool call across a re-initialization; a
// cancellation reaches a session that did not get the request). Fix: the
// MCP session records, with each runner request in progress
// (Session.Requesting), the upstream session it was sent in, and a
// runner's notifications/cancelled naming such a request goes there
// (never re-initializing for it); one naming nothing in progress is
// dropped. (Not new in 2e38faa: the test fails at ff952ea too; it is the
// runner→upstream side of what 2e38faa fixed for upstream→runner.)
// Fixed: the MCP session records the upstream session each runner request
// in progress here went to (Session.SentIn), and the runner's cancellation
// of one goes there (mcpproxy cancelInProgress).
//
// The same for a call whose upstream answers with JSON (from
// serverrequest_fix3_attack_test.go: the record was made only once the
// answer's headers came, that is with the answer; it is made before the
// request is sent now).
func TestServerRequestGenAttack2RunnerCancellationGoesToTheNewSession(t *testing.T) {
	for _, answer := range []string{"sse", "json"} {
		t.Run(answer, func(t *testing.T) { runnerCancelsAcrossReinit(t, answer) })
	}
}

// runnerCancelsAcrossReinit runs call 5 in upstream session S1 (answered
// as answer says, "sse" or "json": see srCancelUpstream), has a ping find
// S1 expired (S2), cancels the call, and checks that the cancellation
// reached S1 only.
func runnerCancelsAcrossReinit(t *testing.T, answer string) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	cu := srCancelUpstream(t, up, func(b []byte) bool { return gjson.GetBytes(b, "params.requestId").Raw == "5" }, answer)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = faPost(m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	}()
	cu.waitCall()
	srPing(t, m, 2, "ping")
	srCancel(t, m, 5, "the user stopped it", "the runner's cancellation")
	cu.waitCancel()
	cu.letGo()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Error("the call never ended")
	}
	st := cu.state()
	if !st.expired {
		t.Fatal("premise: no re-initialization")
	}
	st.onlyInTheCallsSession(t, "the runner's cancellation of its call 5, running in upstream session %s, reached upstream session %s, and not the one running it")
}

// ga2Until polls cond every 20ms until it holds or d passes.
func ga2Until(cond func() bool, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// Holds: the refused resume of a stream of a replaced upstream session
// (resumeForRunner → runnerStream.upstreamReplaced) gives back what the
// kept stream held (its request's body room, its stream place) and tells
// only the upstream session that ran the call to stop it: the cancellation
// of call 7 never reaches the session that replaced it, whose own request
// 7 may be another. Would fail if upstreamReplaced kept the stream (and
// its room) until the call's deadline, or cancelled the call through the
// MCP session's current upstream session.
func TestServerRequestGenAttack2HoldsRefusedResumeFreesAndCancelsInTheOldSession(t *testing.T) {
	key, _, auth := acctUser("gen-resume2")
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "8s", AuthExtra: auth})
	m := acctRunner(t, g, key)
	before := readBoundGauges(t, g)
	lastID, first := srDroppedWaitCall(t, up, m, strings.Repeat("x", 20000))
	if now := readBoundGauges(t, g); now.bytes <= before.bytes {
		t.Logf("premise: the kept stream holds no request bytes (%v, before %v)", now, before)
	}
	srForgetSessions(t, up, m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	status, body, err := raGet(ctx, m, lastID)
	if err != nil || status != http.StatusBadRequest || !strings.Contains(body, "replaced") {
		t.Fatalf("premise: the resume: HTTP %d %v %.300s, want 400", status, err, body)
	}
	cancelledIn := func() (old, other []string) {
		for _, r := range up.requestLog() {
			if r.Method == http.MethodPost && gjson.Get(r.Body, "method").String() == "notifications/cancelled" && gjson.Get(r.Body, "params.requestId").Raw == "7" {
				if s := r.Header.Get("Mcp-Session-Id"); s == first {
					old = append(old, s)
				} else {
					other = append(other, s)
				}
			}
		}
		return old, other
	}
	ga2Until(func() bool { old, _ := cancelledIn(); return len(old) > 0 }, 3*time.Second)
	gaugesBackWithin(t, g, before, 5*time.Second)
	old, other := cancelledIn()
	if len(old) == 0 {
		t.Errorf("the call 7 whose stream was refused was never cancelled in upstream session %s", first)
	}
	if len(other) > 0 {
		t.Errorf("the cancellation of call 7 of upstream session %s reached %v", first, other)
	}
	// The stream is forgotten: resuming it again is refused as naming nothing.
	if status, body, err := raGet(ctx, m, lastID); err != nil || status != http.StatusBadRequest || !strings.Contains(body, "names no stream") {
		t.Errorf("resuming the refused stream again: HTTP %d %v %.300s, want 400 naming no stream", status, err, body)
	}
}

// Holds since f2733f2 (fails at 2e38faa, where refuseServerRequest still
// answered into call.MCPSession.Upstream(), the session now current): a
// server→client request that S1 asks on a call's stream still open after
// toolgate replaced S1 by S2, and that toolgate refuses (the runner's
// request takes no SSE stream), is refused in S1, the session that asked
// it: S2's own request 1 is another, and must not get S1's error.
func TestServerRequestGenAttack2HoldsRefusalGoesToTheAskingSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	gu := srAskUpstream(up, srAskOptions{})
	done := make(chan int, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := m.send(ctx, http.MethodPost, "application/json", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, "")
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	gu.waitCall()
	srPing(t, m, 2, "ping")
	close(gu.ask)
	gu.waitAnswer(5 * time.Second)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Error("the call never ended")
	}
	st := gu.state()
	if !st.expired {
		t.Fatal("premise: no re-initialization")
	}
	t.Logf("call in %s; refusals in %v", st.callSess, st.answers)
	if len(st.answers) == 0 {
		t.Fatal("premise: the request was not refused upstream")
	}
	for _, s := range st.strays() {
		t.Errorf("toolgate's refusal of request 1 of upstream session %s reached upstream session %s", st.callSess, s)
	}
}

// Attack (fixed): a legitimate resume is refused, and the runner loses its
// standalone stream for good. A runner's standalone stream (GET, opened in
// upstream session S1) drops; a call finds S1 expired and toolgate
// re-initializes it (S2); the runner resumes its standalone stream with
// Last-Event-ID, as the SDKs do. Since 2e38faa resumeForRunner refuses
// it (400, "the request's answer is lost; send it again") and forgets it —
// though the standalone stream has no request and no answer to lose, and
// carries toolgate's own notices besides the upstream's (an approval
// decided: notifications/elicitation/complete, see
// TestResume2AttackResumedStandaloneStreamGetsNoNotices). A client that
// reconnects with the stream's Last-Event-ID (the TypeScript SDK retries
// it a few times, then gives up on the standalone stream) is left without
// one: from then on the runner gets neither S2's
// server-initiated messages nor toolgate's notices, and an approval
// decided for it waits for a stream that never comes. Severity: medium
// (availability of the approval flow and of server-initiated messages
// after any re-initialization; nothing leaks). Fix: a resumed standalone
// stream (st.call not a request) whose upstream session was replaced is
// continued on a new standalone stream of the current upstream session
// (openStream, no Last-Event-ID) with the notices attached, as stream
// does; only a request's stream is refused. (The test passes at ff952ea,
// which resumed it — wrongly, with S1's event id, in S2: the fix must
// open a new stream, not resume the old one.)
// Fixed: a resumed standalone stream whose upstream session was replaced
// goes on as a new standalone stream of the current one.
func TestServerRequestGenAttack2StandaloneStreamNotResumedAfterReinit(t *testing.T) {
	up := startUpstream(t)
	var ping srPingExpiry
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method == http.MethodGet {
			rrSSE(w)
			if r.Header.Get("Last-Event-Id") == "" {
				rrEvent(w, "sn-1", rrNote("standalone"))
			}
			<-r.Context().Done()
			return true
		}
		return ping.serve(w, r, b)
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals")})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initializeWith(`{"elicitation":{"url":{}}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lastID, drop := srStandalone(ctx, t, m)
	drop()
	srPing(t, m, 2, "ping")
	if !ping.expired() {
		t.Fatal("premise: no re-initialization")
	}
	rresp, refused := srResume(ctx, t, m, lastID)
	defer rresp.Body.Close()
	if rresp.StatusCode != http.StatusOK {
		t.Fatalf("resuming the standalone stream after the upstream session was re-initialized: HTTP %d %.300s; the runner has no standalone stream any more (toolgate's notices, S2's requests)", rresp.StatusCode, refused)
	}
	got := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		var sb strings.Builder
		for {
			n, err := rresp.Body.Read(b)
			sb.Write(b[:n])
			if strings.Contains(sb.String(), "notifications/elicitation/complete") || err != nil {
				got <- sb.String()
				return
			}
		}
	}()
	answer := m.call(1, "gated_tool", `{"text":"notice me"}`)
	id := gjson.GetBytes(answer, "error.data.elicitations.0.elicitationId").String()
	if id == "" {
		t.Fatalf("want -32042 with the approval's URL, got %s", answer)
	}
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode/100 != 2 {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	select {
	case text := <-got:
		if !strings.Contains(text, "notifications/elicitation/complete") {
			t.Errorf("the resumed standalone stream ended without the approval's notification: %.300q", text)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the approval was decided 5s ago and the runner's resumed standalone stream never got notifications/elicitation/complete")
	}
}

// Holds (replicas): a call runs on replica A in upstream session S1; a
// ping on replica B finds S1 expired and B re-initializes it (S2; A's copy
// may still say S1). S1's stream on A then asks roots/list (id 1), and the
// runner answers on A or on B. Whether S1 is really gone (every later
// request in it gets 404) or still alive, the answer reaches S1 or is
// refused, and never S2, whose own request 1 would be another: A's older
// copy sends it to S1 (where a 404 makes A re-initialize, find S2 and
// refuse), B's newer one refuses it at once. Would fail if the request
// were named by a replica's current copy, or post re-initialized into a
// session that did not ask.
func TestServerRequestGenAttack2HoldsReinitOnOtherReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	for _, answerOnB := range []bool{false, true} {
		for _, oldGone := range []bool{false, true} {
			t.Run(fmt.Sprintf("answer on B %v, S1 gone %v", answerOnB, oldGone), func(t *testing.T) {
				up := startUpstream(t)
				// A ping made while the call runs finds S1 expired; when
				// oldGone, every later request in S1 gets 404.
				gu := srAskUpstream(up, srAskOptions{
					expires: func(b []byte, calling bool) bool { return calling && gjson.GetBytes(b, "method").String() == "ping" },
					gone:    oldGone,
					linger:  3 * time.Second,
				})
				m, onB := srOnTwoReplicas(t, bin, up, "")
				c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
				gu.waitCall()
				srPing(t, onB, 2, "ping on B")
				close(gu.ask)
				id := srAskedID(t, c, "roots/list")
				on := m
				if answerOnB {
					on = onB
				}
				status, body := srPost(t, on, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
				for range c {
				}
				st := gu.state()
				t.Logf("answer: HTTP %d %.200s; call in %s, expired %s; answers in %v", status, body, st.callSess, st.expiredSess, st.answers)
				if st.expiredSess == "" || st.expiredSess != st.callSess {
					t.Fatal("premise: S1 was not re-initialized on B")
				}
				for _, s := range st.strays() {
					t.Errorf("the answer to request 1 of upstream session %s reached upstream session %s (HTTP %d)", st.callSess, s, status)
				}
				if status == http.StatusAccepted && len(st.answers) == 0 {
					t.Errorf("the answer was accepted (202) and reached no upstream session")
				}
			})
		}
	}
}
