package integration

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// A route whose toolgate_policy or toolgate_result_policy has a matcher
// that lets a message by fails closed: toolgate_proxy relays no message
// no request policy decided, and no request whose answer no result policy
// sees. (A route without them at all fails validation:
// TestPipelineOrderIsValidated.) The control: the same call through a
// route whose matchers cover it runs.
func TestProxyRelaysNothingThePoliciesDidNotJudge(t *testing.T) {
	up := startUpstream(t)
	lax := aaPolicies(t, "", "")
	port := freePort(t)
	route := func(path, request, result string) string {
		return `
	route ` + path + ` {
		toolgate_session
		toolgate_registry
		toolgate_policy ` + request + ` {
			source ` + lax + `
		}
		toolgate_credentials
		toolgate_result_policy ` + result + ` {
			source ` + lax + `
		}
		toolgate_proxy
	}`
	}
	// Three prefixes of the same endpoint, each a route of its own whose
	// matchers cover svc, or miss it at one step.
	sites := `http://127.0.0.1:` + aaItoa(port) + ` {
	handle_path /judged/* {` + route("/v1/mcp/*", "/v1/mcp/svc", "/v1/mcp/svc") + `
	}
	handle_path /unjudged/* {` + route("/v1/mcp/*", "/v1/mcp/elsewhere", "/v1/mcp/svc") + `
	}
	handle_path /unseen/* {` + route("/v1/mcp/*", "/v1/mcp/svc", "/v1/mcp/elsewhere") + `
	}
}
`
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo", Sites: sites})
	session := g.createSession(t, aliceKey, "svc")
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`
	for _, c := range []struct {
		prefix string
		runs   bool
	}{{"judged", true}, {"unjudged", false}, {"unseen", false}} {
		g2 := *g
		g2.URL = "http://127.0.0.1:" + aaItoa(port) + "/" + c.prefix
		m := g2.raw(t, aliceKey, session, "svc")
		if !c.runs {
			status, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"r","version":"1"}}}`)
			if len(msgs) != 1 || !strings.Contains(gjson.GetBytes(msgs[0], "error.message").String(), "without a policy's judgement") {
				t.Errorf("%s: initialize through a route whose matchers let it by: HTTP %d %s (want refused: no policy judged it)", c.prefix, status, msgs)
			}
			continue
		}
		m.initialize()
		if _, _, msgs := m.post(call); len(msgs) != 1 || gjson.GetBytes(msgs[0], "result.content.0.text").String() == "" {
			t.Errorf("%s: the call through a route whose policies cover it: %s", c.prefix, msgs)
		}
	}
}
