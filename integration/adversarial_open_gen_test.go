//go:build open_findings

package integration

import (
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

// Attack: a call's stream opened in upstream session S1; another call of
// the runner's (a ping) finds S1 expired and toolgate re-initializes it
// (S2). The upstream then asks roots/list on the call's stream, which
// belongs to S1. toolgate names the request with S2's generation
// (mcpproxy.deliver → Session.ServerRequestID / ServerRequestSent read
// s.Upstream().Generation at relay time, not the generation of the
// upstream session whose stream carried the request), so relayAnswer's
// generation check passes and the answer is POSTed into S2 under id 1:
// an upstream session that never asked it (whose own request 1 may be
// another). It should be refused (S1 is gone for toolgate) or reach S1.
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

// Attack: the upstream asks roots/list (id 1) on a call's stream of
// upstream session S1; the runner is told of it under S1's generation.
// Another call re-initializes the upstream session (S2). The upstream then
// cancels request 1 on the same stream: toolgate names the cancellation
// with S2's generation (cancelledAsRelayed → ServerRequestID reads the
// current generation), an id the runner was never asked under: the runner
// never learns its request was cancelled.
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
