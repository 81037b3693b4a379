package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// The benchmarks below measure the per-call path of both policy steps with
// the shipped default policies (../../policies), the way the handlers run
// it: the input is built from a gateway.Call and evaluated with a deadline.
// Besides ns/op and allocs/op they report the median and 99th percentile of
// the per-iteration latency (p50-ns, p99-ns), which is what the budget in
// DESIGN.md is about:
//
//	go test -run '^$' -bench . ./modules/policy/
//
// A benchmark measures; it does not pass or fail on time. To measure your
// own policy directory instead of the shipped defaults, name it in
// TOOLGATE_BENCH_POLICIES (the decisions are then not checked, only that
// the policy made them):
//
//	TOOLGATE_BENCH_POLICIES=$PWD/policies go test -run '^$' -bench . ./modules/policy/

// benchPolicies is the policy directory measured.
func benchPolicies() (dir string, defaults bool) {
	if dir := os.Getenv("TOOLGATE_BENCH_POLICIES"); dir != "" {
		return dir, false
	}
	return "../../policies", true
}

// benchTimeout is the evaluation deadline of the benchmarks: generous, so
// that a busy machine or a profiler does not turn a slow run into a deny.
// The cost of the deadline itself does not depend on its length.
const benchTimeout = time.Minute

func benchEngine(b testing.TB, query, stage string) *engine {
	b.Helper()
	return benchEngineWith(b, query, stage, evaluatorPlan)
}

// benchEngineWith is benchEngine with the given evaluator.
func benchEngineWith(b testing.TB, query, stage, evaluator string) *engine {
	b.Helper()
	dir, _ := benchPolicies()
	e, err := newEngine(newSource(dir), query, stage, evaluator, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Destruct() })
	return e
}

// benchTool is a realistic upstream tool definition, as a tools/list answer
// carries it.
const benchTool = `{"name":"read_ticket","title":"Read ticket","description":"Returns a ticket with its comments.",` +
	`"annotations":{"readOnlyHint":true,"openWorldHint":false},` +
	`"inputSchema":{"type":"object","properties":{"ticket_id":{"type":"string","description":"The ticket key, e.g. TEST-123"},` +
	`"include_comments":{"type":"boolean"}},"required":["ticket_id"]}}`

const benchUnmarkedTool = `{"name":"update_ticket","title":"Update ticket","description":"Changes fields of a ticket.",` +
	`"annotations":{"readOnlyHint":false,"destructiveHint":false},` +
	`"inputSchema":{"type":"object","properties":{"ticket_id":{"type":"string"},"status":{"type":"string"}},"required":["ticket_id"]}}`

// benchService and benchSession live as long as the config and the session
// do; a call points at them.
var (
	benchService = &gateway.Service{
		ID:    "tracker",
		Title: "Work tracker",
		URL:   "https://tracker.example.com/mcp",
		Tools: []string{"whoami", "read_ticket", "search_tickets", "create_ticket", "update_ticket"},
		Auth:  &gateway.UpstreamAuth{Kind: gateway.AuthOAuth},
	}
	benchSession = &gateway.Session{
		ID:       "7c1f0e52b9a34d6e8f20a1b2c3d4e5f6a7b8c9d0e1f2a3b4",
		User:     "alice@example.com",
		Services: []string{"tracker"},
	}
)

// benchCall returns a tools/call of tool (a definition as JSON) with
// arguments, as toolgate_session and toolgate_registry leave it, for a
// caller with the claims of a typical JWT. A benchmark evaluates it over and
// over, as a runner makes call after call in one session.
func benchCall(b testing.TB, toolJSON, arguments string) *gateway.Call {
	b.Helper()
	call, err := callOf(toolJSON, arguments)
	if err != nil {
		b.Fatal(err)
	}
	return call
}

