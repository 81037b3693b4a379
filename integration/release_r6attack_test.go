package integration

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attacks on f01e82c: a held call (a stateless runner's call to an
// upstream of an earlier revision that asked its client something) is
// released in one place, toolgate_registry's releaseUntaken, when the
// retry that redeemed its requestState is taken on by nothing; the request
// policy's reason (Stateless.Refused) goes upstream with the release.

// r6Retry is the retry of a held "ask" call answering its elicitation
// with action and content.
func r6Retry(id int, action, content, state string) string {
	return saCall(id, "ask", `{}`, `{"elicitation":{}}`,
		`,"inputResponses":{"upstream-1":{"action":"`+action+`","content":`+content+`}},"requestState":`+aaJSON(state))
}

// r6Cancels are the reasons of the notifications/cancelled the upstream
// got, waiting up to wait for at least want of them (the release posts
// its notification in the background).
func r6Cancels(up *upstream, want int, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		var reasons []string
		for _, r := range up.requestLog() {
			if gjson.Get(r.Body, "method").String() == "notifications/cancelled" {
				reasons = append(reasons, gjson.Get(r.Body, "params.reason").String())
			}
		}
		if len(reasons) >= want || time.Now().After(deadline) {
			return reasons
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Held: two retries of one requestState racing each other. The state is
// used up once (storage lock, then Stat/Store): exactly one retry
// continues the held call (the upstream gets the answer, the runner the
// tool's result), the other is refused before anything takes or releases
// the call — no release, no cancellation upstream, and the caller's one
// place (max_streams_per_caller 1) is free afterwards.
func TestR6HeldRetriesRacingContinueOnce(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "60s",
		RequestPolicy: aaPolicies(t, "", ""), Extra: "max_streams_per_caller 1"})
	session := g.createSession(t, aliceKey, "svc")
	for round := range 3 {
		a := r4Send(g, aliceKey, session, "ask", saCall(100*round+1, "ask", `{}`, `{"elicitation":{}}`, ""))
		if a.err != nil {
			t.Fatal(a.err)
		}
		state := r4State(t, a.msg)
		const n = 4
		answers := make([]r4Answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = r4Send(g, aliceKey, session, "ask", r6Retry(100*round+10+i, "accept", `{"ok":true}`, state))
			}()
		}
		wg.Wait()
		continued, refused := 0, 0
		for _, a := range answers {
			switch {
			case a.err == nil && a.status == http.StatusOK && strings.Contains(aaJSON(a.msg), "elicitation answered: accept"):
				continued++
			case a.err == nil && a.status == http.StatusBadRequest && strings.Contains(aaJSON(a.msg), "requestState refused"):
				refused++
			default:
				t.Errorf("round %d: a racing retry got %d %s %v", round, a.status, aaJSON(a.msg), a.err)
			}
		}
		if continued != 1 || refused != n-1 {
			t.Errorf("round %d: %d retries continued the held call and %d were refused, want 1 and %d", round, continued, refused, n-1)
		}
		if a := r4Send(g, aliceKey, session, "echo", saCall(100*round+50, "echo", `{"text":"r6"}`, `{}`, "")); a.status != http.StatusOK {
			t.Errorf("round %d: the caller's place is not free after the race: %d %s", round, a.status, aaJSON(a.msg))
		}
	}
	if reasons := r6Cancels(up, 1, 500*time.Millisecond); len(reasons) != 0 {
		t.Errorf("a racing retry released a held call another one continued: the upstream was told %q", reasons)
	}
}

