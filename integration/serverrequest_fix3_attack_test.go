package integration

// Tests breaking 33b8aa9 and b32ac2c (a winding upstream session takes its
// answers; the runner's cancellation goes where its request went; a
// standalone stream outlives a re-initialization; sampling's tools,
// toolChoice and context need their capabilities; refusals bounded).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// f3SameIDUpstream is a Streamable HTTP MCP server that gives every
// session it initializes the same Mcp-Session-Id (a server deriving it
// from something fixed — the caller, a constant — or a hostile one), and
// numbers its own server→client requests from 1 in each session. A ping
// made while forget is set makes it forget its session (404, until the
// next initialize). A tools/call asks roots/list under id 1 on its stream
// and waits for release. Answers are recorded with the session generation
// (how many initializes) they arrived in.
type f3SameIDUpstream struct {
	URL     string
	mu      sync.Mutex
	gen     int
	gone    bool
	forget  bool
	answers []f3Answer
	release chan struct{}
}

type f3Answer struct {
	gen  int
	body string
}

func startF3SameID(t *testing.T) *f3SameIDUpstream {
	u := &f3SameIDUpstream{release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		u.letGo()
		srv.CloseClientConnections()
		srv.Close()
	})
	u.URL = srv.URL + "/mcp"
	return u
}

func (u *f3SameIDUpstream) letGo() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

func f3JSON(w http.ResponseWriter, id, result string) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result)
}

