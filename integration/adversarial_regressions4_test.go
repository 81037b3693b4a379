package integration

// Attacks on a fourth round of fixes (a held stateless call handing its
// stream place and request byte room to the retry that continues it, a
// configuration that stops giving up its held calls, the HTTP API's own
// 401 body, GET /v1/approvals refusing an unknown state): what each fix
// missed or made worse. Tests whose comment starts with "Attack" describe
// what an attack would get through without the defence the test checks
// (each failed before its fix); those starting with "Holds" show attacks
// the design resists.

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Users of their own: stream places and request byte room are counted per
// user across the process (and outlive a configuration), so a call one
// test leaves held must not take another test's places.
const (
	r4DaveKey  = "test-key-r4-dave"
	r4Dave     = "dave@example.test"
	r4ErinKey  = "test-key-r4-erin"
	r4Erin     = "erin@example.test"
	r4FrankKey = "test-key-r4-frank"
	r4Frank    = "frank@example.test"
	r4GraceKey = "test-key-r4-grace"
	r4Grace    = "grace@example.test"
)

// r4Users is the auth block's lines adding the users above.
func r4Users() string {
	return "api_key " + hashKey(r4DaveKey) + " " + r4Dave + "\n" +
		"api_key " + hashKey(r4ErinKey) + " " + r4Erin + "\n" +
		"api_key " + hashKey(r4FrankKey) + " " + r4Frank + "\n" +
		"api_key " + hashKey(r4GraceKey) + " " + r4Grace
}

// r4Answer is a stateless runner's answer.
type r4Answer struct {
	status int
	msg    map[string]any
	err    error
}

// r4Send is saSend for a goroutine: it reports a failure instead of
// failing the test.
func r4Send(g *gateway, token, session, name, body string) r4Answer {
	req, err := http.NewRequest(http.MethodPost, g.URL+"/v1/mcp/svc", strings.NewReader(body))
	if err != nil {
		return r4Answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Toolgate-Session", session)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", name)
	resp, err := (&http.Client{Transport: g.transport(), Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return r4Answer{err: err}
	}
	defer resp.Body.Close()
	data := answerBody(resp)
	var out map[string]any
	_ = json.Unmarshal(data, &out)
	if out == nil {
		out = map[string]any{"raw": string(data)}
	}
	return r4Answer{status: resp.StatusCode, msg: out}
}

// r4State is the requestState of an input_required answer.
func r4State(t *testing.T, msg map[string]any) string {
	t.Helper()
	state, _ := aaResult(msg)["requestState"].(string)
	if aaResult(msg)["resultType"] != "input_required" || state == "" {
		t.Fatalf("not an input_required answer with a requestState: %s", aaJSON(msg))
	}
	return state
}

// ---------------------------------------------------------------------------
// Attacks
// ---------------------------------------------------------------------------

// Attack (missed): a call held by a configuration that stopped already
// keeps its caller's stream place until the service timeout, and nothing
// can continue it. The fix releases the held calls when the configuration
// stops (internal/mcp2026/held.go:121-140 releaseAll, registered with
// app.OnStop at internal/mcp2026/runtime.go:83), but Caddy's reload does
// not wait for the old configuration's requests: the http app's Stop only
// starts its servers' graceful shutdown, and a request the old server
// was reading goes on through the old configuration's handlers. One that
// holds its call after releaseAll ran goes into the stopped runtime's
// holds all the same (held.go:66-91 Hold knows no "stopped";
// modules/mcpproxy/rounds.go:253-281 hold), keeping the request's stream
// place (rounds.go:265 placeOf) and room, its goroutine and the
// upstream's stream until its deadline; its requestState reaches the new
// configuration, which holds nothing of it. Stream counts are
// process-wide, so a runner that has requests in flight across reloads
// (a body sent slowly is enough) fills its max_streams_per_caller, and
// with several callers max_streams, with calls nobody can continue. Here,
// with max_streams_per_caller 1, a call whose body arrives just after a
// reload is held by the old configuration, and its caller cannot make any
// call on the new one. Fix: releaseAll marks the runtime stopped (under
// holds.mu) and Hold refuses once it is (hold then fails, giving the
// place and room back), or releases what it is given at once.
func TestRegression4AttackCallHeldAfterReloadKeepsPlace(t *testing.T) {
	up := startUpstream(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "60s", DataDir: t.TempDir(),
		AuthExtra: r4Users(), Extra: "max_streams_per_caller 1"}
	port := freePort(t)
	g := startGatewayOnPort(t, port, cfg)
	session := g.createSession(t, r4DaveKey, "svc")
	// The request's head reaches the old configuration, which starts
	// reading its body (100 Continue); the body comes after the reload.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(g.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	body := saCall(1, "ask", `{}`, `{"elicitation":{}}`, "")
	head := "POST /v1/mcp/svc HTTP/1.1\r\nHost: " + strings.TrimPrefix(g.URL, "http://") + "\r\n" +
		"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n" +
		"Authorization: Bearer " + r4DaveKey + "\r\nX-Toolgate-Session: " + session + "\r\n" +
		"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: ask\r\n" +
		"Content-Length: " + aaItoa(len(body)) + "\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	if cont, err := http.ReadResponse(br, nil); err != nil || cont.StatusCode != http.StatusContinue {
		t.Fatalf("the old configuration did not start reading the body: %v %v", cont, err)
	}
	g2 := startGatewayOnPort(t, port, cfg) // returns once the old configuration stopped (releaseAll ran)
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if d, ok := strings.CutPrefix(lines[i], "data: "); ok {
				data = []byte(d)
				break
			}
		}
	}
	var msg map[string]any
	_ = json.Unmarshal(data, &msg)
	if resp.StatusCode != http.StatusOK || aaResult(msg)["resultType"] != "input_required" {
		// Not held: nothing of the flaw to show (the old configuration
		// refused to hold it, as it should).
		t.Logf("the call across the reload was not held: %d %s", resp.StatusCode, data)
	}
	// The caller has no call in progress it could end, yet (with the flaw)
	// every call of its is refused until the old configuration's deadline.
	echo := r4Send(g2, r4DaveKey, session, "echo", saCall(3, "echo", `{"text":"hi"}`, `{}`, ""))
	if echo.err != nil {
		t.Fatal(echo.err)
	}
	if echo.status != http.StatusOK || strings.Contains(aaJSON(echo.msg), "max_streams_per_caller") {
		t.Fatalf("a call held by the configuration that had stopped (its answer: %d %.200s) keeps its caller's only stream place: the caller's next call on the new configuration: %d %s",
			resp.StatusCode, data, echo.status, aaJSON(echo.msg))
	}
}