// Held: another caller (bob, who may use the service) and the same caller
// in another toolgate session send alice's requestState with her call's
// very name and arguments. Both are refused as not theirs before the state
// is used up, and neither releases her held call (Take is by owner, and
// releaseUntaken runs only after a redeem): no cancellation reaches the
// upstream, and alice's own retry still continues the call.
func TestR6HeldRetryOfAnotherOwnerReleasesNothing(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "60s",
		RequestPolicy: aaPolicies(t, "", "")})
	session := g.createSession(t, aliceKey, "svc")
	other := g.createSession(t, aliceKey, "svc")
	bobs := g.createSession(t, bobKey, "svc")
	a := r4Send(g, aliceKey, session, "ask", saCall(1, "ask", `{}`, `{"elicitation":{}}`, ""))
	if a.err != nil {
		t.Fatal(a.err)
	}
	state := r4State(t, a.msg)
	for _, who := range []struct{ key, session, name string }{{bobKey, bobs, "bob"}, {aliceKey, other, "alice's other session"}} {
		a := r4Send(g, who.key, who.session, "ask", r6Retry(2, "decline", `{"ok":false}`, state))
		if a.err != nil || a.status != http.StatusBadRequest || !strings.Contains(aaJSON(a.msg), "requestState refused") {
			t.Errorf("%s's retry with alice's requestState: %d %s %v", who.name, a.status, aaJSON(a.msg), a.err)
		}
	}
	if reasons := r6Cancels(up, 1, 500*time.Millisecond); len(reasons) != 0 {
		t.Fatalf("another owner's retry released alice's held call: the upstream was told %q", reasons)
	}
	a = r4Send(g, aliceKey, session, "ask", r6Retry(3, "accept", `{"ok":true}`, state))
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(aaJSON(a.msg), "elicitation answered: accept") {
		t.Errorf("alice's own retry after the others': %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
}

// Held: a retry the request policy denies releases the held call with the
// policy's reason (intended, it reaches the upstream), and nothing else of
// the retry's: not the runner's input response the policy refused (the
// marker in its content), not the caller's toolgate API key, not
// toolgate's requestState. The caller's place is free at once.
func TestR6HeldRetryDeniedTellsUpstreamOnlyThePolicyReason(t *testing.T) {
	const marker = "R6-RUNNER-ANSWER-7f3a"
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "r6: answers with a secret are refused"} if {
	input.method == "tools/call"
	input.input_responses["upstream-1"].content.secret
}`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "60s", Auth: "bearer",
		RequestPolicy: policies, Extra: "max_streams_per_caller 1"})
	if r := g.api(t, http.MethodPut, "/v1/connections/svc", aliceKey, []byte(`{"token":"alice-upstream-token"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("storing alice's token: %d %s", r.StatusCode, r.Body)
	}
	session := g.createSession(t, aliceKey, "svc")
	a := r4Send(g, aliceKey, session, "ask", saCall(1, "ask", `{}`, `{"elicitation":{}}`, ""))
	if a.err != nil {
		t.Fatal(a.err)
	}
	state := r4State(t, a.msg)
	a = r4Send(g, aliceKey, session, "ask", r6Retry(2, "accept", `{"ok":true,"secret":"`+marker+`"}`, state))
	if a.err != nil || !strings.Contains(aaJSON(a.msg), "answers with a secret are refused") {
		t.Fatalf("premise: the retry is not denied: %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
	if a := r4Send(g, aliceKey, session, "echo", saCall(3, "echo", `{"text":"r6"}`, `{}`, "")); a.status != http.StatusOK {
		t.Errorf("the denied retry did not free the caller's place: %d %s", a.status, aaJSON(a.msg))
	}
	reasons := r6Cancels(up, 1, 5*time.Second)
	if len(reasons) != 1 || !strings.Contains(reasons[0], "answers with a secret are refused") {
		t.Errorf("the upstream was told %q, want one cancellation with the policy's reason", reasons)
	}
	for _, r := range up.requestLog() {
		for _, leak := range []string{marker, aliceKey, state} {
			if strings.Contains(r.Body, leak) {
				t.Errorf("the upstream got %q in %s", leak, r.Body)
			}
		}
	}
}

// Held: a retry the request policy asks an approval for (its answer needs
// one) is not taken on — the runner is told to get the approval — and the
// held call is released at once (the caller's one place is free), telling
// the upstream that the retry needs an approval, with the policy's reason
// (toolgate's generic words before).
func TestR6HeldRetryAskedReleasesTheCall(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "ask", "reason": "r6: accepting needs an approval"} if {
	input.method == "tools/call"
	input.input_responses["upstream-1"].action == "accept"
}`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "ask echo", Timeout: "60s",
		RequestPolicy: policies, Extra: "max_streams_per_caller 1"})
	session := g.createSession(t, aliceKey, "svc")
	a := r4Send(g, aliceKey, session, "ask", saCall(1, "ask", `{}`, `{"elicitation":{}}`, ""))
	if a.err != nil {
		t.Fatal(a.err)
	}
	state := r4State(t, a.msg)
	a = r4Send(g, aliceKey, session, "ask", r6Retry(2, "accept", `{"ok":true}`, state))
	if a.err != nil || strings.Contains(aaJSON(a.msg), "elicitation answered") {
		t.Fatalf("premise: the asked retry continued the call: %d %s %v", a.status, aaJSON(a.msg), a.err)
	}
	if a := r4Send(g, aliceKey, session, "echo", saCall(3, "echo", `{"text":"r6"}`, `{}`, "")); a.status != http.StatusOK {
		t.Errorf("the asked retry did not free the caller's place: %d %s", a.status, aaJSON(a.msg))
	}
	if reasons := r6Cancels(up, 1, 5*time.Second); len(reasons) != 1 || !strings.Contains(reasons[0], "needs an approval: r6: accepting needs an approval") {
		t.Errorf("the upstream was told %q, want one cancellation saying the retry needs an approval, with the policy's reason", reasons)
	}
}
