package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// copyPolicies copies a policy directory's top-level files to a temporary
// directory the test may edit.
func copyPolicies(t *testing.T, from string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// toolNames lists the names of the tools the session sees.
func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, tool := range list.Tools {
		n = append(n, tool.Name)
	}
	return n
}

func toolError(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return err.Error(), true
	}
	return callText(t, res), res.IsError
}

// The shipped default policies, end to end through the gateway.
func TestDefaultPolicies(t *testing.T) {
	dir := copyPolicies(t, filepath.Join("..", "policies"))
	// Pin pinned_echo's project through the settings, as an operator would:
	// in the site directory.
	site := "toolgate:\n  settings:\n    services:\n      svc:\n        pin_arguments:\n          pinned_echo:\n            project: sandbox\n"
	if err := os.MkdirAll(filepath.Join(dir, "site"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "site", "data.yaml"), []byte(site), 0o644); err != nil {
		t.Fatal(err)
	}

	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir})
	aliceCS := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	carolCS := g.connect(t, carolKey, g.createSession(t, carolKey, "svc"), "svc", nil)

	// Read-only: allowed.
	if text, isErr := toolError(t, aliceCS, "echo", map[string]any{"text": "x"}); isErr || text != `{"text":"x"}` {
		t.Errorf("echo: %q", text)
	}
	// Unmarked: approval required.
	if text, _ := toolError(t, aliceCS, "gated_tool", map[string]any{}); !strings.Contains(text, "approval required") {
		t.Errorf("gated_tool: %q, want approval required", text)
	}
	// Destructive: denied for alice, with a reason; gated for an admin.
	if text, isErr := toolError(t, aliceCS, "drop_table", map[string]any{}); !isErr || !strings.Contains(text, "destructive") {
		t.Errorf("drop_table as alice: %q, want a deny naming destructiveHint", text)
	}
	if text, _ := toolError(t, carolCS, "drop_table", map[string]any{}); !strings.Contains(text, "approval required") {
		t.Errorf("drop_table as an admin: %q, want approval required", text)
	}
	// A tool alice can never call is not listed for her; an admin sees it.
	names := func(cs *mcp.ClientSession) []string { return toolNames(t, cs) }
	if slices.Contains(names(aliceCS), "drop_table") || !slices.Contains(names(carolCS), "drop_table") {
		t.Errorf("drop_table visible to alice %v / carol %v", names(aliceCS), names(carolCS))
	}
	// Argument rewrite from the settings.
	if text, _ := toolError(t, aliceCS, "pinned_echo", map[string]any{"text": "y", "project": "prod"}); text != `{"text":"y","project":"sandbox"}` {
		t.Errorf("pinned_echo: upstream got %q, want project pinned to sandbox", text)
	}
	// Result redaction of a secret shape.
	if text, _ := toolError(t, aliceCS, "leak", map[string]any{}); strings.Contains(text, "AKIAIOSFODNN7EXAMPLE") || !strings.Contains(text, "REDACTED") {
		t.Errorf("leak: %q, want the access key redacted", text)
	}
	// Every result names its decision in _meta, as unchanged ones do too.
	for name, want := range map[string]string{"echo": "allow", "leak": "allow", "drop_table": "deny"} {
		res, err := aliceCS.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		d, _ := res.Meta["toolgate/decision"].(map[string]any)
		if id, _ := d["id"].(string); id == "" || d["action"] != want {
			t.Errorf("%s: _meta %v, want the decision (%s)", name, res.Meta, want)
		}
	}
}

// A tool's annotations are the upstream's claims. The defaults apply MCP's
// defaults where they are missing (an unannotated tool may be destructive)
// and believe the registry over the upstream; in read-only mode only the
// registry's word makes a tool read-only.
func TestToolAnnotationsTrustTheRegistry(t *testing.T) {
	dir := copyPolicies(t, filepath.Join("..", "policies"))
	data := `{"toolgate": {"settings": {"services": {"svc": {"read_only": true}}}}}`
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t)
	tools := "echo delete_all_tickets unannotated"
	names := func(cs *mcp.ClientSession) []string { return toolNames(t, cs) }

	// Read-only mode: echo is declared read-only; delete_all_tickets is
	// read-only only by its upstream's word.
	g := startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: dir, Tools: tools, ServiceExtra: "tool echo read_only"})
	for _, key := range []string{aliceKey, carolKey} {
		cs := g.connect(t, key, g.createSession(t, key, "svc"), "svc", nil)
		if text, isErr := toolError(t, cs, "echo", map[string]any{"text": "x"}); isErr || text != `{"text":"x"}` {
			t.Errorf("echo: %q", text)
		}
		if text, isErr := toolError(t, cs, "delete_all_tickets", map[string]any{}); !isErr || !strings.Contains(text, "not declared read-only in its registry entry") {
			t.Errorf("delete_all_tickets in read-only mode: %q, want a deny", text)
		}
		if n := names(cs); !slices.Equal(n, []string{"echo"}) {
			t.Errorf("tools/list in read-only mode: %v, want only echo", n)
		}
	}

	// Normal mode: the upstream's claim skips approval unless the registry
	// says otherwise; a tool without annotations may be destructive.
	g = startGateway(t, gatewayConfig{Upstream: up.URL, RequestPolicy: filepath.Join("..", "policies"), Tools: tools,
		ServiceExtra: "tool delete_all_tickets destructive"})
	alice := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	carol := g.connect(t, carolKey, g.createSession(t, carolKey, "svc"), "svc", nil)
	if text, isErr := toolError(t, alice, "delete_all_tickets", map[string]any{}); !isErr || !strings.Contains(text, "as declared in the registry") {
		t.Errorf("delete_all_tickets declared destructive: %q, want a deny", text)
	}
	if text, isErr := toolError(t, alice, "unannotated", map[string]any{}); !isErr || !strings.Contains(text, "by MCP's default") {
		t.Errorf("unannotated as alice: %q, want a deny", text)
	}
	if text, _ := toolError(t, carol, "unannotated", map[string]any{}); !strings.Contains(text, "approval required") {
		t.Errorf("unannotated as an admin: %q, want approval required", text)
	}
	if n := names(alice); !slices.Equal(n, []string{"echo"}) {
		t.Errorf("tools/list for alice: %v, want only echo", n)
	}
}