func (u *f3SameIDUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	msg := gjson.ParseBytes(body)
	method := msg.Get("method").String()
	switch r.Method {
	case http.MethodGet:
		http.Error(w, "no standalone stream", http.StatusMethodNotAllowed)
		return
	case http.MethodDelete:
		w.WriteHeader(http.StatusOK)
		return
	}
	u.mu.Lock()
	if method == "initialize" {
		u.gen++
		u.gone = false
		u.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", "f3-same-session")
		f3JSON(w, msg.Get("id").Raw, `{"protocolVersion":`+msg.Get("params.protocolVersion").Raw+
			`,"capabilities":{"tools":{}},"serverInfo":{"name":"f3","version":"1"}}`)
		return
	}
	gen := u.gen
	if r.Header.Get("Mcp-Session-Id") != "" && u.gone {
		u.mu.Unlock()
		http.Error(w, "unknown session", http.StatusNotFound)
		return
	}
	if method == "ping" && u.forget {
		u.forget, u.gone = false, true
		u.mu.Unlock()
		http.Error(w, "unknown session", http.StatusNotFound)
		return
	}
	if method == "" {
		u.answers = append(u.answers, f3Answer{gen, string(body)})
		u.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		return
	}
	u.mu.Unlock()
	switch {
	case strings.HasPrefix(method, "notifications/"):
		w.WriteHeader(http.StatusAccepted)
	case method == "ping":
		f3JSON(w, msg.Get("id").Raw, `{}`)
	case method == "tools/list":
		f3JSON(w, msg.Get("id").Raw, `{"tools":[{"name":"echo","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}}]}`)
	case method == "tools/call":
		sseStart(w)
		// This session's first request of its own: id 1, as in every session.
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n\n")
		flush(w)
		select {
		case <-u.release:
		case <-r.Context().Done():
		case <-time.After(15 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end %d\"}]}}\n\n", msg.Get("id").Raw, gen)
		flush(w)
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"unknown method"}}`, msg.Get("id").Raw)
	}
}

// Attack (fixed): the runner's answer to a server request of a replaced upstream
// session reaches another request of the session that replaced it. The
// exemption of 33b8aa9 (registry.relayAnswer and mcpproxy.post/askedIn:
// an answer to an older generation is relayed when the current upstream
// session has the same Ref, a digest of its Mcp-Session-Id) is made for
// the stdio bridge, which keeps its session id and tags its relayed ids by
// process (mcpbridge Link.relayedID), so its ids never repeat across
// re-initializations. It applies to every upstream. An HTTP upstream that
// hands out the same Mcp-Session-Id again after forgetting a session (one
// that derives it from something fixed, or a hostile one) starts its
// request ids again, as 2e38faa says ("its ids start again (its request of
// the same id is another)"). Here upstream session generation 1 asks
// roots/list id 1 on call 5's stream; a ping finds it forgotten and
// toolgate re-initializes (generation 2, same id); call 6 in generation 2
// asks its own roots/list id 1; the runner then answers generation 1's
// request (toolgate's id for it, which names generation 1): toolgate
// accepts it (202) and posts it into generation 2 under id 1, where it is
// taken as the answer to the other question. For elicitation (a user's
// "accept" of one question) or sampling, an answer is applied to a request
// the user never saw. Severity: medium (integrity of server→client
// answers across a re-initialization; needs an upstream that reuses its
// session id — its own requests are confused, nothing crosses users).
// Fix: honour the Ref exemption only where the ids of generations cannot
// collide — services of a toolgate transport (svc.Transport() != "", the
// bridge's tagged ids) — or record in the pending request that the asking
// session is a bridge's; refuse answers to older generations of any other
// upstream, whatever its session id.
// Fixed: only a bridged program's session (Service.Transport) re-initialized
// under the same id takes an answer of its earlier generation.
func TestServerRequestFix3AttackSameSessionIDAnswerReachesNewGeneration(t *testing.T) {
	up := startF3SameID(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	c1 := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"first"}}}`)
	id1 := srAskedID(t, c1, "roots/list")
	up.mu.Lock()
	up.forget = true
	up.mu.Unlock()
	srPing(t, m, 2, "ping")
	up.mu.Lock()
	gen := up.gen
	up.mu.Unlock()
	if gen < 2 {
		t.Fatalf("premise: no re-initialization (generation %d)", gen)
	}
	c2 := faStream(t, m, `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"text":"second"}}}`)
	id2 := srAskedID(t, c2, "roots/list")
	if id1 == id2 {
		t.Fatalf("premise: both requests relayed under the id %s", id1)
	}
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id1+`,"result":{"roots":[{"uri":"file:///answer-to-generation-1","name":"gen1"}]}}`, nil)
	up.letGo()
	for range c1 {
	}
	for range c2 {
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	t.Logf("generation 1 asked %s, generation 2 asked %s; the answer to %s: HTTP %d %.200s; answers upstream: %v", id1, id2, id1, status, body, up.answers)
	for _, a := range up.answers {
		if a.gen >= 2 && strings.Contains(a.body, "answer-to-generation-1") {
			t.Errorf("the answer to request 1 of upstream session generation 1 (forgotten by the upstream) was posted into generation 2, where request 1 is another question: %s (HTTP %d)", a.body, status)
		}
	}
	if status == http.StatusAccepted {
		t.Errorf("the answer to a request of a replaced upstream session (another one of the same id) was accepted: HTTP %d", status)
	}
}

// Attack (fixed): the runner's cancellation of a call whose stream it dropped (and
// may resume) goes to the session that replaced the one running it. When
// the runner's stream drops, relay returns quietly ("the runner may resume
// the stream"), request returns, and its deferred RequestDone forgets where
// the call went — though the call goes on upstream, kept for a resume
// until its deadline. The upstream session is then replaced (a ping finds
// it expired), and the runner, instead of resuming, cancels the call:
// cancelInProgress (then cancelsInReplaced) found nothing, and the cancellation went into S2.
// S1 runs the call until the deadline's own cancellation. (Nor does a
// resumed relay, resumeForRunner → relay, record SentIn.) Severity: low
// (a dropped call cannot be stopped across a re-initialization before its
// deadline). Fix: keep the SentIn record with the runnerStream while it is
// kept (end it in forget), and record it for a resumed relay.
// Fixed: a kept stream keeps the record until it is forgotten
// (runnerStream.sent).
func TestServerRequestFix3AttackCancellationOfDroppedStreamGoesToNewSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "12s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	// The upstream's own wait tool runs the call (and gets its
	// cancellations); a ping during the call finds its session expired.
	cu := srCancelUpstream(t, up, func(b []byte) bool { return strings.Contains(string(b), "f3-runner-stops-7") }, "")
	lastID, _ := acctOpenUntil(t, m, raWaitCall(7, ""), "") // to its priming event, then dropped
	if lastID == "" {
		t.Fatal("premise: the call's stream carried no event id")
	}
	time.Sleep(500 * time.Millisecond) // the relay notices the drop
	srPing(t, m, 8, "ping")
	srCancel(t, m, 7, "f3-runner-stops-7", "the runner's cancellation")
	cu.waitCancel()
	st := cu.state()
	if !st.expired {
		t.Fatal("premise: no re-initialization")
	}
	st.onlyInTheCallsSession(t, "the runner's cancellation of its call 7 (stream dropped, kept for a resume), running in upstream session %s, reached upstream session %s, and not the one running it")
}

