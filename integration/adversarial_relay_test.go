package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The protocol relay for everything that is not a plain tools/call:
// prompts, completions, resources, progress, resumption, answers to
// server requests. Tests whose comment starts with "Attack" describe what
// an attack would get through without the defence the test checks (each
// failed before its fix); the TestRelayAttackHolds… tests are attacks the
// general design resists.

// relayRequestPolicy pins a prompt's argument, denies one resource, and
// denies an elicitation answer that carries a password — each rule one a
// security team would write from policies/README.md.
const relayRequestPolicy = `package toolgate.request

default decision := {"action": "allow"}

# Pin the project of the "greet" prompt: "What the policy returns is
# exactly what the upstream gets."
decision := {"action": "allow", "arguments": {"project": "sandbox"}} if {
	input.method == "prompts/get"
}

decision := {"action": "deny", "reason": "test://secret is off limits"} if {
	input.method == "resources/read"
	input.params.uri == "test://secret"
}

# A runner must not hand a password to an upstream's elicitation.
decision := {"action": "deny", "reason": "no passwords to upstreams"} if {
	input.method == "elicitation/create"
	contains(json.marshal(input), "hunter2")
}
`

const relayResultPolicy = `package toolgate.result

default decision := {"action": "allow"}
`

func relayPolicies(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte(relayRequestPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "result.rego"), []byte(relayResultPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newRelayServer is the test upstream plus a prompt that echoes its
// argument, a tool that reports progress on a token the runner never
// issued, and a tool that elicits a password.
func newRelayServer(u *upstream) *mcp.Server {
	s := newTestServer(u)
	s.AddPrompt(&mcp.Prompt{Name: "greet", Arguments: []*mcp.PromptArgument{{Name: "project"}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{
				{Role: "user", Content: &mcp.TextContent{Text: "project=" + req.Params.Arguments["project"]}},
			}}, nil
		})
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: "forge_progress", Description: "Reports progress on a token never issued.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: "never-issued", Progress: 1, Message: "FORGED-PROGRESS"})
			if token := req.Params.GetProgressToken(); token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Message: "own progress"})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "forge_standalone_progress", Description: "Reports progress on the standalone stream: on a token never issued, then on its own.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			// Sent outside the request's context, they go on the
			// standalone stream, while the call is still in progress.
			unrelated := context.WithoutCancel(context.Background())
			_ = req.Session.NotifyProgress(unrelated, &mcp.ProgressNotificationParams{ProgressToken: "never-issued", Progress: 1, Message: "FORGED-STANDALONE"})
			if token := req.Params.GetProgressToken(); token != nil {
				_ = req.Session.NotifyProgress(unrelated, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Message: "own standalone progress"})
			}
			// The call stays in progress until the runner got its progress
			// (progress about a call no longer in progress is dropped).
			if seen, _ := standaloneProgressSeen.Load().(chan struct{}); seen != nil {
				select {
				case <-seen:
				case <-ctx.Done():
				case <-time.After(20 * time.Second):
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ask_password", Description: "Asks the user for a password.", Annotations: readOnly},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: "password?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"pw": map[string]any{"type": "string"}}}})
			if err != nil {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "refused: " + err.Error()}}}, nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("upstream got: %v %v", res.Action, res.Content)}}}, nil, nil
		})
	return s
}

// standaloneProgressSeen, when set, is closed by the test once its runner
// got forge_standalone_progress's own progress.
var standaloneProgressSeen atomic.Value

func relayGateway(t *testing.T) (*upstream, *gateway) {
	t.Helper()
	up := startUpstreamServer(t, nil, newRelayServer)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: relayPolicies(t),
		Tools: "echo progress forge_progress forge_standalone_progress ask_password"})
	return up, g
}

// Attack: a policy's arguments rewrite on prompts/get — the input has the
// prompt's params.arguments, and the contract says the returned arguments
// are exactly what goes upstream — was dropped without a word, and the
// runner's own arguments reached the upstream. toolgate rewrites the
// arguments of tools/call only: such a decision is malformed, and denies.
func TestRelayAttackPromptArgumentRewriteIsIgnored(t *testing.T) {
	up, g := relayGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"greet","arguments":{"project":"prod"}}}`)
	t.Logf("prompts/get: %d %s", status, msgs)
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"prompts/get"`) && strings.Contains(r.Body, `"prod"`) {
			t.Errorf("the upstream got the runner's arguments, not the policy's pinned ones: %s", r.Body)
		}
	}
	for _, msg := range msgs {
		if strings.Contains(string(msg), "project=prod") {
			t.Errorf("the runner got a prompt rendered with its own arguments despite the policy's pin: %s", msg)
		}
	}
	if len(msgs) != 1 || !strings.Contains(string(msgs[0]), "toolgate rewrites only those of tools/call") {
		t.Errorf("prompts/get with a rewrite toolgate cannot make: %s, want denied saying so", msgs)
	}
}

// Attack: the runner's answer to a server→client request was decided with
// input.method only: nothing of the answer was in the input, so a rule
// against what the runner hands an upstream (a password typed into an
// elicitation form) could never fire. The answer is input.result.
func TestRelayAttackElicitationAnswerIsJudgedBlind(t *testing.T) {
	_, g := relayGateway(t)
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"pw": "hunter2"}}, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask_password", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if strings.Contains(text, "hunter2") {
		t.Errorf("the runner's password reached the upstream past a policy that denies it: %q", text)
	}
}

