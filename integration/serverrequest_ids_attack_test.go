package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attacks on the ids of server→client requests: the runner knows an
// upstream's request by an id of toolgate's own ("toolgate-request:…"),
// and its answer goes upstream under the upstream's id
// (registry.relayAnswer rewrites call.Message.ID). Whatever toolgate then
// writes the runner "in answer" to that answer must not carry the
// upstream's id: it is the text no policy reads that the change keeps
// from runners.

// srSecretID is an upstream's request id carrying text of its own.
const srSecretID = `"UPSTREAM-ID-TEXT-no-policy-read-this"`

// srAsk makes up answer a tools/call by asking the runner roots/list
// under the id srSecretID. Answers to it reach onAnswer (which answers
// the upstream's HTTP request itself), then the call ends.
func srAsk(up *upstream, onAnswer func(w http.ResponseWriter, body []byte)) {
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		if gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists() {
			onAnswer(w, b)
			return true
		}
		if gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"roots/list\"}\n\n", srSecretID)
		flush(w)
		select {
		case <-r.Context().Done():
		case <-time.After(4 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
}

// srRunnerID starts a tools/call in m's session and returns the id the
// runner was asked roots/list under.
func srRunnerID(t *testing.T, m *rawMCP) string {
	t.Helper()
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	for {
		msg := faNext(t, c)
		if gjson.GetBytes(msg, "method").String() == "roots/list" {
			id := gjson.GetBytes(msg, "id").Raw
			if !strings.HasPrefix(id, `"toolgate-request:`) {
				t.Fatalf("the runner was asked under the id %s", id)
			}
			go func() {
				for range c {
				}
			}()
			return id
		}
	}
}

// srAnswerAskedAgain sends the runner's answer to the request it knows by
// id, which toolgate must ask for again (503, retryable), and sends it
// again: the retry must be taken (202).
func srAnswerAskedAgain(t *testing.T, m *rawMCP, id string) {
	t.Helper()
	answer := `{"jsonrpc":"2.0","id":` + id + `,"result":{"roots":[]}}`
	status, body := srPost(t, m, answer, nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, `"retryable":true`) {
		t.Fatalf("toolgate did not ask for the answer again: HTTP %d %s", status, body)
	}
	if status, body = srPost(t, m, answer, nil); status != http.StatusAccepted {
		t.Errorf("the retry toolgate asked for was refused (HTTP %d %s): the upstream's request is never answered", status, body)
	}
}

// srPost posts body in m's session with the headers given (over m's
// own) and returns the status and the body.
func srPost(t *testing.T, m *rawMCP, body string, header map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Mcp-Session-Id", m.sessionID)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Transport: m.transport, Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// Attack (fixed): the runner's answer is refused after registry put the
// upstream's id in its place (here by the MCP-Protocol-Version check,
// which runs after the message is read: registry.checkProtocolVersion):
// the error toolgate writes the runner names the message by
// call.Message.ID, now the upstream's id. Any runner gets the upstream's
// id on demand by answering with a version header toolgate knows but does
// not speak ("2024-11-05"). It should get an error with no id (as
// every other refusal of an answer does: call.Fail, WriteRPCError(nil)),
// or at most the id it sent. Fixed: the version is checked before the
// request is taken, and toolgate's errors about a runner's answer carry no
// id (gateway.Call.ReplyID).
func TestServerRequestIDAttackRefusedAnswerEchoesTheUpstreamsID(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	srAsk(up, func(w http.ResponseWriter, _ []byte) { w.WriteHeader(http.StatusAccepted) })
	id := srRunnerID(t, m)
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`,
		map[string]string{"Mcp-Protocol-Version": "2024-11-05"})
	t.Logf("the answer's POST: HTTP %d %s", status, body)
	if status == http.StatusAccepted {
		t.Fatalf("the answer with an unsupported MCP-Protocol-Version was accepted")
	}
	if strings.Contains(body, "UPSTREAM-ID-TEXT") {
		t.Errorf("the runner got the upstream's request id in toolgate's refusal of its answer (HTTP %d): %s", status, body)
	}
}

// Attack (fixed): the runner's answer meets the end of its MCP session while it is
// on its way upstream; toolgate answers the runner 404 with
// call.Message.ID (mcpproxy.answerError, kindClosed), now the upstream's
// id. It should carry no id (or the runner's own). Fixed: it carries none
// (gateway.Call.ReplyID).
func TestServerRequestIDAttackAnswerMeetingSessionEndEchoesTheUpstreamsID(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "20s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srAsk(up, func(w http.ResponseWriter, _ []byte) {
		once.Do(func() { close(arrived) })
		select {
		case <-release:
		case <-time.After(8 * time.Second):
		}
		w.WriteHeader(http.StatusAccepted)
	})
	id := srRunnerID(t, m)
	type answer struct {
		status int
		body   string
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, m.url,
			strings.NewReader(`{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range m.headers {
			req.Header.Set(k, v)
		}
		req.Header.Set("Mcp-Session-Id", m.sessionID)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		resp, err := (&http.Client{Transport: m.transport, Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			got <- answer{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		got <- answer{resp.StatusCode, string(data)}
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the answer never reached the upstream")
	}
	endMCPSession(t, m)
	var a answer
	select {
	case a = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("no answer to the runner's POST")
	}
	close(release)
	t.Logf("the answer's POST: HTTP %d %s", a.status, a.body)
	if strings.Contains(a.body, "UPSTREAM-ID-TEXT") {
		t.Errorf("the runner got the upstream's request id in toolgate's answer to its answer (HTTP %d): %s", a.status, a.body)
	}
}

// Holds: another MCP session of the same person (another runner) answers
// the request under the id the first runner was asked by: it answers
// nothing pending in its session (400), and the upstream gets no answer
// from it; the first runner's answer then goes upstream under the
// upstream's id.
func TestServerRequestIDHoldsAnswerFromAnotherMCPSession(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	session := g.createSession(t, aliceKey, "svc")
	m := aaRunner(t, g, aliceKey, session, `{"roots":{}}`)
	other := aaRunner(t, g, aliceKey, session, `{"roots":{}}`)
	answered := make(chan string, 4)
	srAsk(up, func(w http.ResponseWriter, b []byte) {
		answered <- gjson.GetBytes(b, "id").Raw
		w.WriteHeader(http.StatusAccepted)
	})
	id := srRunnerID(t, m)
	if status, body := srPost(t, other, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil); status != http.StatusBadRequest {
		t.Errorf("another MCP session's answer: HTTP %d %s", status, body)
	}
	if status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil); status != http.StatusAccepted {
		t.Errorf("the asked session's answer: HTTP %d %s", status, body)
	}
	select {
	case got := <-answered:
		if got != srSecretID {
			t.Errorf("the upstream got an answer under %s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer reached the upstream")
	}
	select {
	case got := <-answered:
		t.Errorf("the upstream got a second answer, under %s", got)
	case <-time.After(300 * time.Millisecond):
	}
}

// Holds: on the federated endpoint, a service's request reaches the runner
// as "toolgate:svc:<toolgate's id>", with no text of the upstream's id,
// and the runner's answer goes back under the upstream's id; the
// service's cancellation names it alike.
func TestServerRequestIDHoldsFederatedRequestIDs(t *testing.T) {
	up := startUpstream(t)
	beta := startUpstream(t)
	g := startGateway(t, faConfig(t, up, beta, gatewayConfig{Tools: "echo"}))
	m := faRunner(t, g, aliceKey, `{"roots":{}}`)
	answered := make(chan string, 4)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		if gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists() {
			answered <- gjson.GetBytes(b, "id").Raw
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		if gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"roots/list\"}\n\n", srSecretID)
		flush(w)
		var got string
		select {
		case got = <-answered:
			answered <- got
		case <-time.After(5 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":%s}}\n\n", srSecretID)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	asked, cancelled := "", ""
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`) {
		if strings.Contains(string(msg), "UPSTREAM-ID-TEXT") {
			t.Errorf("the federated runner got the upstream's id: %s", msg)
		}
		switch gjson.GetBytes(msg, "method").String() {
		case "roots/list":
			asked = gjson.GetBytes(msg, "id").Raw
			if status, _, err := faPost(m, `{"jsonrpc":"2.0","id":`+asked+`,"result":{"roots":[]}}`); status != http.StatusAccepted || err != nil {
				t.Errorf("the federated answer: HTTP %d %v", status, err)
			}
		case "notifications/cancelled":
			cancelled = gjson.GetBytes(msg, "params.requestId").Raw
		}
	}
	if !strings.HasPrefix(asked, `"toolgate:svc:\"toolgate-request:`) || cancelled != asked {
		t.Errorf("asked under %s, cancelled %s", asked, cancelled)
	}
	select {
	case got := <-answered:
		if got != srSecretID {
			t.Errorf("the upstream got the answer under %s", got)
		}
	default:
		t.Errorf("the answer never reached the upstream")
	}
}

// Holds: a program over stdio (a shared one, through mcpbridge) asks the
// runner sampling/createMessage: the runner gets it under toolgate's id,
// and its answer reaches the program, which answers the call with it.
func TestServerRequestIDHoldsProgramRequestIDs(t *testing.T) {
	prog := strings.Replace(backgroundProgram(t, "prog"), "tools background finish", "tools sample", 1)
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", Services: prog})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "prog"), "prog")
	status, hdr, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"runner","version":"1"}}}`)
	if status != http.StatusOK || hdr.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize: %d %s", status, msgs)
	}
	m.sessionID = hdr.Get("Mcp-Session-Id")
	if status, _, _ := m.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d", status)
	}
	result := ""
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sample","arguments":{"prompt":"x"}}}`) {
		switch {
		case gjson.GetBytes(msg, "method").String() == "sampling/createMessage":
			id := gjson.GetBytes(msg, "id").Raw
			if !strings.HasPrefix(id, `"toolgate-request:`) {
				t.Errorf("the runner was asked under %s", id)
			}
			if status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"role":"assistant","model":"m","content":{"type":"text","text":"SAMPLED-ANSWER"}}}`, nil); status != http.StatusAccepted {
				t.Errorf("the answer: HTTP %d %s", status, body)
			}
		case gjson.GetBytes(msg, "id").Raw == "1":
			result = string(msg)
		}
	}
	if !strings.Contains(result, "SAMPLED-ANSWER") {
		t.Errorf("the call's answer: %s", result)
	}
}

// Attack (fixed; not new with toolgate's ids: the previous version took the
// pending request the same way): registry.takeMessage takes the pending
// request (ServerRequestAnswered reads and deletes its record) before the
// rest of the pipeline has relayed the answer. When the relay then fails
// in a way toolgate tells the runner to retry (the upstream answers the
// answer's POST with 503: HTTP 503, data.retryable), the retry answers
// "no pending server request" (400), and the upstream's request is never
// answered. A retryable failure should leave the request pending (or put
// it back), so the retry reaches the upstream under its id. Fixed: a
// request whose answer the runner is told to send again (503) waits for
// it again (registry.relayAnswer).
func TestServerRequestIDAttackRetryableFailureOfAnAnswerLosesIt(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	answered := make(chan string, 4)
	var mu sync.Mutex
	posts := 0
	srAsk(up, func(w http.ResponseWriter, b []byte) {
		mu.Lock()
		posts++
		first := posts == 1
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		answered <- gjson.GetBytes(b, "id").Raw
		w.WriteHeader(http.StatusAccepted)
	})
	srAnswerAskedAgain(t, m, srRunnerID(t, m))
	select {
	case got := <-answered:
		if got != srSecretID {
			t.Errorf("the upstream got the retried answer under %s", got)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("the upstream's request was never answered")
	}
}

// Attack (fixed; a hostile upstream, on demand): the upstream answers the
// runner's answer with 404 (its session is gone), and the initialize
// toolgate then sends it (replaying the runner's) with another protocol
// version: toolgate ends the MCP session (mcpproxy.reinitialize) and
// answers the runner's POST with 404 whose id is call.Message.ID
// (mcpproxy.answerError, kindClosed) — the upstream's id, which
// registry.takeMessage put in the answer's place. So the upstream's id
// still reaches the runner, unread by any policy, whenever the upstream
// wants: any text it chooses. The runner's POST should be answered with
// no id (as call.Fail answers a response), or with the runner's own.
// Fixed: with none (gateway.Call.ReplyID).
func TestServerRequestIDAttackUpstreamForgettingItsSessionSendsItsIDToTheRunner(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	srForgetOnAnswer(up)
	id := srRunnerID(t, m)
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	t.Logf("the answer's POST: HTTP %d %s", status, body)
	if strings.Contains(body, "UPSTREAM-ID-TEXT") {
		t.Errorf("the upstream sent the runner its request id, unread by any policy (HTTP %d): %s", status, body)
	}
}

// The same through the federated endpoint: the service's answer to the
// sub-call is passed on to the runner as it is (federation's passOn).
func TestServerRequestIDAttackUpstreamForgettingItsSessionSendsItsIDThroughFederation(t *testing.T) {
	up := startUpstream(t)
	beta := startUpstream(t)
	g := startGateway(t, faConfig(t, up, beta, gatewayConfig{Tools: "echo"}))
	m := faRunner(t, g, aliceKey, `{"roots":{}}`)
	srForgetOnAnswer(up)
	id := ""
	c := faStream(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	for id == "" {
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == "roots/list" {
			id = gjson.GetBytes(msg, "id").Raw
		}
	}
	go func() {
		for range c {
		}
	}()
	status, body := srPost(t, m, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`, nil)
	t.Logf("the federated answer's POST: HTTP %d %s", status, body)
	if strings.Contains(body, "UPSTREAM-ID-TEXT") {
		t.Errorf("the upstream sent the federated runner its request id, unread by any policy (HTTP %d): %s", status, body)
	}
}

