package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// Tests breaking f2733f2 (server→client requests relayed only when the
// runner declared the capability they need).

// capsAttackStream is an intercept that answers a tools/call by writing
// each of asks (raw JSON-RPC requests) on the call's stream, then, after
// wait returns, the call's answer ("end").
func capsAttackStream(asks func() []string, wait func()) func(w http.ResponseWriter, r *http.Request, b []byte) bool {
	return func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost || gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		sseStart(w)
		for _, a := range asks() {
			fmt.Fprintf(w, "data: %s\n\n", a)
		}
		flush(w)
		wait()
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"end\"}]}}\n\n", gjson.GetBytes(b, "id").Raw)
		flush(w)
		return true
	}
}

// Attack (fixed): an upstream streams server→client requests the runner did not
// declare the capability of (roots/list to a runner without roots, which
// most runners are) and stalls the POSTs that carry toolgate's refusals.
// deliver refuses each at once with refuseServerRequest → h.background: a
// goroutine and an upstream HTTP request of its own per refused request,
// unbounded, each held for up to the service's timeout, and a Warn log
// line each. One upstream (one tools/call) makes toolgate hold as many
// goroutines and TCP connections as it sends cheap SSE events — the file
// descriptors every other service and runner share — and floods the log.
// The change made this path the common one: before it, such requests went
// to the runner and at most MaxPendingServerRequests were pending per MCP
// session; the stdio/legacy bridge bounds its own refusals to 8 in flight
// (mcpbridge.maxOwnSends, TestLegacyAttackPingFloodOpensUnboundedPosts).
// Severity: medium (denial of service of the gateway by an upstream).
// Fix: bound the refusals in flight (per upstream session or per service,
// as Link.sendLater does: drop those past the limit — the upstream times
// out on its own), and rate-limit the "refused a server request" log.
// Fixed: at most maxRefusals (8) refusals of an MCP session are in flight
// (mcpproxy refusals.go); past them a request is dropped unanswered.
func TestCapsAttackUndeclaredRequestFloodOpensUnboundedRefusals(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`) // no roots
	const asks = 300
	release := make(chan struct{})
	var inflight, peak, refusals atomic.Int32
	var once sync.Once
	stop := func() { once.Do(func() { close(release) }) }
	defer stop()
	inner := capsAttackStream(func() []string {
		out := make([]string, asks)
		for i := range out {
			out[i] = fmt.Sprintf(`{"jsonrpc":"2.0","id":"rf-%d","method":"roots/list"}`, i)
		}
		return out
	}, func() {})
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method == http.MethodPost && strings.HasPrefix(gjson.GetBytes(b, "id").String(), "rf-") && gjson.GetBytes(b, "error").Exists() {
			refusals.Add(1)
			n := inflight.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			defer inflight.Add(-1)
			select {
			case <-release:
			case <-r.Context().Done():
			case <-time.After(15 * time.Second):
			}
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		return inner(w, r, b)
	})
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	for msg := range c {
		if gjson.GetBytes(msg, "method").String() == "roots/list" {
			t.Fatalf("the runner was asked roots/list, which it did not declare: %s", msg)
		}
	}
	// Wait for the refusals in flight to stop growing (at most 4 s).
	last, stable := int32(-1), 0
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline) && stable < 10; time.Sleep(50 * time.Millisecond) {
		if p := peak.Load(); p == last {
			stable++
		} else {
			last, stable = p, 0
		}
	}
	t.Logf("%d refused requests, %d refusals at the upstream, at most %d in flight at once", asks, refusals.Load(), peak.Load())
	const bound = 16
	if p := peak.Load(); p > bound {
		t.Errorf("toolgate held %d refusals of undeclared server requests in flight at once (one goroutine and one TCP connection each); want at most %d", p, bound)
	}
	stop()
}

// capsAttackCall runs one tools/call of m ("echo") against an upstream
// that asks asks (raw requests) on the call's stream, answering each
// request the runner is sent with an empty result, and returns the
// requests the runner got, by their params' marker "k".
func capsAttackCall(t *testing.T, up *upstream, m *rawMCP, name string, asks ...string) []string {
	t.Helper()
	up.setIntercept(capsAttackStream(func() []string { return asks }, func() { time.Sleep(500 * time.Millisecond) }))
	c := faStream(t, m, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"`+name+`","arguments":{"text":"x"}}}`)
	var got []string
	for msg := range c {
		if gjson.GetBytes(msg, "method").String() != "" && gjson.GetBytes(msg, "id").Exists() {
			got = append(got, gjson.GetBytes(msg, "params._meta.k").String())
			srPost(t, m, `{"jsonrpc":"2.0","id":`+gjson.GetBytes(msg, "id").Raw+`,"result":{"role":"assistant","content":{"type":"text","text":"ok"},"model":"m"}}`, nil)
		}
	}
	return got
}

