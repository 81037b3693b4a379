//go:build open_findings

package integration

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (federation): the same as
// TestServerRequestGenAttackStreamOfReplacedSessionAnswerReachesNewSession
// through the federated endpoint. A federated tools/call of svc runs in
// svc's upstream session S1; another federated call of svc finds S1
// expired and toolgate re-initializes it (S2); S1's stream then asks
// roots/list. The runner's answer is POSTed into S2, which never asked it.
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
