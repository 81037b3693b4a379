package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// genUp is an upstream (see genUpstream) that answers a tools/call by
// waiting until ask is closed, then asking the runner roots/list under the
// id 1 (and, when cancel is set, cancelling it once cancelNow is closed).
// Answers are recorded with the upstream session they were sent in. The
// first ping gets 404: toolgate re-initializes the upstream session.
type genUp struct {
	mu        sync.Mutex
	callSess  string
	answers   []string // Mcp-Session-Id of each answer
	expired   bool
	ask       chan struct{}
	cancelNow chan struct{}
	asked     chan struct{}
}

func genUpstream(up *upstream, cancel bool) *genUp {
	g := &genUp{ask: make(chan struct{}), cancelNow: make(chan struct{}), asked: make(chan struct{})}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		switch {
		case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
			g.mu.Lock()
			g.answers = append(g.answers, sess)
			g.mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			return true
		case gjson.GetBytes(b, "method").String() == "ping":
			g.mu.Lock()
			defer g.mu.Unlock()
			if !g.expired {
				g.expired = true
				w.WriteHeader(http.StatusNotFound) // toolgate replaces the upstream session
				return true
			}
			return false
		case gjson.GetBytes(b, "method").String() != "tools/call":
			return false
		}
		g.mu.Lock()
		g.callSess = sess
		g.mu.Unlock()
		sseStart(w)
		fmt.Fprint(w, ": started\n\n")
		flush(w)
		select {
		case <-g.ask:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n\n")
		flush(w)
		close(g.asked)
		if cancel {
			select {
			case <-g.cancelNow:
			case <-time.After(10 * time.Second):
			}
			fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1,\"reason\":\"enough\"}}\n\n")
			flush(w)
		}
		time.Sleep(1500 * time.Millisecond)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	return g
}

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
	gu := genUpstream(up, false)
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	deadline := time.Now().Add(5 * time.Second)
	for {
		gu.mu.Lock()
		s := gu.callSess
		gu.mu.Unlock()
		if s != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
	close(gu.ask)
	id := ""
	for id == "" {
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == "roots/list" {
			id = gjson.GetBytes(msg, "id").Raw
		}
	}
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	for range c {
	}
	gu.mu.Lock()
	defer gu.mu.Unlock()
	t.Logf("answer: HTTP %d %s; call in %s; answers in %v", status, body, gu.callSess, gu.answers)
	if !gu.expired {
		t.Fatal("no re-initialization")
	}
	for _, s := range gu.answers {
		if s != gu.callSess {
			t.Errorf("the answer to a request upstream session %s asked reached upstream session %s (HTTP %d): a session that never asked it", gu.callSess, s, status)
		}
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
	gu := genUpstream(up, true)
	close(gu.ask)
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	asked := ""
	for asked == "" {
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == "roots/list" {
			asked = gjson.GetBytes(msg, "id").Raw
		}
	}
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
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
	var mu sync.Mutex
	callSess, expired := "", false
	var answers []string
	ask := make(chan struct{})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		switch {
		case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
			mu.Lock()
			answers = append(answers, sess)
			mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			return true
		case gjson.GetBytes(b, "method").String() != "tools/call":
			return false
		case gjson.GetBytes(b, "params.arguments.text").String() == "expire":
			mu.Lock()
			defer mu.Unlock()
			if !expired {
				expired = true
				w.WriteHeader(http.StatusNotFound)
				return true
			}
			return false
		}
		mu.Lock()
		callSess = sess
		mu.Unlock()
		sseStart(w)
		fmt.Fprint(w, ": started\n\n")
		flush(w)
		select {
		case <-ask:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n\n")
		flush(w)
		time.Sleep(1500 * time.Millisecond)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	start := time.Now()
	cc := make(chan (<-chan []byte), 1)
	go func() {
		cc <- faStreamBytes(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		s := callSess
		mu.Unlock()
		if s != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%v call in %s", time.Since(start), callSess)
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"expire"}}}`) {
		t.Logf("%v second call: %s", time.Since(start), msg)
	}
	close(ask)
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
	mu.Lock()
	defer mu.Unlock()
	t.Logf("answer: HTTP %d %s; call in %s; answers in %v", status, body, callSess, answers)
	if !expired {
		t.Fatal("no re-initialization")
	}
	for _, s := range answers {
		if s != callSess {
			t.Errorf("the answer to a request upstream session %s asked reached upstream session %s (HTTP %d): a session that never asked it", callSess, s, status)
		}
	}
}

func faStreamBytes(t *testing.T, m *rawMCP, body string) <-chan []byte {
	out := make(chan []byte, 16)
	in := faStream(t, m, body)
	go func() {
		defer close(out)
		for msg := range in {
			out <- []byte(msg)
		}
	}()
	return out
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
	lastID, _ := acctOpenUntil(t, m, raWaitCall(7, ""), "") // to its priming event, then dropped
	if lastID == "" {
		t.Fatal("the call's stream carried no event id")
	}
	first := ""
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"name":"wait"`) {
			first = r.Header.Get("Mcp-Session-Id")
		}
	}
	up.reset() // the upstream forgets its sessions
	if status, body := acctStatus(t, m, acctPing(8, 0)); status != http.StatusOK {
		t.Fatalf("a ping after the upstream forgot the session: %d %.300s", status, body)
	}
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