// callOf is benchCall's call, or why there is none (arguments that are not
// JSON, a tool definition without a name).
func callOf(toolJSON, arguments string) (*gateway.Call, error) {
	var def struct{ Name string }
	if err := json.Unmarshal([]byte(toolJSON), &def); err != nil {
		return nil, err
	}
	body := `{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":` + string(mcpmsg.Quote(def.Name)) + `,"arguments":` + arguments +
		`,"_meta":{"progressToken":"p-42"}}}`
	msg, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{})
	if err != nil {
		return nil, err
	}
	return &gateway.Call{
		Started: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
		Caller: &gateway.Caller{
			User:   "alice@example.com",
			Groups: []string{"eng", "tracker-users"},
			Claims: map[string]any{
				"iss": "https://idp.example.com", "sub": "alice", "aud": "https://gateway.example.com",
				"exp": json.Number("1796040000"), "iat": json.Number("1796036400"),
				"email": "alice@example.com", "groups": []any{"eng", "tracker-users"},
			},
			Method: "jwt",
		},
		Session:         benchSession,
		RemoteIP:        "10.1.2.3",
		Service:         benchService,
		Message:         msg,
		Method:          msg.Method,
		ProtocolVersion: "2025-11-25",
		Tool:            &gateway.ToolDefinition{Name: def.Name, Raw: []byte(toolJSON)},
	}, nil
}

// latencies collects per-iteration durations and reports their median and
// 99th percentile.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	at := func(p int) float64 { return float64(l.d[(len(l.d)-1)*p/100].Nanoseconds()) }
	b.ReportMetric(at(50), "p50-ns")
	b.ReportMetric(at(99), "p99-ns")
}

// benchMode is how a benchmark runs its steps.
type benchMode int

const (
	warm benchMode = iota // one after another, each finding the last one's memory in the caches
	// parallel: on every CPU at once (b.RunParallel).
	parallel
	// cold: one after another, each after other work has pushed its
	// memory out of the CPU caches and a system call has entered the
	// kernel (which, on a machine without PCID, flushes the TLB). That is
	// what a decision meets in a gateway, where connections, other
	// processes and the kernel run between two decisions, and the more so
	// the fewer calls it gets. The default request step (input and
	// decision) takes about 3 µs (p50) in a loop and 14 to 17 µs in this
	// mode; its decision alone about 1.4 µs and 13 µs, where an execution
	// trace of the gateway under the side-by-side harness has it at 12 µs
	// (p50) at 400 calls/s. Its ns/op includes the eviction: read p50-ns,
	// p99-ns and mean-ns.
	cold
)

// measure runs step b.N times in mode, timing each run.
func measure(b *testing.B, mode benchMode, step func()) {
	var lat latencies
	var evict []byte // garbage once the benchmark is done: it does not stay to hold the heap large
	if mode == cold {
		evict = make([]byte, evictSize)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if mode == parallel {
		b.RunParallel(func(pb *testing.PB) {
			d := make([]time.Duration, 0, 1024)
			for pb.Next() {
				t := time.Now()
				step()
				d = append(d, time.Since(t))
			}
			lat.add(d)
		})
	} else {
		d := make([]time.Duration, 0, b.N)
		var total time.Duration
		for range b.N {
			if mode == cold {
				evictCaches(evict)
			}
			t := time.Now()
			step()
			took := time.Since(t)
			d = append(d, took)
			total += took
		}
		lat.add(d)
		if mode == cold {
			// ns/op counts the eviction too (timed, so that b.N stays
			// small); the steps alone take this on average.
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "mean-ns")
		}
	}
	b.StopTimer()
	lat.report(b)
}

// evictSize is larger than a core's L2 cache and its share of L3 on
// common servers, so that writing as much evicts what a step left there.
const evictSize = 32 << 20

// evictCaches writes a byte of every cache line of memory, then enters the
// kernel.
func evictCaches(memory []byte) {
	for i := 0; i < len(memory); i += 64 {
		memory[i]++
	}
	_, _ = os.Stat(".")
}

