package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Mixes of revisions: a runner of the stateless revision (2026-07-28) in
// front of an upstream that initializes, whose server→client requests
// toolgate turns into input_required rounds; and a runner that initializes
// in front of an upstream of the stateless revision only (mix2026_test.go).

// interviewServer is a go-sdk server of the earlier revisions whose
// "interview" tool asks its client three things during the call —
// elicitation/create, sampling/createMessage, roots/list — with a progress
// notification in between, and whose "sample" tool only samples.
func interviewServer(cancelled chan<- string) func(*upstream) *mcp.Server {
	return func(*upstream) *mcp.Server {
		s := mcp.NewServer(&mcp.Implementation{Name: "interview-upstream", Version: "1.0.0"}, nil)
		readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
		mcp.AddTool(s, &mcp.Tool{Name: "interview", Description: "Asks the client three things.", Annotations: readOnly},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				el, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "your name?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}}})
				if err != nil {
					if cancelled != nil && ctx.Err() != nil {
						cancelled <- "interview"
					}
					return nil, nil, fmt.Errorf("elicitation: %w", err)
				}
				if token := req.Params.GetProgressToken(); token != nil {
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Total: 3})
				}
				sm, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
					Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "a color?"}}}})
				if err != nil {
					return nil, nil, fmt.Errorf("sampling: %w", err)
				}
				roots, err := req.Session.ListRoots(ctx, nil)
				if err != nil {
					return nil, nil, fmt.Errorf("roots: %w", err)
				}
				var uris []string
				for _, r := range roots.Roots {
					uris = append(uris, r.URI)
				}
				text := fmt.Sprintf("name=%v color=%s roots=%s", el.Content["name"], sm.Content.(*mcp.TextContent).Text, strings.Join(uris, ","))
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
			})
		mcp.AddTool(s, &mcp.Tool{Name: "sample", Description: "Samples the client's model.", Annotations: readOnly},
			func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
				sm, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
					Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "hi"}}}})
				if err != nil {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampling failed: " + err.Error()}}}, nil, nil
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampled " + sm.Content.(*mcp.TextContent).Text}}}, nil, nil
			})
		return s
	}
}

// A stateless runner (the go-sdk client at 2026-07-28, which fulfils input
// requests and retries by itself) in front of an upstream that initializes:
// each server→client request of the upstream's call reaches the runner as
// an input_required round, its answer reaches the upstream's held request,
// and the call completes; the progress notification in between reaches
// the runner too.
func TestMixStatelessRunnerServerRequests(t *testing.T) {
	up := startUpstreamServer(t, nil, interviewServer(nil))
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample"})
	var mu sync.Mutex
	var asked []string
	var progress int
	client := &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			asked = append(asked, "elicit:"+req.Params.Message)
			mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "ada"}}, nil
		},
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			mu.Lock()
			asked = append(asked, "sample")
			mu.Unlock()
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "teal"}}, nil
		},
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress++
			mu.Unlock()
		},
	}
	cs := g.connectStateless(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", client)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "interview", Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": "p"}})
	if err != nil {
		t.Fatalf("interview: %v", err)
	}
	if got := callText(t, res); !strings.HasPrefix(got, "name=ada color=teal roots=") {
		t.Fatalf("interview: %q", got)
	}
	// The client may run its notification handler after the call returned.
	for i := 0; ; i++ {
		mu.Lock()
		q, p := strings.Join(asked, " "), progress
		mu.Unlock()
		if q != "elicit:your name? sample" || p > 1 || (p == 0 && i > 200) {
			t.Fatalf("the runner was asked %q and got %d progress notifications", q, p)
		}
		if p == 1 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	// The upstream saw one tools/call, and an answer to each of its requests.
	calls, answers := 0, 0
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"tools/call"`) {
			calls++
		}
		if strings.Contains(r.Body, `"result"`) && !strings.Contains(r.Body, `"method"`) {
			answers++
		}
		if strings.Contains(r.Body, "requestState") || strings.Contains(r.Body, "inputResponses") {
			t.Fatalf("the stateless revision's retry reached the upstream: %s", r.Body)
		}
	}
	if calls != 1 || answers != 3 {
		t.Fatalf("the upstream saw %d calls and %d answers, want 1 and 3", calls, answers)
	}
}

func mixCall(id int, tool, caps, extra string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{},`+
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":%s}%s}}`, id, tool, caps, extra)
}

func retryWith(state string, responses map[string]any) string {
	s, _ := json.Marshal(state)
	r, _ := json.Marshal(responses)
	return `,"inputResponses":` + string(r) + `,"requestState":` + string(s)
}

