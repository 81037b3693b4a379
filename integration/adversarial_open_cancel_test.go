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

// Attack (replicas): the record of where a runner's request went
// (Session.SentIn) is in one process's memory. A call runs on replica A
// in upstream session S1; a ping on replica B finds S1 expired and B
// re-initializes it (S2); the runner's cancellation of the call lands on
// B (a load balancer spreads a session's requests), which has no record
// of the call: forward → post sends it into S2, and S1, running the call,
// is never told. Severity: low (as the single-replica case 33b8aa9 fixed:
// a call cannot be stopped across a re-initialization, on replicas).
// Fix: keep the upstream generation a request went to where every replica
// reads it (beside the pending requests in the shared storage), or route
// a cancellation naming no local request to the replica that relays it.
func TestServerRequestFix3AttackCancellationOnOtherReplicaGoesToNewSession(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	var mu sync.Mutex
	callSess, expiredSess := "", ""
	var cancels []string
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	defer letGo()
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		sess := r.Header.Get("Mcp-Session-Id")
		switch gjson.GetBytes(b, "method").String() {
		case "notifications/cancelled":
			if strings.Contains(string(b), "f3-replica-cancel") {
				mu.Lock()
				cancels = append(cancels, sess)
				mu.Unlock()
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		case "ping":
			mu.Lock()
			defer mu.Unlock()
			if expiredSess == "" && callSess != "" {
				expiredSess = sess
				w.WriteHeader(http.StatusNotFound)
				return true
			}
			return false
		case "tools/call":
			mu.Lock()
			callSess = sess
			mu.Unlock()
			sseStart(w)
			fmt.Fprint(w, ": started\n\n")
			flush(w)
			select {
			case <-release:
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
			flush(w)
			return true
		}
		return false
	})
	m, onB := srOnTwoReplicas(t, bin, up, "")
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	ga2Until(func() bool { mu.Lock(); defer mu.Unlock(); return callSess != "" }, 5*time.Second)
	if status, _, err := faPost(onB, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || err != nil {
		t.Fatalf("ping on B: HTTP %d %v", status, err)
	}
	status, _, err := faPost(onB, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"f3-replica-cancel"}}`)
	if status != http.StatusAccepted || err != nil {
		t.Fatalf("the runner's cancellation on B: HTTP %d %v", status, err)
	}
	ga2Until(func() bool { mu.Lock(); defer mu.Unlock(); return len(cancels) > 0 }, 3*time.Second)
	letGo()
	for range c {
	}
	mu.Lock()
	defer mu.Unlock()
	if expiredSess == "" || expiredSess != callSess {
		t.Fatal("premise: S1 was not re-initialized on B")
	}
	t.Logf("call in %s; the runner's cancellation (on B) reached %v", callSess, cancels)
	if len(cancels) == 0 {
		t.Fatal("the runner's cancellation reached no upstream session")
	}
	for _, s := range cancels {
		if s != callSess {
			t.Errorf("the runner's cancellation of call 5, running in upstream session %s (relayed by replica A), sent on replica B, reached upstream session %s", callSess, s)
		}
	}
}
