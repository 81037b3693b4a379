package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/modules/gateway"
)

const requestQuery = "data.toolgate.request.decision"

// writePolicy replaces dir/request.rego at once (a watcher polling the
// directory never reads it half written).
func writePolicy(t *testing.T, dir, text string) {
	t.Helper()
	tmp := filepath.Join(dir, "request.rego.tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "request.rego")); err != nil {
		t.Fatal(err)
	}
}

func testEngine(t *testing.T, dir string, interval time.Duration) (*engine, *observer.ObservedLogs) {
	t.Helper()
	return testEngineWith(t, dir, interval, evaluatorPlan)
}

func testEngineWith(t *testing.T, dir string, interval time.Duration, evaluator string) (*engine, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	e, err := newEngine(newSource(dir), requestQuery, "test", evaluator, interval, zap.New(core), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	return e, logs
}

var someInput = ast.MustParseTerm(`{"method": "tools/call", "arguments": {"n": 1}}`).Value

func TestDecisionsThatAreNotWellFormedDeny(t *testing.T) {
	for _, tc := range []struct {
		name, rules string
		timeout     time.Duration
		failure     string
	}{
		{"undefined", `decision := {"action": "allow"} if input.never`, 0, failUndefined},
		{"not an object", `decision := "allow"`, 0, failMalformed},
		{"several values", "decision contains {\"action\": \"allow\"}\ndecision contains {\"action\": \"deny\"}", 0, failMultiple},
		{"unknown action", `decision := {"action": "permit"}`, 0, failMalformed},
		{"no action", `decision := {"reason": "because"}`, 0, failMalformed},
		{"misspelled field", `decision := {"action": "allow", "argument": {}}`, 0, failMalformed},
		{"reason not a string", `decision := {"action": "allow", "reason": 1}`, 0, failMalformed},
		{"arguments not an object", `decision := {"action": "allow", "arguments": [1]}`, 0, failMalformed},
		{"approval not an object", `decision := {"action": "ask", "reason": "r", "approval": "x"}`, 0, failMalformed},
		{"a result field where arguments are rewritten", `decision := {"action": "allow", "result": {}}`, 0, failMalformed},
		{"conflict", "decision := {\"action\": \"allow\"} if input.method\ndecision := {\"action\": \"ask\"} if input.arguments", 0, failError},
		{"too slow", `decision := {"action": "allow"} if count([x | some x in numbers.range(1, 50000000)]) > 0`, time.Millisecond, failTimeout},
		// The time goes to iterating, with no built-in that watches the
		// deadline itself: the plan's own cancellation checks must stop it.
		{"too slow in a loop", "l := [" + strings.Repeat("0, ", 4999) + "0]\n" +
			`decision := {"action": "allow"} if count([1 | some x in l; some y in l; x == y]) < 0`, time.Millisecond, failTimeout},
	} {
		for _, evaluator := range []string{evaluatorPlan, evaluatorTopdown} {
			t.Run(tc.name+"/"+evaluator, func(t *testing.T) {
				dir := t.TempDir()
				writePolicy(t, dir, "package toolgate.request\n\n"+tc.rules+"\n")
				e, _ := testEngineWith(t, dir, 0, evaluator)
				if (e.current.Load().program != nil) != (evaluator == evaluatorPlan) {
					t.Fatalf("evaluator %s: program %v", evaluator, e.current.Load().program)
				}
				timeout := tc.timeout
				if timeout == 0 {
					timeout = time.Minute
				}
				o := e.decide(context.Background(), someInput, timeout, "arguments")
				if o.Action != gateway.ActionDeny || o.Failure != tc.failure || o.Reason == "" || o.Arguments != nil {
					t.Fatalf("outcome = %+v, want a deny with failure %q", o, tc.failure)
				}
				// A malformed field is named.
				field := map[string]string{"misspelled field": `"argument"`, "reason not a string": "reason",
					"arguments not an object": "arguments", "approval not an object": "approval",
					"a result field where arguments are rewritten": `"result"`}[tc.name]
				if !strings.Contains(o.Reason, field) {
					t.Fatalf("reason %q does not name the field %s", o.Reason, field)
				}
			})
		}
	}
}

// A policy that waits on the network (http.send to a server that does not
// answer) is stopped at its deadline on both evaluators: the request
// http.send made is cancelled, not left to run out its own timeout.
func TestPolicyWaitingOnTheNetworkTimesOut(t *testing.T) {
	for _, evaluator := range []string{evaluatorPlan, evaluatorTopdown} {
		t.Run(evaluator, func(t *testing.T) {
			cut := make(chan struct{}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
					cut <- struct{}{}
				case <-time.After(time.Minute):
				}
			}))
			defer srv.Close()
			dir := t.TempDir()
			writePolicy(t, dir, "package toolgate.request\n\n"+
				`decision := {"action": "allow"} if http.send({"method": "GET", "url": "`+srv.URL+`", "timeout": "1m"}).status_code == 200`+"\n")
			e, _ := testEngineWith(t, dir, 0, evaluator)
			if c := e.current.Load(); evaluator == evaluatorPlan && (c.program == nil || !c.program.Impure()) {
				t.Fatal("the policy calling http.send was not planned as impure")
			}
			o := e.decide(context.Background(), someInput, 50*time.Millisecond, "arguments")
			if o.Action != gateway.ActionDeny || o.Failure != failTimeout {
				t.Fatalf("outcome = %+v, want a deny with failure %q", o, failTimeout)
			}
			select {
			case <-cut:
			case <-time.After(30 * time.Second):
				t.Fatal("the policy's request was not cancelled at the deadline")
			}
		})
	}
}

