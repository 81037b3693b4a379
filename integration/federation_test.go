package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// federationPolicy denies one tool of one service: calls through the
// federated endpoint are decided with the real service and tool names.
const federationPolicy = `package toolgate.request

default decision := {"action": "allow"}

decision := {"action": "deny", "reason": sprintf("%s may not run %s", [input.service.id, input.tool.name])} if {
	input.method == "tools/call"
	input.service.id == "beta"
	input.tool.name == "lookup"
}
`

const allowResults = `package toolgate.result

default decision := {"action": "allow"}
`

// federatedGateway runs two services, alpha and beta, each with its own
// upstream and service-wide credential, and a third whose upstream is
// down, behind a gateway with the federated endpoint.
func federatedGateway(t *testing.T) (alphaUp, betaUp *smallUpstream, g *gateway) {
	t.Helper()
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	alphaUp = startSmallUpstream(t, "alpha", &mcp.Tool{Name: "lookup", Description: "Looks up in alpha.", Annotations: readOnly},
		&mcp.Tool{Name: "hidden", Description: "Not allowlisted.", Annotations: readOnly})
	alphaUp.Server.AddResource(&mcp.Resource{URI: "file:///readme", Name: "readme", MIMEType: "text/plain"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: "alpha's readme"}}}, nil
		})
	alphaUp.Server.AddPrompt(&mcp.Prompt{Name: "greet", Description: "Greets."},
		func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello from alpha"}}}}, nil
		})
	betaUp = startSmallUpstream(t, "beta", &mcp.Tool{Name: "lookup", Description: "Looks up in beta.", Annotations: readOnly},
		&mcp.Tool{Name: "other", Description: "Something else.", Annotations: readOnly})
	policies := t.TempDir()
	for name, text := range map[string]string{"request.rego": federationPolicy, "result.rego": allowResults} {
		if err := os.WriteFile(filepath.Join(policies, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	down := fmt.Sprintf("http://127.0.0.1:%d/mcp", freePort(t))
	g = startGateway(t, gatewayConfig{Upstream: alphaUp.URL, RequestPolicy: policies, Federation: " ",
		Tools: "lookup", Auth: `header Authorization "Bearer alpha-secret"`,
		Services: `service beta {
			url ` + betaUp.URL + `
			allow_http
			tools lookup other
			auth header Authorization "Bearer beta-secret"
		}
		service down {
			url ` + down + `
			allow_http
			tools anything
			dial_timeout 1s
		}`})
	// The harness names its first service svc: federated, its tools are
	// svc__lookup.
	return alphaUp, betaUp, g
}

// One MCP endpoint over several services: tools named service__tool, each
// call routed to its service with that service's credential and decided by
// the policy with the real service; a service that is down leaves the
// others listed and is named in _meta; resources are namespaced too.
func TestFederatedEndpoint(t *testing.T) {
	alphaUp, betaUp, g := federatedGateway(t)
	changed := make(chan struct{}, 4)
	cs := g.connectWithToken(t, aliceKey, "/v1/mcp", &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	// beta's lookup is hidden: the policy denies it there (and not in svc).
	if !slices.Equal(names, []string{"svc__lookup", "beta__other"}) {
		t.Fatalf("federated tools: %v", names)
	}
	gaps, _ := json.Marshal(tools.Meta["toolgate/unavailable"])
	if !strings.Contains(string(gaps), `"service":"down"`) || !strings.Contains(string(gaps), `"code":-32011`) {
		t.Fatalf("the missing service in _meta: %s", gaps)
	}

	call := func(name string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"q": name}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	if got := callText(t, call("svc__lookup")); got != `lookup {"q":"svc__lookup"}` {
		t.Errorf("svc__lookup = %q", got)
	}
	if got := callText(t, call("beta__other")); got != `other {"q":"beta__other"}` {
		t.Errorf("beta__other = %q", got)
	}
	if res := call("beta__lookup"); !res.IsError || callText(t, res) != "beta may not run lookup" {
		t.Errorf("beta__lookup: %+v, want the policy's deny naming beta", res)
	}
	for _, name := range []string{"svc__hidden", "nope__lookup", "lookup", "down__anything"} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}})
		if err == nil && !res.IsError {
			t.Errorf("%s: %+v, want an error", name, res)
		}
	}
	// Each upstream got its own credential, and only it.
	for up, want := range map[*smallUpstream]string{alphaUp: "Bearer alpha-secret", betaUp: "Bearer beta-secret"} {
		auths := up.authorizations()
		if len(auths) == 0 {
			t.Fatal("an upstream was never called")
		}
		for _, a := range auths {
			if a != want {
				t.Fatalf("an upstream got Authorization %q, want %q", a, want)
			}
		}
	}

	// Resources, namespaced.
	res, err := cs.ListResources(ctx, nil)
	if err != nil || len(res.Resources) != 1 || res.Resources[0].URI != "svc__file:///readme" {
		t.Fatalf("federated resources: %+v %v", res, err)
	}
	read, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "svc__file:///readme"})
	if err != nil || len(read.Contents) != 1 || read.Contents[0].Text != "alpha's readme" || read.Contents[0].URI != "svc__file:///readme" {
		t.Fatalf("reading a federated resource: %+v %v", read, err)
	}

	// Prompts, namespaced.
	prompts, err := cs.ListPrompts(ctx, nil)
	if err != nil || len(prompts.Prompts) != 1 || prompts.Prompts[0].Name != "svc__greet" {
		t.Fatalf("federated prompts: %+v %v", prompts, err)
	}
	prompt, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "svc__greet"})
	if err != nil || len(prompt.Messages) != 1 || prompt.Messages[0].Content.(*mcp.TextContent).Text != "hello from alpha" {
		t.Fatalf("a federated prompt: %+v %v", prompt, err)
	}

	// A service's list_changed reaches the runner on the federated stream.
	betaUp.addTool(&mcp.Tool{Name: "late", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}})
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/tools/list_changed on the federated stream")
	}
}

