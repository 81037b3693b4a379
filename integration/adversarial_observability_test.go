package integration

// Attacks on toolgate's observability surface: the Activity record and
// page, the audit and debug logs, Prometheus metrics and traces. Tests
// whose comment starts with "Attack" describe what an attack would get
// through without the defence the test checks (each failed before its
// fix); the "Holds" tests are attacks the general design resists.

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// obsDirSize is the size of the files under dir.
func obsDirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n += info.Size()
		}
		return nil
	})
	return n
}

// obsActivityDir is where the file_system storage keeps the Activity record.
func obsActivityDir(g *gateway) string { return filepath.Join(g.DataDir, "toolgate", "activity") }

// obsWaitActivity waits until the Activity record holds at least one object.
func obsWaitActivity(t *testing.T, g *gateway) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if obsDirSize(obsActivityDir(g)) > 0 {
			time.Sleep(1500 * time.Millisecond) // let the flush of the same second finish
			return
		}
	}
	t.Fatal("the Activity record stayed empty")
}

// obsTraceReceiver is an OTLP/HTTP receiver; the gateway exports its spans
// to it (set before the gateway starts).
type obsTraceReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	raw   strings.Builder
}

func startObsTraceReceiver(t *testing.T) *obsTraceReceiver {
	t.Helper()
	rc := &obsTraceReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.raw.Write(body)
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", srv.URL+"/v1/traces")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	return rc
}

// calls are the toolgate.policy.request spans of tools/call, by trace id.
func (rc *obsTraceReceiver) calls() map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	m := map[string]int{}
	for _, s := range rc.spans {
		if s.Name == "toolgate.policy.request" && attr(s, "mcp.method") == "tools/call" {
			m[hex.EncodeToString(s.TraceId)]++
		}
	}
	return m
}

// obsTracing is the README's traced MCP route: the runner's trace context
// removed, then Caddy's tracing; obsTrustingTracing continues runners'
// traces.
const (
	obsTracing         = "request_header -traceparent\n\t\trequest_header -tracestate\n\t\t" + obsTrustingTracing
	obsTrustingTracing = "tracing {\n\t\t\tspan toolgate\n\t\t}"
)

// Attack: a runner's method name stored in the Activity record as it
// came, whatever its length, with json.Marshal writing each '<', '>' or '&'
// as a six-byte \u003c escape: one call with a 256 KiB method of '<' made
// about 1.5 MiB of Activity record (kept up to 2,000 objects per user, each
// of up to 256 decisions, swept once per 15 minutes), and every Activity
// page that lists it (the person's own, an admin's "Everyone") rendered it
// as &lt; — 200 such calls made an admin's page hundreds of megabytes.
// Names are cut in the record (the audit log keeps them whole).
func TestObservabilityAttackActivityRecordTakesUnboundedMethodNames(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{})
	sent := 256 << 10
	method := "x/" + strings.Repeat("<", sent)
	if status, _, _ := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":%q,"params":{}}`, method)); status != http.StatusOK {
		t.Logf("the long method got HTTP %d", status)
	}
	obsWaitActivity(t, g)
	stored := obsDirSize(obsActivityDir(g))
	t.Logf("one call with a %d-byte method: %d bytes of Activity record", len(method), stored)
	if stored > 64<<10 {
		t.Errorf("one runner call put %d bytes into the Activity record (%.1f× the %d bytes of its method): names in the record are not bounded",
			stored, float64(stored)/float64(len(method)), len(method))
	}
	_, page := g.signedIn(t, carolKey).get(g.URL + "/console/activity?everyone=1")
	t.Logf("an admin's Activity page: %d bytes", len(page))
	if len(page) > 64<<10 {
		t.Errorf("one runner call made an admin's Activity page %d bytes", len(page))
	}
}

// Attack: the Activity page showing a runner's method (and tool) names as
// they came: bidirectional and invisible controls (U+202E, U+2066, U+200B)
// reach the page, so a runner can make what a person or an administrator
// reads there differ from what was called. The approval page writes the
// same characters as \u escapes (visible, modules/console/approvals.go); the
// Activity page does not.
func TestObservabilityAttackActivityPageShowsBidiControls(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{})
	m.post(`{"jsonrpc":"2.0","id":7,"method":"prompts/get\u202eteg/stpmorp","params":{"name":"x\u2066y\u200bz"}}`)
	obsWaitActivity(t, g)
	var page string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, page = g.signedIn(t, aliceKey).get(g.URL + "/console/activity"); strings.Contains(page, "stpmorp") {
			break
		}
	}
	if !strings.Contains(page, "stpmorp") {
		t.Fatalf("the call is not on alice's Activity page:\n%s", page)
	}
	for _, c := range []string{"\u202e", "\u2066", "\u200b"} {
		if strings.Contains(page, c) {
			t.Errorf("the Activity page carries the runner's %+q as it came", c)
		}
	}
}