// A deadline is cancelled on the first call after its time has come (a
// plan asks only every few hundred steps), or at once by Cancel.
func TestDeadline(t *testing.T) {
	d := &deadline{at: time.Now().Add(time.Hour)}
	if first, again := d.Cancelled(), d.Cancelled(); first || again {
		t.Fatal("a deadline an hour away is cancelled")
	}
	d = &deadline{at: time.Now().Add(-time.Millisecond)}
	if !d.Cancelled() || !d.expired.Load() || !d.Cancelled() {
		t.Fatal("a deadline that passed is not cancelled when first asked")
	}
	d = &deadline{at: time.Now().Add(time.Hour)}
	d.Cancel()
	if !d.Cancelled() {
		t.Fatal("a cancelled deadline is not cancelled")
	}
}

// A policy whose plan uses what the plan evaluator does not run (here a
// reference to a package's rules and base documents at once) decides on
// OPA's evaluator, and the log says so once.
func TestPolicyOutsideThePlanRunsOnTopdown(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, `package toolgate.request

decision := {"action": "allow", "reason": sprintf("%d limits", [count(data.limits)])}
`)
	if err := os.WriteFile(filepath.Join(dir, "limits.rego"), []byte("package limits\n\nextra := 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"limits": {"calls": 10}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e, logs := testEngine(t, dir, 0)
	if e.current.Load().program != nil {
		t.Fatal("the policy was planned; want it on topdown")
	}
	if n := logs.FilterMessageSnippet("runs on OPA's evaluator").Len(); n != 1 {
		t.Fatalf("%d warnings that the policy runs on OPA's evaluator, want 1: %v", n, logs.All())
	}
	o := e.decide(context.Background(), someInput, time.Minute, "arguments")
	if o.Action != gateway.ActionAllow || o.Reason != "2 limits" {
		t.Fatalf("outcome = %+v, want allow with reason \"2 limits\"", o)
	}
}

func TestWellFormedDecisions(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, `package toolgate.request

decision := {"action": "allow", "reason": "ok", "arguments": object.union(input.arguments, {"n": 2})}
`)
	e, _ := testEngine(t, dir, 0)
	o := e.decide(context.Background(), someInput, time.Minute, "arguments")
	if o.Action != gateway.ActionAllow || o.Reason != "ok" || o.Failure != "" || o.Revision == "" {
		t.Fatalf("outcome = %+v", o)
	}
	if n, _ := o.Arguments["n"]; n == nil || n.(interface{ String() string }).String() != "2" {
		t.Fatalf("arguments = %v, want n rewritten to 2", o.Arguments)
	}
}