// Attack (made worse): every retry that continues a held call and holds it
// again adds its own body's room to the call's, although the call keeps
// only its first round's body. continueHeld hands the held call's place
// and room to the retry (modules/mcpproxy/rounds.go:107-117 handOver →
// streamPlace.done), and when the call is held again, hold takes that
// streamPlace.done over as the new hc.slot — which gives back the old room
// too — and hands the retry's own room over as hc.room
// (rounds.go:265-266: hc.slot = placeOf(r); hc.room =
// gateway.RequestRoom(r.Context()).Handover(), the room
// modules/registry/registry.go:151-155 put in the retry's context). The
// retry's body is not kept (continueHeld copies the first round's call,
// rounds.go:308-310; the retry's message only names the next
// requestState), yet its room stays until the call ends. So a call whose
// upstream asks several times, or a runner that retries without answering
// (the call is asked again), piles up max_request_bytes_in_flight room
// until its own continuation is refused (503, "retryable") — and stays
// refused until the call expires, which also refuses every other request
// of the caller's. Here, with max_request_size 64 KiB and a share of
// 128 KiB, a call held with a small body is retried three times with
// 50 KiB bodies that answer nothing: the third is refused although only
// a few hundred bytes are kept. Fix: when a continued call is held again,
// give back the room handed over with the place (keep hc.room as it was:
// the first round's body), and release the retry's room as usual; e.g.
// hand over only the stream place in handOver and keep hc.room on the
// held call across rounds.
func TestRegression4AttackRetryRoomPilesUpAcrossRounds(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "30s", AuthExtra: r4Users(),
		Extra: "max_request_size 64KiB\nmax_request_bytes_in_flight_per_caller 128KiB\nmax_request_bytes_in_flight 16MiB"})
	session := g.createSession(t, r4ErinKey, "svc")
	a := r4Send(g, r4ErinKey, session, "ask", saCall(1, "ask", `{}`, `{"elicitation":{}}`, ""))
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("the call asking for input: %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
	state := r4State(t, a.msg)
	pad := strings.Repeat(" ", 50<<10) // JSON white space, kept in the body as it came
	for i := range 3 {
		a = r4Send(g, r4ErinKey, session, "ask", saCall(2+i, "ask", `{}`, `{"elicitation":{}}`,
			`,"inputResponses":{},"requestState":`+aaJSON(state))+pad)
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.status != http.StatusOK || aaResult(a.msg)["resultType"] != "input_required" {
			t.Fatalf("retry %d (50 KiB, answering nothing) of a call held with a small body: %d %s — the room of the earlier retries, whose bodies are gone, is still held for the call",
				i+1, a.status, aaJSON(a.msg))
		}
		state = r4State(t, a.msg)
	}
	a = r4Send(g, r4ErinKey, session, "ask", saCall(9, "ask", `{}`, `{"elicitation":{}}`,
		`,"inputResponses":{"upstream-1":{"action":"accept","content":{"ok":true}}},"requestState":`+aaJSON(state)))
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(aaJSON(a.msg), "elicitation answered: accept") {
		t.Fatalf("the answered retry: %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
}

// ---------------------------------------------------------------------------
// Holds
// ---------------------------------------------------------------------------

// Holds: a retry whose requestState names a held call opens no stream place
// of its own (modules/mcpproxy/mcpproxy.go:94-99), but it cannot be used to
// pass max_streams_per_caller: a requestState naming a held call is sealed
// by toolgate and redeemed once by the registry before the proxy
// (modules/registry/stateless.go:42-51), so a replayed one is refused with
// 400 there, and one naming a call that is no longer held is answered at
// once (continueHeld, 400). Here, at max_streams_per_caller 1, the held
// call is continued once; its requestState replayed (twice, concurrently
// with a held call) and a made-up one are refused, and the caller's place
// is back afterwards.
func TestRegression4HoldsStaleHeldStateOpensNothing(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "30s", AuthExtra: r4Users(),
		Extra: "max_streams_per_caller 1"})
	session := g.createSession(t, r4FrankKey, "svc")
	ask := func(id int, extra string) r4Answer {
		a := r4Send(g, r4FrankKey, session, "ask", saCall(id, "ask", `{}`, `{"elicitation":{}}`, extra))
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a
	}
	answer := func(state string) string {
		return `,"inputResponses":{"upstream-1":{"action":"accept","content":{"ok":true}}},"requestState":` + aaJSON(state)
	}
	state := r4State(t, ask(1, "").msg)
	if a := ask(2, answer(state)); a.status != http.StatusOK || !strings.Contains(aaJSON(a.msg), "elicitation answered: accept") {
		t.Fatalf("the continuation: %d %s", a.status, aaJSON(a.msg))
	}
	// A new held call takes the one place; the spent requestState of the
	// first names a call that is gone.
	state2 := r4State(t, ask(3, "").msg)
	for i := range 2 {
		if a := ask(4+i, answer(state)); a.status != http.StatusBadRequest || !strings.Contains(aaJSON(a.msg), "requestState refused") {
			t.Fatalf("a replayed requestState naming a held call: %d %s", a.status, aaJSON(a.msg))
		}
	}
	if a := ask(6, answer("toolgate.1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")); a.status != http.StatusBadRequest {
		t.Fatalf("a made-up requestState: %d %s", a.status, aaJSON(a.msg))
	}
	// The other held call is still there, and its place was not given twice.
	if a := ask(7, ""); a.status != http.StatusServiceUnavailable || !strings.Contains(aaJSON(a.msg), "max_streams_per_caller") {
		t.Fatalf("a new call while one is held at max_streams_per_caller 1: %d %s", a.status, aaJSON(a.msg))
	}
	if a := ask(8, answer(state2)); a.status != http.StatusOK || !strings.Contains(aaJSON(a.msg), "elicitation answered: accept") {
		t.Fatalf("the second held call's continuation: %d %s", a.status, aaJSON(a.msg))
	}
	if a := ask(9, ""); a.status != http.StatusOK || aaResult(a.msg)["resultType"] != "input_required" {
		t.Fatalf("a call after every held call ended: %d %s", a.status, aaJSON(a.msg))
	}
}

