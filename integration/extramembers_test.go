package integration

import (
	"net/http"
	"strings"
	"sync"
	"testing"
)

// A member a runner writes beside JSON-RPC's own is dropped before the
// upstream sees the request: the request policy reads params, and an
// upstream that read such a member would act on what no policy saw. (The
// upstream's direction: TestR5ResultTopLevelMemberBesideResultSkipsPolicy.)
func TestRunnerMemberBesideJSONRPCsNeverReachesTheUpstream(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	var mu sync.Mutex
	var seen []string
	up.setIntercept(func(_ http.ResponseWriter, _ *http.Request, body []byte) bool {
		if strings.Contains(string(body), `"tools/call"`) {
			mu.Lock()
			seen = append(seen, string(body))
			mu.Unlock()
		}
		return false
	})
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}},"arguments":{"text":"smuggled"}}`)
	if status != http.StatusOK || len(msgs) != 1 || !strings.Contains(string(msgs[0]), "hi") {
		t.Fatalf("control: the call: %d %s", status, msgs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("the upstream got %d tools/call requests, want 1", len(seen))
	}
	if strings.Contains(seen[0], "smuggled") {
		t.Errorf("the upstream got the member beside params: %s", seen[0])
	}
}
