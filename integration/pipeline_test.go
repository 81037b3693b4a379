package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func callText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) == 0 {
		t.Fatalf("empty result: %+v", res)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T, not text", res.Content[0])
	}
	return tc.Text
}

func TestListAndCallThroughThePipeline(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	sess := g.createSession(t, aliceKey, "svc")
	cs := g.connect(t, aliceKey, sess, "svc", nil)
	ctx := context.Background()

	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	// not_allowlisted exists upstream but is off the allowlist;
	// forbidden_tool is allowlisted but the policy denies it, so it is
	// hidden too.
	want := []string{"add_tool", "ask", "big", "drop_table", "echo", "gated_tool", "leak", "pinned_echo", "poll", "progress", "reconnect", "redacted", "set_visibility", "touch_resource", "unknown_field", "wait"}
	if !slices.Equal(names, want) {
		t.Errorf("tools/list = %v, want %v", names, want)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hello"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || callText(t, res) != `{"text":"hello"}` {
		t.Errorf("echo = %+v", res)
	}
}

func TestToolOffTheAllowlistIsUnknown(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "not_allowlisted", Arguments: map[string]any{}})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeInvalidParams || !strings.Contains(rpcErr.Message, "Unknown tool") {
		t.Fatalf("calling a tool off the allowlist: err = %v, want JSON-RPC -32602 unknown tool", err)
	}
}

func TestPolicyDenyIsAToolError(t *testing.T) {
	_, _, m := aliceSession(t, gatewayConfig{})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"forbidden_tool","arguments":{}}}`)
	if len(msgs) != 1 {
		t.Fatalf("want one message, got %s", msgs)
	}
	var resp struct {
		ID     int
		Result struct {
			IsError bool
			Content []struct{ Type, Text string }
			Meta    map[string]struct{ ID, Action string } `json:"_meta"`
		}
	}
	if err := json.Unmarshal(msgs[0], &resp); err != nil {
		t.Fatal(err)
	}
	d := resp.Result.Meta["toolgate/decision"]
	if resp.ID != 7 || !resp.Result.IsError || len(resp.Result.Content) != 1 ||
		resp.Result.Content[0].Text != "forbidden_tool is forbidden in tests" || d.Action != "deny" || len(d.ID) < 20 {
		t.Fatalf("deny answer = %s", msgs[0])
	}
}

func TestPolicyAskNeedsApproval(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "gated_tool", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "approval required") {
		t.Fatalf("calling a gated tool: err = %v, want approval required", err)
	}
}

func TestPolicyRewritesArguments(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "pinned_echo",
		Arguments: map[string]any{"text": "hi", "project": "production"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, res); got != `{"text":"hi","project":"sandbox"}` {
		t.Fatalf("the upstream received %s, want the project pinned to sandbox", got)
	}
}

func TestResultPolicyRedacts(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "redacted", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, res); got != "the password is [REDACTED]" {
		t.Fatalf("result = %q, want the secret redacted", got)
	}
}

func TestMissingTokenIs401WithResourceMetadata(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := g.raw(t, "", "", "svc")
	delete(m.headers, "Authorization")
	status, hdr, _ := m.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	if status != http.StatusUnauthorized {
		t.Fatalf("status = %d, want 401", status)
	}
	// The endpoint's own metadata (RFC 9728 section 3.3: its resource is
	// the endpoint's URL exactly), and the gateway's.
	want := `Bearer resource_metadata="` + g.URL + `/.well-known/oauth-protected-resource/v1/mcp/svc"`
	if got := hdr.Get("WWW-Authenticate"); got != want {
		t.Errorf("WWW-Authenticate = %q, want %q", got, want)
	}
	meta := g.api(t, http.MethodGet, "/.well-known/oauth-protected-resource/v1/mcp/svc", "", nil)
	if meta.StatusCode != http.StatusOK || !strings.Contains(string(meta.Body), `"resource":"`+g.URL+`/v1/mcp/svc"`) {
		t.Errorf("resource metadata: %d %s", meta.StatusCode, meta.Body)
	}
	meta = g.api(t, http.MethodGet, "/.well-known/oauth-protected-resource", "", nil)
	if meta.StatusCode != http.StatusOK || !strings.Contains(string(meta.Body), `"resource":"`+g.URL+`"`) {
		t.Errorf("the gateway's resource metadata: %d %s", meta.StatusCode, meta.Body)
	}
	m.headers["Authorization"] = "Bearer wrong-key"
	if status, hdr, _ := m.post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`); status != http.StatusUnauthorized ||
		!strings.Contains(hdr.Get("WWW-Authenticate"), `error="invalid_token"`) {
		t.Errorf("wrong key: %d %q", status, hdr.Get("WWW-Authenticate"))
	}
}

