package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

// Runners of the stateless revision (2026-07-28) through toolgate, with the
// MCP Go SDK as runner and as upstream: an upstream of the same revision
// (the SDK's stateless server, which speaks every revision), and one that
// initializes (the SDK's stateful server, which speaks only the earlier
// revisions).

// statelessUpstream is a go-sdk server in stateless mode with a recorder of
// what reaches it.
type statelessUpstream struct {
	URL string

	mu       sync.Mutex
	requests []upstreamRequest
}

// confirmState is the requestState the upstream's confirm tool issues; a
// retry must bring it back byte for byte (the escaped slash and the
// non-ASCII character included).
const confirmState = `state/1 ✓ "opaque"`

func startStatelessUpstream(t testing.TB) *statelessUpstream {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "stateless-upstream", Version: "1.0.0"}, nil)
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	echo := func(_ context.Context, _ *mcp.CallToolRequest, args map[string]any) (*mcp.CallToolResult, any, error) {
		b, _ := json.Marshal(args)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo " + string(b)}}}, nil, nil
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the arguments.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "forbidden_tool", Description: "Denied by the test policy.", Annotations: readOnly}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "gated_tool", Description: "Needs approval by the test policy."}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "confirm", Description: "Asks the user first (a multi round-trip request).", Annotations: readOnly},
		func(_ context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
			answer, ok := req.Params.InputResponses["confirm"].(*mcp.ElicitResult)
			if !ok {
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "deploy?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}}},
					RequestState: confirmState}, nil, nil
			}
			text := "confirmed: " + answer.Action
			if req.Params.RequestState != confirmState {
				text = fmt.Sprintf("requestState changed on the way: %q", req.Params.RequestState)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	return serveStateless(t, s)
}

// serveStateless serves s in the go-sdk's stateless mode, recording every
// request it gets.
func serveStateless(t testing.TB, s *mcp.Server) *statelessUpstream {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	u := &statelessUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		u.mu.Lock()
		u.requests = append(u.requests, upstreamRequest{Method: r.Method, Header: r.Header.Clone(), Body: string(body)})
		u.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL + "/mcp"
	return u
}

// seen returns the requests whose body contains s.
func (u *statelessUpstream) seen(s string) []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []upstreamRequest
	for _, r := range u.requests {
		if strings.Contains(r.Body, s) {
			out = append(out, r)
		}
	}
	return out
}

// connectStateless connects the SDK's client through the gateway at its
// default, the stateless revision (it probes server/discover).
func (g *gateway) connectStateless(t testing.TB, key, session, service string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-runner", Version: "1.0.0"}, opts)
	transport := &mcp.StreamableClientTransport{
		Endpoint: g.URL + "/v1/mcp/" + service,
		HTTPClient: &http.Client{Transport: headerTransport{base: http.DefaultTransport, headers: map[string]string{
			"Authorization": "Bearer " + key, "X-Toolgate-Session": session,
		}}},
		MaxRetries: -1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connecting through the gateway: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("the client settled on protocol %s, want 2026-07-28", v)
	}
	return cs
}

func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("tools/call %s: %v", name, err)
	}
	return callText(t, res)
}