// Attack (fixed): sampling/createMessage with includeContext "thisServer" or
// "allServers" reaches a runner that declared sampling without
// sampling.context. The 2025-11-25 schema: those values are for clients
// that declare ClientCapabilities.sampling.context ("Servers SHOULD only
// use these values if the client declares" it); "allServers" asks the
// runner's host to put what its other MCP servers said into a prompt the
// upstream reads back — the cross-server context a runner that did not
// declare it does not expect to be asked for. declared() reads only
// "tools" among the sub-capabilities of sampling.
// Severity: low (SHOULD-level; a host that does not support context
// ignores it, one that does and did not declare it may not).
// Fix: in mcp2026.RequiredCapability, an includeContext other than
// "none" (read with memberFold, as tools is) needs sampling.context.
// Fixed so.
func TestCapsAttackIncludeContextWithoutSamplingContext(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"sampling":{}}`)
	got := capsAttackCall(t, up, m, "echo",
		`{"jsonrpc":"2.0","id":21,"method":"sampling/createMessage","params":{"_meta":{"k":"none"},"messages":[],"maxTokens":5,"includeContext":"none"}}`,
		`{"jsonrpc":"2.0","id":22,"method":"sampling/createMessage","params":{"_meta":{"k":"thisServer"},"messages":[],"maxTokens":5,"includeContext":"thisServer"}}`,
		`{"jsonrpc":"2.0","id":23,"method":"sampling/createMessage","params":{"_meta":{"k":"allServers"},"messages":[],"maxTokens":5,"includeContext":"allServers"}}`)
	if !slices.Contains(got, "none") {
		t.Fatalf("the runner was not asked even the plain sampling request it declared: %q", got)
	}
	for _, k := range []string{"thisServer", "allServers"} {
		if slices.Contains(got, k) {
			t.Errorf("a runner that declared sampling without sampling.context was asked a sampling/createMessage with includeContext %q", k)
		}
	}
}

// Holds: a runner that declared sampling (and roots) at the federated
// endpoint gets the sampling/createMessage and roots/list a service asks
// on a federated call's stream (the service's MCP session is initialized
// with the runner's capabilities), and not the elicitation it did not
// declare.
func TestCapsAttackHoldsFederatedRunnerGetsWhatItDeclared(t *testing.T) {
	svc, beta := startUpstream(t), startUpstream(t)
	g := startGateway(t, faConfig(t, svc, beta, gatewayConfig{Tools: "echo"}))
	m := faRunner(t, g, aliceKey, `{"sampling":{},"roots":{}}`)
	got := capsAttackCall(t, svc, m, "svc__echo",
		`{"jsonrpc":"2.0","id":31,"method":"sampling/createMessage","params":{"_meta":{"k":"sampling"},"messages":[],"maxTokens":5}}`,
		`{"jsonrpc":"2.0","id":32,"method":"roots/list","params":{"_meta":{"k":"roots"}}}`,
		`{"jsonrpc":"2.0","id":33,"method":"elicitation/create","params":{"_meta":{"k":"elicitation"},"message":"m","requestedSchema":{"type":"object","properties":{}}}}`)
	slices.Sort(got)
	if strings.Join(got, " ") != "roots sampling" {
		t.Errorf("the federated runner was asked %q, want roots and sampling", got)
	}
}

// Holds: on the federated endpoint's standalone stream (GET /v1/mcp, which
// carries every service's), a service's server→client requests reach the
// runner only when it declared what they need: sampling passes,
// elicitation and roots do not.
func TestCapsAttackHoldsFederatedStandaloneStream(t *testing.T) {
	svc, beta := startUpstream(t), startUpstream(t)
	svc.setIntercept(func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.Method != http.MethodGet {
			return false
		}
		sseStart(w)
		for _, a := range []string{
			`{"jsonrpc":"2.0","id":41,"method":"elicitation/create","params":{"_meta":{"k":"elicitation"},"message":"m","requestedSchema":{"type":"object","properties":{}}}}`,
			`{"jsonrpc":"2.0","id":42,"method":"roots/list","params":{"_meta":{"k":"roots"}}}`,
			`{"jsonrpc":"2.0","id":43,"method":"sampling/createMessage","params":{"_meta":{"k":"sampling"},"messages":[],"maxTokens":5}}`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", a)
		}
		flush(w)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	})
	g := startGateway(t, faConfig(t, svc, beta, gatewayConfig{Tools: "echo"}))
	m := faRunner(t, g, aliceKey, `{"sampling":{}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	resp, err := m.send(ctx, http.MethodGet, "text/event-stream", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/mcp: HTTP %d", resp.StatusCode)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(resp.Body)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	var got []string
	quiet := time.NewTimer(3 * time.Second)
	defer quiet.Stop()
read:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break read
			}
			if d, ok := strings.CutPrefix(line, "data: "); ok && gjson.Get(d, "method").String() != "" {
				got = append(got, gjson.Get(d, "params._meta.k").String())
				if gjson.Get(d, "method").String() == "sampling/createMessage" {
					quiet.Reset(time.Second) // the last one asked: anything else comes at once
				}
			}
		case <-quiet.C:
			break read
		}
	}
	cancel()
	if strings.Join(got, " ") != "sampling" {
		t.Errorf("the federated runner's standalone stream carried %q, want only sampling", got)
	}
}