func TestAPolicyWithoutTheRuleFailsToLoad(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.other\n\nx := 1\n")
	_, err := newEngine(newSource(dir), requestQuery, "test", evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err == nil || !strings.Contains(err.Error(), "defines no rule data.toolgate.request.decision") {
		t.Fatalf("err = %v", err)
	}
}

// A setting of the wrong type would switch a protection off without a word
// (max_result_bytes: "2000" is not a number, so nothing would be cut): the
// shipped policies refuse to load, naming the key.
func TestWronglyTypedSettingsFailToLoad(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"request.rego", "result.rego", "text.rego", "settings.rego"} {
		src, err := os.ReadFile(filepath.Join("..", "..", "policies", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ data, want string }{
		{`{"toolgate": {"settings": {"max_result_bytes": "2000"}}}`, `settings.max_result_bytes: "2000" is not a whole number of bytes`},
		{"toolgate:\n  settings:\n    services:\n      tracker:\n        read_only: \"yes\"\n", `settings.services.tracker.read_only: "yes" is not true or false`},
		{`{"toolgate": {"settings": {"max_result_bytes": 2000, "services": {}}}}`, ""},
	} {
		name := "data.json"
		if !strings.HasPrefix(tc.data, "{") {
			name = "data.yaml"
		}
		os.Remove(filepath.Join(dir, "data.json"))
		os.Remove(filepath.Join(dir, "data.yaml"))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(tc.data), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, query := range []string{requestQuery, "data.toolgate.result.decision"} {
			_, err := newEngine(newSource(dir), query, "test", evaluatorPlan, 0, zap.NewNop(), policyMetrics)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s: %v", tc.data, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%s: err = %v, want it to say %s", tc.data, err, tc.want)
			}
		}
	}
}

// A policy directory's site subdirectory is loaded with it: its rules
// extend the packages, its data merges with the top level's (a value set in
// both is a load error); its tests and deeper directories are not loaded.
func TestSitePoliciesLoadWithTheDefaults(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"request.rego": `package toolgate.request

decision := {"action": "deny", "reason": concat("; ", deny)} if {
	count(deny) > 0
} else := {"action": "allow", "reason": sprintf("a=%v b=%v", [data.toolgate.settings.a, data.toolgate.settings.b])}

deny contains msg if some msg in set()
`,
		"data.json":             `{"toolgate": {"settings": {"a": 1}}}`,
		"site/data.yaml":        "toolgate:\n  settings:\n    b: 2\n",
		"site/tickets.rego":     "package toolgate.request\n\ndeny contains \"site says no\" if input.arguments.n == 2\n",
		"site/broken_test.rego": "this is not Rego",
		"site/drafts/x.rego":    "this is not Rego either",
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e, _ := testEngine(t, dir, 0)
	if o := e.decide(context.Background(), someInput, time.Minute, "arguments"); o.Action != gateway.ActionAllow || o.Reason != "a=1 b=2" {
		t.Errorf("decision %+v, want allow with both files' settings", o)
	}
	two := ast.MustParseTerm(`{"method": "tools/call", "arguments": {"n": 2}}`).Value
	if o := e.decide(context.Background(), two, time.Minute, "arguments"); o.Action != gateway.ActionDeny || o.Reason != "site says no" {
		t.Errorf("decision %+v, want the site rule's deny", o)
	}

	if err := os.WriteFile(filepath.Join(dir, "site", "data.yaml"), []byte("toolgate:\n  settings:\n    a: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := newEngine(newSource(dir), requestQuery, "test", evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err == nil || !strings.Contains(err.Error(), "conflicting values at data.toolgate.settings.a") {
		t.Errorf("a setting in both data files: %v, want a load error naming it", err)
	}
}

func TestEditsApplyAndBrokenEditsKeepTheLastGoodPolicy(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n")
	e, logs := testEngine(t, dir, 10*time.Millisecond)
	e.start()
	ctx := context.Background()
	if o := e.decide(ctx, someInput, time.Second, "arguments"); o.Action != gateway.ActionAllow {
		t.Fatalf("first decision %+v", o)
	}
	first := e.Revision()

	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"edited\"}\n")
	waitFor(t, func() bool { return e.decide(ctx, someInput, time.Second, "arguments").Reason == "edited" })
	if e.Revision() == first {
		t.Error("the revision did not change with the policy")
	}

	failures := testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues("test"))
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"allow\"\n")
	waitFor(t, func() bool { return testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues("test")) > failures })
	if o := e.decide(ctx, someInput, time.Second, "arguments"); o.Reason != "edited" {
		t.Fatalf("after a broken edit the decision is %+v, want the last good policy's", o)
	}
	found := false
	for _, entry := range logs.FilterMessage("policy load failed; keeping the last good policy").All() {
		if err, ok := entry.ContextMap()["error"].(string); ok && strings.Contains(err, "request.rego:4: rego_parse_error") {
			found = true
		}
	}
	if !found {
		t.Errorf("no log entry names the broken file and line: %v", logs.All())
	}
}