// Attack (fixed): the standalone stream continued in the new upstream session is
// later resumed there with an event id of the old session. resumeForRunner
// continues a standalone stream whose upstream session was replaced
// (continuesIn: st.up becomes S2, upstreamID ""), but keeps the stream's
// window of upstream event ids, all S1's. The runner's next resume from
// an id of that window (its last event id, when the continued stream
// dropped before S2 sent anything with an id — exactly what an SDK
// sends) now passes upstreamIs, and toolgate asks S2 to resume from S1's
// event id: what the commit says the fix must not do ("wrongly, with S1's
// event id, in S2"). An upstream whose event store is shared across
// sessions (the Python SDK's is per server, keyed by event id alone)
// replays S1's events into S2's stream; a strict one refuses, and the
// runner's standalone stream is given up (release: "toolgate could not
// resume the upstream's stream"). Severity: low (the runner's own old
// events, replayed or its stream lost; nothing crosses users). Fix: on
// continuesIn, forget the window (or record the seq it starts at, and
// resume an older id as a new stream without Last-Event-ID).
// Fixed: continuesIn sets a floor: a resume from an event of the old
// session opens the stream anew, without Last-Event-ID.
func TestServerRequestFix3AttackContinuedStandaloneStreamResumedWithOldSessionsEventID(t *testing.T) {
	up := startUpstream(t)
	type getReq struct{ sess, last string }
	var mu sync.Mutex
	first := ""
	var gets []getReq
	var ping srPingExpiry
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		sess := r.Header.Get("Mcp-Session-Id")
		if r.Method == http.MethodGet {
			last := r.Header.Get("Last-Event-Id")
			mu.Lock()
			gets = append(gets, getReq{sess, last})
			if first == "" {
				first = sess
			}
			isFirst := sess == first
			mu.Unlock()
			rrSSE(w)
			if last == "" && isFirst {
				rrEvent(w, "ev-"+sess+"-1", rrNote("standalone of the first session"))
			} else {
				fmt.Fprint(w, ": open\n\n")
				flush(w)
			}
			select {
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
			return true
		}
		return ping.serve(w, r, b)
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lastID, drop := srStandalone(ctx, t, m)
	drop()
	srPing(t, m, 2, "ping")
	// The first resume: continued as a new standalone stream of S2.
	rctx, rcancel := context.WithCancel(ctx)
	rresp, refused := srResume(rctx, t, m, lastID)
	if rresp.StatusCode != http.StatusOK {
		t.Fatalf("premise: the first resume after the re-initialization: HTTP %d %.300s", rresp.StatusCode, refused)
	}
	ga2Until(func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, gr := range gets {
			if gr.sess != first {
				return true
			}
		}
		return false
	}, 5*time.Second)
	rcancel() // it drops before S2 sent anything with an id
	rresp.Body.Close()
	time.Sleep(200 * time.Millisecond)
	// The runner resumes from the last event id it got, again.
	r2ctx, r2cancel := context.WithTimeout(ctx, 3*time.Second)
	defer r2cancel()
	if r2, err := m.send(r2ctx, http.MethodGet, "text/event-stream", "", lastID); err == nil {
		t.Logf("the second resume: HTTP %d", r2.StatusCode)
		go func() {
			<-time.After(time.Second)
			r2cancel()
		}()
		_, _ = io.Copy(io.Discard, r2.Body)
		r2.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("first session %s; GETs upstream: %+v", first, gets)
	if !ping.expired() {
		t.Fatal("premise: no re-initialization")
	}
	for _, gr := range gets {
		if gr.sess != first && strings.HasPrefix(gr.last, "ev-"+first) {
			t.Errorf("upstream session %s was asked to resume a stream from event %q, an event of the replaced session %s", gr.sess, gr.last, first)
		}
	}
}

// Attack (fixed): the standalone stream is still not continued when the resume
// itself is what finds the upstream session gone — the usual case.
// 33b8aa9 continues a standalone stream in the current upstream session
// only when toolgate had already replaced the old one (another request got
// the 404 first). When the upstream forgot the session (it restarted,
// which is also why the runner's stream dropped) and the runner's resume
// is the first thing to reach it, resumeForRunner sends GET with
// Last-Event-ID into the forgotten session through getStream, which never
// re-initializes: the 404 becomes 503 "the upstream session expired"
// (retryable) to the runner, and so does every retry — the stream is kept,
// but nothing re-initializes until the runner sends some other request.
// A runner idle on its standalone stream (waiting for toolgate's notices
// or the server's requests) retries its resume until its SDK gives up
// (the TypeScript SDK after a few tries), and has no standalone stream
// any more, exactly as in
// TestServerRequestGenAttack2StandaloneStreamNotResumedAfterReinit, which
// the commit fixed for the other order only. Severity: medium
// (availability of the approval flow and of server-initiated messages
// after an upstream restart; nothing leaks). Fix: in resumeForRunner,
// when the standalone stream's resume finds the session gone
// (kindSessionGone), re-initialize (h.reinitialize with st.up) and
// continue as a new standalone stream of the new session (continuesIn,
// no Last-Event-ID), as for a session replaced before.
// Fixed: a standalone resume that finds its session gone re-initializes
// it and goes on as the new session's; a request's is refused (400).
func TestServerRequestFix3AttackStandaloneResumeThatFindsTheSessionGoneIsLost(t *testing.T) {
	up := startUpstream(t)
	var mu sync.Mutex
	first, forgotten := "", false
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		sess := r.Header.Get("Mcp-Session-Id")
		mu.Lock()
		gone := forgotten && sess != "" && sess == first
		mu.Unlock()
		if gone {
			http.Error(w, "unknown session", http.StatusNotFound) // the upstream restarted
			return true
		}
		if r.Method != http.MethodGet {
			return false
		}
		mu.Lock()
		if first == "" {
			first = sess
		}
		isFirst := sess == first
		mu.Unlock()
		rrSSE(w)
		if r.Header.Get("Last-Event-Id") == "" && isFirst {
			rrEvent(w, "ev-1", rrNote("standalone"))
		}
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
		return true
	})
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lastID, drop := srStandalone(ctx, t, m)
	mu.Lock()
	forgotten = true // the upstream restarts; the runner's stream drops
	mu.Unlock()
	drop()
	time.Sleep(200 * time.Millisecond)
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	rresp, refused := srResume(rctx, t, m, lastID)
	defer rresp.Body.Close()
	if rresp.StatusCode != http.StatusOK {
		t.Errorf("resuming the standalone stream of an upstream session the upstream forgot: HTTP %d %.300s; the runner has no standalone stream any more", rresp.StatusCode, refused)
		// Retried, it fails the same way: nothing re-initializes.
		if status, body, err := raGet(rctx, m, lastID); err == nil {
			t.Logf("resuming again: HTTP %d %.200s", status, body)
		}
	}
}

