package integration

import (
	"bufio"
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/approval"
)

// approvalsGateway is a gateway whose policies ask for approvals (see
// testdata/approvals).
func approvalsGateway(t testing.TB, extra string) (*upstream, *gateway) {
	t.Helper()
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), Extra: extra})
	return up, g
}

// upstreamCalls counts the tools/call requests of tool the upstream got.
func (u *upstream) upstreamCalls(tool string) int {
	n := 0
	for _, r := range u.requestLog() {
		if strings.Contains(r.Body, `"method":"tools/call"`) && strings.Contains(r.Body, `"name":"`+tool+`"`) {
			n++
		}
	}
	return n
}

// pending is the data of a -32012 answer.
type pendingData struct {
	ApprovalRequired bool      `json:"approval_required"`
	ApprovalID       string    `json:"approval_id"`
	ApprovalURL      string    `json:"approval_url"`
	ExpiresAt        time.Time `json:"expires_at"`
	DecisionID       string    `json:"decision_id"`
}

// call makes one tools/call and returns the raw answer.
func (m *rawMCP) call(id int, tool, args string) json.RawMessage {
	m.t.Helper()
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`)
	if len(msgs) == 0 {
		m.t.Fatalf("tools/call %s %s: no answer", tool, args)
	}
	return msgs[len(msgs)-1]
}

// mustPend expects the -32012 answer of a pending approval.
func mustPend(t testing.TB, answer json.RawMessage) pendingData {
	t.Helper()
	var a struct {
		Error *struct {
			Code int
			Data pendingData
		}
	}
	if json.Unmarshal(answer, &a) != nil || a.Error == nil || a.Error.Code != -32012 || !a.Error.Data.ApprovalRequired || a.Error.Data.ApprovalID == "" {
		t.Fatalf("want -32012 approval required, got %s", answer)
	}
	return a.Error.Data
}

// mustSucceed expects a successful tool result and returns its text.
func mustSucceed(t testing.TB, answer json.RawMessage) string {
	t.Helper()
	var a struct {
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct{ Text string }
		}
	}
	if json.Unmarshal(answer, &a) != nil || a.Result == nil || a.Result.IsError || len(a.Result.Content) == 0 {
		t.Fatalf("want a successful result, got %s", answer)
	}
	return a.Result.Content[0].Text
}

// decide approves (scope) or denies an approval through the API.
func (g *gateway) decide(t testing.TB, key, id string, approve bool, scope, note string) apiResponse {
	t.Helper()
	verb, body := "deny", map[string]string{"note": note}
	if approve {
		verb = "approve"
		if scope != "" {
			body["scope"] = scope
		}
	}
	b, _ := json.Marshal(body)
	return g.api(t, http.MethodPost, "/v1/approvals/"+id+"/"+verb, key, b)
}

func TestApprovalOnceThroughTheAPI(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()

	first := mustPend(t, m.call(1, "gated_tool", `{"text":"hello","project":"apollo"}`))
	if first.ApprovalURL != g.URL+"/console/approvals/"+first.ApprovalID || time.Until(first.ExpiresAt) < 9*time.Minute {
		t.Fatalf("the pending answer: %+v", first)
	}
	if n := up.upstreamCalls("gated_tool"); n != 0 {
		t.Fatalf("the upstream saw %d calls of a tool waiting for approval", n)
	}
	// The identical call, spelled differently, waits for the same approval.
	if again := mustPend(t, m.call(2, "gated_tool", `{ "project" : "apollo", "text" : "hello" }`)); again.ApprovalID != first.ApprovalID {
		t.Fatalf("the identical call made a second approval %s (first %s)", again.ApprovalID, first.ApprovalID)
	}

	// Alice sees it, masked; bob neither sees nor decides it.
	r := g.api(t, http.MethodGet, "/v1/approvals/"+first.ApprovalID, aliceKey, nil)
	var view struct {
		State     string
		Arguments map[string]any
		MayDecide bool `json:"may_decide"`
		Scopes    []string
	}
	if r.StatusCode != http.StatusOK || json.Unmarshal(r.Body, &view) != nil || view.State != "pending" || !view.MayDecide ||
		view.Arguments["text"] != "hello" || view.Arguments["project"] != "[masked]" {
		t.Fatalf("GET the approval: %d %s", r.StatusCode, r.Body)
	}
	for _, path := range []string{"/v1/approvals/" + first.ApprovalID} {
		if r := g.api(t, http.MethodGet, path, bobKey, nil); r.StatusCode != http.StatusNotFound {
			t.Errorf("bob reading alice's approval: %d", r.StatusCode)
		}
	}
	if r := g.decide(t, bobKey, first.ApprovalID, true, "", ""); r.StatusCode != http.StatusNotFound {
		t.Errorf("bob approving alice's call: %d %s", r.StatusCode, r.Body)
	}
	if r := g.api(t, http.MethodGet, "/v1/approvals?role=approver", bobKey, nil); strings.Contains(string(r.Body), first.ApprovalID) {
		t.Errorf("bob's queue lists alice's approval: %s", r.Body)
	}
	if r := g.api(t, http.MethodGet, "/v1/approvals?role=approver", aliceKey, nil); !strings.Contains(string(r.Body), first.ApprovalID) {
		t.Errorf("alice's queue lacks her approval: %s", r.Body)
	}
	if r := g.decide(t, aliceKey, first.ApprovalID, true, "tool", ""); r.StatusCode != http.StatusBadRequest {
		t.Errorf("approving for a scope the policy does not offer: %d %s", r.StatusCode, r.Body)
	}

	// Approved once: the identical call runs once, then asks again.
	if r := g.decide(t, aliceKey, first.ApprovalID, true, "once", "looks fine"); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	if r := g.decide(t, aliceKey, first.ApprovalID, false, "", ""); r.StatusCode != http.StatusConflict {
		t.Errorf("deciding twice: %d %s", r.StatusCode, r.Body)
	}
	// Other arguments are not approved.
	other := mustPend(t, m.call(3, "gated_tool", `{"text":"something else","project":"apollo"}`))
	if other.ApprovalID == first.ApprovalID {
		t.Fatal("other arguments were covered by the approval")
	}
	if !strings.Contains(mustSucceed(t, m.call(4, "gated_tool", `{"project":"apollo","text":"hello"}`)), `"text":"hello"`) {
		t.Fatal("the approved call did not run")
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want exactly the approved one", n)
	}
	next := mustPend(t, m.call(5, "gated_tool", `{"text":"hello","project":"apollo"}`))
	if next.ApprovalID == first.ApprovalID {
		t.Fatal("a once approval let a second call through")
	}

	// Twenty identical retries at once of a once approval: exactly one runs.
	if r := g.decide(t, aliceKey, next.ApprovalID, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answer := m.call(100+i, "gated_tool", `{"text":"hello","project":"apollo"}`)
			if strings.Contains(string(answer), `"result"`) {
				mu.Lock()
				ran++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ran != 1 || up.upstreamCalls("gated_tool") != 2 {
		t.Fatalf("20 concurrent retries of a once approval: %d ran, the upstream saw %d calls in all; want 1 and 2", ran, up.upstreamCalls("gated_tool"))
	}
	// The requester's list shows what became of them.
	r = g.api(t, http.MethodGet, "/v1/approvals?role=requester", aliceKey, nil)
	if !strings.Contains(string(r.Body), `"state":"consumed"`) || !strings.Contains(string(r.Body), `"decided_by":"`+alice) {
		t.Errorf("alice's requests: %s", r.Body)
	}
}

