package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// heldState starts the interview tool for key in session and returns the
// requestState of its first round and the key of its input request.
func heldState(t *testing.T, g *gateway, key, session string, id int) (state, input string) {
	t.Helper()
	status, msg := statelessPost(t, g, key, session, mixCall(id, "interview", `{"elicitation":{},"sampling":{},"roots":{}}`, ""), nil)
	res, _ := msg["result"].(map[string]any)
	state, _ = res["requestState"].(string)
	if status != 200 || state == "" {
		t.Fatalf("interview: %d %v, want input_required", status, msg)
	}
	for k := range res["inputRequests"].(map[string]any) {
		input = k
	}
	return state, input
}

// A held call continues only for the toolgate session and the call it was
// held for: alice's requestState is refused from another session of hers
// and with another tool, and refusing it does not use it up.
func TestMixStatelessRunnerHeldCallBinding(t *testing.T) {
	up := startUpstreamServer(t, nil, interviewServer(nil))
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample"})
	all := `{"elicitation":{},"sampling":{},"roots":{}}`
	session := g.createSession(t, aliceKey, "svc")
	state, key := heldState(t, g, aliceKey, session, 1)
	answer := map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"name": "ada"}}}
	other := g.createSession(t, aliceKey, "svc")
	for _, r := range []struct{ name, session, body string }{
		{"from another session", other, mixCall(2, "interview", all, retryWith(state, answer))},
		{"with another tool", session, mixCall(3, "sample", all, retryWith(state, answer))},
		{"with other arguments", session, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"interview","arguments":{"x":1},` +
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":` + all + `}` + retryWith(state, answer) + `}}`},
	} {
		if status, msg := statelessPost(t, g, aliceKey, r.session, r.body, nil); status != 400 || errorCode(msg) != -32602 {
			t.Errorf("the requestState %s: %d %v, want 400 -32602", r.name, status, msg)
		}
	}
	status, msg := statelessPost(t, g, aliceKey, session, mixCall(5, "interview", all, retryWith(state, answer)), nil)
	if res, _ := msg["result"].(map[string]any); status != 200 || res["resultType"] != "input_required" {
		t.Fatalf("the owner's retry after the refusals: %d %v, want the next round", status, msg)
	}
}

// Held calls are bounded per caller, toolgate session and service: the
// seventeenth of one owner is refused (503, retryable) and its upstream
// call ended, while the same caller's other session and another caller
// still get theirs held.
func TestMixStatelessRunnerHeldCallBound(t *testing.T) {
	up := startUpstreamServer(t, nil, interviewServer(nil))
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample", Timeout: "20s"})
	session := g.createSession(t, aliceKey, "svc")
	for i := range 16 {
		heldState(t, g, aliceKey, session, 100+i)
	}
	status, msg := statelessPost(t, g, aliceKey, session, mixCall(200, "interview", `{"elicitation":{},"sampling":{},"roots":{}}`, ""), nil)
	if status != 200 || errorCode(msg) != -32011 || !strings.Contains(fmt.Sprint(msg), "too many calls are waiting") {
		t.Fatalf("the 17th held call: %d %v, want -32011 too many calls are waiting", status, msg)
	}
	heldState(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), 300)
	heldState(t, g, bobKey, g.createSession(t, bobKey, "svc"), 301)
}

// A retry the request policy does not let through (a deny, or an ask,
// which answers with an approval round of its own) ends the call it would
// have continued: the held call does not keep its place (and its upstream
// stream) until it expires.
func TestMixStatelessRunnerHeldCallDenied(t *testing.T) {
	for _, action := range []string{"deny", "ask"} {
		t.Run(action, func(t *testing.T) {
			dir := t.TempDir()
			rego := "package toolgate.request\n\ndefault decision := {\"action\": \"allow\"}\n\n" +
				"decision := {\"action\": \"" + action + "\", \"reason\": \"no answers\"} if {\n\tinput.input_responses\n}\n"
			for name, text := range map[string]string{"request.rego": rego, "result.rego": allowResults} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cancelled := make(chan string, 1)
			up := startUpstreamServer(t, nil, interviewServer(cancelled))
			g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample", RequestPolicy: dir, Timeout: "20s"})
			all := `{"elicitation":{},"sampling":{},"roots":{}}`
			session := g.createSession(t, aliceKey, "svc")
			var state, key string
			for i := range 16 {
				state, key = heldState(t, g, aliceKey, session, 100+i)
			}
			answer := map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"name": "ada"}}}
			status, msg := statelessPost(t, g, aliceKey, session, mixCall(200, "interview", all, retryWith(state, answer)), nil)
			res, _ := msg["result"].(map[string]any)
			switch {
			case action == "deny" && (status != 200 || res["isError"] != true):
				t.Fatalf("the denied retry: %d %v, want a tool error", status, msg)
			case action == "ask" && !(status == 400 && errorCode(msg) == -32021):
				// The client declared no URL elicitation: it is told where
				// to approve, with the capability it lacks.
				t.Fatalf("the retry the policy asks about: %d %v, want -32021 naming the approval page", status, msg)
			}
			select {
			case <-cancelled:
			case <-time.After(15 * time.Second):
				t.Fatalf("the upstream's call was not cancelled when the policy answered its retry with %s", action)
			}
			heldState(t, g, aliceKey, session, 201)
		})
	}
}