// An explicit session federates the services it selected, nothing else;
// a federated MCP session cannot be used at a service's endpoint, nor a
// service's at the federated one.
func TestFederatedEndpointFollowsTheSession(t *testing.T) {
	_, _, g := federatedGateway(t)
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "beta"), "svc")
	m.url = g.URL + "/v1/mcp"
	m.initialize()
	if names := listedTools(t, m); !slices.Equal(names, []string{"beta__other"}) {
		t.Fatalf("tools of a session that selected beta: %v", names)
	}
	if answer := string(m.call(1, "svc__lookup", `{}`)); !strings.Contains(answer, "Unknown tool") {
		t.Errorf("a tool of a service the session did not select: %s", answer)
	}
	federated := m.sessionID
	m.url = g.URL + "/v1/mcp/beta"
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); status != http.StatusNotFound {
		t.Errorf("the federated MCP session at /v1/mcp/beta: %d, want 404", status)
	}
	m.sessionID = ""
	m.initialize()
	m.url = g.URL + "/v1/mcp"
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); status != http.StatusNotFound {
		t.Errorf("beta's MCP session at /v1/mcp: %d, want 404", status)
	}
	// A runner of the stateless revision is sent to the services' endpoints.
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/v1/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "/v1/mcp/{service}") {
		t.Errorf("a stateless runner at the federated endpoint: %d %s", resp.StatusCode, body)
	}

	// DELETE ends the federated session.
	m.sessionID = federated
	if status := m.delete(); status != http.StatusNoContent {
		t.Errorf("DELETE: %d", status)
	}
	if status, _, _ := m.post(`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`); status != http.StatusNotFound {
		t.Errorf("after DELETE: %d, want 404", status)
	}
}