// Attack (fixed): on a call held between rounds (a stateless runner of 2026-07-28
// in front of an upstream that initializes), the upstream's server→client
// request is decided by the result policy on the server_request channel —
// evaluated, its decision recorded (audit entry, metrics), any side effect
// of the policy run — before askRunner checks the runner's declared
// capabilities and refuses it: a request the runner never declared and
// never gets is seen by the policy first, unlike on a stream (deliver
// checks declared before inspect) and unlike the README's "the upstream
// gets a JSON-RPC error for any other at once, before any policy sees it".
// Control: the same call by a runner that initialized without sampling
// leaves no server_request decision.
// Severity: low (the policy, and the audit log, see upstream words that
// go nowhere; a policy that drops the request also changes the runner's
// answer from MissingRequiredClientCapability to a refused request).
// Fix: in askRunner, check mcp2026.RequiredCapability on msg.Params
// before h.inspect (and again on the policy's params, as now). Fixed so.
func TestCapsAttackHeldCallPolicySeesUndeclaredRequest(t *testing.T) {
	up := startUpstreamServer(t, nil, interviewServer(nil))
	logFile := filepath.Join(t.TempDir(), "gateway.log")
	g := startGateway(t, gatewayConfig{Upstream: up.URL, Tools: "interview sample", RequestPolicy: aaPolicies(t, "", ""), Log: "output file " + logFile})
	samplingDecided := func() bool {
		return findAudit(auditEntries(t, logFile), map[string]string{"channel": "server_request", "method": "sampling/createMessage"}) != nil
	}
	// Control: a runner that initialized without sampling.
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{}`)
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sample","arguments":{}}}`)
	if all := trJoin(msgs); !strings.Contains(all, "sampling failed") {
		t.Fatalf("control: the upstream's sampling was not refused: %s", all)
	}
	time.Sleep(300 * time.Millisecond)
	if samplingDecided() {
		t.Fatal("control: the policy decided a sampling/createMessage a runner on a stream did not declare")
	}
	// A stateless runner that declares no sampling: its call is held at
	// the upstream's sampling/createMessage.
	status, msg := statelessPost(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), mixCall(2, "sample", `{}`, ""), nil)
	if status != http.StatusBadRequest || errorCode(msg) != -32021 {
		t.Fatalf("the held call without sampling: %d %v, want 400 -32021", status, msg)
	}
	deadline := time.Now().Add(2 * time.Second)
	for !samplingDecided() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if samplingDecided() {
		t.Errorf("the result policy decided (and the audit log recorded) the upstream's sampling/createMessage on a held call before toolgate refused it as undeclared")
	}
}

// Attack (fixed): sampling/createMessage with "toolChoice" but no "tools" reaches a
// runner that declared sampling without sampling.tools. SEP-1577 (2025-11-25)
// puts both parameters under the capability ("whether the client supports
// tool use via tools and toolChoice parameters"; the Python SDK: servers
// must see sampling.tools declared before they send tools / tool_choice);
// RequiredCapability asks for sampling.tools only when "tools" is present
// and not null, so a toolChoice ("required", say) goes to a sampler that
// never agreed to tool use and may hand it to its model's API as is.
// Severity: low (no tools are offered, so no tool is run).
// Fix: in mcp2026.RequiredCapability, a present, non-null "toolChoice"
// (memberFold) needs sampling.tools as "tools" does. Fixed so.
func TestCapsAttackToolChoiceWithoutSamplingTools(t *testing.T) {
	up := startUpstream(t)
	g := startGateway(t, gatewayConfig{Upstream: up.URL})
	m := aaRunner(t, g, aliceKey, g.createSession(t, aliceKey, "svc"), `{"sampling":{}}`)
	got := capsAttackCall(t, up, m, "echo",
		`{"jsonrpc":"2.0","id":24,"method":"sampling/createMessage","params":{"_meta":{"k":"plain"},"messages":[],"maxTokens":5}}`,
		`{"jsonrpc":"2.0","id":25,"method":"sampling/createMessage","params":{"_meta":{"k":"toolChoice"},"messages":[],"maxTokens":5,"toolChoice":{"mode":"required"}}}`)
	if !slices.Contains(got, "plain") {
		t.Fatalf("the runner was not asked even the plain sampling request it declared: %q", got)
	}
	if slices.Contains(got, "toolChoice") {
		t.Errorf("a runner that declared sampling without sampling.tools was asked a sampling/createMessage with a toolChoice")
	}
}