func TestStatelessRunnerStatelessUpstream(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm gated_tool forbidden_tool"})
	var asked []string
	cs := g.connectStateless(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked = append(asked, req.Params.Message)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		}})

	ctx := context.Background()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, " "); !strings.Contains(got, "echo") || !strings.Contains(got, "confirm") {
		t.Fatalf("tools/list through the gateway: %s", got)
	}
	if got := callTool(t, cs, "echo", map[string]any{"x": 1}); got != `echo {"x":1}` {
		t.Fatalf("echo: %q", got)
	}
	// The upstream asks (input_required), the runner answers, the upstream
	// completes: the requestState came back byte for byte.
	if got := callTool(t, cs, "confirm", map[string]any{}); got != "confirmed: accept" {
		t.Fatalf("confirm: %q", got)
	}
	if len(asked) != 1 || asked[0] != "deploy?" {
		t.Fatalf("the runner was asked %q, want the upstream's one question", asked)
	}
	// A denied call is a tool error the agent reads.
	ctxT, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctxT, &mcp.CallToolParams{Name: "forbidden_tool", Arguments: map[string]any{}})
	if err != nil || !res.IsError {
		t.Fatalf("forbidden_tool: %v %+v", err, res)
	}
	for _, r := range up.seen(`"tools/call"`) {
		if r.Header.Get("Mcp-Session-Id") != "" || r.Header.Get("Authorization") != "" {
			t.Errorf("upstream request carried the runner's session or credential: %v", r.Header)
		}
		if r.Header.Get("Mcp-Method") != "tools/call" || r.Header.Get("Mcp-Protocol-Version") != "2026-07-28" || r.Header.Get("Mcp-Name") == "" {
			t.Errorf("upstream tools/call without the revision's headers: %v", r.Header)
		}
		if strings.Contains(r.Body, "forbidden_tool") {
			t.Errorf("a denied call reached the upstream: %s", r.Body)
		}
	}
}

// statelessPost sends one stateless request by hand, with the headers a
// conforming client sends unless hdr overrides them ("" removes one).
func statelessPost(t testing.TB, g *gateway, key, session, body string, hdr map[string]string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/mcp/svc", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Toolgate-Session", session)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	_ = json.Unmarshal([]byte(body), &msg)
	req.Header.Set("Mcp-Method", msg.Method)
	if msg.Params.Name != "" {
		req.Header.Set("Mcp-Name", msg.Params.Name)
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data := answerBody(resp)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("answer %d is not JSON: %s", resp.StatusCode, data)
	}
	return resp.StatusCode, out
}

const statelessMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`

func errorCode(msg map[string]any) float64 {
	e, _ := msg["error"].(map[string]any)
	c, _ := e["code"].(float64)
	return c
}

// Mcp-Method, Mcp-Name and the protocol version are checked against the
// body before any policy sees the request: a body naming a denied tool
// under the Mcp-Name of an allowed one, and the reverse, are refused with
// 400 and -32020, and nothing reaches the upstream.
func TestStatelessHeaderChecks(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm gated_tool forbidden_tool"})
	session := g.createSession(t, aliceKey, "svc")
	call := func(name string) string {
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + name + `","arguments":{},` + statelessMeta + `}}`
	}
	cases := []struct {
		name   string
		body   string
		hdr    map[string]string
		status int
		code   float64
	}{
		{"denied tool under an allowed name", call("forbidden_tool"), map[string]string{"Mcp-Name": "echo"}, 400, -32020},
		{"allowed tool under a denied name", call("echo"), map[string]string{"Mcp-Name": "forbidden_tool"}, 400, -32020},
		{"no Mcp-Name", call("echo"), map[string]string{"Mcp-Name": ""}, 400, -32020},
		{"Mcp-Method of another method", call("echo"), map[string]string{"Mcp-Method": "tools/list"}, 400, -32020},
		{"Base64 Mcp-Name of another tool", call("forbidden_tool"), map[string]string{"Mcp-Name": "=?base64?ZWNobw==?="}, 400, -32020},
		{"no protocol version header", call("echo"), map[string]string{"Mcp-Protocol-Version": ""}, 400, -32020},
		{"no _meta", `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}`, nil, 400, -32602},
		{"no clientCapabilities", `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, nil, 400, -32602},
		{"unknown version", strings.ReplaceAll(call("echo"), "2026-07-28", "2099-01-01"), map[string]string{"Mcp-Protocol-Version": "2099-01-01"}, 400, -32022},
	}
	for _, c := range cases {
		status, msg := statelessPost(t, g, aliceKey, session, c.body, c.hdr)
		if status != c.status || errorCode(msg) != c.code {
			t.Errorf("%s: got %d %v, want %d with %v", c.name, status, msg, c.status, c.code)
		}
		if id, _ := msg["id"].(float64); id != 7 {
			t.Errorf("%s: the error does not carry the request's id: %v", c.name, msg)
		}
	}
	if calls := up.seen(`"tools/call"`); len(calls) != 0 {
		t.Fatalf("refused requests reached the upstream: %v", calls)
	}
	// The unknown version's error lists what toolgate speaks.
	_, msg := statelessPost(t, g, aliceKey, session, strings.ReplaceAll(call("echo"), "2026-07-28", "2099-01-01"),
		map[string]string{"Mcp-Protocol-Version": "2099-01-01"})
	data, _ := msg["error"].(map[string]any)["data"].(map[string]any)
	if sup, _ := data["supported"].([]any); len(sup) == 0 || sup[0] != "2026-07-28" || data["requested"] != "2099-01-01" {
		t.Errorf("UnsupportedProtocolVersion data: %v", data)
	}
	// With matching headers the same call goes through, and the policy
	// still judges it: the denied tool is a tool error, never run.
	status, msg := statelessPost(t, g, aliceKey, session, call("forbidden_tool"), nil)
	if res, _ := msg["result"].(map[string]any); status != 200 || res["isError"] != true {
		t.Fatalf("forbidden_tool with matching headers: %d %v", status, msg)
	}
	if status, msg := statelessPost(t, g, aliceKey, session, call("echo"), nil); status != 200 || msg["result"] == nil {
		t.Fatalf("echo: %d %v", status, msg)
	}
	// The revision has no GET stream.
	req, _ := http.NewRequest(http.MethodGet, g.URL+"/v1/mcp/svc", nil)
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	req.Header.Set("X-Toolgate-Session", session)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET of a stateless runner: %d, want 405", resp.StatusCode)
	}
}

// toolgate's own ask, for a stateless runner: input_required with a
// URL-mode elicitation of the approval page and a requestState toolgate
// sealed; the runner's client opens the page (here: approves through the
// API), answers, and retries with the state, which toolgate verifies.
func TestStatelessApproval(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm gated_tool forbidden_tool"})
	var pages []string
	cs := g.connectStateless(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			pages = append(pages, req.Params.URL)
			id := req.Params.URL[strings.LastIndexByte(req.Params.URL, '/')+1:]
			if resp := g.api(t, http.MethodPost, "/v1/approvals/"+id+"/approve", aliceKey, []byte(`{"scope":"once"}`)); resp.StatusCode != 200 {
				return nil, fmt.Errorf("approving: %d %s", resp.StatusCode, resp.Body)
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		}})
	if got := callTool(t, cs, "gated_tool", map[string]any{"n": 1}); got != `echo {"n":1}` {
		t.Fatalf("gated_tool after approval: %q", got)
	}
	if len(pages) != 1 || !strings.Contains(pages[0], "/console/approvals/") {
		t.Fatalf("the runner was sent to %q, want one approval page", pages)
	}
	for _, r := range up.seen("gated_tool") {
		if strings.Contains(r.Body, "requestState") || strings.Contains(r.Body, "io.toolgate/approval") {
			t.Fatalf("toolgate's own requestState reached the upstream: %s", r.Body)
		}
	}
}

// A requestState toolgate sealed opens one retry of the call it was issued
// for, by its caller: tampered, replayed, or echoed by another caller or
// for other arguments, it is refused (expiry: mcp2026's unit tests).
func TestStatelessRequestStateRefused(t *testing.T) {
	up := startStatelessUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo confirm gated_tool forbidden_tool"})
	session := g.createSession(t, aliceKey, "svc")
	caps := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}`
	call := func(args, extra string) string {
		return `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"gated_tool","arguments":` + args + `,` + caps + extra + `}}`
	}
	status, msg := statelessPost(t, g, aliceKey, session, call(`{"n":2}`, ""), nil)
	res, _ := msg["result"].(map[string]any)
	state, _ := res["requestState"].(string)
	if status != 200 || res["resultType"] != "input_required" || state == "" {
		t.Fatalf("gated_tool: %d %v, want input_required with a requestState", status, msg)
	}
	page := res["inputRequests"].(map[string]any)["io.toolgate/approval"].(map[string]any)["params"].(map[string]any)["url"].(string)
	id := page[strings.LastIndexByte(page, '/')+1:]
	if resp := g.api(t, http.MethodPost, "/v1/approvals/"+id+"/approve", aliceKey, []byte(`{"scope":"session"}`)); resp.StatusCode != 200 {
		t.Fatalf("approving: %d %s", resp.StatusCode, resp.Body)
	}
	retry := func(args, s string) string {
		q, _ := json.Marshal(s)
		return call(args, `,"inputResponses":{"io.toolgate/approval":{"action":"accept"}},"requestState":`+string(q))
	}
	tampered := []byte(state)
	tampered[len(tampered)-3] ^= 1
	bobSession := g.createSession(t, bobKey, "svc")
	refusals := []struct {
		name, key, session, body string
	}{
		{"tampered", aliceKey, session, retry(`{"n":2}`, string(tampered))},
		{"other arguments", aliceKey, session, retry(`{"n":3}`, state)},
		{"another caller", bobKey, bobSession, retry(`{"n":2}`, state)},
	}
	for _, r := range refusals {
		if status, msg := statelessPost(t, g, r.key, r.session, r.body, nil); status != 400 || errorCode(msg) != -32602 {
			t.Errorf("%s requestState: %d %v, want 400 -32602", r.name, status, msg)
		}
	}
	if status, msg := statelessPost(t, g, aliceKey, session, retry(`{"n":2}`, state), nil); status != 200 || msg["result"].(map[string]any)["isError"] == true {
		t.Fatalf("the approved retry: %d %v", status, msg)
	}
	if status, msg := statelessPost(t, g, aliceKey, session, retry(`{"n":2}`, state), nil); status != 400 || errorCode(msg) != -32602 {
		t.Fatalf("the replayed requestState: %d %v, want 400 -32602", status, msg)
	}
	if n := len(up.seen(`"n":2`)); n != 1 {
		t.Fatalf("the upstream ran the approved call %d times, want once", n)
	}
	// A client that cannot open a URL is not sent one: -32021 naming the
	// capability (with the page, to show a person).
	noURL := strings.Replace(call(`{"n":4}`, ""), `{"elicitation":{"url":{}}}`, `{}`, 1)
	status, msg = statelessPost(t, g, aliceKey, session, noURL, nil)
	data, _ := msg["error"].(map[string]any)["data"].(map[string]any)
	if status != 400 || errorCode(msg) != -32021 || data["requiredCapabilities"] == nil || data["approval_url"] == nil {
		t.Fatalf("ask for a client without URL elicitation: %d %v", status, msg)
	}
}

// A stateless runner in front of an upstream that only initializes (the
// SDK's stateful server): toolgate answers server/discover, holds an
// upstream session initialized with the runner's capabilities, relays
// calls with their notifications, and maps subscriptions/listen to the
// upstream session's stream.
func TestStatelessRunnerLegacyUpstream(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	changed := make(chan struct{}, 4)
	var progress []float64
	var mu sync.Mutex
	cs := g.connectStateless(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params.Progress)
			mu.Unlock()
		},
	})
	if got := callTool(t, cs, "echo", map[string]any{"text": "b"}); got != `{"text":"b"}` {
		t.Fatalf("echo: %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 3}, Meta: mcp.Meta{"progressToken": "p1"}}); err != nil || res.IsError {
		t.Fatalf("progress: %v %+v", err, res)
	}
	mu.Lock()
	got := len(progress)
	mu.Unlock()
	if got == 0 {
		t.Fatal("no progress notification reached the stateless runner")
	}
	// add_tool makes the upstream send notifications/tools/list_changed on
	// its standalone stream, which toolgate relays on the runner's
	// subscriptions/listen stream.
	callTool(t, cs, "add_tool", map[string]any{})
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("notifications/tools/list_changed did not reach the subscription")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for _, r := range up.requests {
		// Only toolgate's server/discover probe, which learns the
		// upstream's revision, carries the revision's _meta.
		if strings.Contains(r.Body, "io.modelcontextprotocol/protocolVersion") && !strings.Contains(r.Body, `"server/discover"`) {
			t.Fatalf("the stateless revision's _meta reached an upstream that initializes: %s", r.Body)
		}
	}
}

