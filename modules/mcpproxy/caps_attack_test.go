package mcpproxy

import (
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Holds: a server→client request spelled so that a runner still reads it
// as one needing a capability the runner did not declare never passes
// declared: either mcpmsg.Parse refuses the message (a case variant or a
// duplicate of "method", "mode", "tools"), or declared reads it as the
// runner does (escapes in the method and in params' keys and values, an
// empty or non-array "tools"). Capabilities declared in forms a runner's
// server would not read as declared ("sampling": null or true) declare
// nothing; what was declared passes.
func TestCapsAttackHoldsSpellingsOfUndeclaredRequests(t *testing.T) {
	const caps = `{"capabilities":{"sampling":{},"elicitation":{"form":{}},"roots":null,"experimental":{"roots":{}}}}`
	from := gateway.Upstream{InitializeParams: []byte(caps)}
	refused := []string{
		`{"jsonrpc":"2.0","id":1,"method":"roots/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"roots\/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"r\u006f\u006fts/list","params":{}}`,
		`{"jsonrpc":"2.0","id":1,"Method":"roots/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","Method":"roots/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","method":"roots/list"}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"mode":"url","message":"m","url":"https://x.test","elicitationId":"e"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"Mode":"url","message":"m","url":"https://x.test","elicitationId":"e"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"MODE":"url","message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"mode":"form","mode":"url","message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"mode":"form","Mode":"url","message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"m\u006fde":"url","message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"mode":"\u0075rl","message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"tools":[{"name":"t","inputSchema":{"type":"object"}}]}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"Tools":[{"name":"t"}]}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"tools":null,"tools":[{"name":"t"}]}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"t\u006fols":[{"name":"t"}]}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"tools":[]}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"tools":{"name":"t"}}}`,
	}
	for _, raw := range refused {
		msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.DefaultLimits)
		if err == nil && msg.Kind == mcpmsg.Request && declared(from, msg) {
			t.Errorf("relayed to a runner that did not declare what it needs: %s", raw)
		}
	}
	passed := []string{
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1}}`,
		`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1,"tools":null}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"mode":"form","message":"m","requestedSchema":{"type":"object"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`,
	}
	for _, raw := range passed {
		msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.DefaultLimits)
		if err != nil || !declared(from, msg) {
			t.Errorf("refused though declared (%v): %s", err, raw)
		}
	}
	for _, c := range []string{`{"capabilities":{"sampling":null}}`, `{"capabilities":{"sampling":true}}`, `{"capabilities":{"sampling":[]}}`,
		`{"capabilities":{"experimental":{"sampling":{}}}}`, `{"capabilities":null}`, `{}`} {
		msg, _ := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"messages":[]}}`), mcpmsg.DefaultLimits)
		if declared(gateway.Upstream{InitializeParams: []byte(c)}, msg) {
			t.Errorf("sampling relayed to a runner whose initialize declared %s", c)
		}
	}
}