func TestApprovalSessionScopeStaysInItsSession(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"session please"}`))
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "session", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving for the session: %d %s", r.StatusCode, r.Body)
	}
	for i := range 3 {
		mustSucceed(t, m.call(2+i, "gated_tool", `{"text":"session please"}`))
	}
	// Another toolgate session of alice, and bob, are not covered.
	other := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	other.initialize()
	mustPend(t, other.call(1, "gated_tool", `{"text":"session please"}`))
	bobM := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bobM.initialize()
	if bp := mustPend(t, bobM.call(1, "gated_tool", `{"text":"session please"}`)); bp.ApprovalID == p.ApprovalID {
		t.Fatal("bob's call waits for alice's approval")
	}
	if n := up.upstreamCalls("gated_tool"); n != 3 {
		t.Fatalf("the upstream saw %d calls, want 3", n)
	}
}

func TestApprovalFourEyesToolScopeDenialAndExpiry(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()

	// Four eyes: the requester may not approve; an admin may.
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"four-eyes 1"}`))
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "", ""); r.StatusCode != http.StatusForbidden {
		t.Fatalf("the requester approving a four-eyes call: %d %s", r.StatusCode, r.Body)
	}
	if r := g.api(t, http.MethodGet, "/v1/approvals?role=approver", carolKey, nil); !strings.Contains(string(r.Body), p.ApprovalID) {
		t.Fatalf("the admin's queue lacks the call: %s", r.Body)
	}
	if r := g.decide(t, carolKey, p.ApprovalID, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("an admin approving: %d %s", r.StatusCode, r.Body)
	}
	mustSucceed(t, m.call(2, "gated_tool", `{"text":"four-eyes 1"}`))

	// A denial answers the identical retry, with the approver's note.
	p = mustPend(t, m.call(3, "gated_tool", `{"text":"four-eyes 2"}`))
	if r := g.decide(t, carolKey, p.ApprovalID, false, "", "not on a Friday"); r.StatusCode != http.StatusOK {
		t.Fatalf("denying: %d %s", r.StatusCode, r.Body)
	}
	answer := string(m.call(4, "gated_tool", `{"text":"four-eyes 2"}`))
	if !strings.Contains(answer, `"isError":true`) || !strings.Contains(answer, "denied by "+carol+": not on a Friday") {
		t.Fatalf("the retry of a denied call: %s", answer)
	}

	// Scope tool, where offered: any arguments of the tool in the session.
	p = mustPend(t, m.call(5, "gated_tool", `{"text":"tool-scope a"}`))
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "tool", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving for the tool: %d %s", r.StatusCode, r.Body)
	}
	mustSucceed(t, m.call(6, "gated_tool", `{"text":"tool-scope b"}`))
	mustSucceed(t, m.call(7, "gated_tool", `{"text":"tool-scope c"}`))
	mustSucceed(t, m.call(8, "gated_tool", `{"text":"tool-scope, any arguments at all"}`))
	// Not a call whose own ask offers no tool scope: the policy decides
	// the terms of each call's approval.
	mustPend(t, m.call(12, "gated_tool", `{"text":"any arguments at all"}`))
	other := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	other.initialize()
	mustPend(t, other.call(1, "gated_tool", `{"text":"tool-scope b"}`)) // another session is not covered

	// An expired approval can no longer be decided; the retry asks anew.
	// (A new session: the tool-scope approval covers every call of the tool
	// in the first one.)
	m = g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p = mustPend(t, m.call(9, "gated_tool", `{"text":"short"}`))
	time.Sleep(1200 * time.Millisecond)
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "", ""); r.StatusCode != http.StatusConflict {
		t.Fatalf("approving an expired approval: %d %s", r.StatusCode, r.Body)
	}
	if again := mustPend(t, m.call(10, "gated_tool", `{"text":"short"}`)); again.ApprovalID == p.ApprovalID {
		t.Fatal("an expired approval was offered again")
	}

	// A malformed approval object denies, and says why.
	answer = string(m.call(11, "gated_tool", `{"text":"malformed"}`))
	if !strings.Contains(answer, `"isError":true`) || !strings.Contains(answer, "approval ttl") {
		t.Fatalf("a malformed approval object: %s", answer)
	}
}

