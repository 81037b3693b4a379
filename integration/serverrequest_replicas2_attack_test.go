package integration

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed; replicas): as TestServerRequestReplicaAttackAnswerOnReplicaWithOlderCopy,
// but the first upstream session S1 really expired: every request in it
// gets 404. Replica B (copy at generation 1) sends the runner's answer to
// S2's request into S1, gets 404, "re-initializes" (finds generation 2
// stored, the very session that asked) and, in mcpproxy.post, refuses the
// answer anyway ("the upstream session that asked this was replaced"): a
// valid answer to the current upstream session's pending request is
// dropped, the runner told it was not relayed, and S2's request is never
// answered. It should reach S2. Fixed: B reads the session again and
// sends the answer to S2; after a re-initialization, an answer is refused
// only when the new session is not the one that asked.
func TestServerRequestReplicaAttackValidAnswerRefusedOnReplicaWithOlderCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	var mu sync.Mutex
	pings, callSess, expiredSess := 0, "", ""
	var answers []string
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		sess := r.Header.Get("Mcp-Session-Id")
		mu.Lock()
		gone := sess != "" && sess == expiredSess
		mu.Unlock()
		if gone {
			w.WriteHeader(http.StatusNotFound)
			return true
		}
		if r.Method != http.MethodPost {
			return false
		}
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
				expiredSess = sess
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
	t.Logf("answer on B: HTTP %d %s; call in %s; expired %s; answers in %v; pings %d", status, body, callSess, expiredSess, answers, pings)
	if expiredSess == "" || expiredSess == callSess {
		t.Fatal("no re-initialization before the call")
	}
	if status != http.StatusAccepted || len(answers) != 1 || answers[0] != callSess {
		t.Errorf("a valid answer to the pending request of the current upstream session %s, sent on the other replica: HTTP %d %s; reached %v", callSess, status, body, answers)
	}
}