// approval_wait holds calls of runners that take requests on a stream; a
// stateless runner takes none, so its call is answered at once with the
// input_required round, even from a gateway with approval_wait, and behind
// an upstream that initializes (whose implied session declared URL
// elicitation in its initialize).
func TestStatelessNotHeld(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, PolicyOptions: "approval_wait 30s"})
	session := g.createSession(t, aliceKey, "svc")
	body := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"gated_tool","arguments":{},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}`
	done := make(chan struct{})
	var status int
	var msg map[string]any
	go func() {
		defer close(done)
		status, msg = statelessPost(t, g, aliceKey, session, body, nil)
	}()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the stateless call was held")
	}
	res, _ := msg["result"].(map[string]any)
	if status != 200 || res["resultType"] != "input_required" {
		t.Fatalf("gated_tool: %d %v", status, msg)
	}
	if strings.Contains(fmt.Sprint(msg), "elicitationId") {
		t.Fatalf("a stateless runner was sent the earlier revision's URL elicitation: %v", msg)
	}
}

// A stateless runner given only a URL and a token (no session header) is
// served in one implied session: its requests find the MCP session
// toolgate implied for them again, so the upstream initializes once.
func TestStatelessRunnerWithoutSessionHeader(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	for i := range 3 {
		cs := g.connectStateless(t, aliceKey, "", "svc", nil)
		if got := callTool(t, cs, "echo", map[string]any{"text": strconv.Itoa(i)}); got != `{"text":"`+strconv.Itoa(i)+`"}` {
			t.Fatalf("echo %d: %q", i, got)
		}
	}
	initializes := 0
	for _, r := range up.requestLog() {
		if strings.Contains(r.Body, `"method":"initialize"`) {
			initializes++
		}
	}
	if initializes != 1 {
		t.Fatalf("the upstream initialized %d times, want 1", initializes)
	}
}

// answerBody reads resp's body: a JSON answer as it is, or the last data
// line of an SSE stream (the answer comes last).
func answerBody(resp *http.Response) []byte {
	data, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if d, ok := strings.CutPrefix(lines[i], "data: "); ok {
				return []byte(d)
			}
		}
	}
	return data
}

// A rule written for resources/subscribe holds for a runner of protocol
// 2026-07-28, whose subscriptions/listen names the resources in its filter
// instead: each is decided as the resources/subscribe a runner of an
// earlier revision would send, before anything goes upstream. A filter
// that is not a list of URIs, or names more than toolgate decides, is
// refused before the policy.
func TestListenSubscriptionsAreDecidedAsSubscribes(t *testing.T) {
	up := startUpstream(t)
	policies := aaPolicies(t, `decision := {"action": "deny", "reason": "test://secret is off limits"} if {
	input.method == "resources/subscribe"
	input.params.uri == "test://secret"
}

