package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/testproc"
)

// The tasks upstream is built with the TypeScript SDK, pinned here with the
// zod it takes its schemas from: the Go SDK does not implement tasks.
const (
	tasksSDKVersion = "1.32.2"
	tasksZodVersion = "4.6.7"
)

// startTasksUpstream runs integration/tasksserver/server.mjs, a malicious
// MCP server with a task tool, and returns its URL. The SDK is installed
// from npm once into the cache.
func startTasksUpstream(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join("tasksserver", "server.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	return runTasksScript(t, tasksScript(t, script))
}

// tasksScript writes a script of the TypeScript SDK beside the SDK (which it
// installs from npm once into the cache), where Node looks for what the
// script imports, and returns its path.
func tasksScript(t *testing.T, text []byte) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		requirePeer(t, "Node.js (node and npm) is needed for the tasks upstream, built with the MCP TypeScript SDK")
	}
	dir := filepath.Join(cacheDir(t), "tasks-upstream-sdk-"+tasksSDKVersion)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tasks-upstream-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp)
		cmd := exec.Command("npm", "install", "--prefix", tmp, "--no-audit", "--no-fund", "--loglevel=error",
			"@modelcontextprotocol/sdk@"+tasksSDKVersion, "zod@"+tasksZodVersion)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm install @modelcontextprotocol/sdk@%s: %v\n%s", tasksSDKVersion, err, out)
		}
		if err := os.Rename(tmp, dir); err != nil && !os.IsExist(err) {
			if _, statErr := os.Stat(dir); statErr != nil {
				t.Fatal(err)
			}
		}
	}
	run, err := os.MkdirTemp(dir, "run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	script := filepath.Join(run, "server.mjs")
	if err := os.WriteFile(script, text, 0o644); err != nil {
		t.Fatal(err)
	}
	return script
}

// runTasksScript runs a tasks script over HTTP, with env added to its
// environment, and returns its URL once it listens.
func runTasksScript(t *testing.T, script string, env ...string) string {
	t.Helper()
	cmd := exec.Command("node", script)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs testproc.Output
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("tasks upstream output:\n%s", logs.String())
		}
	})
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				port <- p
			}
		}
	}()
	select {
	case p := <-port:
		return "http://127.0.0.1:" + p + "/mcp"
	case <-time.After(60 * time.Second):
		t.Fatalf("the tasks upstream did not start listening:\n%s", logs.String())
	}
	return ""
}

// rpc sends one request of the runner and returns its answer (the last
// message of the answer).
func (m *rawMCP) rpc(body string) map[string]any {
	m.t.Helper()
	status, _, msgs := m.post(body)
	if status != http.StatusOK || len(msgs) == 0 {
		m.t.Fatalf("%s: HTTP %d, %d messages", body, status, len(msgs))
	}
	m.seen = append(m.seen, msgs...)
	var answer map[string]any
	if err := json.Unmarshal(msgs[len(msgs)-1], &answer); err != nil {
		m.t.Fatal(err)
	}
	return answer
}

