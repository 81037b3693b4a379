package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Attacks on the per-user OAuth connect flow and credential injection
// (TestOAuthAttack…) and on tasks, the deferred tool results of MCP
// 2025-11-25 (TestTaskAttack…). Each test says what it shows: an attack
// that must fail for the reason its comment gives, or "Holds" (an attack
// the general design resists). Everything is real: the harness's go-oauth2
// provider, go-sdk upstreams and a TypeScript SDK upstream for tasks, the
// gateway in process, loopback only.

// A person who disconnects a service (DELETE /v1/connections/svc) while a
// refresh of their grant is in flight must find it gone afterwards: the
// refresh must not write the grant back, or the catalog says "connected"
// again and the runner's calls go on acting as them upstream with a grant
// they revoked in toolgate.
func TestOAuthAttackDisconnectDuringRefreshResurrectsTheGrant(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second, RefreshedAccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	waitExpiry(time.Second)

	// A call needs a refresh; the provider is slow to answer it.
	release := p.holdTokens()
	defer release()
	done := make(chan error, 1)
	go func() {
		_, err := m.callEcho("during the refresh")
		done <- err
	}()
	waitFor(t, "the refresh to reach the provider", func() bool { return p.heldTokenRequests() == 1 })

	// Meanwhile alice disconnects. (A gateway that makes the disconnect
	// wait for the refresh answers it once the refresh is over.)
	deleted := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodDelete, g.URL+"/v1/connections/svc", nil)
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		resp, err := (&http.Client{Transport: g.transport()}).Do(req)
		if err != nil {
			deleted <- 0
			return
		}
		resp.Body.Close()
		deleted <- resp.StatusCode
	}()
	status := 0
	select {
	case status = <-deleted:
	case <-time.After(500 * time.Millisecond):
	}
	early := status != 0 // answered while the refresh was still held at the provider
	release()
	if status == 0 {
		select {
		case status = <-deleted:
		case <-time.After(20 * time.Second):
		}
	}
	if status != http.StatusNoContent {
		t.Fatalf("DELETE /v1/connections/svc: %d", status)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the call waiting for the refresh never ended")
	}

	files := len(g.connectionFiles(t, "svc"))
	catalog := g.catalogService(t, aliceKey, "svc").Status
	a, err := m.callEcho("after disconnecting")
	if err != nil {
		t.Fatal(err)
	}
	if files != 0 || catalog != "needs_sign_in" || a.Error == nil || !a.Error.Data.NeedsSignIn {
		t.Errorf("after alice disconnected (204, answered before the refresh ended: %v): %d connection records stored, catalog status %q, "+
			"next call result %s error %+v; want no record, needs_sign_in, and a call that needs sign-in",
			early, files, catalog, a.Result, a.Error)
	}
}

// reflectingUpstream is a go-sdk upstream behind the go-sdk's own bearer
// middleware (auth.RequireBearerToken), which accepts p's valid tokens that
// carry scopes (HTTP 401 otherwise, 403 insufficient_scope when a scope is
// missing). Its echo tool answers like an upstream that, carelessly or on
// purpose, reports the credential its request carried.
func reflectingUpstream(t *testing.T, p *oauthProvider, scopes ...string) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "reflecting", Version: "1.0.0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo, with diagnostics.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest, in struct {
			Text string `json:"text"`
		}) (*mcp.CallToolResult, any, error) {
			header := req.Extra.Header.Get("Authorization")
			return &mcp.CallToolResult{Content: []mcp.Content{
				&mcp.TextContent{Text: in.Text},
				&mcp.TextContent{Text: "diagnostics: your request carried " + header},
				&mcp.TextContent{Text: "[session] key " + strings.TrimPrefix(header, "Bearer ") + " is valid"},
			}}, nil, nil
		})
	verify := func(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		ti, err := p.manager.LoadAccessToken(ctx, token)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
		}
		return &auth.TokenInfo{Scopes: strings.Fields(ti.GetScope()), Expiration: ti.GetAccessCreateAt().Add(ti.GetAccessExpiresIn())}, nil
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Minute})
	srv := httptest.NewServer(auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{Scopes: scopes})(h))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// oauthGatewayAt is oauthGateway for an upstream at upstreamURL (and the
