package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// A held call (approval_wait) whose client declared URL elicitation is
// told where its approval is decided with elicitation/create in URL mode,
// and, once decided, with notifications/elicitation/complete; the call
// then goes on on the same request.
func TestApprovalHoldElicitsURL(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 10s"})
	var (
		mu        sync.Mutex
		asked     []*mcp.ElicitParams
		completed = make(chan string, 1)
	)
	opts := &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, req.Params)
			mu.Unlock()
			// The person opens the page and approves there.
			go g.decide(t, aliceKey, req.Params.ElicitationID, true, "once", "")
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
		ElicitationCompleteHandler: func(_ context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			completed <- req.Params.ElicitationID
		},
	}
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", opts)
	text, isErr := toolError(t, cs, "gated_tool", map[string]any{"text": "elicit url"})
	if isErr || !strings.Contains(text, "elicit url") {
		t.Fatalf("the held call after its approval: %q", text)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0].Mode != "url" || asked[0].ElicitationID == "" ||
		!strings.HasSuffix(asked[0].URL, "/console/approvals/"+asked[0].ElicitationID) {
		t.Fatalf("the elicitations asked: %+v", asked)
	}
	select {
	case id := <-completed:
		if id != asked[0].ElicitationID {
			t.Errorf("completed %q, want %q", id, asked[0].ElicitationID)
		}
	case <-time.After(5 * time.Second):
		t.Error("no notifications/elicitation/complete")
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want 1", n)
	}
}

// An in_band approval asks the client with form elicitation to let its
// person approve the held call in the client: yes runs it once, no denies
// it; either is recorded as decided by the requester, in-band.
func TestInBandApproval(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: testdataPath(t, "approvals"), PolicyOptions: "approval_wait 10s"})
	var (
		mu    sync.Mutex
		asked []*mcp.ElicitParams
	)
	opts := &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, req.Params)
			mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": !strings.Contains(req.Params.Message, "in-band no")}}, nil
		},
	}
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", opts)
	if text, isErr := toolError(t, cs, "gated_tool", map[string]any{"text": "in-band yes"}); isErr || !strings.Contains(text, "in-band yes") {
		t.Fatalf("the call approved in the client: %q", text)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want 1", n)
	}
	if text, isErr := toolError(t, cs, "gated_tool", map[string]any{"text": "in-band no"}); !isErr || !strings.Contains(text, "denied by "+alice+": denied in the client (in-band)") {
		t.Fatalf("the call denied in the client: %q", text)
	}
	if n := up.upstreamCalls("gated_tool"); n != 1 {
		t.Fatalf("the upstream saw %d calls, want still 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0].Mode != "form" || !strings.Contains(asked[0].Message, "gated_tool") ||
		!strings.Contains(asked[0].Message, `"text":"in-band yes"`) || !strings.Contains(asked[0].Message, "approve it yourself") {
		t.Fatalf("the elicitations asked: %+v", asked)
	}
	r := g.api(t, http.MethodGet, "/v1/approvals?role=requester", aliceKey, nil)
	if !strings.Contains(string(r.Body), "approved in the client (in-band)") {
		t.Errorf("the approvals: %s", r.Body)
	}
}

// An answer to toolgate's elicitation is taken only from the requester's
// own toolgate session, and a form answer only for an in_band approval:
// another person, or another session of the same person, cannot decide an
// approval by posting an answer that names it.
func TestElicitationAnswersBoundToTheSession(t *testing.T) {
	_, g := approvalsGateway(t, "")
	session := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	inBand := mustPend(t, m.call(1, "gated_tool", `{"text":"in-band pending"}`))
	plain := mustPend(t, m.call(2, "gated_tool", `{"text":"plain pending"}`))
	answer := func(id string) string {
		return `{"jsonrpc":"2.0","id":"toolgate-approval:form:` + id + `","result":{"action":"accept","content":{"approve":true}}}`
	}
	state := func(id string) string {
		var a struct{ State string }
		_ = json.Unmarshal(g.api(t, http.MethodGet, "/v1/approvals/"+id, aliceKey, nil).Body, &a)
		return a.State
	}

	other := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	other.initialize()
	bob := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bob.initialize()
	for name, runner := range map[string]*rawMCP{"another session of alice": other, "bob": bob} {
		if status, _, _ := runner.post(answer(inBand.ApprovalID)); status != http.StatusBadRequest {
			t.Errorf("%s answering alice's elicitation: HTTP %d, want 400", name, status)
		}
	}
	if status, _, _ := m.post(answer(plain.ApprovalID)); status != http.StatusBadRequest {
		t.Errorf("a form answer for an approval that is not in_band: HTTP %d, want 400", status)
	}
	if s1, s2 := state(inBand.ApprovalID), state(plain.ApprovalID); s1 != "pending" || s2 != "pending" {
		t.Fatalf("after the refused answers: %s, %s; want both pending", s1, s2)
	}
	// The requester's own session answering its in_band approval decides
	// it: in-band approval trusts the client (see the README).
	if status, _, _ := m.post(answer(inBand.ApprovalID)); status != http.StatusAccepted {
		t.Fatalf("the requester's session answering: HTTP %d, want 202", status)
	}
	if s := state(inBand.ApprovalID); s != "approved" {
		t.Fatalf("after the requester's answer: %s", s)
	}
}
