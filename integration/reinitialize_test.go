package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// An upstream that forgot the session and refuses, for now, to initialize
// a new one (a program restarting) leaves the runner's MCP session as it
// was: the call gets a retryable error, and the next one re-initializes.
func TestRefusedReinitializeKeepsTheSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	call := func(text string) []json.RawMessage {
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + text + `"}}}`)
		return msgs
	}
	if msgs := call("before"); len(msgs) != 1 || !bytes.Contains(msgs[0], []byte("before")) {
		t.Fatalf("before: %s", msgs)
	}
	up.reset() // the upstream forgets the session: 404 from now on
	var refused sync.Once
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		handled := false
		if bytes.Contains(body, []byte(`"method":"initialize"`)) {
			refused.Do(func() {
				handled = true
				var req struct{ ID json.RawMessage }
				_ = json.Unmarshal(body, &req)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"busy restarting"}}`, req.ID)
			})
		}
		return handled
	})
	if msgs := call("during"); len(msgs) != 1 || !bytes.Contains(msgs[0], []byte(`the upstream did not re-create the session (it answered with error -32603)`)) ||
		!bytes.Contains(msgs[0], []byte(`"retryable":true`)) {
		t.Fatalf("a call while the upstream refuses to initialize: %s", msgs)
	}
	if msgs := call("after"); len(msgs) != 1 || !bytes.Contains(msgs[0], []byte("after")) {
		t.Fatalf("the next call, on the same MCP session: %s", msgs)
	}
}