func TestBundleSource(t *testing.T) {
	var version atomic.Value // of the bundle served: "v1", then "v2"
	version.Store("v1")
	var fetches, notModified atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		v := version.Load().(string)
		action := map[string]string{"v1": "allow", "v2": "deny"}[v]
		body := bundleBytes(t, "package toolgate.request\n\ndecision := {\"action\": \""+action+"\", \"reason\": \""+v+"\"}\n", "rev-"+v)
		etag := `"` + v + `"`
		if r.Header.Get("If-None-Match") == etag {
			notModified.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	core, _ := observer.New(zap.InfoLevel)
	e, err := newEngine(newSource(srv.URL+"/bundle.tar.gz"), requestQuery, "test", evaluatorPlan, 10*time.Millisecond, zap.New(core), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Destruct()
	ctx := context.Background()
	if o := e.decide(ctx, someInput, time.Second, "arguments"); o.Failure != failNotLoaded || fetches.Load() != 0 {
		t.Fatalf("before start: %+v after %d fetches; want a not_loaded deny and no network I/O", o, fetches.Load())
	}
	e.start()
	waitFor(t, func() bool { return e.decide(ctx, someInput, time.Second, "arguments").Reason == "v1" })
	if !strings.HasPrefix(e.Revision(), "rev-v1@") {
		t.Errorf("revision = %q, want the manifest's and the digest", e.Revision())
	}
	waitFor(t, func() bool { return notModified.Load() > 0 })
	version.Store("v2")
	waitFor(t, func() bool { return e.decide(ctx, someInput, time.Second, "arguments").Reason == "v2" })
}

// A bundle whose server fails at first is fetched again until it loads,
// with reload_interval off too: off stops looking for changes, not the
// first load (without it every call is denied, and a configuration reload
// keeps the engine).
func TestBundleFirstLoadIsRetried(t *testing.T) {
	var fetches atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fetches.Add(1) <= 2 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(bundleBytes(t, "package toolgate.request\n\ndecision := {\"action\": \"allow\", \"reason\": \"up\"}\n", "r1"))
	}))
	defer srv.Close()
	core, _ := observer.New(zap.InfoLevel)
	e, err := newEngine(newSource(srv.URL+"/bundle.tar.gz"), requestQuery, "test-first-load", evaluatorPlan, 0, zap.New(core), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Destruct()
	e.start()
	deadline := time.Now().Add(10 * time.Second)
	for e.decide(context.Background(), someInput, time.Second, "arguments").Reason != "up" {
		if time.Now().After(deadline) {
			t.Fatalf("not loaded after %d fetches", fetches.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := fetches.Load(); n != 3 {
		t.Errorf("%d fetches: want none after the first load (reload_interval off)", n)
	}
}

func bundleBytes(t *testing.T, module, revision string) []byte {
	t.Helper()
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: revision},
		Modules:  []bundle.ModuleFile{{URL: "/policy.rego", Path: "/policy.rego", Raw: []byte(module)}},
		Data:     map[string]any{},
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).Write(b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestMaskedPayload(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, `package toolgate.request

decision := {"action": "allow"}
`)
	if err := os.WriteFile(filepath.Join(dir, "log.rego"), []byte(`package toolgate.log

mask contains "/arguments/password"

mask contains "/arguments/nested/token"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _ := testEngine(t, dir, 0)
	got := e.maskedPayload(context.Background(), someInput, stageRequest,
		[]byte(`{"user":"a","password":"hunter2","nested":{"token":"t","keep":1},"big":9007199254740993}`))
	m := got.(map[string]any)
	if m["password"] != "[masked]" || m["user"] != "a" || m["nested"].(map[string]any)["token"] != "[masked]" ||
		m["nested"].(map[string]any)["keep"] != json.Number("1") {
		t.Fatalf("masked payload = %v", got)
	}
	// Approvers and the audit log read the digits that go upstream.
	if out, _ := json.Marshal(got); !strings.Contains(string(out), `"big":9007199254740993`) {
		t.Fatalf("masked payload as JSON = %s", out)
	}
}

// waitFor polls cond for up to 5 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With log_input the audit entry holds the input the policy read, masked
// like payloads, the session id as its reference; toolgate policy eval takes
// it back as it is.
func TestLogInput(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"allow\", \"reason\": \"ok\"}\n")
	if err := os.WriteFile(filepath.Join(dir, "log.rego"), []byte("package toolgate.log\n\nmask contains \"/arguments/ticket_id\"\n\nmask contains \"/caller/claims\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _ := testEngine(t, dir, 0)
	core, logs := observer.New(zap.InfoLevel)
	c := &Config{LogInput: true, engine: e, audit: zap.New(core)}
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123","include_comments":true}`)
	input, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
	if err != nil {
		t.Fatal(err)
	}
	o := e.decide(context.Background(), input, time.Minute, "arguments")
	c.newDecision(context.Background(), call, &o, stageRequest, nil, nil, input)
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d audit entries", len(entries))
	}
	logged, _ := json.Marshal(entries[0].ContextMap()["input"])
	for _, want := range []string{`"ticket_id":"[masked]"`, `"include_comments":true`, `"claims":"[masked]"`, `"groups":["eng","tracker-users"]`,
		`"session":{"id":"` + sessionRef(benchSession.ID) + `"`, `"annotations_source":"upstream"`, `"method":"tools/call"`} {
		if !strings.Contains(string(logged), want) {
			t.Errorf("logged input %s lacks %s", logged, want)
		}
	}
	if strings.Contains(string(logged), benchSession.ID) || strings.Contains(string(logged), `"ticket_id":"TEST-123"`) {
		t.Errorf("logged input %s shows the session id or a masked argument", logged)
	}

	// The logged input goes straight into toolgate policy eval.
	file := filepath.Join(t.TempDir(), "input.json")
	if err := os.WriteFile(file, logged, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := policyEval(file, "", "", Config{Source: dir}, "", nil)
	if err != nil || out.Action != "allow" || out.Reason != "ok" || out.Stage != stageRequest {
		t.Errorf("policy eval of the logged input: %+v, %v", out, err)
	}
}

// Every audit entry names the session by its reference (never its id),
// the reference each session gets once and keeps, whatever other
// sessions do meanwhile.
func TestAuditEntriesNameTheSessionByItsReference(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	c := &Config{audit: zap.New(core)}
	other := &gateway.Session{ID: "another-session-id-of-enough-length", User: "bob@example.com", Services: []string{"tracker"}}
	for i := range 3 {
		for _, s := range []*gateway.Session{benchSession, other} {
			call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
			call.Session = s
			c.newDecision(context.Background(), call, &outcome{Action: gateway.ActionAllow}, stageRequest, nil, nil, nil)
			entries := logs.TakeAll()
			if len(entries) != 1 {
				t.Fatalf("%d audit entries", len(entries))
			}
			if got := entries[0].ContextMap()["session"]; got != sessionRef(s.ID) || got == s.ID {
				t.Fatalf("entry %d names session %q as %v, want %s", i, s.ID, got, sessionRef(s.ID))
			}
		}
	}
}

// A policy run from its plan keeps neither OPA's prepared query nor,
// through it, the compiler and the policy's syntax trees: the garbage
// collector marks what a gateway keeps on every cycle, so what it keeps
// costs on every call. The same policy on OPA's evaluator keeps them all.
func TestPlannedPolicyKeepsNoCompiler(t *testing.T) {
	held := func(evaluator string) (uint64, *compiled) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&before)
		e, err := newEngine(newSource("../../policies"), "data.toolgate.result.decision", stageResult, evaluator, 0, zap.NewNop(), policyMetrics)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Destruct() })
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&after)
		c := e.current.Load()
		runtime.KeepAlive(e)
		return after.HeapObjects - min(after.HeapObjects, before.HeapObjects), c
	}
	held(evaluatorTopdown) // OPA's own lasting state (built-ins, interned terms) is built once
	planned, c := held(evaluatorPlan)
	if c.program == nil || c.query != nil {
		t.Fatalf("the default result policy: program %v, prepared query %v; want a program and no query", c.program != nil, c.query != nil)
	}
	topdown, c := held(evaluatorTopdown)
	if c.program != nil || c.query == nil {
		t.Fatalf("on OPA's evaluator: program %v, prepared query %v; want the query alone", c.program != nil, c.query != nil)
	}
	t.Logf("objects kept: %d planned, %d on OPA's evaluator", planned, topdown)
	if planned*3 > topdown {
		t.Errorf("the planned policy keeps %d heap objects, on OPA's evaluator %d: want under a third", planned, topdown)
	}
}