// The rounds by hand: input requests the runner did not declare are never
// sent (400, -32021 with requiredCapabilities, and the upstream's request
// refused); a held call's requestState continues it once, for its caller
// only; tampered and replayed states are refused.
func TestMixStatelessRunnerRounds(t *testing.T) {
	up := startUpstreamServer(t, nil, interviewServer(nil))
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample"})
	session := g.createSession(t, aliceKey, "svc")
	all := `{"elicitation":{"form":{}},"sampling":{},"roots":{}}`

	status, msg := statelessPost(t, g, aliceKey, session, mixCall(1, "sample", `{"elicitation":{}}`, ""), nil)
	data, _ := msg["error"].(map[string]any)["data"].(map[string]any)
	if status != 400 || errorCode(msg) != -32021 || fmt.Sprint(data["requiredCapabilities"]) != "map[sampling:map[]]" {
		t.Fatalf("sample without the sampling capability: %d %v", status, msg)
	}

	status, msg = statelessPost(t, g, aliceKey, session, mixCall(2, "interview", all, ""), nil)
	res, _ := msg["result"].(map[string]any)
	state, _ := res["requestState"].(string)
	inputs, _ := res["inputRequests"].(map[string]any)
	if status != 200 || res["resultType"] != "input_required" || state == "" || len(inputs) != 1 {
		t.Fatalf("interview: %d %v, want input_required with one input request", status, msg)
	}
	var key string
	for k, v := range inputs {
		key = k
		if m := v.(map[string]any)["method"]; m != "elicitation/create" {
			t.Fatalf("the first input request is %v", m)
		}
	}
	answer := map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"name": "bo"}}}
	tampered := []byte(state)
	tampered[len(tampered)-2] ^= 1
	bob := g.createSession(t, bobKey, "svc")
	for _, r := range []struct{ name, key, session, state string }{
		{"tampered", aliceKey, session, string(tampered)},
		{"another caller's", bobKey, bob, state},
	} {
		if status, msg := statelessPost(t, g, r.key, r.session, mixCall(3, "interview", all, retryWith(r.state, answer)), nil); status != 400 || errorCode(msg) != -32602 {
			t.Errorf("%s requestState: %d %v, want 400 -32602", r.name, status, msg)
		}
	}
	status, msg = statelessPost(t, g, aliceKey, session, mixCall(4, "interview", all, retryWith(state, answer)), nil)
	res, _ = msg["result"].(map[string]any)
	next, _ := res["requestState"].(string)
	if status != 200 || res["resultType"] != "input_required" || next == "" || next == state {
		t.Fatalf("the retry: %d %v, want the next round", status, msg)
	}
	if id, _ := msg["id"].(float64); id != 4 {
		t.Fatalf("the next round answers id %v, want the retry's 4", msg["id"])
	}
	if status, msg := statelessPost(t, g, aliceKey, session, mixCall(5, "interview", all, retryWith(state, answer)), nil); status != 400 || errorCode(msg) != -32602 {
		t.Fatalf("the replayed requestState: %d %v, want 400 -32602", status, msg)
	}
	// Sampling, then roots, then the result, renumbered to the last retry.
	for i, a := range []map[string]any{
		{"role": "assistant", "model": "m", "content": map[string]any{"type": "text", "text": "red"}},
		{"roots": []any{map[string]any{"uri": "file:///work"}}},
	} {
		var key string
		for k := range res["inputRequests"].(map[string]any) {
			key = k
		}
		status, msg = statelessPost(t, g, aliceKey, session, mixCall(10+i, "interview", all, retryWith(next, map[string]any{key: a})), nil)
		res, _ = msg["result"].(map[string]any)
		next, _ = res["requestState"].(string)
		if status != 200 || res == nil {
			t.Fatalf("round %d: %d %v", i, status, msg)
		}
	}
	if id, _ := msg["id"].(float64); id != 11 || res["resultType"] != "complete" || !strings.Contains(fmt.Sprint(res["content"]), "name=bo color=red roots=file:///work") {
		t.Fatalf("the last round: %v", msg)
	}
}

// A held call the runner does not continue expires with the call's
// deadline (the service timeout): the upstream is told to stop, and the
// requestState is refused afterwards.
func TestMixStatelessRunnerHeldCallExpires(t *testing.T) {
	cancelled := make(chan string, 1)
	up := startUpstreamServer(t, nil, interviewServer(cancelled))
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample", Timeout: "2s"})
	session := g.createSession(t, aliceKey, "svc")
	all := `{"elicitation":{},"sampling":{},"roots":{}}`
	_, msg := statelessPost(t, g, aliceKey, session, mixCall(1, "interview", all, ""), nil)
	res, _ := msg["result"].(map[string]any)
	state, _ := res["requestState"].(string)
	if state == "" {
		t.Fatalf("interview: %v", msg)
	}
	select {
	case <-cancelled:
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream's call was not cancelled when the held call expired")
	}
	var key string
	for k := range res["inputRequests"].(map[string]any) {
		key = k
	}
	status, msg := statelessPost(t, g, aliceKey, session, mixCall(2, "interview", all, retryWith(state, map[string]any{key: map[string]any{"action": "decline"}})), nil)
	if status != 400 || errorCode(msg) != -32602 {
		t.Fatalf("the expired requestState: %d %v, want 400 -32602", status, msg)
	}
}