// Attack (fixed): 33b8aa9 breaks sampling for runners of the revisions before
// 2025-11-25. mcp2026.RequiredCapability now makes any includeContext
// other than "none" need sampling.context — a capability 2025-11-25
// introduced. In 2025-06-18 (and 2025-03-26, 2024-11-05) includeContext
// "thisServer"/"allServers" is a plain member of sampling/createMessage
// that needs nothing beyond sampling (the client "MAY ignore" it), and no
// client of those revisions declares sampling.context: it did not exist.
// A runner that negotiated 2025-06-18 and declared sampling is now refused
// every sampling request that asks for context (the upstream gets
// toolgate's error, the runner never sees the request), though both
// sides follow their revision. 2025-11-25 itself only says servers
// SHOULD use those values when the client declares sampling.context.
// Severity: low to medium (availability: sampling with context — common
// in servers written against 2025-06-18 — breaks for every older runner;
// nothing leaks). Fix: require sampling.context only when the upstream
// session's negotiated protocol version is 2025-11-25 or later (pass it
// to RequiredCapability); or, for a runner that did not declare it,
// relay the request with includeContext "none" rather than refusing it
// (the client may ignore it anyway).
// Fixed: includeContext needs sampling.context only from 2025-11-25
// (mcp2026.RequiredCapabilityIn).
func TestServerRequestFix3AttackIncludeContextRefusedToOlderRevisionRunner(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := srRunnerAt(t, g, "2025-06-18", `{"sampling":{}}`)
	got := capsAttackCall(t, up, m, "echo",
		`{"jsonrpc":"2.0","id":21,"method":"sampling/createMessage","params":{"_meta":{"k":"none"},"messages":[],"maxTokens":5}}`,
		`{"jsonrpc":"2.0","id":22,"method":"sampling/createMessage","params":{"_meta":{"k":"thisServer"},"messages":[],"maxTokens":5,"includeContext":"thisServer"}}`)
	t.Logf("the 2025-06-18 runner was asked %q", got)
	if !slices.Contains(got, "none") {
		t.Fatalf("premise: the runner was not asked even the plain sampling request: %q", got)
	}
	if !slices.Contains(got, "thisServer") {
		t.Errorf("a runner of 2025-06-18 that declared sampling was refused a sampling/createMessage with includeContext \"thisServer\", a plain member of its revision (sampling.context does not exist there)")
	}
}

