package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attacks on the put-back of 997f142 (registry.relayAnswer): a request
// whose answer the rest of the pipeline answered the runner 503 for is
// recorded again, so that the runner may send the answer again. The 503
// came from mcpproxy.answerError for any kindUnavailable failure,
// including those where the answer reached the upstream (ue.sent: the
// upstream read it, then was slow to acknowledge it). The runner did as
// told, and the upstream got the same answer twice. Fixed: an answer that
// may have reached the upstream gets 502, not to be sent again, and its
// request does not wait again (mcpproxy.forward). An upstream that answers
// the answer with a 5xx status says it did not take it: that answer is
// asked for again, as any call the upstream answers so.

// srFixAnswers counts the answers the upstream gets to srAsk's request,
// acknowledging the first with ack and the rest at once (202).
func srFixAnswers(up *upstream, ack func(w http.ResponseWriter)) (count func() int) {
	var mu sync.Mutex
	n := 0
	srAsk(up, func(w http.ResponseWriter, b []byte) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			ack(w)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// srFixSlowAcknowledgement makes the upstream take the first answer and
// acknowledge it after the service's timeout (2s).
func srFixSlowAcknowledgement(w http.ResponseWriter) {
	time.Sleep(3 * time.Second)
	w.WriteHeader(http.StatusAccepted)
}

// srFixAnswerTwice sends the runner's answer to the request it was asked
// under id, and once more (as a runner told to may), and returns how the
// first was answered.
func srFixAnswerTwice(t *testing.T, m *rawMCP, id string) (int, string) {
	t.Helper()
	answer := `{"jsonrpc":"2.0","id":` + id + `,"result":{"roots":[]}}`
	status, body := srPost(t, m, answer, nil)
	again, againBody := srPost(t, m, answer, nil)
	t.Logf("the answer: HTTP %d %s; sent again: HTTP %d %s", status, body, again, againBody)
	time.Sleep(300 * time.Millisecond)
	return status, body
}

// Attack (fixed): a correct upstream, slow to acknowledge the answer it
// took (longer than the service's timeout). toolgate answered the runner
// 503 "retryable", and relayAnswer recorded the request again; the
// runner's retry went upstream a second time.
func TestServerRequestFixAttackSlowAcknowledgementDeliversTheAnswerTwice(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "2s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	count := srFixAnswers(up, srFixSlowAcknowledgement)
	status, body := srFixAnswerTwice(t, m, srRunnerID(t, m))
	if status != http.StatusBadGateway || strings.Contains(body, "retryable") {
		t.Errorf("an answer the upstream may have: HTTP %d %s", status, body)
	}
	if n := count(); n != 1 {
		t.Errorf("the upstream got the runner's one answer %d times", n)
	}
}

// Attack (fixed): the put-back is refused when the session's pending requests
// reached their bound meanwhile (the place the answer freed taken by a
// request the upstream sent while the answer was on its way: here the
// upstream's 256th), yet the runner is told 503 "retryable" all the same
// (relayAnswer only logs "no longer waits"). The retry toolgate asked for
// is refused (400, "answers no pending server request") and the
// upstream's request is never answered. A put-back that cannot be made
// should not tell the runner to send again, or the request should keep
// its place until the answer's fate is known. Fixed: it keeps its place
// (mcpsession.Session.ServerRequestWaitsAgain), and should the storage
// refuse, the runner gets 502 instead.
func TestServerRequestFixAttackPutBackRefusedAtTheBoundLosesTheAnswer(t *testing.T) {
	const bound = 256 // mcpsession.MaxPendingServerRequests
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Timeout: "30s"})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{}}`)
	more, sentMore, finish := make(chan struct{}), make(chan struct{}), make(chan struct{})
	defer close(finish)
	var mu sync.Mutex
	answers := []string{}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost {
			return false
		}
		if gjson.GetBytes(b, "result").Exists() || gjson.GetBytes(b, "error").Exists() {
			mu.Lock()
			answers = append(answers, gjson.GetBytes(b, "id").Raw)
			first := len(answers) == 1
			mu.Unlock()
			if !first {
				w.WriteHeader(http.StatusAccepted)
				return true
			}
			close(more)
			<-sentMore
			time.Sleep(500 * time.Millisecond) // toolgate records the new request
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		if gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		for i := range bound {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"roots/list\"}\n\n", i)
		}
		flush(w)
		select {
		case <-more:
		case <-time.After(20 * time.Second):
			return true
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"roots/list\"}\n\n", bound)
		flush(w)
		close(sentMore)
		select {
		case <-finish:
		case <-time.After(20 * time.Second):
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	c := faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	id := ""
	for n := 0; n < bound; { // all relayed (and recorded) before the answer
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == "roots/list" {
			if n == 0 {
				id = gjson.GetBytes(msg, "id").Raw // the upstream's 0
			}
			n++
		}
	}
	go func() {
		for range c {
		}
	}()
	srAnswerAskedAgain(t, m, id)
}

// Attack (fixed): the same through the federated endpoint (federation's
// answerServer passed the service's 503 on).
func TestServerRequestFixAttackSlowAcknowledgementDeliversTheAnswerTwiceThroughFederation(t *testing.T) {
	up := startUpstream(t)
	beta := startUpstream(t)
	g := startGateway(t, faConfig(t, up, beta, gatewayConfig{Tools: "echo", Timeout: "2s"}))
	m := faRunner(t, g, aliceKey, `{"roots":{}}`)
	count := srFixAnswers(up, srFixSlowAcknowledgement)
	c := faStream(t, m, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"svc__echo","arguments":{"text":"x"}}}`)
	id := ""
	for id == "" {
		if msg := faNext(t, c); gjson.GetBytes(msg, "method").String() == "roots/list" {
			id = gjson.GetBytes(msg, "id").Raw
		}
	}
	go func() {
		for range c {
		}
	}()
	if status, _ := srFixAnswerTwice(t, m, id); status == http.StatusServiceUnavailable {
		t.Errorf("an answer the upstream may have: HTTP %d", status)
	}
	if n := count(); n != 1 {
		t.Errorf("the upstream got the runner's one answer %d times", n)
	}
}

// Holds: an upstream's notifications/cancelled naming its request by an
// odd requestId (null, an object or an array carrying text, a number with
// a fraction, a case variant of the member's name) reaches the runner
// naming a request of toolgate's id space, with none of the upstream's
// text, or not at all (a requestId that is no JSON-RPC id).
func TestServerRequestFixHoldsOddCancellationRequestIDs(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"roots":{},"elicitation":{"form":{},"url":{}}}`)
	odd := []string{
		`{"requestId":null}`,
		`{"requestId":{"x":"UPSTREAM-ID-TEXT"}}`,
		`{"requestId":["UPSTREAM-ID-TEXT"]}`,
		`{"requestId":1.5}`,
		`{"RequestId":"UPSTREAM-ID-TEXT"}`,
		`{"requestID":"toolgate-approval:form:abcdefabcdefabcdef"}`,
	}
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost || gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		for _, p := range odd {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":%s}\n\n", p)
		}
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	})
	for msg := range faStream(t, m, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`) {
		if gjson.GetBytes(msg, "method").String() != "notifications/cancelled" {
			continue
		}
		t.Logf("the runner got %s", msg)
		if strings.Contains(string(msg), "UPSTREAM-ID-TEXT") || strings.Contains(string(msg), "toolgate-approval") {
			t.Errorf("the runner got the upstream's text: %s", msg)
		}
	}
}