func TestAnotherUsersSessionIs403(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	aliceSess := g.createSession(t, aliceKey, "svc")
	alice := g.raw(t, aliceKey, aliceSess, "svc")
	alice.initialize()
	bobSess := g.createSession(t, bobKey, "svc")
	before := snapshot(t, up, g)

	// Bob with alice's toolgate session.
	bobRaw := g.raw(t, bobKey, aliceSess, "svc")
	if status, _, msgs := bobRaw.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bob","version":"1"}}}`); status != http.StatusForbidden {
		t.Errorf("bob using alice's toolgate session: %d %s, want 403", status, msgs)
	}
	// Bob with his own toolgate session but alice's MCP session.
	bobRaw = g.raw(t, bobKey, bobSess, "svc")
	bobRaw.sessionID = alice.sessionID
	if status, _, msgs := bobRaw.post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`); status != http.StatusForbidden {
		t.Errorf("bob using alice's MCP session: %d %s, want 403", status, msgs)
	}
	// And through the API.
	if r := g.api(t, http.MethodGet, "/v1/sessions/"+aliceSess, bobKey, nil); r.StatusCode != http.StatusForbidden {
		t.Errorf("bob reading alice's session: %d", r.StatusCode)
	}
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+aliceSess, bobKey, nil); r.StatusCode != http.StatusForbidden {
		t.Errorf("bob deleting alice's session: %d", r.StatusCode)
	}
	// Nothing reached the upstream or changed in storage.
	before.check(t)
	if status, _, _ := alice.post(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); status != http.StatusOK {
		t.Errorf("alice's own session after bob's attempts: %d", status)
	}
}

func TestUpstreamRestartIsReinitializedTransparently(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	ctx := context.Background()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "before"}}); err != nil {
		t.Fatal(err)
	}
	up.reset() // the upstream forgets every session: it answers 404 now
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "after"}})
	if err != nil {
		t.Fatalf("call after the upstream restarted: %v", err)
	}
	if callText(t, res) != `{"text":"after"}` {
		t.Fatalf("result = %+v", res)
	}
	var inits int
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"method":"initialize"`) {
			inits++
		}
	}
	if inits != 2 {
		t.Errorf("the upstream saw %d initialize requests, want 2 (the first and one re-initialize)", inits)
	}
}

func TestProgressArrivesBeforeTheResult(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	var mu sync.Mutex
	var progress []float64
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params.Progress)
			mu.Unlock()
		},
	})
	params := &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 3}}
	params.SetProgressToken("p-1")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(progress)
	mu.Unlock()
	if callText(t, res) != "done" || !slices.Equal(got, []float64{1, 2, 3}) {
		t.Fatalf("progress before the result = %v, result %+v; want [1 2 3] then done", got, res)
	}
}

func TestRunnerCredentialsNeverReachTheUpstream(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	sess := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, sess, "svc")
	m.headers["Cookie"] = "runner-cookie=secret"
	m.initialize()
	m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	cs := g.connect(t, aliceKey, sess, "svc", nil)
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}

	hs := up.headers()
	if len(hs) < 4 {
		t.Fatalf("the upstream saw only %d requests", len(hs))
	}
	if v := headerValues(hs, "Authorization"); len(v) > 0 {
		t.Errorf("Authorization reached the upstream: %q", v)
	}
	if v := headerValues(hs, "Cookie"); len(v) > 0 {
		t.Errorf("Cookie reached the upstream: %q", v)
	}
	if v := headerValues(hs, "X-Toolgate-Session"); len(v) > 0 {
		t.Errorf("the toolgate session header reached the upstream: %q", v)
	}
	if containsAny(headerValues(hs, "Mcp-Session-Id"), m.sessionID, sess) {
		t.Errorf("a gateway session id reached the upstream")
	}
	for _, h := range hs {
		for name, values := range h {
			if containsAny(values, aliceKey, sess, m.sessionID) {
				t.Errorf("header %s carried a runner secret to the upstream", name)
			}
		}
	}
}