decision := {"action": "ask", "reason": "watching test://gated needs an approval"} if {
	input.method == "resources/subscribe"
	input.params.uri == "test://gated"
}
`, "")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policies})
	session := g.createSession(t, aliceKey, "svc")
	listen := func(uris string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp := aaStatelessSend(t, ctx, g, aliceKey, session, "subscriptions/listen",
			`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":[`+uris+`]},`+aaStatelessMeta(`{}`)+`}}`)
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			line, _ := bufio.NewReader(resp.Body).ReadString('\n') // the stream stays open: its first line
			return resp.StatusCode, line
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	subscribed := func() []string {
		var uris []string
		for _, r := range up.requestLog() {
			if strings.Contains(r.Body, `"resources/subscribe"`) {
				uris = append(uris, gjson.Get(r.Body, "params.uri").String())
			}
		}
		return uris
	}

	status, body := listen(`"test://watched","test://secret"`)
	if gjson.Get(body, "error.code").Int() != -32013 || !strings.Contains(body, `subscribing to \"test://secret\" is denied: test://secret is off limits`) {
		t.Fatalf("a listen naming a resource the policy denies subscribing to: %d %s", status, body)
	}
	if got := subscribed(); len(got) != 0 {
		t.Fatalf("a denied listen subscribed the upstream to %v", got)
	}
	var many []string // one more than toolgate takes
	for i := range 65 {
		many = append(many, `"test://r`+strconv.Itoa(i)+`"`)
	}
	for _, bad := range []string{`"test://watched",7`, strings.Join(many, ",")} {
		status, body := listen(bad)
		if status != http.StatusBadRequest || gjson.Get(body, "error.code").Int() != -32602 {
			t.Errorf("a listen naming [%.60s…]: %d %s, want 400 with -32602", bad, status, body)
		}
	}
	if got := subscribed(); len(got) != 0 {
		t.Fatalf("refused listens subscribed the upstream to %v", got)
	}

	// A resource the policy asks about makes the listen ask; once
	// approved, the same listen opens.
	status, body = listen(`"test://watched","test://gated"`)
	id := gjson.Get(body, "error.data.approval_id").String()
	if id == "" || !strings.Contains(body, `subscribing to \"test://gated\": watching test://gated needs an approval`) {
		t.Fatalf("a listen naming a resource the policy asks about: %d %s", status, body)
	}
	if got := subscribed(); len(got) != 0 {
		t.Fatalf("a listen waiting for its approval subscribed the upstream to %v", got)
	}
	if r := g.decide(t, aliceKey, id, true, "once", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving the listen: %d %s", r.StatusCode, r.Body)
	}
	if status, line := listen(`"test://watched","test://gated"`); status != http.StatusOK || line == "" {
		t.Fatalf("the approved listen: %d %q", status, line)
	}
	if got := subscribed(); !slices.Equal(got, []string{"test://watched", "test://gated"}) {
		t.Fatalf("the approved listen subscribed the upstream to %v", got)
	}

	// A resource named twice is subscribed once. The acknowledgement names
	// what the upstream is subscribed to: by this listen, or still by the
	// one before it, whose end the gateway may not have seen yet
	// (TestListenEndsItsUpstreamSubscriptions).
	resp := aaStatelessSend(t, context.Background(), g, aliceKey, session, "subscriptions/listen",
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["test://watched","test://watched"]},`+aaStatelessMeta(`{}`)+`}}`)
	line := trReadUntil(bufio.NewReader(resp.Body), "acknowledged")
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(line, `"resourceSubscriptions":["test://watched"]`) {
		t.Fatalf("a listen naming a resource the policy allows, twice: HTTP %d, acknowledged with %q", resp.StatusCode, line)
	}
}

// The resources a stateless runner's listens name stay subscribed upstream
// for as long as a listen of the implied MCP session names them: when a
// listen ends, the resources no other listen names are unsubscribed, and
// the other listens keep their updates.
func TestListenEndsItsUpstreamSubscriptions(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	session := g.createSession(t, aliceKey, "svc")
	before := readBoundGauges(t, g)
	count := func(method string) int {
		n := 0
		for _, r := range up.requestLog() {
			if strings.Contains(r.Body, `"`+method+`"`) && gjson.Get(r.Body, "params.uri").String() == "test://watched" {
				n++
			}
		}
		return n
	}
	listen := func() (*bufio.Reader, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp := aaStatelessSend(t, ctx, g, aliceKey, session, "subscriptions/listen",
			`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"resourceSubscriptions":["test://watched"]},`+aaStatelessMeta(`{}`)+`}}`)
		br := bufio.NewReader(resp.Body)
		if resp.StatusCode != http.StatusOK || trReadUntil(br, "notifications/subscriptions/acknowledged") == "" {
			cancel()
			t.Fatalf("the listen did not open: HTTP %d", resp.StatusCode)
		}
		return br, cancel
	}
	_, endFirst := listen()
	second, endSecond := listen()
	defer endSecond()
	open := readBoundGauges(t, g)
	endFirst()
	if now, ended := settleBoundGauges(t, g, boundGauges{streams: open.streams - 1, bytes: open.bytes}, 10*time.Second); !ended {
		t.Fatalf("the first listen did not end: %v (with both open: %v)", now, open)
	}
	if n := count("resources/unsubscribe"); n != 0 {
		t.Fatalf("a listen ending unsubscribed the upstream from a resource another listen names (%d times)", n)
	}
	if status, msg := statelessPost(t, g, aliceKey, session,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"touch_resource","arguments":{},`+aaStatelessMeta(`{}`)+`}}`, nil); status != http.StatusOK || msg["error"] != nil {
		t.Fatalf("touch_resource: HTTP %d %v", status, msg)
	}
	if line := trReadUntil(second, "notifications/resources/updated"); !strings.Contains(line, "test://watched") {
		t.Fatalf("the listen still open got no update of test://watched: %q", line)
	}
	endSecond()
	gaugesBackWithin(t, g, before, 10*time.Second)
	for i := 0; count("resources/unsubscribe") == 0; i++ {
		if i > 100 {
			t.Fatalf("the last listen naming test://watched ended and the upstream stays subscribed (%d subscribes)", count("resources/subscribe"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := count("resources/unsubscribe"); n != 1 {
		t.Fatalf("the upstream was unsubscribed %d times", n)
	}
}

// Holds: ending a toolgate session (DELETE /v1/sessions/{id}, say because
// its runner misbehaves) ends the streams its runners hold open: the
// standalone stream of a runner that initialized, and a stateless
// runner's subscriptions/listen. Nothing more reaches them in the session.
func TestEndedSessionEndsItsStreams(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	session := g.createSession(t, aliceKey, "svc")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ended := openSessionStreams(t, ctx, g, session)
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+session, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending the session: %d %s", r.StatusCode, r.Body)
	}
	for range 2 {
		select {
		case name := <-ended:
			t.Logf("%s ended", name)
		case <-ctx.Done():
			t.Fatal("a stream of the ended session stays open")
		}
	}
}

// Holds: a session ended on one replica ends the streams its runner holds
// open on another.
func TestEndedSessionEndsItsStreamsOnEveryReplica(t *testing.T) {
	up := startUpstream(t)
	a, b, _ := soReplicas(t, testdataPath(t, "policy"), func(storage, data string) string {
		return soBlock(storage, data, up.URL, "echo", "", "")
	})
	session := a.createSession(t, aliceKey, "svc")
	ma := a.raw(t, aliceKey, session, "svc")
	ma.initialize()
	mb := b.raw(t, aliceKey, session, "svc")
	mb.sessionID = ma.sessionID
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	get, body := mb.openStream(t, ctx)
	if get.StatusCode != http.StatusOK {
		t.Fatalf("the standalone stream on b: HTTP %d %s", get.StatusCode, body)
	}
	ended := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, get.Body)
		close(ended)
	}()
	if r := a.api(t, http.MethodDelete, "/v1/sessions/"+session, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending the session on a: %d %s", r.StatusCode, r.Body)
	}
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the stream on b of the session ended on a stays open")
	}
}

// openSessionStreams opens, in session, the standalone stream of a runner
// that initializes and a stateless runner's subscriptions/listen, and
// names each on the channel when it ends (both within ctx).
func openSessionStreams(t *testing.T, ctx context.Context, g *gateway, session string) <-chan string {
	t.Helper()
	m := g.raw(t, aliceKey, session, "svc")
	m.initialize()
	get, body := m.openStream(t, ctx)
	if get.StatusCode != http.StatusOK {
		t.Fatalf("the standalone stream: HTTP %d %s", get.StatusCode, body)
	}
	listen := aaStatelessSend(t, ctx, g, aliceKey, session, "subscriptions/listen",
		`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},`+aaStatelessMeta(`{}`)+`}}`)
	if listen.StatusCode != http.StatusOK || trReadUntil(bufio.NewReader(listen.Body), "acknowledged") == "" {
		t.Fatalf("the listen: HTTP %d", listen.StatusCode)
	}
	ended := make(chan string, 2)
	for name, r := range map[string]io.Reader{"the standalone stream": get.Body, "the listen": listen.Body} {
		go func() {
			_, _ = io.Copy(io.Discard, r)
			ended <- name
		}()
	}
	return ended
}
