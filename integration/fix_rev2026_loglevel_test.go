package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// A stateless runner's per-request log level is decided as the
// logging/setLevel it stands for (TestRev2026AttackStatelessLogLevelSkipsSetLevelRule):
// a level the policy allows still reaches an upstream of 2026-07-28, in
// the spelling the runner sent, and one it denies is removed while the
// request itself goes on.
func TestRev2026StatelessLogLevelDecidedAsSetLevel(t *testing.T) {
	up := saStartModern(t, `["2026-07-28"]`, `[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]`,
		func(gjson.Result) (int, string) {
			return http.StatusOK, `"result":{"resultType":"complete","content":[{"type":"text","text":"ok"}]}`
		})
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "no debug logs"} if {
	input.method == "logging/setLevel"
	input.params.level == "debug"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	call := func(id, level string) (int, map[string]any) {
		meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"` + level + `"}`
		return statelessPost(t, g, aliceKey, session, `{"jsonrpc":"2.0","id":`+id+`,"method":"tools/call","params":{"name":"echo","arguments":{},`+meta+`}}`, nil)
	}
	if status, msg := call("1", "warning"); status != http.StatusOK || !strings.Contains(aaJSON(msg), `"ok"`) {
		t.Fatalf("call with an allowed level: %d %s", status, aaJSON(msg))
	}
	if len(up.seen(`"io.modelcontextprotocol/logLevel":"warning"`)) != 1 {
		t.Errorf("an allowed log level did not reach the upstream")
	}
	if status, msg := call("2", "debug"); status != http.StatusOK || !strings.Contains(aaJSON(msg), `"ok"`) {
		t.Fatalf("call with a denied level: %d %s, want it served without the level", status, aaJSON(msg))
	}
	if sent := up.seen(`"debug"`); len(sent) != 0 {
		t.Errorf("a denied log level reached the upstream: %s", sent[0])
	}
}
