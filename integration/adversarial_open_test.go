//go:build open_findings

package integration

// Findings reproduced and not fixed yet: each test here fails today. They
// are kept out of `make test` (build tag open_findings) and listed in the
// README's adversarial suite; run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.
// A fixed finding's test moves, marked "Attack (fixed)", to the file of
// its class.

import (
	"strings"
	"testing"
)

// Attack: the id of an upstream's server→client request (roots/list,
// sampling, elicitation on a call's stream) is relayed to the runner as
// the upstream wrote it, and is in no policy's input: a string the
// result policy never sees. (Members beside JSON-RPC's are dropped:
// TestR5ResultTopLevelMemberBesideParamsSkipsPolicy.) What should happen:
// toolgate names the request with an id of its own, and maps the runner's
// answer back.
func TestR5ResultServerRequestIDSkipsPolicyAttack(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{RequestPolicy: r5Policies(t)})
	r5Script(up, "resources/read", func(id string) []string {
		return []string{`{"jsonrpc":"2.0","id":"` + r5Leak + `","method":"roots/list","params":{"_meta":{"x":1}}}`,
			`{"jsonrpc":"2.0","id":` + id + `,"result":{"contents":[{"uri":"file:///a","text":"done"}]}}`}
	}, true)
	status, body := r5Raw(t, m, `{"jsonrpc":"2.0","id":43,"method":"resources/read","params":{"uri":"file:///a"}}`)
	if strings.Contains(body, r5Leak) {
		t.Fatalf("the runner got the upstream's server request id, which no result policy saw (%d): %s", status, body)
	}
}
