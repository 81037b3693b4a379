package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// Finding (R5 review of 1fabb43): "runners get toolgate's words, not the
// storage's or the cipher's". The 2026-07-28 retry that carries
// toolgate's requestState is still answered with the storage's own
// words when the storage cannot record the state's use:
// mcp2026.Runtime.Redeem joins the storage's error to its own text, and
// registry.readStateless writes "requestState refused: "+err.Error() to
// the runner (with 400: "send the call again without it", though nothing
// was wrong with the call). Here the file_system storage fails with its
// own path; a PostgreSQL or Redis storage names its host, user, database.
//
// Secure behaviour: the runner is told storage is unavailable (retryable),
// in toolgate's words; the storage's error goes to the log only.
func TestR5ReviewRequestStateRedeemQuotesStorageToRunner(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo gated_tool"})
	session := g.createSession(t, aliceKey, "svc")
	caps := `{"elicitation":{"url":{}}}`
	call := func(extra string) string {
		return `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"gated_tool","arguments":{"n":1},` + aaStatelessMeta(caps) + extra + `}}`
	}
	_, msg := statelessPost(t, g, aliceKey, session, call(""), nil)
	state, _ := aaResult(msg)["requestState"].(string)
	page := gjson.Get(aaJSON(msg), `result.inputRequests.io\.toolgate/approval.params.url`).String()
	if state == "" || page == "" {
		t.Fatalf("control: gated_tool: %s, want an approval round", aaJSON(msg))
	}
	if r := g.decide(t, aliceKey, page[strings.LastIndexByte(page, '/')+1:], true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("control: approving: %d %s", r.StatusCode, r.Body)
	}

	// The storage fails where used requestStates are recorded (a file
	// where its folder should be: every read there fails, naming the path).
	used := filepath.Join(g.DataDir, "toolgate", "mcp-request-states")
	if _, err := os.Stat(used); err == nil {
		t.Fatalf("control: %s exists before the first retry", used)
	}
	if err := os.MkdirAll(filepath.Dir(used), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(used, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	q, _ := json.Marshal(state)
	status, msg := statelessPost(t, g, aliceKey, session,
		call(`,"inputResponses":{"io.toolgate/approval":{"action":"accept"}},"requestState":`+string(q)), nil)
	text := aaJSON(msg)
	if strings.Contains(text, g.DataDir) || strings.Contains(text, "not a directory") || strings.Contains(text, "mcp-request-states") {
		t.Errorf("the runner was given the storage's own words (%d): %s", status, text)
	}
	if status == http.StatusBadRequest {
		t.Errorf("a storage failure answered as the runner's fault (400, 'send the call again without it'): %s", text)
	}
}
