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

// Attack (fixed): the id of an upstream's server→client request
// (roots/list, sampling, elicitation on a call's stream) was relayed to
// the runner as the upstream wrote it, and is in no policy's input: a
// string the result policy never saw. The runner now knows the request by
// an id of toolgate's own, and its answer goes upstream under the
// upstream's.
func TestR5ResultServerRequestIDSkipsPolicyAttack(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: r5Policies(t)})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initializeWith(`{"roots":{}}`)
	r5Script(up, "resources/read", func(id string) []string {
		return []string{`{"jsonrpc":"2.0","id":"` + r5Leak + `","method":"roots/list","params":{"_meta":{"x":1}}}`,
			`{"jsonrpc":"2.0","id":` + id + `,"result":{"contents":[{"uri":"file:///a","text":"done"}]}}`}
	}, true)
	status, body := r5Raw(t, m, `{"jsonrpc":"2.0","id":43,"method":"resources/read","params":{"uri":"file:///a"}}`)
	if strings.Contains(body, r5Leak) {
		t.Fatalf("the runner got the upstream's server request id, which no result policy saw (%d): %s", status, body)
	}
	if !strings.Contains(body, `"id":"toolgate-request:`) || !strings.Contains(body, `"text":"done"`) {
		t.Fatalf("the runner did not get the request under toolgate's id, then the answer (%d): %s", status, body)
	}
}

// askingUpstream makes up answer a tools/call by asking the runner
// roots/list under the id upstreamID, then cancelling it when cancel is
// set, and ending the call with the id its answer came back with (or
// "none" when none came within five seconds).
func askingUpstream(up *upstream, upstreamID string, cancel bool) {
	answered := make(chan string, 1)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		if gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists() {
			answered <- gjson.GetBytes(b, "id").Raw
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		if gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"roots/list\"}\n\n", upstreamID)
		if cancel {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":%s,\"reason\":\"enough\"}}\n\n", upstreamID)
		}
		flush(w)
		got := "none"
		select {
		case got = <-answered:
		case <-time.After(5 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":%q}]}}\n\n",
			gjson.GetBytes(b, "id").Raw, "answered "+got)
		flush(w)
		return true
	})
}

// The runner's answer to a server→client request reaches the upstream
// under the id the upstream gave the request, whatever id the runner knew
// it by, with an id of either JSON type.
func TestServerRequestAnswerGoesUpstreamUnderItsID(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	for i, upstreamID := range []string{`"up-7"`, `7`} {
		askingUpstream(up, upstreamID, false)
		var result string
		for msg := range faStream(t, m, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, 10+i)) {
			switch {
			case gjson.GetBytes(msg, "method").String() == "roots/list":
				id := gjson.GetBytes(msg, "id").Raw
				if !strings.HasPrefix(id, `"toolgate-request:`) {
					t.Errorf("the runner got the request under the id %s", id)
				}
				if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`); status != http.StatusAccepted || err != nil {
					t.Errorf("the answer: HTTP %d, %v", status, err)
				}
			case gjson.GetBytes(msg, "result").Exists():
				result = gjson.GetBytes(msg, "result.content.0.text").String()
			}
		}
		if result != "answered "+upstreamID {
			t.Errorf("the upstream that asked under %s was %q", upstreamID, result)
		}
	}
	// Its own id answers nothing: the runner never had it.
	askingUpstream(up, `"up-8"`, false)
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
		if gjson.GetBytes(msg, "method").String() == "roots/list" {
			if status, _, _ := faPost(m, `{"jsonrpc":"2.0","id":"up-8","result":{"roots":[]}}`); status != http.StatusBadRequest {
				t.Errorf("an answer under the upstream's own id: HTTP %d", status)
			}
		}
	}
}

// An upstream's cancellation of its request names it as the runner knows
// it.
func TestServerRequestCancellationNamesTheRunnersID(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	askingUpstream(up, `"up-9"`, true)
	asked, cancelled := "", ""
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
		switch gjson.GetBytes(msg, "method").String() {
		case "roots/list":
			asked = gjson.GetBytes(msg, "id").Raw
		case "notifications/cancelled":
			cancelled = gjson.GetBytes(msg, "params.requestId").Raw
		}
	}
	if asked == "" || cancelled != asked {
		t.Fatalf("the runner was asked under %s and told of the cancellation of %s", asked, cancelled)
	}
}

// An answer whose upstream session expired on its way is not sent into
// the session that replaced it: the new session never asked it, and its
// ids start again (its request 1 is another). The runner is told why.
func TestServerRequestAnswerNeverReachesTheSessionThatReplacedItsOwn(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	var mu sync.Mutex
	answers := 0
	srAsk(up, func(w http.ResponseWriter, _ []byte) {
		mu.Lock()
		answers++
		mu.Unlock()
		w.WriteHeader(http.StatusNotFound) // the upstream session expired
	})
	id := srRunnerID(t, m)
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	if status != http.StatusBadRequest || !strings.Contains(body, "replaced") {
		t.Errorf("the answer: HTTP %d %s", status, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if answers != 1 {
		t.Errorf("the upstream got the answer %d times: the session that replaced the one that asked got it too", answers)
	}
}

// An answer to a request of an upstream session that another call's
// exchange found expired, and replaced, is refused: the new session never
// asked it.
func TestServerRequestAnswerToAReplacedUpstreamSessionIsRefused(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	srAsk(up, func(w http.ResponseWriter, _ []byte) { w.WriteHeader(http.StatusAccepted) })
	id := srRunnerID(t, m)
	var mu sync.Mutex
	expired, answers := false, 0
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPost && gjson.GetBytes(b, "method").String() == "ping" && !expired:
			expired = true
			w.WriteHeader(http.StatusNotFound) // the upstream session expired: toolgate replaces it
			return true
		case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
			answers++
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		return false
	})
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping: HTTP %d %v", status, err)
	}
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	if status != http.StatusBadRequest || !strings.Contains(body, "replaced") {
		t.Errorf("an answer to the replaced session's request: HTTP %d %s", status, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if !expired || answers != 0 {
		t.Errorf("expired %v; the upstream got %d answers", expired, answers)
	}
}