// Attack: a runner sends a traceparent and tracestate of its choosing. With
// the README's traced route, the upstream gets a trace of toolgate's own —
// not the trace id the runner chose (another user's, to make their traces
// one) — and never the runner's tracestate or baggage. A route that
// continues runners' traces (tracing alone) still sends the upstream no
// tracestate: InjectTrace writes toolgate's traceparent only.
func TestObservabilityAttackRunnerTraceContextReachesUpstream(t *testing.T) {
	startObsTraceReceiver(t)
	const runnerTrace = "0af7651916cd43dd8448eb211c80319c"
	const runnerState = "runner=chosen-by-the-runner"
	for _, route := range []string{obsTracing, obsTrustingTracing} {
		trusting := route == obsTrustingTracing
		up, _, m := aliceSession(t, gatewayConfig{RouteFirst: route})
		m.headers["Traceparent"] = "00-" + runnerTrace + "-b7ad6b7169203331-01"
		m.headers["Tracestate"] = runnerState
		m.headers["Baggage"] = "runner-baggage=1"
		m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"trace-probe-call"}}}`)
		var found bool
		for _, r := range up.requestLog() {
			if !strings.Contains(r.Body, "trace-probe-call") {
				continue
			}
			found = true
			if r.Header.Get("Traceparent") == "" {
				t.Errorf("trusting %v: the upstream got no traceparent", trusting)
			}
			if !trusting && strings.Contains(r.Header.Get("Traceparent"), runnerTrace) {
				t.Errorf("the upstream's traceparent carries the trace id the runner chose: %q", r.Header.Get("Traceparent"))
			}
			if r.Header.Get("Tracestate") != "" {
				t.Errorf("trusting %v: a tracestate reached the upstream: %q", trusting, r.Header.Get("Tracestate"))
			}
			if r.Header.Get("Baggage") != "" {
				t.Errorf("trusting %v: the runner's baggage reached the upstream: %q", trusting, r.Header.Get("Baggage"))
			}
		}
		if !found {
			t.Fatal("the call did not reach the upstream")
		}
	}
}

// Attack: a runner sends a traceparent with the sampled flag off (…-00),
// which Caddy's tracing would follow (the SDK's default sampler follows a
// remote parent), so that toolgate's policy, credential and upstream spans
// of its calls are never recorded. With the README's traced route every
// call is traced.
func TestObservabilityAttackUnsampledTraceparentHidesCalls(t *testing.T) {
	rc := startObsTraceReceiver(t)
	_, _, m := aliceSession(t, gatewayConfig{RouteFirst: obsTracing})
	m.headers["Traceparent"] = "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
	m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hidden"}}}`)
	delete(m.headers, "Traceparent")
	m.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{"text":"control"}}}`)
	total := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && total < 2; time.Sleep(100 * time.Millisecond) {
		total = 0
		for _, n := range rc.calls() {
			total += n
		}
	}
	if total < 2 {
		t.Errorf("the call whose runner sent sampled=0 left no span: %d of 2 calls traced (%v)", total, rc.calls())
	}
}

// Holds: Metric labels carry only registry ids and fixed outcomes: 300
// distinct runner-chosen method names, tool names (off the allowlist and
// unknown services) add no series and none of the names appears in
// /metrics.
func TestObservabilityAttackHoldsMetricLabelsBounded(t *testing.T) {
	_, g, m := aliceSession(t, gatewayConfig{})
	m.post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"warm"}}}`)
	m.post(`{"jsonrpc":"2.0","id":2,"method":"x/warm","params":{}}`)
	series := func() (int, string) {
		resp, err := http.Get(g.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		n := 0
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "toolgate_") {
				n++
			}
		}
		return n, string(body)
	}
	before, _ := series()
	for i := range 100 {
		m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"obsmethod%d/x","params":{}}`, 100+i, i))
		m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"obstool%d","arguments":{}}}`, 300+i, i))
		m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"prompts/get","params":{"name":"obsprompt%d"}}`, 500+i, i))
	}
	for i := range 20 {
		g.raw(t, aliceKey, "", fmt.Sprintf("obssvc%d", i)).post(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	}
	after, body := series()
	if after > before {
		t.Errorf("runner-chosen names grew toolgate's series from %d to %d", before, after)
	}
	for _, s := range []string{"obsmethod", "obstool", "obsprompt", "obssvc"} {
		if strings.Contains(body, s) {
			t.Errorf("/metrics carries the runner's %q", s)
		}
	}
}

// Holds: Newlines, carriage returns and ANSI escapes in a runner's method
// and tool names reach the log (console and JSON formats) escaped: no
// forged line, no terminal control sequence.
func TestObservabilityAttackHoldsLogInjection(t *testing.T) {
	for _, format := range []string{"console", "json"} {
		t.Run(format, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "log")
			_, _, m := aliceSession(t, gatewayConfig{Log: "output file " + logFile + "\n\t\tformat " + format + "\n\t\tlevel DEBUG"})
			const forged = `FORGED {\"level\":\"error\",\"msg\":\"admin approved everything\"}`
			m.post(`{"jsonrpc":"2.0","id":7,"method":"x/a\n` + forged + `\r\u001b[2J\u001b[31m","params":{}}`)
			m.post(`{"jsonrpc":"2.0","id":8,"method":"prompts/get","params":{"name":"p\n` + forged + `\u001b]0;title\u0007"}}`)
			time.Sleep(300 * time.Millisecond)
			data, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(data), "FORGED") {
				t.Fatalf("the calls are not in the log:\n%s", data)
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "FORGED") {
					t.Errorf("a runner's name started a log line: %q", line)
				}
			}
			// (Caddy's console format colours level names with escapes of its own.)
			for _, b := range []string{"\x1b[2J", "\x1b]0;", "\r", "\x07"} {
				if strings.Contains(string(data), b) {
					t.Errorf("the log holds a raw %q from a runner's name", b)
				}
			}
		})
	}
}