func TestUnknownResultFieldsPassUnchanged(t *testing.T) {
	_, _, m := aliceSession(t, gatewayConfig{})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"unknown_field","arguments":{}}}`)
	if len(msgs) != 1 || !strings.Contains(string(msgs[len(msgs)-1]), `"x_future_field":{"kept":[1,2,3]}`) {
		t.Fatalf("result = %s, want x_future_field kept", msgs)
	}
}

func TestSessionSelectsServices(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Services: `service other {
			url ` + up.URL + `
			allow_http
			tools echo
		}`})
	sess := g.createSession(t, aliceKey, "svc")
	m := g.raw(t, aliceKey, sess, "other")
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`); status != http.StatusNotFound {
		t.Errorf("a service the session did not select: %d, want 404", status)
	}
	if r := g.api(t, http.MethodPost, "/v1/sessions", aliceKey, []byte(`{"services":["nope"]}`)); r.StatusCode != http.StatusNotFound {
		t.Errorf("a session for an unknown service: %d %s", r.StatusCode, r.Body)
	}
}

func TestBatchesAndDuplicateKeysAreRejected(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{})
	before := len(up.headers())
	for _, body := range []string{
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"forbidden_tool","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","Name":"forbidden_tool","arguments":{}}}`,
	} {
		if status, _, msgs := m.post(body); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, status, msgs)
		}
	}
	if after := len(up.headers()); after != before {
		t.Errorf("rejected messages reached the upstream (%d requests)", after-before)
	}
}

// An upstream message with duplicate keys reads differently to different
// parsers (gjson keeps the first, encoding/json the last); the gateway
// withholds it (a retryable error, as for any malformed upstream message)
// rather than let a policy inspect one reading while the runner uses
// another.
func TestAmbiguousUpstreamResultIsWithheld(t *testing.T) {
	_, _, m := aliceSession(t, gatewayConfig{})
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + duplicateKeyMarker + `"}}}`)
	if len(msgs) == 0 {
		t.Fatal("no answer")
	}
	last := string(msgs[len(msgs)-1])
	if !strings.Contains(last, `"error"`) || !strings.Contains(last, "malformed") || !strings.Contains(last, "duplicate key") ||
		strings.Contains(last, "SECRET") {
		t.Fatalf("answer = %s, want the result withheld as malformed", last)
	}
}

// A call that outlasts the service's timeout is answered with a retryable
// error, not replayed, and the upstream is told to stop.
func TestServiceTimeoutIsRetryable(t *testing.T) {
	up, _, m := aliceSession(t, gatewayConfig{Timeout: "300ms"})
	before := len(up.headers())
	start := time.Now()
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"progress","arguments":{"steps":100}}}`)
	if len(msgs) == 0 {
		t.Fatal("no answer")
	}
	var answer struct {
		Error struct {
			Code int
			Data struct{ Retryable bool }
		}
	}
	if err := json.Unmarshal(msgs[len(msgs)-1], &answer); err != nil || answer.Error.Code != -32011 || !answer.Error.Data.Retryable {
		t.Fatalf("answer = %s, want -32011 with retryable", msgs[len(msgs)-1])
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("the answer took %s", elapsed)
	}
	// The call went upstream once; the cancellation follows it.
	deadline := time.Now().Add(5 * time.Second)
	for len(up.headers())-before < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(up.headers()) - before; n != 2 {
		t.Errorf("the upstream saw %d requests after the call, want the call and its notifications/cancelled", n)
	}
}