// srForgetOnAnswer makes up ask roots/list under srSecretID during a
// tools/call, answer the runner's answer with 404 (its session gone), and
// answer the initialize toolgate then replays with another protocol
// version than the session's.
func srForgetOnAnswer(up *upstream) {
	ask := make(chan struct{})
	var once sync.Once
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		switch {
		case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
			w.WriteHeader(http.StatusNotFound) // "session gone"
			return true
		case gjson.GetBytes(b, "method").String() == "initialize":
			select {
			case <-ask:
			default:
				return false // the runner's own initialize
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Mcp-Session-Id", "another-session")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-03-26","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}`, gjson.GetBytes(b, "id").Raw)
			return true
		case gjson.GetBytes(b, "method").String() != "tools/call":
			return false
		}
		once.Do(func() { close(ask) })
		sseStart(w)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"roots/list\"}\n\n", srSecretID)
		flush(w)
		select {
		case <-r.Context().Done():
		case <-time.After(4 * time.Second):
		}
		return true
	})
}

// Holds (newly, with toolgate's ids): an upstream cannot name toolgate's
// own requests to the runner. Its notifications/cancelled naming the id
// of an in-band approval's elicitation ("toolgate-approval:form:…", which
// the runner's client would take as the end of the approval it shows)
// reaches the runner naming a request of toolgate's id space for the
// upstream's requests instead.
func TestServerRequestIDHoldsUpstreamCannotCancelToolgatesOwnRequests(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{},"elicitation":{"form":{},"url":{}}}`)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost || gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		for _, id := range []string{`"toolgate-approval:form:abcdefabcdefabcdef"`, `"toolgate-approval:url:abcdefabcdefabcdef"`} {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":%s}}\n\n", id)
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	n := 0
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
		if gjson.GetBytes(msg, "method").String() != "notifications/cancelled" {
			continue
		}
		n++
		if id := gjson.GetBytes(msg, "params.requestId").String(); !strings.HasPrefix(id, "toolgate-request:") {
			t.Errorf("the runner was told of the cancellation of %q", id)
		}
	}
	if n != 2 {
		t.Errorf("%d cancellations relayed", n)
	}
}

// Holds: two replicas of this version. The upstream asks roots/list on a
// call's stream relayed by one replica and cancels it on the standalone
// stream relayed by the other: the runner is told of the cancellation
// under the id it was asked by; its answer, sent to the second replica,
// reaches the upstream under the upstream's id.
func TestServerRequestIDHoldsIDsAlikeOnEveryReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	asked, cancel := make(chan struct{}), make(chan struct{})
	answered := make(chan string, 4)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		switch {
		case r.Method == http.MethodGet:
			sseStart(w)
			flush(w)
			select {
			case <-asked:
			case <-time.After(10 * time.Second):
				return true
			}
			fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":\"up-9\",\"reason\":\"enough\"}}\n\n")
			flush(w)
			<-r.Context().Done()
			return true
		case r.Method != http.MethodPost:
			return false
		case gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists():
			answered <- gjson.GetBytes(b, "id").Raw
			w.WriteHeader(http.StatusAccepted)
			return true
		case gjson.GetBytes(b, "method").String() != "tools/call":
			return false
		}
		sseStart(w)
		fmt.Fprint(w, "data: {\"jsonrpc\":\"2.0\",\"id\":\"up-9\",\"method\":\"roots/list\"}\n\n")
		flush(w)
		close(asked)
		select {
		case <-cancel:
		case <-time.After(10 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	m, onB := srOnTwoReplicas(t, bin, up, "")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	get, err := onB.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer get.Body.Close()
	cancelled := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(get.Body)
		for lines.Scan() {
			t.Logf("the standalone stream on the other replica: %s", lines.Text())
			ev, ok := strings.CutPrefix(lines.Text(), "data: ")
			if ok && gjson.Get(ev, "method").String() == "notifications/cancelled" {
				cancelled <- gjson.Get(ev, "params.requestId").Raw
				return
			}
		}
	}()
	c := faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	id := ""
	for id == "" {
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == "roots/list" {
			id = gjson.GetBytes(msg, "id").Raw
		}
	}
	select {
	case got := <-cancelled:
		if got != id {
			t.Errorf("asked under %s on one replica, told of the cancellation of %s on the other", id, got)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("no cancellation on the other replica's standalone stream")
	}
	if status, _, err := faPost(onB, `{"jsonrpc":"2.0","id":`+id+`,"result":{"roots":[]}}`); status != http.StatusAccepted || err != nil {
		t.Errorf("the answer on the other replica: HTTP %d %v", status, err)
	}
	select {
	case got := <-answered:
		if got != `"up-9"` {
			t.Errorf("the upstream got the answer under %s", got)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the answer never reached the upstream")
	}
	close(cancel)
	for range c {
	}
}

// Attack (fixed; bound, across replicas; not new with toolgate's ids: the
// previous version counts the same way): the bound on a session's pending
// server requests (mcpsession.MaxPendingServerRequests, 256) is counted in
// the relaying replica's memory (Session.pendingRequest) and given back
// only by the replica that takes the answer (ServerRequestAnswered →
// answeredRequest). Behind a load balancer, answers reach other replicas:
// the relaying replica counts every request it ever relayed as pending,
// and after 256 of them refuses every further request of the session
// ("too many server requests are waiting for the client's answer"),
// though none is waiting. Each answered request should free its place,
// wherever it was answered. Fixed: a session at its bound asks the storage
// which requests still wait (mcpsession.Session.forgetAnsweredElsewhere).
func TestServerRequestIDAttackAnsweredElsewhereStillCountsAsPending(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	const asks = 260
	answers := make(chan []byte, 4)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		if gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists() {
			answers <- b
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		if gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		outcome := fmt.Sprintf("all %d answered", asks)
	ask:
		for i := range asks {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"roots/list\"}\n\n", 1000+i)
			flush(w)
			select {
			case a := <-answers:
				if gjson.GetBytes(a, "error").Exists() {
					outcome = fmt.Sprintf("request %d refused: %s", i, gjson.GetBytes(a, "error.message").String())
					break ask
				}
			case <-time.After(10 * time.Second):
				outcome = fmt.Sprintf("request %d never answered", i)
				break ask
			}
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":%q}]}}\n\n", gjson.GetBytes(b, "id").Raw, outcome)
		flush(w)
		return true
	})
	m, onB := srOnTwoReplicas(t, bin, up, "timeout 120s")
	result := ""
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
		switch {
		case gjson.GetBytes(msg, "method").String() == "roots/list":
			if status, _, err := faPost(onB, `{"jsonrpc":"2.0","id":`+gjson.GetBytes(msg, "id").Raw+`,"result":{"roots":[]}}`); status != http.StatusAccepted || err != nil {
				t.Fatalf("an answer on the other replica: HTTP %d %v", status, err)
			}
		case gjson.GetBytes(msg, "result").Exists():
			result = gjson.GetBytes(msg, "result.content.0.text").String()
		}
	}
	if result != fmt.Sprintf("all %d answered", asks) {
		t.Errorf("each request was answered at once on the other replica, yet: %s", result)
	}
}

// srOnTwoReplicas starts two replicas of bin sharing a storage, in front
// of up (with the service options given), and returns a runner's MCP
// session initialized through the first and the same session through the
// second.
func srOnTwoReplicas(t *testing.T, bin string, up *upstream, options string) (m, onB *rawMCP) {
	t.Helper()
	data := t.TempDir()
	block := replicaBlock("storage file_system "+filepath.Join(data, "storage"), data, up.URL, "echo", options)
	a := startReplica(t, bin, block, data)
	b := startReplica(t, bin, block, data)
	m = aaRunner(t, a.gateway, aliceKey, a.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	other := *m
	other.url = b.URL + "/v1/mcp/svc"
	other.transport = nil
	return m, &other
}