// Holds: With tracing on, the log at DEBUG and a service-wide upstream
// key, a call leaves the runner's API key, cookie, toolgate session id,
// MCP session id, baggage, the upstream key and the arguments out of the
// log, the exported spans and /metrics.
func TestObservabilityAttackHoldsNoSecretsInLogsSpansMetrics(t *testing.T) {
	rc := startObsTraceReceiver(t)
	logFile := filepath.Join(t.TempDir(), "log")
	up, g, m := aliceSession(t, gatewayConfig{RouteFirst: obsTracing, Auth: "header X-Upstream-Key very-secret-upstream-key-obs",
		Log: "output file " + logFile + "\n\t\tformat json\n\t\tlevel DEBUG"})
	m.headers["Cookie"] = "runner-cookie=secret-cookie-obs"
	m.headers["Baggage"] = "secret-baggage-obs=1"
	m.post(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"secret-argument-obs"}}}`)
	m.post(`{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"leak","arguments":{}}}`)
	m.post(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"forbidden_tool","arguments":{"text":"secret-argument-obs"}}}`)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && len(rc.calls()) < 2; time.Sleep(100 * time.Millisecond) {
	}
	time.Sleep(300 * time.Millisecond)
	resp, err := http.Get(g.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	logs, _ := os.ReadFile(logFile)
	rc.mu.Lock()
	spans := rc.raw.String()
	rc.mu.Unlock()
	if len(spans) == 0 || len(logs) == 0 {
		t.Fatalf("nothing exported (%d bytes of spans, %d of log)", len(spans), len(logs))
	}
	secrets := []string{aliceKey, "secret-cookie-obs", m.headers["X-Toolgate-Session"], m.sessionID, "secret-baggage-obs",
		"very-secret-upstream-key-obs", "secret-argument-obs"}
	for _, s := range secrets {
		for what, text := range map[string]string{"the log": string(logs), "a span": spans, "/metrics": string(metrics)} {
			if strings.Contains(text, s) {
				t.Errorf("%s holds %q", what, s)
			}
		}
	}
	for _, r := range up.requestLog() {
		if r.Header.Get("Baggage") != "" {
			t.Errorf("the runner's baggage reached the upstream: %q", r.Header.Get("Baggage"))
		}
	}
}