// auth block cfg.Auth, default oauthBlock's).
func oauthGatewayAt(t *testing.T, p *oauthProvider, upstreamURL string, cfg gatewayConfig) *gateway {
	t.Helper()
	cfg.Upstream = upstreamURL
	if cfg.Auth == "" {
		cfg.Auth = oauthBlock(p, "")
	}
	cfg.Extra = "state_secret " + testStateSecret + "\n" + cfg.Extra
	g := startGateway(t, cfg)
	p.allowRedirect(g.URL + "/v1/connections/svc/callback")
	return g
}

// lastIssuedAccess is the access token the provider issued last.
func (p *oauthProvider) lastIssuedAccess(t *testing.T) string {
	t.Helper()
	calls := p.calls()
	for i := len(calls) - 1; i >= 0; i-- {
		if calls[i].IssuedAccess != "" {
			return calls[i].IssuedAccess
		}
	}
	t.Fatal("the provider issued no access token")
	return ""
}

// An upstream that reflects the credential it received into a tool result
// must not hand the caller's OAuth access token to the runner. A result
// policy redacts only secrets of shapes it knows ("Bearer <token>"); the
// bare token is caught by toolgate, which knows the exact value it
// injected. DESIGN.md: credentials never appear in responses. With the
// token, a runner (or whoever injected a prompt into it) would act as the
// person at the provider directly, past every policy.
func TestOAuthAttackUpstreamReflectsTheAccessTokenToTheRunner(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	policies := channelPolicies(t, "")
	g := oauthGatewayAt(t, p, reflectingUpstream(t, p), gatewayConfig{RequestPolicy: policies})
	g.connectOAuth(t, aliceKey)
	token := p.lastIssuedAccess(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	a, err := m.callEcho("hello")
	if err != nil {
		t.Fatal(err)
	}
	if a.Error != nil || !strings.Contains(string(a.Result), "hello") {
		t.Fatalf("echo: result %s, error %+v", a.Result, a.Error)
	}
	if strings.Contains(string(a.Result), token) {
		t.Errorf("the runner received alice's access token in a tool result: %s", a.Result)
	}
}

// A provider that issues a sender-constrained token (token_type DPoP, RFC
// 9449; the same for "mac" or any type toolgate does not speak) must not
// have it stored and sent upstream as "Authorization: Bearer <token>". RFC
// 6749 section 7.1: a client MUST NOT use an access token whose type it
// does not understand; presenting a DPoP-bound token as a bearer token
// throws away the proof of possession it was issued with.
func TestOAuthAttackNonBearerTokenIsSentAsBearer(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	p.mu.Lock() // the provider's handlers take p.mu before they read its config
	p.server.Config.TokenType = "DPoP"
	p.mu.Unlock()
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	status, page := g.signedIn(t, aliceKey).connect("svc")
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if users, _ := up.seen(); len(users) > 0 {
		t.Errorf("the provider issued token_type DPoP; toolgate connected it (callback %d %q) and presented it upstream as a bearer token "+
			"(the upstream accepted %d requests for %v; initialize answered %s)", status, pageHeading(page), len(users), users[0], msgs)
	}
}

// pageHeading is the <h1> of a page, or its start.
func pageHeading(page string) string {
	if _, rest, ok := strings.Cut(page, "<h1>"); ok {
		h, _, _ := strings.Cut(rest, "</h1>")
		return h
	}
	return page[:min(len(page), 80)]
}

// An upstream that refuses the caller's token — here the go-sdk's own
// bearer middleware answering 403 insufficient_scope, because it needs a
// scope the grant lacks — must not make toolgate refresh the grant on
// every call (each refresh rotating the refresh token): one token request
// per runner request, without bound, would be a refresh storm a runner (or
// a prompt-injected agent retrying) drives at will, against DESIGN.md's
// "no OAuth round trip on the steady-state path".
func TestOAuthAttackRefusingUpstreamForcesARefreshPerCall(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	g := oauthGatewayAt(t, p, reflectingUpstream(t, p, "tickets.write"), gatewayConfig{})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	const attempts = 6
	var last []json.RawMessage
	for range attempts {
		_, _, last = m.post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	}
	p.checkRotation(t)
	if n := len(p.refreshes()); n > 1 {
		t.Errorf("%d runner requests refused by the upstream (403 insufficient_scope) made %d refreshes at the provider, each rotating the refresh token; "+
			"want at most 1. The last answer: %s", attempts, n, last)
	}
}

// attackTasksScript is a tasks upstream built with the TypeScript SDK (like
// tasksserver/server.mjs), whose build tool runs as a task. Over HTTP (or,
// with TASKS_TRANSPORT=stdio, as a stdio program) it keeps tasks the SDK's
// own way (bound to the MCP session that created them), or (TASKS_MODE):
//
//   - shared: a task belongs to the upstream's caller, as the MCP spec has
//     receivers bind tasks to the authorization context; toolgate calls
//     with one service-wide credential (here none), so every toolgate user
//     is that one caller. Every MCP session lists and reads every task.
//   - counting: each upstream session numbers its tasks task-1, task-2, …
//     (ids unique within the session that may name them).
const attackTasksScript = `
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import * as z from 'zod/v4';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { InMemoryTaskStore, InMemoryTaskMessageQueue } from '@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js';

const mode = process.env.TASKS_MODE;
const shared = new InMemoryTaskStore();

class CountingStore extends InMemoryTaskStore {
  constructor() { super(); this.n = 0; }
  generateTaskId() { this.n += 1; return 'task-' + this.n; }
}

function newServer() {
  const store = mode === 'counting' ? new CountingStore() : shared;
  const server = new McpServer({ name: 'tasks-upstream', version: '1.0.0' }, {
    capabilities: { tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } },
    taskStore: store,
    taskMessageQueue: new InMemoryTaskMessageQueue(),
  });
  server.experimental.tasks.registerToolTask('build', {
    description: 'Builds a project in the background.',
    inputSchema: { project: z.string(), delay: z.number().optional() },
    annotations: { readOnlyHint: true },
    execution: { taskSupport: 'optional' },
  }, {
    async createTask({ project, delay }, { taskStore, taskRequestedTtl, requestId }) {
      const params = { ttl: taskRequestedTtl ?? 60000, pollInterval: 20 };
      const task = mode === 'shared'
        ? await shared.createTask(params, requestId, { method: 'tools/call', params: {} })
        : await taskStore.createTask(params);
      // Through the request's task store, as SDK servers do: each change
      // is announced with notifications/tasks/status.
      await taskStore.updateTaskStatus(task.taskId, 'working', 'building ' + project);
      setTimeout(() => {
        taskStore.storeTaskResult(task.taskId, 'completed', { content: [{ type: 'text', text: 'built ' + project }] }).catch(() => {});
      }, delay ?? 30);
      return { task: { ...task, statusMessage: 'building ' + project } };
    },
    async getTask(_args, { taskId, taskStore }) { return await taskStore.getTask(taskId); },
    async getTaskResult(_args, { taskId, taskStore }) { return await taskStore.getTaskResult(taskId); },
  });
  server.registerTool('wait', {
    description: 'Waits ms milliseconds.',
    inputSchema: { ms: z.number() },
    annotations: { readOnlyHint: true },
  }, async ({ ms }) => {
    await new Promise((resolve) => setTimeout(resolve, Math.min(ms, 5000)));
    return { content: [{ type: 'text', text: 'waited' }] };
  });
  return server;
}

const transports = new Map();

async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const text = Buffer.concat(chunks).toString('utf8');
  return text ? JSON.parse(text) : undefined;
}

const httpServer = http.createServer(async (req, res) => {
  try {
    const body = req.method === 'POST' ? await readBody(req) : undefined;
    const id = req.headers['mcp-session-id'];
    let transport = id && transports.get(id);
    if (!transport) {
      if (id || req.method !== 'POST' || body?.method !== 'initialize') {
        res.writeHead(id ? 404 : 400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'no session' }, id: null }));
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => transports.set(sid, transport),
      });
      transport.onclose = () => transports.delete(transport.sessionId);
      await newServer().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (err) {
    if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
    res.end(String(err));
  }
});

if (process.env.TASKS_TRANSPORT === 'stdio') {
  const { StdioServerTransport } = await import('@modelcontextprotocol/sdk/server/stdio.js');
  await newServer().connect(new StdioServerTransport());
} else {
  httpServer.listen(0, '127.0.0.1', () => console.log('listening ' + httpServer.address().port));
}
`

// attackTasksScriptFile writes attackTasksScript beside the cached
// TypeScript SDK and returns its path.
func attackTasksScriptFile(t *testing.T) string {
	t.Helper()
	return tasksScript(t, []byte(attackTasksScript))
}

// startAttackTasksUpstream runs attackTasksScript over HTTP in mode and returns its URL.
func startAttackTasksUpstream(t *testing.T, mode string) string {
	t.Helper()
	return runTasksScript(t, attackTasksScriptFile(t), "TASKS_MODE="+mode)
}

// buildTask makes a task-augmented call of build and returns the task id.
func (m *rawMCP) buildTask(project string) string {
	m.t.Helper()
	return m.buildTaskAfter(project, 30)
}

// buildTaskAfter is buildTask of a task that completes after ms.
func (m *rawMCP) buildTaskAfter(project string, ms int) string {
	m.t.Helper()
	created := m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":"create-%s","method":"tools/call","params":{"name":"build","arguments":{"project":%q,"delay":%d},"task":{"ttl":60000}}}`, project, project, ms))
	id, _ := dig(created, "result", "task", "taskId").(string)
	if id == "" {
		m.t.Fatalf("creating a task: %v", created)
	}
	return id
}

// awaitTask polls tasks/get until the task completed.
func (m *rawMCP) awaitTask(id string) {
	m.t.Helper()
	for i := range 200 {
		got := m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":"get-%d","method":"tasks/get","params":{"taskId":%q}}`, i, id))
		if dig(got, "result", "status") == "completed" {
			return
		}
		if dig(got, "result") == nil {
			m.t.Fatalf("tasks/get %s: %v", id, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	m.t.Fatalf("task %s never completed", id)
}

// tasks/list must show a runner only the tasks created through its MCP
// session, as tasks/get, tasks/result and tasks/cancel do (the spec: a
// receiver given session and authorization context MUST bind tasks to
// it): bob's list must not show alice's task, its id and its status
// message ("building alice-merger-plan"). Two everyday setups: an HTTP
// upstream that binds tasks to its caller, which toolgate's one
// service-wide credential makes everyone (svc); and the stock TypeScript
// SDK server run as a stdio program, whose one MCP session toolgate shares
// among all users (local). Only toolgate has the per-person context.
func TestTaskAttackListShowsOtherUsersTasks(t *testing.T) {
	upURL := startAttackTasksUpstream(t, "shared")
	local := stdioAttackTasksService(t)
	g := startGateway(t, gatewayConfig{Upstream: upURL, RequestPolicy: channelPolicies(t, ""), Tools: "build", Services: local})
	for _, service := range []string{"svc", "local"} {
		am := g.raw(t, aliceKey, g.createSession(t, aliceKey, service), service)
		am.initialize()
		id := am.buildTask("alice-merger-plan")
		am.awaitTask(id)

		bm := g.raw(t, bobKey, g.createSession(t, bobKey, service), service)
		bm.initialize()
		list := bm.rpc(`{"jsonrpc":"2.0","id":"list","method":"tasks/list"}`)
		if strings.Contains(fmt.Sprint(list), id) || strings.Contains(fmt.Sprint(list), "alice-merger-plan") {
			t.Errorf("%s: bob's tasks/list shows alice's task %s: %v", service, id, list)
		}
	}
}

// stdioAttackTasksService is the service block of "local": attackTasksScript (stock
// SDK task keeping) as a stdio program, which all users share.
func stdioAttackTasksService(t *testing.T) string {
	return "service local {\n\t\t\tcommand node " + attackTasksScriptFile(t) + "\n\t\t\tenv TASKS_TRANSPORT stdio\n\t\t\ttools build wait\n\t\t}"
}

// On a stdio program toolgate shares among users, the SDK's
// notifications/tasks/status for alice's task (it completed; the status
// names her project) must not reach bob's call, which happens to be in
// progress when it is sent: a task's status belongs to the task's creator.
func TestTaskAttackStatusNotificationReachesAnotherUser(t *testing.T) {
	g := startGateway(t, gatewayConfig{Upstream: "http://127.0.0.1:9/unused", RequestPolicy: channelPolicies(t, ""), Tools: "build",
		Services: stdioAttackTasksService(t)})
	am := g.raw(t, aliceKey, g.createSession(t, aliceKey, "local"), "local")
	am.initialize()
	bm := g.raw(t, bobKey, g.createSession(t, bobKey, "local"), "local")
	bm.initialize()
	// bob's call is in progress when alice's task completes.
	answered := make(chan []json.RawMessage, 1)
	go func() {
		_, _, msgs := bm.post(`{"jsonrpc":"2.0","id":"w","method":"tools/call","params":{"name":"wait","arguments":{"ms":3000}}}`)
		answered <- msgs
	}()
	time.Sleep(300 * time.Millisecond)
	id := am.buildTaskAfter("alice-merger-plan", 300)
	var msgs []json.RawMessage
	select {
	case msgs = <-answered:
	case <-time.After(20 * time.Second):
		t.Fatal("bob's call never ended")
	}
	for _, msg := range msgs {
		if strings.Contains(string(msg), id) || strings.Contains(string(msg), "alice-merger-plan") {
			t.Errorf("bob's call carried a message about alice's task: %s", msg)
		}
	}
	if len(msgs) == 0 || !strings.Contains(string(msgs[len(msgs)-1]), "waited") {
		t.Errorf("bob's wait call: %s", msgs)
	}
}

// A withheld deferred result that its approver released must go to the
// retry of that task only: two runners of one toolgate session whose
// upstream sessions number their tasks alike (task-1) name different tasks
// with the same id, and the second runner, asking for its own task-1
// ("build beta"), must not be given the first's approved "build alpha"
// result. DESIGN.md: approving releases exactly that result to the
// identical retry.
func TestTaskAttackReleasedResultGoesToAnotherSessionsTask(t *testing.T) {
	upURL := startAttackTasksUpstream(t, "counting")
	dir := channelPolicies(t, `{"toolgate": {"settings": {"services": {"svc": {"review_results": true}}}}}`)
	g := startGateway(t, gatewayConfig{Upstream: upURL, RequestPolicy: dir, Tools: "build"})
	sess := g.createSession(t, aliceKey, "svc")
	first, second := g.raw(t, aliceKey, sess, "svc"), g.raw(t, aliceKey, sess, "svc")
	first.initialize()
	second.initialize()
	alpha, beta := first.buildTask("alpha"), second.buildTask("beta")
	if alpha != beta {
		t.Fatalf("the upstream sessions numbered their tasks %q and %q, want the same id", alpha, beta)
	}
	first.awaitTask(alpha)
	second.awaitTask(beta)

	result := fmt.Sprintf(`{"jsonrpc":"2.0","id":"r","method":"tasks/result","params":{"taskId":%q}}`, alpha)
	withheld := first.rpc(result)
	approvalID, _ := dig(withheld, "result", "_meta", "toolgate/approval", "id").(string)
	if approvalID == "" {
		t.Fatalf("the first runner's deferred result on a reviewed service: %v", withheld)
	}
	if r := g.decide(t, aliceKey, approvalID, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	got := second.rpc(result)
	if text := fmt.Sprint(dig(got, "result", "content", "0", "text")); text == "built alpha" {
		t.Errorf("the second runner asked for its own task %s (build beta) and was given the first runner's approved result %q", beta, text)
	}
	if again := first.rpc(result); dig(again, "result", "content", "0", "text") != "built alpha" {
		t.Logf("the first runner's retry, as told: %v", again)
	}
}

// Holds. State swapping and code injection: carol's provider code paired
// with alice's state (alice's browser opens it, as a login-CSRF link would
// make it), and alice's code paired with carol's state in carol's browser.
// The code was issued for the other flow's PKCE challenge, so the provider
// refuses it with the verifier the state names; nothing is stored, and the
// state is spent.
func TestOAuthAttackHoldsSwappedStateAndCode(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Hour})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{})
	aliceBrowser, carolBrowser := g.signedIn(t, aliceKey), g.signedIn(t, carolKey)
	aliceCB := providerRedirect(t, aliceBrowser.startConnect("svc")).Query()
	carolCB := providerRedirect(t, carolBrowser.startConnect("svc")).Query()
	for _, c := range []struct {
		name                 string
		browser              *person
		state, code, genuine string
	}{
		{"carol's code with alice's state, in alice's browser", aliceBrowser, aliceCB.Get("state"), carolCB.Get("code"), aliceCB.Get("code")},
		{"alice's code with carol's state, in carol's browser", carolBrowser, carolCB.Get("state"), aliceCB.Get("code"), carolCB.Get("code")},
	} {
		q := url.Values{"state": {c.state}, "code": {c.code}}
		status, page := c.browser.get(g.URL + "/v1/connections/svc/callback?" + q.Encode())
		if status != http.StatusBadRequest || !strings.Contains(page, "did not accept") {
			t.Errorf("%s: %d %s", c.name, status, pageHeading(page))
		}
		if n := len(g.connectionFiles(t, "svc")); n != 0 {
			t.Fatalf("%s: %d connections stored", c.name, n)
		}
		// The genuine code cannot be used with the spent state either.
		q.Set("code", c.genuine)
		if status, page := c.browser.get(g.URL + "/v1/connections/svc/callback?" + q.Encode()); status != http.StatusBadRequest {
			t.Errorf("%s, then the genuine code: %d %s", c.name, status, pageHeading(page))
		}
	}
	if n := len(g.connectionFiles(t, "svc")); n != 0 {
		t.Fatalf("%d connections stored", n)
	}
}

// Holds. A hostile token endpoint: a refresh answered with a 307 redirect
// to another host (which would receive the refresh token and the client
// secret if followed), then with an HTML error page. toolgate follows no
// redirect, shows nothing of the page, keeps the grant and answers
// retryably; the grant works again once the provider does.
func TestOAuthAttackHoldsHostileTokenEndpoint(t *testing.T) {
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	var mu sync.Mutex
	var attackerGot []string
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		attackerGot = append(attackerGot, r.Method+" "+r.URL.String()+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"access_token":"attacker-chosen","token_type":"Bearer","expires_in":3600}`)
	}))
	defer attacker.Close()
	behaviour, hostile := "proxy", 0
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		mu.Lock()
		how := behaviour
		if how != "proxy" && r.PostForm.Get("grant_type") == "refresh_token" {
			hostile++
		}
		mu.Unlock()
		switch {
		case how == "redirect" && r.PostForm.Get("grant_type") == "refresh_token":
			http.Redirect(w, r, attacker.URL+"/token", http.StatusTemporaryRedirect)
		case how == "html" && r.PostForm.Get("grant_type") == "refresh_token":
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `<html><script>alert(1)</script><p>error=invalid_grant&amp;hint=ZAP-SECRET-PAGE</p></html>`)
		default:
			resp, err := http.PostForm(p.TokenURL, r.PostForm)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		}
	}))
	defer front.Close()
	g := oauthGatewayAt(t, p, up.URL, gatewayConfig{Auth: strings.Replace(oauthBlock(p, ""), p.TokenURL, front.URL+"/token", 1)})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	before := g.connectionFiles(t, "svc")

	for _, how := range []string{"redirect", "html"} {
		mu.Lock()
		behaviour = how
		mu.Unlock()
		waitExpiry(time.Second)
		a, err := m.callEcho("refresh answered with " + how)
		if err != nil {
			t.Fatal(err)
		}
		if a.Error == nil || !a.Error.Data.Retryable || a.Error.Data.NeedsSignIn ||
			strings.Contains(a.Error.Message, "script") || strings.Contains(a.Error.Message, "ZAP-SECRET") || strings.Contains(a.Error.Message, attacker.URL) {
			t.Errorf("a refresh answered with a %s: result %s, error %+v; want a retryable error that shows nothing of the answer", how, a.Result, a.Error)
		}
		after := g.connectionFiles(t, "svc")
		for k := range before {
			if string(before[k]) != string(after[k]) {
				t.Errorf("after a refresh answered with a %s the stored grant changed", how)
			}
		}
	}
	mu.Lock()
	if hostile != 2 {
		t.Errorf("the token endpoint gave %d hostile answers, want 2 (one refresh each)", hostile)
	}
	if len(attackerGot) != 0 {
		t.Errorf("the host the token endpoint redirected to received: %q", attackerGot)
	}
	behaviour = "proxy"
	mu.Unlock()
	m.mustEcho(t, "provider sane again")
	if users, _ := up.seen(); len(users) == 0 || users[len(users)-1] != alice {
		t.Errorf("the upstream's users: %v", users)
	}
}

// Holds. No secret of the OAuth flow is written in the clear: after a
// connect, refreshes, a swapped-code callback and a forged one, the debug
// log and every file of the storage hold none of the client secret, the
// codes, the PKCE verifiers, the states, the issued access and refresh
// tokens, or the runner's API key.
func TestOAuthAttackHoldsNoSecretInLogOrStorage(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "gateway.log")
	p := startOAuthProvider(t, providerConfig{AccessTTL: time.Second})
	up := startProtectedUpstream(t, p)
	g := oauthGateway(t, p, up, gatewayConfig{Log: "output file " + logFile + "\n\t\tlevel DEBUG"})
	g.connectOAuth(t, aliceKey)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	for i := range 2 {
		waitExpiry(time.Second)
		m.mustEcho(t, fmt.Sprintf("after expiry %d", i))
	}
	carol := g.signedIn(t, carolKey)
	cb := providerRedirect(t, carol.startConnect("svc")).Query()
	swapped := url.Values{"state": {cb.Get("state")}, "code": {"not-" + cb.Get("code")}}
	carol.get(g.URL + "/v1/connections/svc/callback?" + swapped.Encode())
	carol.get(g.URL + "/v1/connections/svc/callback?" + url.Values{"state": {"forged." + cb.Get("state")}, "code": {cb.Get("code")}}.Encode())
	if len(p.refreshes()) < 2 {
		t.Fatalf("%d refreshes, want 2", len(p.refreshes()))
	}

	secrets := map[string]string{"client secret": p.ClientSecret, "alice's API key": aliceKey, "carol's code": cb.Get("code"), "carol's state": cb.Get("state")}
	for i, c := range p.calls() {
		for what, v := range map[string]string{"code": c.Form.Get("code"), "verifier": c.Form.Get("code_verifier"),
			"sent refresh token": c.Form.Get("refresh_token"), "access token": c.IssuedAccess, "refresh token": c.IssuedRefresh} {
			if v != "" {
				secrets[fmt.Sprintf("%s of token call %d", what, i)] = v
			}
		}
	}
	for i, a := range p.authorizeRequests() {
		secrets[fmt.Sprintf("state of authorization %d", i)] = a.Get("state")
	}
	logged, err := os.ReadFile(logFile)
	if err != nil || !strings.Contains(string(logged), "oauth token refreshed") {
		t.Fatalf("the log: %v (%d bytes, want debug entries)", err, len(logged))
	}
	found := func(where string, data []byte) {
		for what, v := range secrets {
			if len(v) >= 8 && strings.Contains(string(data), v) {
				t.Errorf("%s holds the %s in the clear", where, what)
			}
		}
	}
	found("the debug log", logged)
	err = filepath.WalkDir(g.DataDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err == nil {
			found(path, b)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Holds. A task id is usable only in the MCP session that created it:
// alice's second runner, alice's session on another service with the same
// upstream, and bob are refused for alice's task (the upstream here would
// answer anyone: its tasks belong to toolgate's one credential), and ids
// guessed in the upstream's shape are refused before anything goes
// upstream.
func TestTaskAttackHoldsOtherSessionsCannotNameATask(t *testing.T) {
	upURL := startAttackTasksUpstream(t, "shared")
	g := startGateway(t, gatewayConfig{Upstream: upURL, RequestPolicy: channelPolicies(t, ""), Tools: "build",
		Services: "service svc2 {\n\t\t\turl " + upURL + "\n\t\t\tallow_http\n\t\t\ttools build\n\t\t}"})
	sess := g.createSession(t, aliceKey, "svc", "svc2")
	am := g.raw(t, aliceKey, sess, "svc")
	am.initialize()
	id := am.buildTask("alice-merger-plan")
	am.awaitTask(id)

	other := g.raw(t, aliceKey, sess, "svc")
	other.initialize()
	svc2 := g.raw(t, aliceKey, sess, "svc2")
	svc2.initialize()
	bm := g.raw(t, bobKey, g.createSession(t, bobKey, "svc"), "svc")
	bm.initialize()
	for _, c := range []struct {
		who string
		m   *rawMCP
		id  string
	}{
		{"alice's other runner", other, id}, {"alice on svc2", svc2, id}, {"bob", bm, id},
		{"bob, guessing", bm, "00000000000000000000000000000000"}, {"bob, a neighbour of the id", bm, id[:31] + "0"},
	} {
		for _, method := range []string{"tasks/get", "tasks/result", "tasks/cancel"} {
			got := c.m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":"x","method":%q,"params":{"taskId":%q}}`, method, c.id))
			if dig(got, "error", "code") != float64(-32602) || strings.Contains(fmt.Sprint(got), "built alice") {
				t.Errorf("%s: %s of alice's task: %v", c.who, method, got)
			}
		}
	}
	// The task is alice's still, in her session.
	if got := am.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":"r","method":"tasks/result","params":{"taskId":%q}}`, id)); dig(got, "result", "content", "0", "text") != "built alice-merger-plan" {
		t.Errorf("alice's own tasks/result: %v", got)
	}
}
