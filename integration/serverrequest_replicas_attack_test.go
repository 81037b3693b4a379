package integration

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed; replicas): replica B read the MCP session (upstream
// generation 1, session S1). A ping on replica A finds S1 expired and A
// re-initializes (generation 2, S2). A tools/call on A, in S2, is asked
// roots/list; the runner answers on replica B. The request's record says
// generation 2; B's copy still said 1, and relayAnswer only refused
// records older than its copy: the answer went out with B's copy of the
// upstream session, to S1. When S1 had really expired (every request in it
// gets 404), B "re-initialized" (finding generation 2 stored, the very
// session that asked) and refused the valid answer all the same. It
// should reach S2, the session that asked, and only it. Fixed: a replica
// whose copy is older than the request's generation reads the session
// again first, and after a re-initialization an answer is refused only
// when the new session is not the one that asked (mcpproxy.post,
// gateway.Call.AnswerGeneration).
func TestServerRequestReplicaAttackAnswerOnReplicaWithOlderCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	for _, oldExpired := range []bool{false, true} {
		t.Run(fmt.Sprintf("old session expired %v", oldExpired), func(t *testing.T) {
			up := startUpstream(t)
			var mu sync.Mutex
			pings, callSess, expiredSess := 0, "", ""
			var answers []string
			up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
				if r.Method != http.MethodPost {
					return false
				}
				sess := r.Header.Get("Mcp-Session-Id")
				mu.Lock()
				gone := oldExpired && sess != "" && sess == expiredSess
				mu.Unlock()
				switch {
				case gone:
					w.WriteHeader(http.StatusNotFound)
					return true
				case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
					mu.Lock()
					answers = append(answers, sess)
					mu.Unlock()
					w.WriteHeader(http.StatusAccepted)
					return true
				case gjson.GetBytes(b, "method").String() == "ping":
					mu.Lock()
					defer mu.Unlock()
					if pings++; pings == 2 {
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
			if expiredSess == "" || expiredSess == callSess {
				t.Fatal("no re-initialization before the call")
			}
			if status != http.StatusAccepted || len(answers) != 1 || answers[0] != callSess {
				t.Errorf("a valid answer to the pending request of the current upstream session %s, sent on the other replica: HTTP %d %s; reached %v",
					callSess, status, body, answers)
			}
		})
	}
}
