package integration

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed; replicas): replica B read the MCP session (upstream generation
// 1, session S1). A ping on replica A finds S1 expired and A re-initializes
// (generation 2, S2). A tools/call on A, in S2, is asked roots/list; the
// runner answers on replica B. The request's record says generation 2; B's
// copy still says 1, and relayAnswer only refuses records *older* than its
// copy: the answer goes out with B's copy of the upstream session. It
// should reach S2, the session that asked (or B should read the record
// before judging); it must never reach S1, and must not be refused.
// Fixed: a replica whose copy is older than the request's generation reads
// the session again first (mcpproxy.post, gateway.Call.AnswerGeneration).
func TestServerRequestReplicaAttackAnswerOnReplicaWithOlderCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	var mu sync.Mutex
	pings, callSess := 0, ""
	var answers []string
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
		case gjson.GetBytes(b, "method").String() == "ping":
			mu.Lock()
			defer mu.Unlock()
			pings++
			if pings == 2 {
				w.WriteHeader(http.StatusNotFound)
				return true
			}
			return false
		case gjson.GetBytes(b, "method").String() != "tools/call":
			return false
		}
		mu.Lock()
		callSess = sess
		mu.Unlock()
		sseStart(w)
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n\n")
		flush(w)
		select {
		case <-r.Context().Done():
		case <-time.After(4 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	m, onB := srOnTwoReplicas(t, bin, up, "")
	if status, _, err := faPost(onB, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping on B: HTTP %d %v", status, err)
	}
	if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":3,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping on A: HTTP %d %v", status, err)
	}
	id := srRunnerID(t, m)
	status, body := srPost(t, onB, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("answer on B: HTTP %d %s; call in %s; answers in %v; pings %d", status, body, callSess, answers, pings)
	var inits []string
	for _, r := range up.requestLog() {
		if r.SessionID != "" {
			inits = append(inits, r.SessionID)
		}
	}
	t.Logf("upstream sessions initialized, in order: %v", inits)
	if pings < 2 {
		t.Fatal("no re-initialization")
	}
	if status != http.StatusAccepted {
		t.Errorf("a valid answer to the current upstream session's request was refused on the other replica: HTTP %d %s", status, body)
	}
	for _, s := range answers {
		if s != callSess {
			t.Errorf("the answer to a request of upstream session %s reached %s", callSess, s)
		}
	}
	if len(answers) == 0 {
		t.Errorf("the answer reached no upstream session")
	}
}