// A 2025-11-25 client that declared URL elicitation gets -32042 with the
// approval page, is told on its session's standalone stream when the
// approval is decided (notifications/elicitation/complete), and its retry
// after the approval runs once.
func TestApprovalURLElicitationClient(t *testing.T) {
	up, g := approvalsGateway(t, "")
	completed := make(chan string, 4)
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
		ElicitationCompleteHandler: func(_ context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			completed <- req.Params.ElicitationID
		},
	})
	ctx := context.Background()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "gated_tool", Arguments: map[string]any{"text": "via elicitation"}})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired {
		t.Fatalf("a gated call from a URL-elicitation client: %v, want -32042", err)
	}
	var data struct {
		Elicitations []struct {
			Mode          string
			ElicitationID string `json:"elicitationId"`
			URL           string
			Message       string
		}
	}
	if json.Unmarshal(rpcErr.Data, &data) != nil || len(data.Elicitations) != 1 || data.Elicitations[0].Mode != "url" ||
		data.Elicitations[0].URL != g.URL+"/console/approvals/"+data.Elicitations[0].ElicitationID {
		t.Fatalf("the -32042 data: %s", rpcErr.Data)
	}
	// Asking again before the decision names the same approval, and the
	// runner is told of its decision once.
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "gated_tool", Arguments: map[string]any{"text": "via elicitation"}}); !errors.As(err, &rpcErr) ||
		!strings.Contains(string(rpcErr.Data), data.Elicitations[0].ElicitationID) {
		t.Fatalf("asking again before the decision: %v", err)
	}
	select {
	case id := <-completed:
		t.Fatalf("elicitation %s completed before any decision", id)
	default:
	}
	if r := g.decide(t, aliceKey, data.Elicitations[0].ElicitationID, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	select {
	case id := <-completed:
		if id != data.Elicitations[0].ElicitationID {
			t.Fatalf("notifications/elicitation/complete for %q, want %q", id, data.Elicitations[0].ElicitationID)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no notifications/elicitation/complete on the standalone stream after the decision")
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "gated_tool", Arguments: map[string]any{"text": "via elicitation"}})
	if err != nil || res.IsError {
		t.Fatalf("the retry after approval: %+v, %v", res, err)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want 1", n)
	}
	select {
	case id := <-completed:
		t.Fatalf("elicitation %s completed twice", id)
	case <-time.After(2 * time.Second):
	}
}

