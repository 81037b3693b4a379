package integration

// Scripted upstreams and runner steps shared by the tests of server→client
// requests across a re-initialization of the upstream session
// (serverrequest_gen_attack*, serverrequest_fix3/fix4_attack,
// serverrequest_caps*, adversarial_open_cancel).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// srAsker is an upstream (see srAskUpstream) whose tools/call opens its
// stream, waits until ask is closed, then asks the runner roots/list under
// the id 1 on it (and, with cancel, cancels it once cancelNow is closed),
// and answers the call a while later. One request of the runner's finds
// the upstream session expired (404: toolgate re-initializes it). The
// answers it gets (result or error) are recorded with the upstream session
// they were sent in.
type srAsker struct {
	mu          sync.Mutex
	callSess    string // the upstream session of the last call
	expired     bool
	expiredSess string   // the upstream session found expired
	answers     []string // Mcp-Session-Id of each answer
	ask         chan struct{}
	cancelNow   chan struct{}
}

// srAskOptions are how an srAsker's session expires and its call ends;
// the zero value: the first ping expires it, and the call is answered
// 1.5 s after asking.
type srAskOptions struct {
	// expires tells the request that finds the session expired (the
	// first one gets 404; a later one goes to the upstream as any other);
	// calling says whether a call has started. Default: a ping.
	expires func(b []byte, calling bool) bool
	// gone: the expired session stays gone (every later POST in it gets
	// 404), as an upstream that forgot it.
	gone bool
	// cancel: after asking, the call cancels request 1 once cancelNow is
	// closed.
	cancel bool
	// linger is how long after asking (and cancelling) the call's stream
	// stays open before its answer, unless toolgate drops it first.
	// Default: 1.5 s.
	linger time.Duration
}

// srPingExpires: a ping finds the session expired.
func srPingExpires(b []byte, _ bool) bool { return gjson.GetBytes(b, "method").String() == "ping" }