// Attack: a progress notification, on a request's stream, for a token no
// request of this session carried was relayed to the runner (the
// federated endpoint dropped them already).
func TestRelayAttackProgressForTokenNeverIssued(t *testing.T) {
	_, g := relayGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	status, _, msgs := m.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"forge_progress","arguments":{},"_meta":{"progressToken":"mine"}}}`)
	if status != http.StatusOK || len(msgs) == 0 {
		t.Fatalf("forge_progress: %d %s", status, msgs)
	}
	own := false
	for _, msg := range msgs {
		if strings.Contains(string(msg), "FORGED-PROGRESS") {
			t.Errorf("progress on a token the runner never issued reached it: %s", msg)
		}
		own = own || strings.Contains(string(msg), "own progress")
	}
	if !own {
		t.Errorf("the runner's own progress did not arrive: %s", msgs)
	}
}

// Attack: on the standalone stream, progress for a token no request of
// the session carried reached the runner (it was dropped on requests'
// streams only). Progress on the token of a request in progress passes.
func TestRelayAttackStandaloneProgressForTokenNeverIssued(t *testing.T) {
	_, g := relayGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, answer := m.openStream(t, ctx)
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("the standalone stream: %d %s", stream.StatusCode, answer)
	}
	defer stream.Body.Close()
	seen := make(chan struct{})
	standaloneProgressSeen.Store(seen)
	defer standaloneProgressSeen.Store((chan struct{})(nil))
	called := make(chan string, 1)
	go func() {
		status, _, msgs := m.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"forge_standalone_progress","arguments":{},"_meta":{"progressToken":"mine"}}}`)
		called <- fmt.Sprintf("%d %s", status, msgs)
	}()
	lines := bufio.NewScanner(stream.Body)
	own := false
	for !own && lines.Scan() { // until the runner's own progress, which came after the forged one
		line := lines.Text()
		if strings.Contains(line, "FORGED-STANDALONE") {
			t.Errorf("progress on a token the runner never issued reached its standalone stream: %s", line)
		}
		own = strings.Contains(line, "own standalone progress")
	}
	close(seen)
	if answer := <-called; !strings.HasPrefix(answer, "200 ") {
		t.Errorf("forge_standalone_progress: %s", answer)
	}
	if !own {
		t.Fatalf("the progress of the runner's call in progress did not arrive on the standalone stream: %v", lines.Err())
	}
}

// Escaped and variant spellings of a denied resource URI: the policy sees
// the decoded string, and the upstream never resolves a variant to the
// denied resource.
func TestRelayAttackHoldsEscapedAndVariantResourceURIs(t *testing.T) {
	_, g := relayGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	for i, uri := range []string{`test://\u0073ecret`, `test:\/\/secret`, `TEST://secret`, `test://SECRET`, `test://%73ecret`,
		`test://secret#x`, `test://secret?`, `test://./secret`, `test://watched/../secret`, `test://secret/`, `test://secret\u0000`} {
		status, _, msgs := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"resources/read","params":{"uri":"%s"}}`, 100+i, uri))
		for _, msg := range msgs {
			if strings.Contains(string(msg), "the test policy hides this") {
				t.Errorf("resources/read %s: %d, the denied resource reached the runner: %s", uri, status, msg)
			}
		}
		// subscribe, then read through templates: nothing of it either.
		_, _, msgs = m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"resources/subscribe","params":{"uri":"%s"}}`, 200+i, uri))
		for _, msg := range msgs {
			if strings.Contains(string(msg), "the test policy hides this") {
				t.Errorf("resources/subscribe %s: %s", uri, msg)
			}
		}
	}
}

// A runner's answer to a server request it never received is refused and
// never reaches the upstream, whatever the id's spelling; a cancellation
// of a request it never sent goes nowhere harmful.
func TestRelayAttackHoldsAnswerToNothing(t *testing.T) {
	up, g := relayGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	for _, id := range []string{`"forged-1"`, `0`, `1`, `"toolgate-x"`, `"\u0074oolgate-x"`} {
		status, _, msgs := m.post(`{"jsonrpc":"2.0","id":` + id + `,"result":{"action":"accept","content":{"marker":"FORGED-ANSWER"}}}`)
		if status == http.StatusAccepted || status == http.StatusOK {
			t.Errorf("an answer %s to nothing pending: %d %s", id, status, msgs)
		}
	}
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, "FORGED-ANSWER") {
			t.Errorf("a forged answer reached the upstream: %s", r.Body)
		}
	}
}

// Last-Event-ID resumes only the session's own streams: alice's other MCP
// session and bob's cannot take over alice's dropped stream with its real
// event id, and alice's own session still can.
func TestRelayAttackHoldsForeignLastEventID(t *testing.T) {
	_, g := relayGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	other := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	other.initialize()
	bobs := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bobs.initialize()

	lastID := droppedAfterProgress(t, m)
	for name, r := range map[string]*rawMCP{"alice's other session": other, "bob's session": bobs} {
		resp, err := r.send(context.Background(), http.MethodGet, "text/event-stream", "", lastID)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "done") || strings.Contains(string(body), "step") {
			t.Errorf("%s resumed alice's stream %q: %d %s", name, lastID, resp.StatusCode, body)
		}
	}
	// Bob with alice's MCP session id: refused before anything.
	stolen := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	stolen.sessionID = m.sessionID
	resp, err := stolen.send(context.Background(), http.MethodGet, "text/event-stream", "", lastID)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || strings.Contains(string(body), "step") {
		t.Errorf("bob resumed with alice's MCP session id: %d %s", resp.StatusCode, body)
	}
	// The owner still can.
	resumed, err := m.send(context.Background(), http.MethodGet, "text/event-stream", "", lastID)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resumed.Body)
	resumed.Body.Close()
	if resumed.StatusCode != http.StatusOK || !strings.Contains(string(body), `"text":"done"`) {
		t.Errorf("alice could not resume her own stream: %d %s", resumed.StatusCode, body)
	}
}
