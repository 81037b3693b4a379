package integration

// Tests breaking f27f3c0 (a cancellation's record made before sending, moved
// when post re-initializes; a standalone stream resumed anew; the same-id
// exemption only for bridged programs) and 61b398a (a link's relayed ids).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Attack (fixed): the fix of includeContext (mcp2026.RequiredCapabilityIn: it needs
// sampling.context only from 2025-11-25) reaches declared (an upstream of
// an earlier revision asking on its stream) but not the translated path:
// a runner of 2025-06-18 in front of an upstream of 2026-07-28 gets the
// upstream's input requests as server→client requests (askTranslated),
// and those are checked with mcp2026.RequiredCapability, i.e. with the
// rules of 2026-07-28, against the capabilities the runner declared under
// 2025-06-18, where sampling.context does not exist. A plain
// sampling/createMessage with includeContext "thisServer" — a member of
// the runner's revision, covered by its sampling capability — ends the
// runner's call with "the upstream needs sampling, which this client did
// not declare (capabilities: context)". Severity: low (legitimate use
// broken: older runners cannot serve such upstreams; nothing gets
// through). Fix: in askTranslated use
// mcp2026.RequiredCapabilityIn(call.ProtocolVersion (the runner's
// revision), caps, …), as declared does with the asking session's.
// Fixed: askTranslated asks RequiredCapabilityIn with the runner's
// revision (call.ProtocolVersion). (The harness sent 2025-11-25 in every
// session whatever the test set; it sends the test's header now.)
func TestServerRequestFix4AttackTranslatedIncludeContextRefusedToOlderRunner(t *testing.T) {
	up := saStartModern(t, `["2026-07-28"]`, `[{"name":"echo","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},{"name":"plain","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]`,
		func(params gjson.Result) (int, string) {
			if params.Get("inputResponses").Exists() {
				return http.StatusOK, `"result":{"resultType":"complete","content":[{"type":"text","text":"done"}]}`
			}
			context := `"includeContext":"thisServer",`
			if params.Get("name").String() == "plain" {
				context = ""
			}
			return http.StatusOK, `"result":{"resultType":"input_required","inputRequests":{"draft":{"method":"sampling/createMessage",` +
				`"params":{"maxTokens":50,` + context + `"messages":[{"role":"user","content":{"type":"text","text":"F4-CONTEXT"}}]}}},"requestState":"s1"}`
		})
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "echo plain"})
	m := srRunnerAt(t, g, "2025-06-18", `{"sampling":{}}`)
	asked := func(id int, tool string) []byte {
		c := faStream(t, m, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{}}}`, id, tool))
		var first []byte
		select {
		case msg, ok := <-c:
			if !ok {
				t.Fatal("the call's stream ended with no message")
			}
			first = msg
		case <-time.After(10 * time.Second):
			t.Fatal("no message in 10s")
		}
		go func() {
			for range c {
			}
		}()
		return first
	}
	if plain := asked(1, "plain"); gjson.GetBytes(plain, "method").String() != "sampling/createMessage" {
		t.Fatalf("control: the runner was not asked even a plain sampling/createMessage: %s", plain)
	}
	first := asked(2, "echo")
	t.Logf("the 2025-06-18 runner got: %s", first)
	if gjson.GetBytes(first, "method").String() != "sampling/createMessage" {
		t.Errorf("a runner of 2025-06-18 that declared sampling was not asked a sampling/createMessage with includeContext \"thisServer\" (a plain member of its revision) of an upstream of 2026-07-28; it got: %s", first)
	}
}

// f4AskProgram is a stdio MCP program: its tool "ask" sends an
// elicitation/create under id 1 (the first request of its own, as in
// every process) and answers the call with what it got for it, tagged
// with its process id.
// f4ProgramEnv puts this test binary in the mode of f4Serve, a program
// speaking MCP over stdin and stdout. It takes over in init.
const f4ProgramEnv = "TOOLGATE_F4_PROGRAM"

func init() {
	if os.Getenv(f4ProgramEnv) != "" {
		f4Serve()
		os.Exit(0)
	}
}

// f4Serve is an MCP server on stdin/stdout with one tool, ask: it asks its
// client elicitation/create under the id 1, and answers the call with the
// answer it got and its process id.
func f4Serve() {
	send := func(s string) { _, _ = os.Stdout.WriteString(s + "\n") }
	pid := strconv.Itoa(os.Getpid())
	call := ""
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := in.Text()
		id, method := gjson.Get(line, "id"), gjson.Get(line, "method").String()
		switch {
		case method == "" && id.Raw == "1" && call != "":
			text, _ := json.Marshal("pid " + pid + " got " + line)
			send(`{"jsonrpc":"2.0","id":` + call + `,"result":{"content":[{"type":"text","text":` + string(text) + `}]}}`)
			call = ""
		case method == "initialize":
			send(`{"jsonrpc":"2.0","id":` + id.Raw + `,"result":{"protocolVersion":` + gjson.Get(line, "params.protocolVersion").Raw + `,"capabilities":{"tools":{}},"serverInfo":{"name":"f4","version":"1"}}}`)
		case method == "tools/list":
			send(`{"jsonrpc":"2.0","id":` + id.Raw + `,"result":{"tools":[{"name":"ask","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}}`)
		case method == "ping":
			send(`{"jsonrpc":"2.0","id":` + id.Raw + `,"result":{}}`)
		case method == "tools/call":
			call = id.Raw
			send(`{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"message":"who?","requestedSchema":{"type":"object","properties":{"who":{"type":"string"}}}}}`)
		case method != "" && id.Exists():
			send(`{"jsonrpc":"2.0","id":` + id.Raw + `,"error":{"code":-32601,"message":"unknown"}}`)
		}
	}
}

// Attack (fixed): (end to end, TestFix4AttackLinkTagsRepeatAcrossBridges in
// internal/mcpbridge) the runner's answer to an elicitation a stdio program
// asked on replica A is given to another process's elicitation on replica
// B. Each replica runs its own program for the MCP session, under the same
// upstream session id (the MCP session's Ref: gateway.UpstreamSession),
// and each relays its program's first request of its own as "1:n1" (the
// first link of each replica's Bridge: Link.tag counts from 1 per
// Bridge). The runner's call 5 on A gets A's question; its call 6 lands
// on B, whose program asks its own; the runner answers A's question only,
// on B: the gateway relays it (same Ref, a bridged service) and B's bridge
// finds "1:n1" among its own link's requests and hands B's program
// {"action":"accept","content":{"who":"answer-for-A"}} as the answer to
// the question the runner never answered. Severity: medium (an answer —
// an elicitation's "accept", a sampling result — applied to a question
// the user never saw, as in fix3's same-session-id attack; within one
// user's MCP session; needs two replicas, or a runtime a reload remakes).
// Fix: make link tags unique across Bridges and processes (a random
// per-Bridge prefix, e.g. gateway.NewID()[:8] + counter), so an answer
// of another replica's program names no request here.
// Fixed: a bridge's link tags start with a random nonce of the bridge's.
func TestServerRequestFix4AttackBridgedAnswerCrossesReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the toolgate binary")
	}
	bin := toolgateBinary(t)
	data := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	block := fmt.Sprintf(`state_secret %s
		storage file_system %s
		cipher local %s/cipher.key
		auth {
			api_key %s %s
			api_key %s %s
		}
		service svc {
			command %s -test.run=^$
			env %s 1
			tools ask
		}`, testStateSecret, filepath.Join(data, "storage"), data, hashKey(aliceKey), alice, hashKey(bobKey), bob, exe, f4ProgramEnv)
	policies := aaPolicies(t, "", "") // answers to elicitation/create allowed
	a := startReplicaWith(t, bin, block, data, policies)
	b := startReplicaWith(t, bin, block, data, policies)
	m := aaRunner(t, a.gateway, aliceKey, a.createSession(t, aliceKey, "svc"), `{"elicitation":{}}`)
	onB := *m
	onB.url = b.URL + "/v1/mcp/svc"
	onB.transport = nil
	question := func(c <-chan json.RawMessage) []byte {
		for {
			msg := faNext(t, c)
			if gjson.GetBytes(msg, "method").String() == "elicitation/create" {
				return msg
			}
			if gjson.GetBytes(msg, "id").Exists() && !gjson.GetBytes(msg, "method").Exists() {
				t.Fatalf("the call ended without asking: %s", msg)
			}
		}
	}
	c1 := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ask","arguments":{}}}`)
	q1 := question(c1)
	c2 := faStream(t, &onB, `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"ask","arguments":{}}}`)
	q2 := question(c2)
	t.Logf("asked on A: %s; on B: %s", q1, q2)
	status, body := srPost(t, &onB, `{"jsonrpc":"2.0","id":`+gjson.GetBytes(q1, "id").Raw+`,"result":{"action":"accept","content":{"who":"answer-for-A"}}}`, nil)
	t.Logf("the answer to A's question, sent on B: HTTP %d %.200s", status, body)
	var final []byte
	deadline := time.After(8 * time.Second)
wait:
	for {
		select {
		case msg, ok := <-c2:
			if !ok {
				break wait
			}
			if gjson.GetBytes(msg, "id").Raw == "6" {
				final = msg
				break wait
			}
		case <-deadline:
			break wait
		}
	}
	t.Logf("B's call: %s", final)
	go func() {
		for msg := range c1 {
			if gjson.GetBytes(msg, "id").Raw == "5" {
				t.Logf("A's call: %s", msg)
			}
		}
	}()
	time.Sleep(time.Second)
	// The runner never answered B's question: whatever B's program got
	// for its request 1 is the answer to A's (or toolgate's policy
	// verdict on it).
	if strings.Contains(string(final), "got {") || strings.Contains(string(final), "answer-for-A") {
		t.Errorf("the runner's answer to the question program A (replica A) asked reached program B (replica B) as the answer to its own question, which the runner never answered: %s", final)
	}
}