func srAskUpstream(up *upstream, o srAskOptions) *srAsker {
	if o.expires == nil {
		o.expires = srPingExpires
	}
	if o.linger == 0 {
		o.linger = 1500 * time.Millisecond
	}
	u := &srAsker{ask: make(chan struct{}), cancelNow: make(chan struct{})}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		u.mu.Lock()
		gone := o.gone && sess != "" && sess == u.expiredSess
		expiring := o.expires(b, u.callSess != "")
		u.mu.Unlock()
		switch {
		case gone:
			w.WriteHeader(http.StatusNotFound)
			return true
		case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
			u.mu.Lock()
			u.answers = append(u.answers, sess)
			u.mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			return true
		case expiring:
			u.mu.Lock()
			defer u.mu.Unlock()
			if !u.expired {
				u.expired, u.expiredSess = true, sess
				w.WriteHeader(http.StatusNotFound) // toolgate replaces the upstream session
				return true
			}
			return false
		case gjson.GetBytes(b, "method").String() != "tools/call":
			return false
		}
		u.mu.Lock()
		u.callSess = sess
		u.mu.Unlock()
		sseStart(w)
		fmt.Fprint(w, ": started\n\n")
		flush(w)
		select {
		case <-u.ask:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n\n")
		flush(w)
		if o.cancel {
			select {
			case <-u.cancelNow:
			case <-time.After(10 * time.Second):
			}
			fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1,\"reason\":\"enough\"}}\n\n")
			flush(w)
		}
		select {
		case <-r.Context().Done():
		case <-time.After(o.linger):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	return u
}

// waitCall waits (at most 5 s) until a call has reached the upstream.
func (u *srAsker) waitCall() {
	ga2Until(func() bool { u.mu.Lock(); defer u.mu.Unlock(); return u.callSess != "" }, 5*time.Second)
}

// waitAnswer waits (at most d) until an answer has reached the upstream.
func (u *srAsker) waitAnswer(d time.Duration) {
	ga2Until(func() bool { u.mu.Lock(); defer u.mu.Unlock(); return len(u.answers) > 0 }, d)
}

// srAskState is what an srAsker saw, at one moment.
type srAskState struct {
	callSess, expiredSess string
	expired               bool
	answers               []string
}

func (u *srAsker) state() srAskState {
	u.mu.Lock()
	defer u.mu.Unlock()
	return srAskState{u.callSess, u.expiredSess, u.expired, append([]string(nil), u.answers...)}
}

// strays are the upstream sessions, other than the call's (the one that
// asked), that answers reached.
func (s srAskState) strays() []string {
	var out []string
	for _, a := range s.answers {
		if a != s.callSess {
			out = append(out, a)
		}
	}
	return out
}

// srCanceller is an upstream (see srCancelUpstream) that records the
// upstream session each of the runner's cancellations of its call arrives
// in. A ping made while a call runs finds the upstream session expired,
// once (404: toolgate re-initializes it).
type srCanceller struct {
	mu          sync.Mutex
	callSess    string // the upstream session of the last call
	expired     bool
	expiredSess string   // the upstream session found expired
	cancels     []string // Mcp-Session-Id of each cancellation of the call
	release     chan struct{}
	once        sync.Once
}

// srCancelUpstream scripts up: isCancel tells the runner's cancellation of
// the call (others are not recorded); answer is how the intercept answers
// a tools/call, held until letGo (or the end of the test): "sse" (a stream
// opened at once) or "json"; with "", up's own tools run the call and get
// the cancellations too, the intercept only records them.
func srCancelUpstream(t *testing.T, up *upstream, isCancel func(b []byte) bool, answer string) *srCanceller {
	u := &srCanceller{release: make(chan struct{})}
	t.Cleanup(u.letGo)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		switch gjson.GetBytes(b, "method").String() {
		case "notifications/cancelled":
			if isCancel(b) {
				u.mu.Lock()
				u.cancels = append(u.cancels, sess)
				u.mu.Unlock()
			}
			if answer == "" {
				return false
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		case "ping":
			u.mu.Lock()
			defer u.mu.Unlock()
			if !u.expired && u.callSess != "" {
				u.expired, u.expiredSess = true, sess
				w.WriteHeader(http.StatusNotFound)
				return true
			}
			return false
		case "tools/call":
			u.mu.Lock()
			u.callSess = sess
			u.mu.Unlock()
			if answer == "" {
				return false
			}
			if answer == "sse" {
				sseStart(w)
				fmt.Fprint(w, ": started\n\n")
				flush(w)
			}
			select {
			case <-u.release:
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			end := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"end"}]}}`, gjson.GetBytes(b, "id").Raw)
			if answer == "json" {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, end)
			} else {
				fmt.Fprintf(w, "data: %s\n\n", end)
				flush(w)
			}
			return true
		}
		return false
	})
	return u
}

// letGo lets the held calls answer.
func (u *srCanceller) letGo() { u.once.Do(func() { close(u.release) }) }

// waitCall waits (at most 5 s) until a call has reached the upstream.
func (u *srCanceller) waitCall() {
	ga2Until(func() bool { u.mu.Lock(); defer u.mu.Unlock(); return u.callSess != "" }, 5*time.Second)
}

// waitCancel waits (at most 3 s) until a cancellation of the call has
// reached the upstream.
func (u *srCanceller) waitCancel() {
	ga2Until(func() bool { u.mu.Lock(); defer u.mu.Unlock(); return len(u.cancels) > 0 }, 3*time.Second)
}

// srCancelState is what an srCanceller saw, at one moment.
type srCancelState struct {
	callSess, expiredSess string
	expired               bool
	cancels               []string
}

func (u *srCanceller) state() srCancelState {
	u.mu.Lock()
	defer u.mu.Unlock()
	return srCancelState{u.callSess, u.expiredSess, u.expired, append([]string(nil), u.cancels...)}
}

// onlyInTheCallsSession fails t unless the runner's cancellation reached
// the upstream session running the call, and only it; wrong is the error
// for one that reached another, formatted with the call's session and
// that one.
func (s srCancelState) onlyInTheCallsSession(t *testing.T, wrong string) {
	t.Helper()
	t.Logf("call in %s; the runner's cancellation of it reached %v", s.callSess, s.cancels)
	if len(s.cancels) == 0 {
		t.Fatal("the runner's cancellation reached no upstream session")
	}
	for _, c := range s.cancels {
		if c != s.callSess {
			t.Errorf(wrong, s.callSess, c)
		}
	}
}

// srPing pings (request id) in m's session and fails t unless it is
// answered 200; what names it in the failure ("ping", "ping on B").
func srPing(t *testing.T, m *rawMCP, id int, what string) {
	t.Helper()
	if status, _, err := faPost(m, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, id)); status != http.StatusOK || err != nil {
		t.Fatalf("%s: HTTP %d %v", what, status, err)
	}
}

// srCancel sends the runner's notifications/cancelled of its request id,
// with reason, in m's session, and fails t unless it is accepted (202);
// what names it in the failure.
func srCancel(t *testing.T, m *rawMCP, id int, reason, what string) {
	t.Helper()
	status, _, err := faPost(m, fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d,"reason":%q}}`, id, reason))
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("%s: HTTP %d %v", what, status, err)
	}
}

