package integration

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// capsAsks are the server→client requests capsUpstream asks on a call's
// stream, by their upstream id, with what each needs of the runner.
var capsAsks = []struct{ id, method, params, needs string }{
	{"11", "sampling/createMessage", `{"messages":[],"maxTokens":5}`, "sampling"},
	{"12", "sampling/createMessage", `{"messages":[],"maxTokens":5,"tools":[{"name":"t","inputSchema":{"type":"object"}}]}`, "sampling.tools"},
	{"13", "elicitation/create", `{"message":"m","requestedSchema":{"type":"object","properties":{}}}`, "elicitation (form)"},
	{"14", "elicitation/create", `{"mode":"url","message":"m","url":"https://example.test/x","elicitationId":"e"}`, "elicitation.url"},
	{"15", "roots/list", `{}`, "roots"},
	{"16", "ping", `{}`, "nothing"},
}

// capsUpstream answers a tools/call by asking every request of capsAsks on
// its stream, then answering the call once it has an answer (or a
// refusal) to each. It records the answers by their id, with the upstream
// session they came in.
func capsUpstream(up *upstream) (answers func() map[string]string) {
	var mu sync.Mutex
	got := map[string]string{}
	all := make(chan struct{})
	asks := make([]string, len(capsAsks))
	for i, a := range capsAsks {
		asks[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":%q,"params":%s}`, a.id, a.method, a.params)
	}
	call := capsAttackStream(func() []string { return asks }, func() {
		select {
		case <-all:
		case <-time.After(10 * time.Second):
		}
	})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method == http.MethodPost && (gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists()) {
			mu.Lock()
			got[gjson.GetBytes(b, "id").String()] = string(b)
			if len(got) == len(capsAsks) {
				close(all)
			}
			mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		return call(w, r, b)
	})
	return func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]string, len(got))
		for k, v := range got {
			out[k] = v
		}
		return out
	}
}

// A server→client request reaches the runner only when the runner declared
// the capability it needs (as the specification asks of servers); the
// upstream gets a JSON-RPC error for any other at once, and a request that
// needs nothing (ping) passes.
func TestServerRequestsNeedTheRunnersDeclaredCapability(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"sampling":{},"elicitation":{}}`)
	answers := capsUpstream(up)
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	var asked []string
	for msg := range c {
		switch method := gjson.GetBytes(msg, "method").String(); {
		case method != "" && gjson.GetBytes(msg, "id").Exists():
			asked = append(asked, method+" "+gjson.GetBytes(msg, "params.mode").String()+gjson.GetBytes(msg, "params.tools.0.name").String())
			if status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+gjson.GetBytes(msg, "id").Raw+`,"result":{}}`, nil); status != http.StatusAccepted {
				t.Errorf("the answer to %s: HTTP %d %s", method, status, body)
			}
		case gjson.GetBytes(msg, "id").Raw == "5":
			if text := gjson.GetBytes(msg, "result.content.0.text").String(); text != "end" {
				t.Errorf("the call's answer: %s", msg)
			}
		}
	}
	sort.Strings(asked)
	if want := "elicitation/create |ping |sampling/createMessage "; strings.Join(asked, "|") != want {
		t.Errorf("the runner was asked %q, want %q", strings.Join(asked, "|"), want)
	}
	got := answers()
	for _, a := range capsAsks {
		refused := strings.Contains(got[a.id], "did not declare the capability")
		if wantRefused := a.id == "12" || a.id == "14" || a.id == "15"; refused != wantRefused {
			t.Errorf("%s needing %s: the upstream got %s (refused: %v, want %v)", a.method, a.needs, got[a.id], refused, wantRefused)
		}
	}
}

// Attack (fixed): a server→client request toolgate refuses (here, one the
// runner did not declare the capability of), asked on the stream of an
// upstream session replaced meanwhile, was refused in the session that
// replaced it (refuseServerRequest posted to the MCP session's current
// upstream session): an error answering that session's own request of the
// same id, which it may have asked too. Fixed: the refusal goes to the
// session that asked.
func TestServerRequestRefusalGoesToTheSessionThatAsked(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`) // no roots: roots/list is refused
	gu := srAskUpstream(up, srAskOptions{})
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	gu.waitCall()
	srPing(t, m, 2, "ping")
	close(gu.ask)
	for msg := range c {
		if gjson.GetBytes(msg, "method").String() == "roots/list" {
			t.Errorf("the runner was asked roots/list, which it did not declare: %s", msg)
		}
	}
	gu.waitAnswer(3 * time.Second)
	st := gu.state()
	if !st.expired {
		t.Fatal("no re-initialization")
	}
	for _, s := range st.strays() {
		t.Errorf("the refusal of a request upstream session %s asked reached upstream session %s", st.callSess, s)
	}
	if len(st.answers) == 0 {
		t.Error("the upstream was never told its request was refused")
	}
}