// The result policy's ask withholds the result; approving releases exactly
// that result to the identical retry, without calling the upstream again.
func TestResultReview(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	args := `{"text":"review-me 1","project":"apollo"}`
	answer := m.call(1, "echo", args)
	var withheld struct {
		Result struct {
			IsError bool `json:"isError"`
			Meta    struct {
				Approval struct{ ID, URL string } `json:"toolgate/approval"`
			} `json:"_meta"`
		}
	}
	if json.Unmarshal(answer, &withheld) != nil || !withheld.Result.IsError || withheld.Result.Meta.Approval.ID == "" {
		t.Fatalf("a reviewed result: %s", answer)
	}
	id := withheld.Result.Meta.Approval.ID
	r := g.api(t, http.MethodGet, "/v1/approvals/"+id, aliceKey, nil)
	if r.StatusCode != http.StatusOK || !strings.Contains(string(r.Body), `"stage":"result"`) || !strings.Contains(string(r.Body), `review-me 1`) ||
		!strings.Contains(string(r.Body), `"scopes":["once"]`) {
		t.Fatalf("the result approval: %d %s", r.StatusCode, r.Body)
	}
	if r := g.decide(t, aliceKey, id, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving the result: %d %s", r.StatusCode, r.Body)
	}
	released := mustSucceed(t, m.call(2, "echo", args))
	if released != `{"text":"review-me 1","project":"apollo"}` {
		t.Fatalf("the released result: %q", released)
	}
	if n := up.upstreamCalls("echo"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want 1: the release must not call it again", n)
	}
	// Released once: the next identical call goes upstream and is reviewed again.
	answer = m.call(3, "echo", args)
	if !strings.Contains(string(answer), `"isError":true`) || up.upstreamCalls("echo") != 2 {
		t.Fatalf("after the release: %s (%d upstream calls)", answer, up.upstreamCalls("echo"))
	}
	// Denied: the retry gets the denial.
	_ = json.Unmarshal(answer, &withheld)
	if r := g.decide(t, aliceKey, withheld.Result.Meta.Approval.ID, false, "", "no"); r.StatusCode != http.StatusOK {
		t.Fatalf("denying: %d %s", r.StatusCode, r.Body)
	}
	if answer := string(m.call(4, "echo", args)); !strings.Contains(answer, "denied by "+alice+": no") {
		t.Fatalf("the retry of a denied result: %s", answer)
	}
}

// A withheld result an approver released is judged again when the result
// policy changed since it was withheld: what the policy in force denies
// is not released, what it rewrites goes out rewritten, and an ask the
// approval's decider may no longer decide asks anew. The upstream is
// never called again.
func TestReleasedResultIsJudgedByThePolicyInForce(t *testing.T) {
	const match = "if {\n\tinput.tool.name == \"echo\"\n\tsome item in input.result.content\n\tcontains(item.text, \"review-me\")\n}\n"
	for name, c := range map[string]struct {
		rule string // the policy's decision on the result after the change
		want func(t *testing.T, answer string)
	}{
		"now denied": {`{"action": "deny", "reason": "never shown now"}`, func(t *testing.T, answer string) {
			if !strings.Contains(answer, "never shown now") || strings.Contains(answer, "review-me") {
				t.Errorf("the released result under a policy that denies it: %s", answer)
			}
		}},
		"now rewritten": {`{"action": "allow", "result": {"content": [{"type": "text", "text": "cleaned"}]}}`, func(t *testing.T, answer string) {
			if !strings.Contains(answer, `"cleaned"`) || strings.Contains(answer, "review-me") {
				t.Errorf("the released result under a policy that rewrites it: %s", answer)
			}
		}},
		"now four eyes": {`{"action": "ask", "reason": "four eyes", "approval": {"approvers": {"groups": ["admins"]}, "requester_may_approve": false}}`, func(t *testing.T, answer string) {
			if !strings.Contains(answer, "four eyes") || strings.Contains(answer, `"isError":false`) {
				t.Errorf("the released result under a policy that leaves it to admins: %s", answer)
			}
		}},
		"asked alike": {`{"action": "ask", "reason": "reviewed, reworded"}`, func(t *testing.T, answer string) {
			if strings.Contains(answer, `"isError":true`) || !strings.Contains(answer, "review-me 1") {
				t.Errorf("the released result under a policy that asks alike: %s", answer)
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(decision string) {
				t.Helper()
				src := "package toolgate.request\n\ndefault decision := {\"action\": \"allow\"}\n"
				if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
				src = "package toolgate.result\n\ndefault decision := {\"action\": \"allow\"}\n\ndecision := " + decision + " " + match
				if err := os.WriteFile(filepath.Join(dir, "result.rego"), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(`{"action": "ask", "reason": "this result is reviewed"}`)
			up := startUpstream(t)
			g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, PolicyOptions: "reload_interval 100ms"})
			m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
			m.initialize()
			args := `{"text":"review-me 1"}`
			var withheld struct {
				Result struct {
					Meta struct {
						Approval struct{ ID string } `json:"toolgate/approval"`
					} `json:"_meta"`
				}
			}
			if answer := m.call(1, "echo", args); json.Unmarshal(answer, &withheld) != nil || withheld.Result.Meta.Approval.ID == "" {
				t.Fatalf("the result was not withheld: %s", answer)
			}
			if r := g.decide(t, aliceKey, withheld.Result.Meta.Approval.ID, true, "", ""); r.StatusCode != http.StatusOK {
				t.Fatalf("approving the result: %d %s", r.StatusCode, r.Body)
			}
			write(c.rule)
			for i := 0; ; i++ { // until the changed policy decides a probe
				answer := string(m.call(100+i, "echo", `{"text":"review-me probe `+strconv.Itoa(i)+`"}`))
				if !strings.Contains(answer, "this result is reviewed") {
					break
				}
				if i == 50 {
					t.Fatalf("the changed policy was not loaded: %s", answer)
				}
				time.Sleep(100 * time.Millisecond)
			}
			c.want(t, string(m.call(2, "echo", args)))
			n := 0
			for _, r := range up.requestLog() {
				if strings.Contains(r.Body, `"review-me 1"`) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("the upstream saw the approved call %d times, want 1", n)
			}
		})
	}
}

// New pending approvals are announced to the webhook, signed, and without
// the arguments unless include_arguments is set.
func TestApprovalWebhook(t *testing.T) {
	const secret = "a-webhook-secret-of-at-least-32-bytes!!"
	for _, include := range []bool{false, true} {
		got := make(chan *http.Request, 4)
		bodies := make(chan []byte, 4)
		fails := 1 // the first delivery fails: it is retried
		var mu sync.Mutex
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			defer mu.Unlock()
			if fails > 0 {
				fails--
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			got <- r
			bodies <- b
		}))
		t.Cleanup(receiver.Close)
		block := "approvals {\n\t\t\twebhook " + receiver.URL + " {\n\t\t\t\tsecret " + secret + "\n"
		if include {
			block += "\t\t\t\tinclude_arguments\n"
		}
		block += "\t\t\t}\n\t\t}"
		_, g := approvalsGateway(t, block)
		m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
		m.initialize()
		p := mustPend(t, m.call(1, "gated_tool", `{"text":"announce me","project":"apollo"}`))

		var r *http.Request
		var body []byte
		select {
		case r = <-got:
			body = <-bodies
		case <-time.After(15 * time.Second):
			t.Fatal("no webhook delivery")
		}
		ts, _ := strconv.ParseInt(r.Header.Get("X-Toolgate-Timestamp"), 10, 64)
		if want := approval.Signature(secret, ts, body); !hmac.Equal([]byte(r.Header.Get("X-Toolgate-Signature")), []byte(want)) || r.Header.Get("X-Toolgate-Delivery") == "" {
			t.Fatalf("the signature %q does not verify (want %q)", r.Header.Get("X-Toolgate-Signature"), want)
		}
		var a struct {
			Type     string
			Approval map[string]any
		}
		if json.Unmarshal(body, &a) != nil || a.Type != "approval.requested" || a.Approval["id"] != p.ApprovalID || a.Approval["url"] != p.ApprovalURL {
			t.Fatalf("the announcement: %s", body)
		}
		_, hasArgs := a.Approval["arguments"]
		if hasArgs != include || strings.Contains(string(body), "apollo") {
			t.Fatalf("include_arguments=%v, the announcement: %s", include, body)
		}
	}
}