// BenchmarkRequestPolicy is the request step's per-call work: building the
// input from the call (the tool definition term is memoised on the
// definition, as in the gateway) and evaluating the default request policy.
func BenchmarkRequestPolicy(b *testing.B) {
	engines := map[string]*engine{
		evaluatorPlan:    benchEngine(b, "data.toolgate.request.decision", stageRequest),
		evaluatorTopdown: benchEngineWith(b, "data.toolgate.request.decision", stageRequest, evaluatorTopdown),
	}
	_, defaults := benchPolicies()
	ctx := context.Background()
	for _, c := range []struct {
		name, tool, args, want string
		mode                   benchMode
		evaluator              string
	}{
		{"read_only", benchTool, `{"ticket_id":"TEST-123","include_comments":true}`, gateway.ActionAllow, warm, evaluatorPlan},
		{"read_only_cold", benchTool, `{"ticket_id":"TEST-123","include_comments":true}`, gateway.ActionAllow, cold, evaluatorPlan},
		{"unmarked", benchUnmarkedTool, `{"ticket_id":"TEST-123","status":"closed"}`, gateway.ActionAsk, warm, evaluatorPlan},
		{"read_only_parallel", benchTool, `{"ticket_id":"TEST-123","include_comments":true}`, gateway.ActionAllow, parallel, evaluatorPlan},
		// The same on OPA's own evaluator (evaluator topdown).
		{"read_only_topdown", benchTool, `{"ticket_id":"TEST-123","include_comments":true}`, gateway.ActionAllow, warm, evaluatorTopdown},
		{"read_only_topdown_cold", benchTool, `{"ticket_id":"TEST-123","include_comments":true}`, gateway.ActionAllow, cold, evaluatorTopdown},
		{"unmarked_topdown", benchUnmarkedTool, `{"ticket_id":"TEST-123","status":"closed"}`, gateway.ActionAsk, warm, evaluatorTopdown},
	} {
		e := engines[c.evaluator]
		b.Run(c.name, func(b *testing.B) {
			call := benchCall(b, c.tool, c.args)
			step := func() {
				input, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
				if err != nil {
					panic(err)
				}
				o := e.decide(ctx, input, benchTimeout, "arguments")
				if o.Failure != "" || (defaults && o.Action != c.want) {
					panic(fmt.Sprintf("decision %+v, want %s", o, c.want))
				}
			}
			step()
			measure(b, c.mode, step)
		})
	}
}

// benchSmallResult is a small tools/call result, text and structured.
const benchSmallResult = `{"content":[{"type":"text","text":"TEST-123: printer on fire, assigned to bob"}],` +
	`"structuredContent":{"id":"TEST-123","status":"open","assignee":"bob","comments":3},"isError":false}`