// Holds: a call held when its configuration is replaced gives its stream
// place back at the reload (releaseAll), not at its deadline: at
// max_streams_per_caller 1 the caller's next call on the new configuration
// is held in turn, and the old requestState is refused there.
func TestRegression4HoldsReloadReleasesHeldCall(t *testing.T) {
	up := startUpstream(t)
	cfg := gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "60s", DataDir: t.TempDir(), AuthExtra: r4Users(),
		Extra: "max_streams_per_caller 1"}
	port := freePort(t)
	g := startGatewayOnPort(t, port, cfg)
	session := g.createSession(t, r4GraceKey, "svc")
	a := r4Send(g, r4GraceKey, session, "ask", saCall(1, "ask", `{}`, `{"elicitation":{}}`, ""))
	if a.err != nil {
		t.Fatal(a.err)
	}
	state := r4State(t, a.msg)
	g2 := startGatewayOnPort(t, port, cfg)
	a = r4Send(g2, r4GraceKey, session, "ask", saCall(2, "ask", `{}`, `{"elicitation":{}}`, ""))
	if a.err != nil || a.status != http.StatusOK || aaResult(a.msg)["resultType"] != "input_required" {
		t.Fatalf("a call after a reload gave up the held one (max_streams_per_caller 1): %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
	state2 := r4State(t, a.msg)
	a = r4Send(g2, r4GraceKey, session, "ask", saCall(3, "ask", `{}`, `{"elicitation":{}}`,
		`,"inputResponses":{"upstream-1":{"action":"accept","content":{"ok":true}}},"requestState":`+aaJSON(state)))
	if a.err != nil || a.status != http.StatusBadRequest || !strings.Contains(aaJSON(a.msg), "requestState refused") {
		t.Fatalf("the requestState of a call the old configuration held: %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
	a = r4Send(g2, r4GraceKey, session, "ask", saCall(4, "ask", `{}`, `{"elicitation":{}}`,
		`,"inputResponses":{"upstream-1":{"action":"accept","content":{"ok":true}}},"requestState":`+aaJSON(state2)))
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(aaJSON(a.msg), "elicitation answered: accept") {
		t.Fatalf("the new configuration's held call: %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
}

// Holds: the HTTP API checks the token before anything of the request (an
// unknown approvals state says nothing to a stranger), answers with its
// own error body and the challenge, and an unknown state is named quoted
// in a JSON error, whatever it holds.
func TestRegression4HoldsAPIUnauthorizedAndStateFilter(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: startUpstream(t).URL})
	for _, key := range []string{"", "not-a-key"} {
		r := g.api(t, http.MethodGet, "/v1/approvals?role=approver&state=bogus", key, nil)
		var body struct {
			Error struct{ Code, Message string }
		}
		if r.StatusCode != http.StatusUnauthorized || json.Unmarshal(r.Body, &body) != nil || body.Error.Code != "unauthorized" ||
			strings.Contains(string(r.Body), "jsonrpc") || strings.Contains(string(r.Body), "bogus") ||
			!strings.Contains(r.Header.Get("WWW-Authenticate"), "resource_metadata=") {
			t.Errorf("GET /v1/approvals with key %q: %d %s, WWW-Authenticate %q", key, r.StatusCode, r.Body, r.Header.Get("WWW-Authenticate"))
		}
	}
	r := g.api(t, http.MethodGet, "/v1/approvals?role=approver&state=%3Cscript%3E%22x", aliceKey, nil)
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(r.Body, &body); r.StatusCode != http.StatusBadRequest || err != nil || body.Error.Code != "invalid_state" ||
		!strings.Contains(body.Error.Message, `"<script>\"x"`) || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		t.Errorf("an unknown state: %d %s (%v) %s", r.StatusCode, r.Body, err, r.Header.Get("Content-Type"))
	}
	for _, state := range []string{"", "pending", "approved", "denied", "consumed", "expired"} {
		if r := g.api(t, http.MethodGet, "/v1/approvals?role=requester&state="+state, aliceKey, nil); r.StatusCode != http.StatusOK {
			t.Errorf("state %q: %d %s", state, r.StatusCode, r.Body)
		}
	}
}