// srAskedID reads c up to the first request of method and returns its id
// (raw JSON): the id the runner was asked under.
func srAskedID(t *testing.T, c <-chan json.RawMessage, method string) string {
	t.Helper()
	for {
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == method {
			return gjson.GetBytes(msg, "id").Raw
		}
	}
}

// srRunnerAt is a runner of alice in a new session of svc, initialized at
// protocol version declaring caps; it fails t unless the gateway
// negotiated that version, and sends it on every request after.
func srRunnerAt(t *testing.T, g *gateway, version, caps string) *rawMCP {
	t.Helper()
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":` + caps + `,"clientInfo":{"name":"runner","version":"1"}}}`)
	if status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" || len(msgs) == 0 {
		t.Fatalf("initialize: %d %s", status, msgs)
	}
	if v := gjson.GetBytes(msgs[len(msgs)-1], "result.protocolVersion").String(); v != version {
		t.Fatalf("premise: negotiated %q, want %s", v, version)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	m.headers["Mcp-Protocol-Version"] = version
	if status, _, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", status)
	}
	return m
}

// srStandalone opens m's standalone stream (GET) and reads it up to its
// first event that says "standalone" and has an id, which it returns;
// drop ends the stream (as a runner's stream that drops).
func srStandalone(ctx context.Context, t *testing.T, m *rawMCP) (lastID string, drop func()) {
	t.Helper()
	sctx, scancel := context.WithCancel(ctx)
	resp, err := m.send(sctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil || resp.StatusCode != http.StatusOK {
		scancel()
		t.Fatalf("the standalone stream: %v %v", err, resp)
	}
	lastID = raLastID(raRead(t, resp.Body, "its first event", func(s string) bool { return strings.Contains(s, "standalone") && raHasID(s) }))
	return lastID, func() {
		scancel()
		resp.Body.Close()
	}
}

// srDroppedWaitCall sends up's wait tool call 7 (with pad) in m's session
// and drops its stream at its priming event; it returns the stream's last
// event id and the upstream session the call went to.
func srDroppedWaitCall(t *testing.T, up *upstream, m *rawMCP, pad string) (lastID, callSess string) {
	t.Helper()
	lastID, _ = acctOpenUntil(t, m, raWaitCall(7, pad), "") // to its priming event, then dropped
	if lastID == "" {
		t.Fatal("the call's stream carried no event id")
	}
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"name":"wait"`) {
			callSess = r.Header.Get("Mcp-Session-Id")
		}
	}
	return lastID, callSess
}

// srForgetSessions makes up forget its sessions and has a ping (id 8) of
// m's find its upstream session gone: toolgate re-initializes it.
func srForgetSessions(t *testing.T, up *upstream, m *rawMCP) {
	t.Helper()
	up.reset() // the upstream forgets its sessions
	if status, body := acctStatus(t, m, acctPing(8, 0)); status != http.StatusOK {
		t.Fatalf("a ping after the upstream forgot the session: %d %.300s", status, body)
	}
}

// srPingExpiry expires an upstream session once: the first ping it is
// given gets 404 (toolgate replaces the upstream session).
type srPingExpiry struct {
	mu   sync.Mutex
	done bool
}

// serve answers the first ping 404, and reports whether it answered.
func (e *srPingExpiry) serve(w http.ResponseWriter, r *http.Request, b []byte) bool {
	if r.Method != http.MethodPost || gjson.GetBytes(b, "method").String() != "ping" {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done {
		return false
	}
	e.done = true
	w.WriteHeader(http.StatusNotFound) // toolgate replaces the upstream session
	return true
}

// expired reports whether a ping has found the session expired.
func (e *srPingExpiry) expired() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.done
}

// srResume resumes m's standalone stream from lastID (GET with
// Last-Event-ID) and returns the response, the caller's to close; when it
// is not 200, refused is its body.
func srResume(ctx context.Context, t *testing.T, m *rawMCP, lastID string) (resp *http.Response, refused string) {
	t.Helper()
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", lastID)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		refused = string(b)
	}
	return resp, refused
}