// Two toolgate processes share one PostgreSQL database: twenty identical
// retries of a once approval, sent to both at the same moment, run the call
// once.
func TestApprovalOnceAcrossTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	up := startUpstream(t)
	data := t.TempDir()
	block := replicaBlock(postgresStorage(t), data, up.URL, "gated_tool", "")
	policies := testdataPath(t, "approvals")
	a := startReplicaWith(t, bin, block, data, policies)
	b := startReplicaWith(t, bin, block, data, policies)
	sess := a.createSession(t, aliceKey, "svc")
	ma, mb := a.raw(t, aliceKey, sess, "svc"), b.raw(t, aliceKey, sess, "svc")
	ma.initialize()
	mb.initialize()

	p := mustPend(t, ma.call(1, "gated_tool", `{"text":"twice?"}`))
	if again := mustPend(t, mb.call(1, "gated_tool", `{"text":"twice?"}`)); again.ApprovalID != p.ApprovalID {
		t.Fatalf("the other replica made its own approval %s (want %s)", again.ApprovalID, p.ApprovalID)
	}
	if r := b.decide(t, aliceKey, p.ApprovalID, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving on the other replica: %d %s", r.StatusCode, r.Body)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	for i := range 20 {
		m := ma
		if i%2 == 1 {
			m = mb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if strings.Contains(string(m.call(10+i, "gated_tool", `{"text":"twice?"}`)), `"result"`) {
				mu.Lock()
				ran++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ran != 1 || up.upstreamCalls("gated_tool") != 1 {
		t.Fatalf("20 retries of a once approval on two replicas: %d ran, the upstream saw %d calls; want 1 and 1", ran, up.upstreamCalls("gated_tool"))
	}
}

// sseCall posts a tools/call accepting SSE and returns the messages of the
// answer as they arrive, on a channel closed at its end.
func (m *rawMCP) sseCall(id int, tool, args string) <-chan json.RawMessage {
	m.t.Helper()
	body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
	req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Mcp-Session-Id", m.sessionID)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		m.t.Fatal(err)
	}
	out := make(chan json.RawMessage, 16)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		for _, msg := range readSSE(resp.Body) {
			out <- msg
		}
	}()
	return out
}

// readSSE returns the data of each event of an SSE body, read to its end.
func readSSE(r io.Reader) []json.RawMessage {
	data, _ := io.ReadAll(r)
	var msgs []json.RawMessage
	for _, line := range strings.Split(string(data), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok && strings.TrimSpace(d) != "" {
			msgs = append(msgs, json.RawMessage(d))
		}
	}
	return msgs
}