// BenchmarkResultPolicy is the result step's per-call work, through the
// handler's own hook: input, evaluation, the decision and its audit entry
// (with the SHA-256 of the result), and the encoding of a replaced result.
func BenchmarkResultPolicy(b *testing.B) {
	h := &ResultHandler{Config{
		Timeout: caddy.Duration(benchTimeout),
		engine:  benchEngine(b, "data.toolgate.result.decision", stageResult),
		audit:   benchAudit(),
		logger:  zap.NewNop(),
	}}
	onTopdown := &ResultHandler{Config{
		Timeout: caddy.Duration(benchTimeout),
		engine:  benchEngineWith(b, "data.toolgate.result.decision", stageResult, evaluatorTopdown),
		audit:   benchAudit(),
		logger:  zap.NewNop(),
	}}
	_, defaults := benchPolicies()
	ctx := context.Background()
	for _, c := range []struct {
		name, result string
		changed      bool // the default policy changes the text
		withheld     bool // the default policy withholds it
		passed       bool // with max_result_bytes raised to 2 MiB
		topdown      bool // on OPA's own evaluator (evaluator topdown)
		mode         benchMode
		// the request stage's members are on the call, as in the gateway
		// (the rest build the whole input)
		members bool
	}{
		{"small", benchSmallResult, false, false, false, false, warm, false},
		{"small_cold", benchSmallResult, false, false, false, false, cold, false},
		{"small_after_request", benchSmallResult, false, false, false, false, warm, true},
		{"small_after_request_cold", benchSmallResult, false, false, false, false, cold, true},
		{"8KiB_text", textResult(strings.Repeat("TEST-123: printer on fire — assigned to bob\n", 8<<10/46)), false, false, false, false, warm, false},
		// A log of a megabyte: over the default limit, so it is cut.
		{"1MiB_text", textResult(logText(1 << 20)), true, false, false, false, warm, false},
		// The same let through unchanged, with a larger limit: marked
		// with the decision, not copied.
		{"1MiB_text_passed", textResult(bigText(1 << 20)), false, false, true, false, warm, false},
		// The same with a secret near its start: redacted, then cut.
		{"1MiB_text_secret", textResult("deploy started with AKIAIOSFODNN7EXAMPLE\n" + logText(1<<20)), true, false, false, false, warm, false},
		// Its keys alone are over the default limit: withheld.
		{"1MiB_structured", structuredResult(1 << 20), true, true, false, false, warm, false},
		{"small_topdown", benchSmallResult, false, false, false, true, warm, false},
		{"1MiB_text_secret_topdown", textResult("deploy started with AKIAIOSFODNN7EXAMPLE\n" + logText(1<<20)), true, false, false, true, warm, false},
		{"1MiB_structured_topdown", structuredResult(1 << 20), true, true, false, true, warm, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			call := benchCall(b, benchTool, `{"ticket_id":"TEST-123"}`)
			if c.members {
				if _, err := recordRequestInput(call, toolTerm(call.ToolDefinition(), call.Message.Name, call.Service)); err != nil {
					b.Fatal(err)
				}
			}
			result := []byte(c.result)
			h := h
			switch {
			case c.passed:
				h = passingHandler(b)
			case c.topdown:
				h = onTopdown
			}
			step := func() {
				// Every answer carries the decision; a changed one says how.
				// (The answer is looked at in its pieces: joining them
				// would measure a copy the gateway does not make.)
				out, err := h.check(ctx, call, result, "")
				contains := func(s string) bool {
					return slices.ContainsFunc(out, func(p []byte) bool { return bytes.Contains(p, []byte(s)) })
				}
				changed := contains("truncated by toolgate") || contains("REDACTED")
				if err != nil || out == nil || (defaults && (changed && !c.withheld) != (c.changed && !c.withheld) ||
					contains("withheld") != c.withheld) {
					panic(fmt.Sprintf("check: %.300s, %v", out.Bytes(), err))
				}
			}
			step()
			b.SetBytes(int64(len(result)))
			measure(b, c.mode, step)
		})
	}
}

// benchAudit is an audit log that is on (as Caddy's default logger is) and
// writes nowhere, so that the audit entry's cost is measured.
func benchAudit() *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), zap.InfoLevel))
}

// logText is about size bytes of log lines.
func logText(size int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < size; i++ {
		fmt.Fprintf(&sb, "2026-11-30T10:%02d:%02dZ INFO ticket TEST-%d updated by bob: status open, printer on fire in room %d\n", i/60%60, i%60, i, i%500)
	}
	return sb.String()
}

func textResult(text string) string {
	return `{"content":[{"type":"text","text":` + string(mcpmsg.Quote(text)) + `}],"isError":false}`
}

// structuredResult is a result of about size bytes whose bulk is
// structuredContent: a list of tickets, as a search tool might answer, one
// of whose fields is long enough to be truncated.
func structuredResult(size int) string {
	var sb strings.Builder
	sb.WriteString(`{"content":[{"type":"text","text":"found tickets"}],"structuredContent":{"tickets":[`)
	for i := 0; sb.Len() < size-200; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"id":"TEST-%d","title":"printer on fire in room %d","status":"open","assignee":"bob","priority":%d,"labels":["hardware","urgent"]}`, i, i, i%5)
	}
	sb.WriteString(`],"log":` + string(mcpmsg.Quote(strings.Repeat("x", 70000))) + `},"isError":false}`)
	return sb.String()
}