// A service's request to the runner (elicitation/create) reaches the
// runner through the federated endpoint, and the runner's answer goes back
// to that service; the policy judges the answer as for the service.
func TestFederatedServerRequests(t *testing.T) {
	up := startUpstream(t)
	policies := t.TempDir()
	for name, text := range map[string]string{"request.rego": federationPolicy, "result.rego": allowResults} {
		if err := os.WriteFile(filepath.Join(policies, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: policies, Federation: "separator ."})
	asked := make(chan string, 1)
	cs := g.connectWithToken(t, aliceKey, "/v1/mcp", &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked <- req.Params.Message
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "svc.ask", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, res); got != "elicitation answered: accept" {
		t.Fatalf("svc.ask = %q", got)
	}
	if msg := <-asked; msg != "proceed?" {
		t.Errorf("the runner was asked %q", msg)
	}
}

// Holds: the federated endpoint's standalone stream ends with the toolgate
// session its person ends, as a service's own does.
func TestFederatedStreamEndsWithItsSession(t *testing.T) {
	_, _, g := federatedGateway(t)
	session := g.createSession(t, aliceKey, "beta")
	m := g.raw(t, aliceKey, session, "svc")
	m.url = g.URL + "/v1/mcp"
	m.initialize()
	listedTools(t, m) // the services' sessions start
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	get, body := m.openStream(t, ctx)
	if get.StatusCode != http.StatusOK {
		t.Fatalf("the federated stream: HTTP %d %s", get.StatusCode, body)
	}
	ended := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, get.Body)
		close(ended)
	}()
	if r := g.api(t, http.MethodDelete, "/v1/sessions/"+session, aliceKey, nil); r.StatusCode != http.StatusNoContent {
		t.Fatalf("ending the session: %d %s", r.StatusCode, r.Body)
	}
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the federated stream of the ended session stays open")
	}
}

// The federated initialize tells the model (its instructions) which
// services of the session are not connected, and where the person connects
// each: many clients show nothing else of why a service's tools are
// missing. Once connected, the next tools/list lists them.
func TestFederatedInitializeNamesServicesNotConnected(t *testing.T) {
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	shared := startSmallUpstream(t, "shared", &mcp.Tool{Name: "lookup", Description: "Looks up.", Annotations: readOnly})
	mine := startSmallUpstream(t, "mine", &mcp.Tool{Name: "mine", Description: "Mine.", Annotations: readOnly})
	policies := t.TempDir()
	for name, text := range map[string]string{"request.rego": federationPolicy, "result.rego": allowResults} {
		if err := os.WriteFile(filepath.Join(policies, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, gatewayConfig{Upstream: shared.URL, RequestPolicy: policies, Federation: " ",
		Tools: "lookup", Auth: `header Authorization "Bearer shared-secret"`,
		Services: `service personal {
			title "Personal tracker"
			url ` + mine.URL + `
			allow_http
			tools mine
			auth bearer
		}`})
	cs := g.connectWithToken(t, aliceKey, "/v1/mcp", nil)
	text := cs.InitializeResult().Instructions
	for _, want := range []string{"SERVICE__NAME", "personal (Personal tracker)", g.URL + "/console/connect/personal?for="} {
		if !strings.Contains(text, want) {
			t.Errorf("the federated initialize's instructions lack %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "svc (") {
		t.Errorf("the instructions name the connected service svc as missing:\n%s", text)
	}
	if names := toolNames(t, cs); !slices.Equal(names, []string{"svc__lookup"}) {
		t.Fatalf("premise: before the connection the federated tools are %v", names)
	}

	if r := g.api(t, http.MethodPut, "/v1/connections/personal", aliceKey, []byte(`{"token":"alice-personal-token"}`)); r.StatusCode != http.StatusNoContent {
		t.Fatalf("storing the personal token: %d %s", r.StatusCode, r.Body)
	}
	if names := toolNames(t, cs); !slices.Equal(names, []string{"svc__lookup", "personal__mine"}) {
		t.Errorf("after the connection the same session lists %v", names)
	}
	again := g.connectWithToken(t, aliceKey, "/v1/mcp", nil)
	if text := again.InitializeResult().Instructions; strings.Contains(text, "personal") {
		t.Errorf("after the connection the instructions still name the service:\n%s", text)
	}
}