// pendingApprovalID is the id of the pending approval key's user asked
// whose contents hold text, waiting up to 5 s for it to be asked.
func pendingApprovalID(t testing.TB, g *gateway, key, text string) string {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r := g.api(t, http.MethodGet, "/v1/approvals?role=requester&state=pending", key, nil)
		var list struct {
			Approvals []struct{ ID string }
		}
		_ = json.Unmarshal(r.Body, &list)
		for _, a := range list.Approvals {
			if ga := g.api(t, http.MethodGet, "/v1/approvals/"+a.ID, key, nil); strings.Contains(string(ga.Body), text) {
				return a.ID
			}
		}
	}
	t.Fatalf("no pending approval for %q", text)
	return ""
}

// With approval_wait, a call that needs an approval is held open on its SSE
// answer: approved during the hold, its result arrives on the same request;
// denied, the denial does; not decided in time, the pending answer does.
func TestApprovalHold(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 3s"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	// Approved during the hold: the result on the same request.
	stream := m.sseCall(1, "gated_tool", `{"text":"hold 1"}`)
	if r := g.decide(t, aliceKey, pendingApprovalID(t, g, aliceKey, "hold 1"), true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	var msgs []json.RawMessage
	for msg := range stream {
		msgs = append(msgs, msg)
	}
	if len(msgs) < 2 || !strings.Contains(string(msgs[0]), "notifications/message") || !strings.Contains(string(msgs[0]), "/console/approvals/") {
		t.Fatalf("the held stream did not start with where to approve: %s", msgs)
	}
	if last := msgs[len(msgs)-1]; !strings.Contains(string(last), `\"text\":\"hold 1\"`) || strings.Contains(string(last), `"isError":true`) {
		t.Fatalf("the held call after its approval: %s", msgs)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want 1", n)
	}

	// Denied during the hold: the denial.
	stream = m.sseCall(2, "gated_tool", `{"text":"hold 2"}`)
	g.decide(t, aliceKey, pendingApprovalID(t, g, aliceKey, "hold 2"), false, "", "not now")
	msgs = nil
	for msg := range stream {
		msgs = append(msgs, msg)
	}
	if last := msgs[len(msgs)-1]; !strings.Contains(string(last), "denied by "+alice+": not now") {
		t.Fatalf("the held call after its denial: %s", msgs)
	}

	// Not decided in time: the pending answer, and the call did not run.
	msgs = nil
	for msg := range m.sseCall(3, "gated_tool", `{"text":"hold 3"}`) {
		msgs = append(msgs, msg)
	}
	if last := msgs[len(msgs)-1]; len(msgs) < 2 || !strings.Contains(string(last), `"code":-32012`) {
		t.Fatalf("the held call after the wait: %s", msgs)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want 1", n)
	}
}

// Approvers see the arguments that would go upstream digit for digit: a
// number beyond float64's precision is not shown as a neighbour.
func TestApprovalShowsNumbersAsSent(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	const args = `{"text":"pay","amount":9007199254740993,"account":12345678901234567890,"rate":0.1000000000000000055511151231257827}`
	p := mustPend(t, m.call(1, "gated_tool", args))
	r := g.api(t, http.MethodGet, "/v1/approvals/"+p.ApprovalID, aliceKey, nil)
	var view struct{ Arguments json.RawMessage }
	if r.StatusCode != http.StatusOK || json.Unmarshal(r.Body, &view) != nil {
		t.Fatalf("GET the approval: %d %s", r.StatusCode, r.Body)
	}
	browser := g.signedIn(t, aliceKey)
	_, page := browser.get(g.URL + "/console/approvals/" + p.ApprovalID)
	for _, n := range []string{"9007199254740993", "12345678901234567890", "0.1000000000000000055511151231257827"} {
		if !strings.Contains(string(view.Arguments), n) {
			t.Errorf("the API shows the arguments as %s, without %s", view.Arguments, n)
		}
		if !strings.Contains(page, n) {
			t.Errorf("the approval page does not show %s", n)
		}
	}
}

// Invisible and bidirectional control characters in arguments cannot make
// the approval page show other arguments than those approved: the page
// writes them as escapes (the same JSON), not as characters that reorder
// or hide text.
func TestApprovalPageShowsInvisibleCharacters(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	// Shown raw, "\u202e1234" reads as "4321", and "\u200b" not at all.
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"pay","to":"acct-\u202e1234","memo":"ok\u200b\u2066\udb40\udc41"}`))
	_, page := g.signedIn(t, aliceKey).get(g.URL + "/console/approvals/" + p.ApprovalID)
	_, args, _ := strings.Cut(page, `<code id="arguments">`)
	args, _, _ = strings.Cut(args, "</code>")
	args = htmlUnescape(args)
	for _, r := range []rune{'\u202e', '\u200b', '\u2066', '\U000E0041'} {
		if strings.ContainsRune(args, r) {
			t.Errorf("the approval page shows U+%04X as itself in %q", r, args)
		}
	}
	for _, esc := range []string{`acct-\u202e1234`, `ok\u200b\u2066\udb40\udc41`} {
		if !strings.Contains(args, esc) {
			t.Errorf("the approval page does not show %s: %q", esc, args)
		}
	}
}

// An announcement links approvers to the approval page, so the page's host
// must not come from the runner's request: a webhook needs public_url.
func TestApprovalWebhookNeedsPublicURL(t *testing.T) {
	err := validateCaddyfile(t, `{
	admin off
	toolgate {
		cipher local `+t.TempDir()+`/key
		approvals {
			webhook https://chat.example.com/hook {
				secret 0123456789abcdef0123456789abcdef
			}
		}
		service svc {
			url http://127.0.0.1:1/mcp
			allow_http
			tools echo
		}
	}
}
:1 {
	toolgate_api
}`)
	if err == nil || !strings.Contains(err.Error(), "public_url") {
		t.Fatalf("a webhook without public_url: validate = %v, want public_url named", err)
	}
}

// An approval id that names a storage directory ("..", decoded from
// "%2e%2e") is no approval: 404, not a storage error.
func TestApprovalIDsAreNotPaths(t *testing.T) {
	_, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	mustPend(t, m.call(1, "gated_tool", `{"text":"one exists"}`)) // the directories exist
	for _, id := range []string{"%2e", "%2e%2e"} {
		if r := g.api(t, http.MethodGet, "/v1/approvals/"+id, aliceKey, nil); r.StatusCode != http.StatusNotFound {
			t.Errorf("GET /v1/approvals/%s: %d %s", id, r.StatusCode, r.Body)
		}
		if r := g.decide(t, aliceKey, id, true, "", ""); r.StatusCode != http.StatusNotFound {
			t.Errorf("approving %s: %d %s", id, r.StatusCode, r.Body)
		}
	}
}

// An approval covers a later ask only if that ask's policy would have let
// its decider decide: the requester's own approval for the tool scope does
// not let through a call of that tool the policy reserves for an admin
// (four eyes), while an admin's does.
func TestToolScopeDoesNotBypassFourEyes(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"tool-scope a"}`))
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "tool", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("alice approving for the tool: %d %s", r.StatusCode, r.Body)
	}
	mustSucceed(t, m.call(2, "gated_tool", `{"text":"tool-scope b"}`))
	fourEyes := mustPend(t, m.call(3, "gated_tool", `{"text":"four-eyes: delete everything"}`))
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls; the four-eyes call must wait for an admin", n)
	}
	if r := g.decide(t, aliceKey, fourEyes.ApprovalID, true, "", ""); r.StatusCode != http.StatusForbidden {
		t.Fatalf("alice approving the four-eyes call: %d", r.StatusCode)
	}

	// An admin's approval covers the identical four-eyes call.
	m = g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p = mustPend(t, m.call(2, "gated_tool", `{"text":"four-eyes 1"}`))
	if r := g.decide(t, carolKey, p.ApprovalID, true, "session", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("carol approving for the session: %d %s", r.StatusCode, r.Body)
	}
	mustSucceed(t, m.call(3, "gated_tool", `{"text":"four-eyes 1"}`))
	mustSucceed(t, m.call(4, "gated_tool", `{"text":"four-eyes 1"}`))
}