// Holds: the bound on refusals in flight (refusals.go) gives its places
// back. An upstream floods undeclared roots/list requests and stalls the
// refusals (8 in flight, the rest dropped); once it lets them go, the
// same MCP session refuses the next undeclared request again, at once.
// Would fail if a refusal's count were never decremented (a session that
// can never refuse again) or a dropped request held a place.
func TestServerRequestFix3HoldsRefusalPlacesComeBack(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`) // no roots
	stall := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(stall) }) }
	defer letGo()
	var mu sync.Mutex
	refused := map[string]bool{}
	round := 0
	// The first call floods 30 undeclared roots/list; the next asks one.
	call := capsAttackStream(func() []string {
		mu.Lock()
		round++
		n := round
		mu.Unlock()
		if n > 1 {
			return []string{`{"jsonrpc":"2.0","id":"rp-after","method":"roots/list"}`}
		}
		flood := make([]string, 30)
		for i := range flood {
			flood[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":"rp-flood-%d","method":"roots/list"}`, i)
		}
		return flood
	}, func() { time.Sleep(300 * time.Millisecond) })
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		if id := gjson.GetBytes(b, "id").String(); strings.HasPrefix(id, "rp-") && gjson.GetBytes(b, "error").Exists() {
			mu.Lock()
			refused[id] = true
			mu.Unlock()
			if strings.HasPrefix(id, "rp-flood-") {
				select {
				case <-stall:
				case <-r.Context().Done():
				case <-time.After(15 * time.Second):
				}
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		return call(w, r, b)
	})
	for range faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
	}
	ga2Until(func() bool { mu.Lock(); defer mu.Unlock(); return len(refused) >= 8 }, 5*time.Second)
	letGo()
	time.Sleep(300 * time.Millisecond) // the stalled refusals end
	for range faStream(t, m, `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
	}
	ok := ga2Until(func() bool { mu.Lock(); defer mu.Unlock(); return refused["rp-after"] }, 5*time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d refusals reached the upstream", len(refused))
	if !ok {
		t.Errorf("after its stalled refusals ended, the MCP session never refused the next undeclared request (its places in the bound on refusals never came back)")
	}
}