// dig returns the value at path in v ("" keys of objects, indexes of
// arrays as numbers in text).
func dig(v any, path ...string) any {
	for _, k := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			var i int
			if _, err := fmt.Sscan(k, &i); err != nil || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// A task-augmented tools/call (MCP 2025-11-25) defers the tool's result to
// tasks/result. What the task yields is decided as the result of the call
// that created it — same input (tool, arguments), same rules: a secret is
// redacted, an instruction to the model withheld, a service's results
// reviewed by a person (and the approved result released to the retried
// tasks/result). The task's own state is inspected too, and a request
// naming a task toolgate did not see created is refused. The upstream is a
// TypeScript SDK server with tasks.
func TestTaskResultsAreDecidedLikeTheirCalls(t *testing.T) {
	upURL := startTasksUpstream(t)
	logFile := filepath.Join(t.TempDir(), "gateway.log")
	dir := channelPolicies(t, `{"toolgate": {"settings": {"services": {"svc": {"review_results": true}}}}}`)
	g := startGateway(t, gatewayConfig{Upstream: upURL, RequestPolicy: dir, Tools: "build", Log: "output file " + logFile})
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()

	// A direct call is reviewed.
	direct := m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"build","arguments":{"mode":"plain"}}}`)
	if dig(direct, "result", "isError") != true || dig(direct, "result", "_meta", "toolgate/approval", "id") == nil {
		t.Fatalf("a direct call on a reviewed service: %v", direct)
	}

	// A task: its state is inspected and passes; what it yields is reviewed.
	created := m.rpc(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"build","arguments":{"mode":"secret"},"task":{"ttl":60000}}}`)
	id, _ := dig(created, "result", "task", "taskId").(string)
	if id == "" || dig(created, "result", "task", "statusMessage") != "started with [REDACTED:aws_access_key_id]" ||
		dig(created, "result", "_meta", "io.modelcontextprotocol/model-immediate-response") != "Building" ||
		dig(created, "result", "_meta", "toolgate/decision", "action") != "allow" {
		t.Errorf("the created task: %v", created)
	}
	if id == "" {
		// A runner learns a task's id from tasks/list too.
		id, _ = dig(m.rpc(`{"jsonrpc":"2.0","id":"list","method":"tasks/list"}`), "result", "tasks", "0", "taskId").(string)
	}
	waitTask := func(id string) {
		t.Helper()
		for i := range 200 {
			got := m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":"get-%d","method":"tasks/get","params":{"taskId":%q}}`, i, id))
			if dig(got, "result", "status") == "completed" {
				return
			}
			if dig(got, "result") == nil {
				t.Fatalf("tasks/get: %v", got)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("task %s never completed", id)
	}
	waitTask(id)
	taskResult := fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"tasks/result","params":{"taskId":%q}}`, id)
	withheld := m.rpc(taskResult)
	approvalID, _ := dig(withheld, "result", "_meta", "toolgate/approval", "id").(string)
	if dig(withheld, "result", "isError") != true || approvalID == "" ||
		!strings.Contains(fmt.Sprint(dig(withheld, "result", "content", "0", "text")), "withheld pending approval") {
		t.Fatalf("the deferred result on a reviewed service: %v", withheld)
	}
	r := g.api(t, http.MethodGet, "/v1/approvals/"+approvalID, aliceKey, nil)
	if r.StatusCode != http.StatusOK || !strings.Contains(string(r.Body), `"tool":"build"`) || !strings.Contains(string(r.Body), `[REDACTED:aws_access_key_id]`) ||
		strings.Contains(string(r.Body), leakKey) {
		t.Fatalf("the approval of the deferred result: %d %s", r.StatusCode, r.Body)
	}
	if r := g.decide(t, aliceKey, approvalID, true, "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("approving: %d %s", r.StatusCode, r.Body)
	}
	released := m.rpc(taskResult)
	if dig(released, "result", "isError") == true || dig(released, "result", "content", "0", "text") != "built with [REDACTED:aws_access_key_id]" {
		t.Fatalf("the released deferred result: %v", released)
	}

	// An instruction to the model in the deferred result: withheld.
	created = m.rpc(`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"build","arguments":{"mode":"inject"},"task":{}}}`)
	id2, _ := dig(created, "result", "task", "taskId").(string)
	if id2 == "" {
		t.Fatalf("the second task: %v", created)
	}
	waitTask(id2)
	denied := m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":5,"method":"tasks/result","params":{"taskId":%q}}`, id2))
	if dig(denied, "result", "isError") != true ||
		!strings.Contains(fmt.Sprint(dig(denied, "result", "content", "0", "text")), "withheld by policy: the upstream tried to instruct the model") {
		t.Fatalf("the deferred result with an instruction: %v", denied)
	}

	// A task toolgate did not see created is refused, whatever it is.
	for _, method := range []string{"tasks/result", "tasks/get", "tasks/cancel"} {
		unknown := m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":6,"method":%q,"params":{"taskId":"not-a-task-of-this-session"}}`, method))
		if dig(unknown, "error", "code") != float64(-32602) || !strings.Contains(fmt.Sprint(dig(unknown, "error", "message")), "knows no task") {
			t.Errorf("%s of an unknown task: %v", method, unknown)
		}
	}
	// tasks/list shows the tasks created through this MCP session: not the
	// one the upstream made of the direct call, whose id the runner never got.
	list := m.rpc(`{"jsonrpc":"2.0","id":7,"method":"tasks/list"}`)
	if tasks, _ := dig(list, "result", "tasks").([]any); len(tasks) != 2 || dig(tasks, "0", "taskId") != id || dig(tasks, "1", "taskId") != id2 {
		t.Errorf("tasks/list: %v; want %s and %s", list, id, id2)
	}

	assertClean(t, rawStrings(m.seen))
	var entries []map[string]any
	waitFor(t, "the audit entries", func() bool {
		entries = auditEntries(t, logFile)
		return findAudit(entries, map[string]string{"method": "tasks/result", "action": "deny"}) != nil
	})
	for _, want := range []map[string]string{
		{"channel": "result", "method": "tools/call", "tool": "build", "action": "ask"},
		{"channel": "task", "method": "tools/call", "tool": "build", "action": "allow"},
		{"channel": "task", "method": "tasks/get", "tool": "build", "action": "allow"},
		{"channel": "result", "method": "tasks/result", "tool": "build", "action": "ask"},
		{"channel": "result", "method": "tasks/result", "tool": "build", "action": "deny"},
		{"channel": "result", "method": "tasks/list", "action": "allow"},
	} {
		if findAudit(entries, want) == nil {
			t.Errorf("no audit entry %v", want)
		}
	}
}

func rawStrings(msgs []json.RawMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m)
	}
	return out
}

// A task of a tool that left the allowlist since it began (a reload) does
// not deliver its result: the call would not run now.
func TestTaskResultOfAToolNoLongerAllowed(t *testing.T) {
	upURL := startTasksUpstream(t)
	port := freePort(t)
	cfg := gatewayConfig{Upstream: upURL, Tools: "build"}
	g := startGatewayOnPort(t, port, cfg)
	cfg.DataDir = g.DataDir
	m := g.raw(t, aliceKey, g.createSession(t, aliceKey, "svc"), "svc")
	m.initialize()
	created := m.rpc(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"build","arguments":{"mode":"plain"},"task":{"ttl":60000}}}`)
	id, _ := dig(created, "result", "task", "taskId").(string)
	if id == "" {
		t.Fatalf("no task: %v", created)
	}
	cfg.Tools = "echo"
	startGatewayOnPort(t, port, cfg)
	got := m.rpc(fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tasks/result","params":{"taskId":%q}}`, id))
	if dig(got, "error", "code") != float64(-32602) || !strings.Contains(fmt.Sprint(dig(got, "error", "message")), "no longer allows") {
		t.Errorf("the result of a task of a tool no longer allowed: %v", got)
	}
}