// What makes two calls identical for an approval is the JSON value of
// their arguments as the upstream reads them: escapes and key order do
// not matter; another number spelling, a duplicate key, a key differing
// only in case or a lone surrogate never match (the last three are not
// even read), and nothing reaches the upstream unapproved.
func TestApprovalIdentityOfArguments(t *testing.T) {
	up, g := approvalsGateway(t, "")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	p := mustPend(t, m.call(1, "gated_tool", `{"text":"hello","n":1}`))
	if r := g.decide(t, aliceKey, p.ApprovalID, true, "session", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	// (The upstream's tool takes no "n": it answers with a tool error, but it
	// was called.)
	if answer := m.call(2, "gated_tool", `{"n":1,"text":"h\u0065llo"}`); !strings.Contains(string(answer), `"result"`) || up.upstreamCalls("gated_tool") != 1 {
		t.Fatalf("the identical call, spelled otherwise: %s", answer)
	}
	for i, args := range []string{`{"text":"hello","n":1.0}`, `{"text":"hello","n":1e0}`, `{"text":"hello","n":1,"extra":null}`} {
		if again := mustPend(t, m.call(3+i, "gated_tool", args)); again.ApprovalID == p.ApprovalID {
			t.Errorf("%s waits for the approval of another value", args)
		}
	}
	for i, args := range []string{`{"text":"hello","n":1,"n":2}`, `{"text":"hello","n":1,"N":2}`, `{"text":"hello\ud800","n":1}`} {
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":` + strconv.Itoa(10+i) + `,"method":"tools/call","params":{"name":"gated_tool","arguments":` + args + `}}`)
		if len(msgs) > 0 && strings.Contains(string(msgs[len(msgs)-1]), `"result"`) {
			t.Errorf("%s ran: %s", args, msgs[len(msgs)-1])
		}
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want only the approved one", n)
	}
}

// A call held for an approval (approval_wait) goes on only if its own ask
// would have let the approval's decider decide: when the policy was
// tightened to four eyes after an identical call asked, the held call
// does not wait for (nor run on) the old approval its requester may
// approve, but for one an admin must decide.
func TestHeldCallNeedsTheApprovalItsPolicyAsks(t *testing.T) {
	dir := t.TempDir()
	write := func(approvalObject string) {
		t.Helper()
		src := "package toolgate.request\n\ndefault decision := {\"action\": \"allow\"}\n\n" +
			"decision := {\"action\": \"ask\", \"reason\": \"gated" + approvalObject + "} if input.tool.name == \"gated_tool\"\n"
		if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`"`)
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, ResultPolicy: testdataPath(t, "approvals"),
		PolicyOptions: "approval_wait 3s\n\t\t\treload_interval 100ms"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	old := mustPend(t, m.call(1, "gated_tool", `{"text":"x"}`))

	write(` (four eyes)", "approval": {"approvers": {"groups": ["admins"]}, "requester_may_approve": false}`)
	// Each probe is held for approval_wait, so few of them.
	for i := 0; ; i++ {
		answer := m.call(100+i, "gated_tool", `{"text":"probe `+strconv.Itoa(i)+`"}`) // a pending ask is reused, reason and all
		if strings.Contains(string(answer), "four eyes") {
			break
		}
		if i == 10 {
			t.Fatalf("the tightened policy was not loaded: %s", answer)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The identical call, held; once it is waiting, alice approves the old
	// approval, which its record lets her decide.
	body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"gated_tool","arguments":{"text":"x"}}}`
	req, _ := http.NewRequest(http.MethodPost, m.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range m.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Mcp-Session-Id", m.sessionID)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "data:") { // the hold's first notification
	}
	if r := g.decide(t, aliceKey, old.ApprovalID, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("alice approving the old approval: %d %s", r.StatusCode, r.Body)
	}
	rest, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(rest), `"code":-32012`) || strings.Contains(string(rest), `"result"`) {
		t.Errorf("the held call's answer: %s", rest)
	}
	if n := up.upstreamCalls("gated_tool"); n != 0 {
		t.Fatalf("the upstream saw %d calls: alice's own approval let a four-eyes call through", n)
	}
}

// A call held for an approval (approval_wait) and approved after the
// policy was reloaded is decided again by the policy in force, as its
// retry would be: approved under a policy that asked, it runs if the
// policy still asks, and not once the policy denies it.
func TestHeldCallApprovedAfterAReloadIsDecidedAgain(t *testing.T) {
	dir := t.TempDir()
	write := func(src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte("package toolgate.request\n\n"+src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const asks = "decision := {\"action\": \"ask\", \"reason\": \"gated\"} if input.tool.name == \"gated_tool\"\n"
	write("default decision := {\"action\": \"allow\"}\n\n" + asks)
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, ResultPolicy: testdataPath(t, "approvals"),
		PolicyOptions: "approval_wait 20s\n\t\t\treload_interval 100ms"})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	id := 0
	reload := func(src, probeAnswer string) {
		t.Helper()
		write(src)
		for i := 0; !strings.Contains(string(m.call(100+id, "echo", `{"text":"probe"}`)), probeAnswer); i++ {
			if i == 100 {
				t.Fatalf("the policy was not reloaded: %s", src)
			}
			id++
			time.Sleep(50 * time.Millisecond)
		}
	}
	heldAcross := func(text, src, probeAnswer string) []json.RawMessage {
		t.Helper()
		id++
		stream := m.sseCall(id, "gated_tool", `{"text":"`+text+`"}`)
		approval := pendingApprovalID(t, g, aliceKey, text)
		reload(src, probeAnswer)
		if r := g.decide(t, aliceKey, approval, true, "once", ""); r.StatusCode != http.StatusOK {
			t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
		}
		var msgs []json.RawMessage
		for msg := range stream {
			msgs = append(msgs, msg)
		}
		if len(msgs) == 0 {
			t.Fatal("the held call got no answer")
		}
		return msgs
	}

	// Still asked for under the new policy: the approval stands.
	msgs := heldAcross("across an edit", "default decision := {\"action\": \"allow\"}\n\n"+asks+
		"decision := {\"action\": \"deny\", \"reason\": \"echo retired\"} if input.tool.name == \"echo\"\n", "echo retired")
	if last := string(msgs[len(msgs)-1]); !strings.Contains(last, `across an edit`) || strings.Contains(last, `"isError":true`) {
		t.Fatalf("the held call approved across an edit that still asks: %s", msgs)
	}
	// Denied by the new policy: refused, never sent.
	msgs = heldAcross("across a denial", "default decision := {\"action\": \"deny\", \"reason\": \"every tool is retired\"}\n", "every tool is retired")
	if last := string(msgs[len(msgs)-1]); !strings.Contains(last, "every tool is retired") {
		t.Errorf("the held call approved across a denial: %s", msgs)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want the one still asked for: an approval given under an old policy ran a call the policy in force denies", n)
	}
}