// Editing the policy under a running gateway changes decisions without a
// restart; a broken edit keeps the last good policy.
func TestPolicyEditTakesEffectWithoutRestart(t *testing.T) {
	dir := copyPolicies(t, testdataPath(t, "policy"))
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL,
		RequestPolicy: dir, PolicyOptions: "reload_interval 50ms", ResultPolicy: dir})
	cs := g.connect(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc", nil)
	if text, isErr := toolError(t, cs, "forbidden_tool", map[string]any{}); !isErr || !strings.Contains(text, "forbidden in tests") {
		t.Fatalf("before the edit: %q", text)
	}
	rego := filepath.Join(dir, "request.rego")
	orig, _ := os.ReadFile(rego)
	edited := strings.Replace(string(orig), `input.tool.name == "forbidden_tool"`, `input.tool.name == "no_such_tool"`, 1)
	if err := os.WriteFile(rego, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		text, isErr := toolError(t, cs, "forbidden_tool", map[string]any{"text": "now"})
		if !isErr && text == `{"text":"now"}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edited policy never took effect: %q", text)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.WriteFile(rego, []byte(edited+"\ndecision := {\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // several reload intervals
	if text, isErr := toolError(t, cs, "forbidden_tool", map[string]any{"text": "still"}); isErr || text != `{"text":"still"}` {
		t.Fatalf("after a broken edit: %q, want the last good policy's decision", text)
	}
}

// A policy engine shared across a reload logs through the new
// configuration's logger, so a broken policy is reported where the new
// log outputs go.
func TestSharedPolicyEngineLogsToTheCurrentConfig(t *testing.T) {
	up := startUpstream(t)
	dir := copyPolicies(t, testdataPath(t, "policy"))
	logs := t.TempDir()
	cfg := gatewayConfig{Upstream: up.URL, RequestPolicy: dir, ResultPolicy: dir, PolicyOptions: "reload_interval 50ms"}
	cfg.Log = "output file " + logs + "/first.log"
	startGateway(t, cfg)
	cfg.Log = "output file " + logs + "/second.log"
	startGateway(t, cfg)
	if err := os.WriteFile(filepath.Join(dir, "request.rego"), []byte("package toolgate.request\n\nbroken :="), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the load failure in the second config's log", func() bool {
		data, _ := os.ReadFile(filepath.Join(logs, "second.log"))
		return strings.Contains(string(data), "policy load failed")
	})
}

// An upstream that decodes arguments with Go's encoding/json matches keys
// ignoring case and folding Unicode, where the policy reads them exactly. A
// key spelled like a declared parameter in another case, or one the policy's
// rewrite would leave next to its own spelling, is refused.
func TestArgumentKeysThatFoldAreRefused(t *testing.T) {
	dir := copyPolicies(t, filepath.Join("..", "policies"))
	data := `{"toolgate": {"settings": {"services": {"svc": {"pin_arguments": {"set_visibility": {"visibility": "private"}}}}}}}`
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	rule := "package toolgate.request\n\ndeny contains \"ticket SECRET-1 is off limits\" if input.arguments.ticket_id == \"SECRET-1\"\n"
	if err := os.WriteFile(filepath.Join(dir, "secret_ticket.rego"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, m := aliceSession(t, gatewayConfig{RequestPolicy: dir})
	m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`) // the gateway learns the tool's inputSchema

	call := func(args string) string {
		t.Helper()
		_, _, msgs := m.post(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"set_visibility","arguments":` + args + `}}`)
		if len(msgs) != 1 {
			t.Fatalf("%s: %d messages", args, len(msgs))
		}
		return string(msgs[0])
	}
	// The pin and the deny rule work on the exact spelling.
	if got := call(`{"ticket_id":"T-1","visibility":"public"}`); !strings.Contains(got, "T-1 is private") {
		t.Errorf("pinned call: %s", got)
	}
	if got := call(`{"ticket_id":"SECRET-1"}`); !strings.Contains(got, "off limits") {
		t.Errorf("denied call: %s", got)
	}
	for _, args := range []string{
		`{"TICKET_ID":"SECRET-1"}`,                       // escapes a rule on ticket_id
		`{"ticket_id":"T-2","vis\u0131bility":"public"}`, // U+0131 upper-cases to I: decoders that compare upper-cased keys fold it
		`{"ticket_id":"T-2","viſibility":"public"}`,      // U+017F: undoes the pin
		`{"ticket_id":"T-2","VISIBILITY":"public"}`,
	} {
		got := call(args)
		if strings.Contains(got, "SECRET-1 is") || strings.Contains(got, "is public") {
			t.Errorf("%s reached the upstream unchecked: %s", args, got)
		}
		if !strings.Contains(got, "differs from the parameter") {
			t.Errorf("%s: %s, want it refused", args, got)
		}
	}
}
