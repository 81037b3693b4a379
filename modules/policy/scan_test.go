package policy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// scanStrings are strings the gateway's scan must judge exactly as the
// policy's own definition (the scan it computes without input.scan) does.
func scanStrings() []string {
	s := []string{
		"", "plain", "Ticket TEST-123: printer on fire", "é", "👍", "\u00a0", "by bob, bearing",
		"AKIAIOSFODNN7EXAMPLE", "xAKIA", "ASIA", "Bearer x", "a bearer", "BEARER", "ghp_", "gho_x", "ghu_", "ghs_", "ghr_",
		"github_pat_", "eyJ", "PRIVATE KEY", "xox", "AKI", "Beare", "earer", "github_pa", "PRIVATE  KEY",
		"bEaReR", "aKiA", "private key", "SIG=", "Hooks.Slack.Com", "IA then", "secretAccessKey",
	}
	// Every invisible character and its neighbours.
	for _, r := range [][2]rune{{0x00AD, 0x00AD}, {0x034F, 0x034F}, {0x115F, 0x1160}, {0x180B, 0x180F}, {0x200B, 0x200F}, {0x202A, 0x202E},
		{0x2060, 0x206F}, {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF}, {0xFFF0, 0xFFFB}, {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF}} {
		for c := r[0] - 1; c <= r[1]+1; c++ {
			if c-r[0] > 16 && r[1]-c > 16 {
				continue // the neighbours of each end are enough
			}
			s = append(s, "a"+string(c)+"b")
		}
	}
	// Long strings: plain, with a marker at either end, with an anchor on
	// every line (the scan then changes its way of searching).
	lines := strings.Repeat("2026-11-30 INFO updated by bob: ok\n", 200)
	s = append(s, lines, "Bearer "+lines, lines+"bearer", lines+"é", strings.Repeat("é", 3000), lines+"\u200b",
		strings.Repeat("b", 5000)+"bearer", strings.Repeat("_", 5000)+"ghp_")
	return s
}

// defaultScan is the shipped result policy compiled with the query of its
// own scan rule, for OPA's evaluator (the tests run its prepared query).
func defaultScan(t *testing.T) *compiled {
	t.Helper()
	e, err := newEngine(newSource("../../policies"), "data.toolgate.result.scan", stageResult, evaluatorTopdown, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	return e.current.Load()
}

func TestScanAgreesWithThePolicy(t *testing.T) {
	c := defaultScan(t)
	if c.scanner == nil {
		t.Fatal("the default policy gives the scan no settings")
	}
	strs := scanStrings()
	content := make([]map[string]any, 0, len(strs))
	for _, s := range strs {
		content = append(content, map[string]any{"type": "text", "text": s})
	}
	structured := map[string]any{"list": strs, "nested": map[string]any{"ghp_ key": "value", "x": []any{1, "eyJ", true}}}
	raw, err := json.Marshal(map[string]any{
		"content": append(content,
			map[string]any{"type": "resource", "resource": map[string]any{"uri": "file:///r", "text": "AKIA"}},
			map[string]any{"type": "image", "data": "AKIAbinary", "mimeType": "image/png"},
			map[string]any{"type": "text", "data": "AKIA inspected", "text": "split AK"},
			map[string]any{"type": "text", "text": "IAIOSFODNN7EXAMPLE"},
			map[string]any{"type": "resource", "resource": map[string]any{"uri": "file:///b", "blob": "QUtJQQ=="}}),
		"structuredContent": structured,
		"_meta":             map[string]any{"not": "AKIA inspected"},
	})
	if err != nil {
		t.Fatal(err)
	}
	res, scan, err := resultTerms(raw, shapeToolResult, c.scanner, nil)
	if err != nil {
		t.Fatal(err)
	}

	// The policy's own scan (no input.scan), cut down to what the gateway
	// lists.
	rs, err := c.query.Eval(context.Background(), rego.EvalParsedInput(ast.NewObject(ast.Item(keyResult, res))))
	if err != nil || len(rs) != 1 {
		t.Fatalf("scan: %v %v", rs, err)
	}
	var want []string
	for _, entry := range entries(t, rs[0].Expressions[0].Value.(*ast.Term)) {
		obj := entry.Value.(ast.Object)
		n, _ := obj.Get(keyBytes).Value.(ast.Number).Int()
		if n > scanThreshold || obj.Get(keyInvisible).Value.Compare(ast.Boolean(true)) == 0 || obj.Get(keyMarkers).Value.Compare(ast.Boolean(true)) == 0 {
			want = append(want, entry.String())
		}
	}
	var got []string
	for _, entry := range entries(t, scan) {
		got = append(got, entry.String())
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) < 40 {
		t.Fatalf("only %d strings listed: %v", len(want), want)
	}
	if !slices.Equal(got, want) {
		for _, g := range got {
			if !slices.Contains(want, g) {
				t.Errorf("the gateway lists %.200s", g)
			}
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("the gateway misses %.200s", w)
			}
		}
	}
	// The sizes, the seams and the verdict agree too.
	own := rs[0].Expressions[0].Value.(*ast.Term).Value.(ast.Object)
	agree(t, scan, own)
	if seams := own.Get(keySeams).Value.(*ast.Array); seams.Len() == 0 {
		t.Error("no seam listed")
	}
	if th := scan.Value.(ast.Object).Get(keyThreshold); th.Value.Compare(ast.Number("4096")) != 0 {
		t.Errorf("threshold %v", th)
	}
}

// agree checks that the gateway's scan and the policy's own agree on the
// sizes, the seams and whether the result is clean.
func agree(t *testing.T, scan *ast.Term, own ast.Object) {
	t.Helper()
	for _, k := range []*ast.Term{keyBytes, keyKeyBytes, keySeams, keyClean} {
		if g, w := scan.Value.(ast.Object).Get(k), own.Get(k); g == nil || w == nil || g.Value.Compare(w.Value) != 0 {
			t.Errorf("%v: the gateway says %v, the policy %v", k, g, w)
		}
	}
}

// The gateway's verdict that a result needs nothing (scan.clean) decides
// most results without the policy reading them, so it must be exactly the
// policy's.
func TestScanCleanAgreesWithThePolicy(t *testing.T) {
	c := defaultScan(t)
	blob := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		result string
		clean  bool
	}{
		{`{"content":[]}`, true},
		{`{"content":[{"type":"text","text":"fine"},{"type":"image","data":"AKIA","mimeType":"image/png"},{"type":"audio","data":"eyJ"},` +
			`{"type":"resource_link","uri":"file:///a","name":"a"},{"type":"resource","resource":{"uri":"file:///b","text":"b"}},` +
			`{"type":"resource","resource":{"uri":"file:///c","blob":"` + blob("plain bytes") + `"}}],"structuredContent":{"a":[1,"x",null]},"_meta":{"m":1}}`, true},
		{`{"content":[{"type":"text","text":"` + strings.Repeat("long and plain ", 1000) + `"}]}`, true},
		{`{}`, false},
		{`{"content":{"type":"text","text":"x"}}`, false},
		{`{"content":[{"type":"html","text":"x"}]}`, false},
		{`{"content":[{"text":"x"}]}`, false},
		{`{"content":["x"]}`, false},
		{`{"content":[{"type":"text"}]}`, false},
		{`{"content":[{"type":"text","text":1}]}`, false},
		{`{"content":[{"type":"image","mimeType":"image/png"}]}`, false},
		{`{"content":[{"type":"resource_link","name":"a"}]}`, false},
		{`{"content":[{"type":"resource","resource":{"uri":"file:///b"}}]}`, false},
		{`{"content":[{"type":"resource","resource":"text"}]}`, false},
		{`{"content":[{"type":"resource","resource":{"uri":"file:///b","blob":"not base64!"}}]}`, false},
		{`{"content":[{"type":"resource","resource":{"uri":"file:///b","text":"t","blob":"a_b-"}}]}`, false},
		{`{"content":[{"type":"resource","resource":{"uri":"file:///b","text":"t","blob":"` + blob("has a bearer token") + `"}}]}`, false},
		{`{"content":[{"type":"text","text":"a\u200bb"}]}`, false},
		{`{"content":[{"type":"text","text":"fine"}],"_meta":{"k":"AKIA"}}`, false},
		{`{"content":[{"type":"text","text":"fine"}],"structuredContent":{"eyJ":1}}`, false},
		{`{"content":[{"type":"text","text":"split AK"},{"type":"text","text":"IA"}]}`, false},
	} {
		res, scan, err := resultTerms([]byte(tc.result), shapeToolResult, c.scanner, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.result, err)
		}
		rs, err := c.query.Eval(context.Background(), rego.EvalParsedInput(ast.NewObject(ast.Item(keyResult, res))))
		if err != nil || len(rs) != 1 {
			t.Fatalf("%.100s: scan: %v %v", tc.result, rs, err)
		}
		own := rs[0].Expressions[0].Value.(*ast.Term).Value.(ast.Object)
		agree(t, scan, own)
		if got := scan.Value.(ast.Object).Get(keyClean).Value.Compare(ast.Boolean(tc.clean)) == 0; !got {
			t.Errorf("%.100s: clean is not %v", tc.result, tc.clean)
		}
	}
}

// On the other channels the scan knows where content blocks are as the
// policy does: their binary data is left out, their blobs are checked, and
// everything else is text.
func TestScanOfOtherChannelsAgreesWithThePolicy(t *testing.T) {
	c := defaultScan(t)
	blob := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		channel, method, payload string
		clean                    bool
		listed                   int // strings the scan lists
	}{
		{"notification", "notifications/progress", `{"progressToken":1,"progress":2,"message":"step 2"}`, true, 0},
		{"notification", "notifications/message", `{"level":"info","data":{"line":"key AKIAIOSFODNN7EXAMPLE"}}`, false, 1},
		{"notification", "notifications/message", `{"level":"info","data":"a\u200bb"}`, false, 1},
		{"error", "tools/call", `{"code":-32000,"message":"failed","data":{"ghp_":1}}`, false, 1},
		// Binary data is binary only in content blocks.
		{"notification", "notifications/message", `{"data":{"type":"image","data":"AKIA"}}`, false, 1},
		{"result", "tools/call", `{"content":[{"type":"image","data":"AKIA","mimeType":"image/png"}]}`, true, 0},
		{"result", "prompts/get", `{"messages":[{"role":"user","content":{"type":"image","data":"AKIA"}},` +
			`{"role":"user","content":{"type":"audio","data":"eyJ"}},{"role":"user","content":{"type":"text","text":"hi"}}]}`, true, 0},
		{"result", "prompts/get", `{"messages":[{"role":"user","content":{"type":"text","data":"AKIA"}}]}`, false, 1},
		{"result", "prompts/get", `{"messages":[{"role":"user","content":{"type":"resource","resource":{"uri":"a","blob":"` + blob("bearer abc") + `"}}}]}`, false, 0},
		{"result", "prompts/get", `{"messages":[{"role":"user","content":{"type":"resource","resource":{"uri":"a","blob":"` + blob("plain") + `"}}}]}`, true, 0},
		{"result", "prompts/get", `{"messages":[{"role":"user","content":{"type":"resource","resource":{"uri":"a","blob":"not base64!"}}}]}`, false, 0},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"type":"image","data":"AKIA"},{"type":"text","text":"ok"}]}],"maxTokens":9}`, true, 0},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"type":"text","text":"AKIA"}]}]}`, false, 1},
		{"server_request", "elicitation/create", `{"message":"ok","requestedSchema":{"type":"object","properties":{"x":{"type":"image","data":"AKIA"}}}}`, false, 1},
		{"result", "resources/read", `{"contents":[{"uri":"a","text":"fine"},{"uri":"b","blob":"` + blob("plain") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"` + blob("x AKIA") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"AKIA!"}]}`, false, 0},
		// A blob of text loses its invisible characters, one of binary
		// data keeps its bytes.
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain","blob":"` + blob("a\u200bb") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"` + blob("a\u202eb") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"TEXT/markdown","blob":"` + blob("a\u200bb") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"image/png","blob":"` + blob("a\u200bb") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"application/json","blob":"` + blob("a\u200bb") + `"}]}`, false, 0},
		// A mimeType of null is none (decoders read it so); one that is
		// not a string, text in another charset than UTF-8, and a blob
		// labelled text that is not UTF-8 are withheld.
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":null,"blob":"` + blob("a\u200bb") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":null,"blob":"` + blob("plain") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":0,"blob":"` + blob("plain") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":["text/plain"],"blob":"` + blob("plain") + `"}]}`, false, 0},
		{"result", "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":{},"blob":"` + blob("plain") + `"}}]}`, false, 0},
		{"result", "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":null,"blob":"` + blob("plain") + `"}}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain; charset=utf-16le","blob":"` + blob("k\x00e\x00y\x00") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain; Charset=\"UTF-8\"","blob":"` + blob("plain") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain;charset = us-ascii","blob":"` + blob("plain") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain; charset","blob":"` + blob("plain") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"; charset=latin1","blob":"` + blob("plain") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"image/png; charset=utf-16","blob":"` + blob("k\x00e\x00y\x00") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain","blob":"` + blob("\xff\xfek\x00") + `"}]}`, false, 0},
		{"result", "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":"application/json","blob":"` + blob("\xff\xfek\x00") + `"}}]}`, false, 0},
		// Without a mimeType, bytes that are not UTF-8 are binary data,
		// unless they open with a byte-order mark of UTF-16 or UTF-32,
		// which a runner reading them as text decodes by: withheld.
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"","blob":"` + blob("\xffk\x00") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":null,"blob":"` + blob("k\xfe\xff") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"","blob":"` + blob("\xff\xfek\x00") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":null,"blob":"` + blob("\xff\xfek\x00") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":" ; x=y","blob":"` + blob("\xfe\xff\x00k") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"` + blob("\x00\x00\xfe\xff\x00\x00\x00k") + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"image/png","blob":"` + blob("\xff\xfek\x00") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"` + blob("\xff a\u200bb") + `"}]}`, true, 0},
		{"result", "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":"text/plain","blob":"` + blob("a\u200bb") + `"}}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain","blob":"` + blob(strings.Repeat("x", 4097)) + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"text/plain","blob":"` + blob(strings.Repeat("x", 4096)) + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"image/png","blob":"` + blob(strings.Repeat("x", 9000)) + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"application/pdf","blob":"` + blob(strings.Repeat("x", 9000)) + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"application/vnd.api+JSON; charset=utf-8","blob":"` + blob(strings.Repeat("x", 9000)) + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","mimeType":"application/x-protobuf","blob":"` + blob("a\u200db") + `"}]}`, true, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"` + blob(strings.Repeat("x", 3000)) + `"},{"uri":"c","blob":"` + blob(strings.Repeat("x", 3000)) + `"}]}`, false, 0},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"QUtJQQ=="}],"x":{"blob":"AKIA"}}`, false, 1},
		{"result", "tools/list", `{"tools":[{"name":"t","description":"Reads.","inputSchema":{"type":"object"}}]}`, true, 0},
		{"result", "tools/list", `{"tools":[{"name":"t","description":"Reads.\u2062"}]}`, false, 1},
		{"task", "tasks/get", `{"taskId":"t1","status":"working"}`, true, 0},
		// An input_required result (2026-07-28) asks the runner things:
		// the blocks of its sampling requests are blocks, nothing else is.
		{"result", "tools/call", `{"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":` +
			`{"messages":[{"role":"user","content":{"type":"image","data":"AKIA"}},{"role":"user","content":[{"type":"audio","data":"eyJ"},` +
			`{"type":"text","text":"hi"}]}],"maxTokens":5}},"e":{"method":"elicitation/create","params":{"message":"ok","requestedSchema":{}}}},"requestState":"x"}`, true, 0},
		{"result", "prompts/get", `{"resultType":"input_required","inputRequests":{"e":{"method":"elicitation/create","params":` +
			`{"messages":[{"role":"user","content":{"type":"image","data":"AKIA"}}]}}}}`, false, 1},
		// What else an input_required result holds is its method's result
		// (a runner of an earlier revision reads it as the answer).
		{"result", "resources/read", `{"resultType":"input_required","inputRequests":{},"contents":[{"uri":"b","blob":"AKIA!"}]}`, false, 0},
		{"result", "tools/call", `{"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":` +
			`{"messages":[{"role":"user","content":{"type":"text","text":"AKIA"}}]}}}}`, false, 1},
		{"result", "tools/call", `{"resultType":"input_required","content":[{"type":"image","data":"AKIA"}]}`, true, 0},
		{"result", "tools/call", `{"resultType":"input_required","content":[{"type":"html","html":"x"}]}`, false, 0},
		{"result", "tools/call", `{"resultType":"input_required","content":[{"type":"resource","resource":{"uri":"a","blob":"` + blob("key AKIA") + `"}}]}`, false, 0},
		{"result", "tools/call", `{"resultType":"input_required","content":[{"type":"text","text":"split AK"},{"type":"text","text":"IA"}]}`, false, 0},
		{"result", "prompts/get", `{"resultType":"input_required","messages":[{"role":"user","content":{"type":"image","data":"AKIA"}}]}`, true, 0},
		// A sampling message's tool_result block holds blocks: their
		// images are binary, their blobs inspected decoded. Another
		// block's content is text.
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":{"type":"tool_result","toolUseId":"t","content":[{"type":"image","data":"AKIA"},` +
			`{"type":"resource","resource":{"uri":"b","mimeType":"text/plain","blob":"` + blob("plain") + `"}}]}}]}`, true, 0},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"tool_result","toolUseId":"t","content":[` +
			`{"type":"resource","resource":{"uri":"b","blob":"` + blob("key AKIA") + `"}}]}]}]}`, false, 0},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"type":"tool_result","toolUseId":"t","content":[` +
			`{"type":"resource","resource":{"uri":"b","mimeType":"text/plain; charset=utf-16le","blob":"` + blob("k\x00e\x00y\x00") + `"}}]}]}]}`, false, 0},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"type":"tool_use","content":[{"type":"image","data":"AKIA"}]}]}]}`, false, 1},
		{"result", "prompts/get", `{"messages":[{"role":"user","content":{"type":"tool_result","content":[{"type":"image","data":"AKIA"}]}}]}`, false, 1},
		{"result", "tools/call", `{"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":` +
			`[{"type":"tool_result","content":[{"type":"audio","data":"eyJ"},{"type":"resource","resource":{"uri":"b","blob":"` + blob("\xff\xfek\x00") + `"}}]}]}]}}}}`, false, 0},
		{"result", "tools/call", `{"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":` +
			`{"type":"tool_result","content":[{"type":"audio","data":"eyJ"}]}}]}}}}`, true, 0},
	} {
		res, scan, err := resultTerms([]byte(tc.payload), shapeOf(tc.channel, tc.method), c.scanner, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.payload, err)
		}
		in := ast.NewObject(ast.Item(keyResult, res), ast.Item(keyChannel, ast.StringTerm(tc.channel)), ast.Item(keyMethod, ast.StringTerm(tc.method)))
		rs, err := c.query.Eval(context.Background(), rego.EvalParsedInput(in))
		if err != nil || len(rs) != 1 {
			t.Fatalf("%.100s: scan: %v %v", tc.payload, rs, err)
		}
		own := rs[0].Expressions[0].Value.(*ast.Term).Value.(ast.Object)
		agree(t, scan, own)
		if got := scan.Value.(ast.Object).Get(keyClean).Value.Compare(ast.Boolean(tc.clean)) == 0; !got {
			t.Errorf("%s %s %.100s: clean is not %v", tc.channel, tc.method, tc.payload, tc.clean)
		}
		if n := len(entries(t, scan)); n != tc.listed {
			t.Errorf("%s %s %.100s: %d strings listed, want %d: %v", tc.channel, tc.method, tc.payload, n, tc.listed, scan)
		}
	}
}

func entries(t *testing.T, scan *ast.Term) []*ast.Term {
	t.Helper()
	list, ok := scan.Value.(ast.Object).Get(keyStrings).Value.(*ast.Array)
	if !ok {
		t.Fatalf("scan %v has no strings", scan)
	}
	var out []*ast.Term
	for i := range list.Len() {
		out = append(out, list.Elem(i))
	}
	return out
}

func TestScanFindsMarkersAnywhere(t *testing.T) {
	sc := &scanner{markers: newMarkerIndex([]string{"AKIA", "bearer", "ghp_", "github_pat_", "eyJ"})}
	for _, m := range []string{"AKIA", "bearer", "ghp_", "github_pat_", "eyJ"} {
		for _, filler := range []string{"", "x", strings.Repeat("by bob ", 2000), strings.Repeat("_", 3000), strings.Repeat("eyeyey", 1000)} {
			for _, s := range []string{m + filler, filler + m, filler + m + filler, filler[:len(filler)/2] + m + filler[len(filler)/2:]} {
				if !sc.hasMarker(s) {
					t.Errorf("marker %q not found in a string of %d bytes", m, len(s))
				}
			}
			if sc.hasMarker(filler + m[:len(m)-1]) {
				t.Errorf("a part of %q is found", m)
			}
		}
	}
}

func TestIsASCII(t *testing.T) {
	for n := range 100 {
		s := strings.Repeat("a", n)
		if !isASCII(s) {
			t.Errorf("%q", s)
		}
		for i := range n {
			b := []byte(s)
			b[i] = 0x80
			if isASCII(string(b)) {
				t.Errorf("%q counts as ASCII", b)
			}
		}
	}
	if isASCII("é") || !utf8.ValidString("é") {
		t.Error("é")
	}
}

// FuzzScanDecidesAsThePolicy decides random payloads of every channel with
// the shipped result policy twice: with the gateway's scan in the input,
// as the gateway decides, and without it, the policy's own long way (as
// under opa test). The scan may only spare the policy work: a scan that
// calls a payload clean, or leaves out a string, where the long way cleans
// something would let a secret or a hidden character through. flags picks
// the channel and method, and whether the settings cut text at 300 bytes.
func FuzzScanDecidesAsThePolicy(f *testing.F) {
	kinds := []struct{ channel, method string }{
		{channelResult, "tools/call"}, {channelTask, "tools/call"}, {channelResult, "prompts/get"}, {channelResult, "resources/read"},
		{channelResult, "tools/list"}, {gateway.ChannelNotification, "notifications/message"},
		{gateway.ChannelNotification, "notifications/progress"}, {gateway.ChannelError, "tools/call"},
		{gateway.ChannelServerRequest, "sampling/createMessage"}, {gateway.ChannelServerRequest, "elicitation/create"},
	}
	var engines [2]*engine
	for i, settings := range []string{`{}`, `{"toolgate": {"settings": {"max_result_bytes": 300, "max_listing_bytes": 300}}}`} {
		e, err := newEngine(newSource(shippedPolicies(f, map[string]string{"data.json": settings})), "data.toolgate.result.decision",
			stageResult, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { _ = e.Destruct() })
		engines[i] = e
	}
	blob := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for i, s := range scanStrings() {
		if len(s) < 200 {
			f.Add(uint8(i), `{"content":[{"type":"text","text":`+string(mcpmsg.Quote(s))+`}],"structuredContent":{"k":`+string(mcpmsg.Quote(s))+`}}`)
		}
	}
	f.Add(uint8(0), `{"content":[{"type":"text","text":"split AK"},{"type":"text","text":"IAIOSFODNN7EXAMPLE"}]}`)
	f.Add(uint8(0), `{"content":[{"type":"text","text":"\u0041KIAIOSFODNN7EXAMPLE"}],"_meta":{"eyJ":1}}`)
	f.Add(uint8(0), `{"content":[{"type":"text","text":"access_to\u212aen=ya29.a0AfH6SMBxExampleTokenValue and acce\u017fs_token=ya29.a0AfH6SMBx"}]}`)
	f.Add(uint8(3), `{"contents":[{"uri":"b","blob":"`+blob("token: ghp_16C7e42F292c6912E7710c838347Ae178B4a")+`"},{"uri":"a","text":"x"}]}`)
	f.Add(uint8(3), `{"contents":[{"uri":"b","mimeType":"text/plain","blob":"`+blob("invoice.\u202efdp.exe")+`"},{"uri":"c","blob":"`+blob("\xff\u200b")+`"}]}`)
	f.Add(uint8(3), `{"contents":[{"uri":"b","mimeType":null,"blob":"`+blob("a\u200bb")+`"},{"uri":"c","mimeType":0,"blob":"`+blob("x")+`"}]}`)
	f.Add(uint8(3), `{"contents":[{"uri":"b","mimeType":"text/plain; charset=utf-16le","blob":"`+blob("k\x00e\x00y\x00")+`"},{"uri":"c","mimeType":"text/csv","blob":"`+blob("\xff")+`"}]}`)
	f.Add(uint8(0), `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":"text/plain;Charset=\"UTF-8\"","blob":"`+blob("a\u202eb")+`"}}],"structuredContent":{"a\u200bb":1,"ab":2}}`)
	f.Add(uint8(4), `{"tools":[{"name":"t","description":"Reads.\u2062","inputSchema":{"type":"object","properties":{"id":{"description":"bearer x"}}}}]}`)
	f.Add(uint8(7), `{"code":-32000,"message":"failed","data":{"ghp_":1}}`)
	f.Add(uint8(8), `{"messages":[{"role":"user","content":[{"type":"image","data":"AKIA"},{"type":"text","text":"ok\u200b"}]}],"maxTokens":9}`)
	f.Add(uint8(11), `{"content":[{"type":"text","text":"`+strings.Repeat("plain text, ", 40)+`"}]}`)
	f.Add(uint8(8), `{"messages":[{"role":"user","content":[{"type":"tool_result","toolUseId":"t","content":[{"type":"image","data":"AKIA"},{"type":"resource","resource":{"uri":"b","blob":"`+blob("a\u200bb")+`"}}]}]}],"maxTokens":9}`)
	f.Add(uint8(8), `{"messages":[{"role":"user","content":{"type":"tool_use","content":[{"type":"resource","resource":{"uri":"b","mimeType":"text/plain","blob":"`+blob("plain")+`"}}]}}]}`)
	f.Add(uint8(3), `{"contents":[{"uri":"b","blob":"`+blob("\xff\xfek\x00")+`"},{"uri":"c","mimeType":" ","blob":"`+blob("\x00\x00\xfe\xff")+`"},{"uri":"d","blob":"`+blob("\xfek")+`"}]}`)
	f.Add(uint8(0), `{"content":[{"type":"text","text":"x"}],"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"resource","resource":{"uri":"b","mimeType":"text/plain","blob":"`+blob("key AKIA")+`"}}]}]}]}}}}`)
	call, err := callOf(`{"name":"read_ticket"}`, `{"id":1}`)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, flags uint8, payload string) {
		if mcpmsg.Validate([]byte(payload), mcpmsg.Limits{}) != nil {
			return // refused before any policy sees it
		}
		k := kinds[int(flags)%len(kinds)]
		e := engines[int(flags/128)]
		c := e.current.Load()
		s := subject{channel: k.channel, method: k.method, view: call}
		h := &ResultHandler{Config{engine: e}}
		spans := map[*ast.Term]string{}
		scanned, err := h.input(c, call, s, []byte(payload), spans)
		if err != nil {
			return // not a payload the gateway would decide
		}
		if scanned.Get(keyScan) == nil {
			t.Fatal("the shipped policy gives the scan no settings")
		}
		long := ast.NewObject()
		scanned.Foreach(func(key, v *ast.Term) {
			if !key.Equal(keyScan) {
				long.Insert(key, v)
			}
		})
		ctx := context.Background()
		fast, slow := e.decideWith(ctx, c, scanned, time.Minute, "result"), e.decideWith(ctx, c, long, time.Minute, "result")
		if a, b := decisionText(fast), decisionText(slow); a != b {
			t.Fatalf("%s %s %.300s:\nwith the gateway's scan %.500s\nthe policy's long way   %.500s", k.channel, k.method, payload, a, b)
		}
	})
}

// A member that makes a string a block's data or blob, spelled in another
// case, is refused: the policy would inspect the string as text, and a
// runner that ignores case in member names would decode it. The same
// names elsewhere (a tool's structured output) are anyone's.
func TestScanRefusesCaseVariantsOfBlockMembers(t *testing.T) {
	c := defaultScan(t)
	blob := base64.StdEncoding.EncodeToString([]byte("key AKIAIOSFODNN7EXAMPLE"))
	for _, tc := range []struct {
		channel, method, payload string
		refused                  bool
	}{
		{"result", "resources/read", `{"Contents":[{"uri":"b","blob":"` + blob + `"}]}`, true},
		{"result", "resources/read", `{"con\u200btents":[{"uri":"b","blob":"` + blob + `"}]}`, true},
		{"result", "prompts/get", `{"messages":[{"role":"user","con\u200btent":{"type":"resource","resource":{"uri":"b","blob":"` + blob + `"}}}]}`, true},
		{"result", "resources/read", `{"contents":[{"uri":"b","BLOB":"` + blob + `"}]}`, true},
		{"result", "tools/call", `{"content":[{"type":"resource","Resource":{"uri":"b","blob":"` + blob + `"}}]}`, true},
		{"result", "tools/call", `{"content":[{"Type":"resource","resource":{"uri":"b","blob":"` + blob + `"}}]}`, true},
		{"result", "tools/call", `{"Content":[{"type":"image","data":"x"}]}`, true},
		{"result", "prompts/get", `{"messages":[{"role":"user","Content":{"type":"resource","resource":{"uri":"b","blob":"` + blob + `"}}}]}`, true},
		{"server_request", "sampling/createMessage", `{"Messages":[{"role":"user","content":{"type":"image","data":"x"}}]}`, true},
		{"result", "tools/call", `{"resultType":"input_required","InputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"image","data":"x"}}]}}}}`, true},
		{"result", "tools/call", `{"content":[{"type":"text","text":"ok"}],"structuredContent":{"Type":"resource","Blob":"x","Contents":[{"Blob":"y"}]}}`, false},
		{"result", "resources/read", `{"contents":[{"uri":"b","blob":"` + blob + `","Note":"x"}]}`, false},
		{"notification", "notifications/message", `{"data":{"Contents":[{"blob":"x"}]}}`, false},
		// mimeType beside a blob, spelled in another case: the policy
		// reads none, a runner that ignores case reads that one.
		{"result", "resources/read", `{"contents":[{"uri":"b","MimeType":"text/plain; charset=utf-16le","blob":"` + blob + `"}]}`, true},
		{"result", "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":"text/plain","mime\u200btype":"x","blob":"` + blob + `"}}]}`, true},
		{"result", "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b","MimeType":"x","text":"y"}}]}`, false},
		{"result", "tools/call", `{"content":[{"type":"text","text":"x","MimeType":"y"}],"structuredContent":{"MimeType":"x","blob":"y"}}`, false},
		// The blocks of a sampling message's tool_result block.
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":{"type":"tool_result","Content":[{"type":"image","data":"x"}]}}]}`, true},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"Type":"tool_result","content":[{"type":"image","data":"x"}]}]}]}`, true},
		{"server_request", "sampling/createMessage", `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"resource","resource":{"uri":"b","mimetype":"x","blob":"` + blob + `"}}]}]}]}`, true},
		{"result", "tools/call", `{"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"Type":"image","data":"x"}]}]}]}}}}`, true},
	} {
		_, _, err := resultTerms([]byte(tc.payload), shapeOf(tc.channel, tc.method), c.scanner, nil)
		var refused *Refusal
		if got := errors.As(err, &refused); got != tc.refused {
			t.Errorf("%s %s %.120s: refused %v (%v), want %v", tc.channel, tc.method, tc.payload, got, err, tc.refused)
		}
	}
}

// shippedScanFixture is the shipped result policy compiled, a call of
// read_ticket and a result hook over it: what a test needs to decide a
// payload with the gateway's scan and by the policy's long way.
func shippedScanFixture(t *testing.T) (*compiled, *gateway.Call, *ResultHandler) {
	t.Helper()
	e, err := newEngine(newSource(shippedPolicies(t, nil)), "data.toolgate.result.decision", stageResult, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	call, err := callOf(`{"name":"read_ticket"}`, `{"id":1}`)
	if err != nil {
		t.Fatal(err)
	}
	return e.current.Load(), call, &ResultHandler{Config{engine: e}}
}

// bothWays decides scanned, a result policy input the gateway's scan
// built, with the scan's findings and without them (the policy's long
// way), and returns both decisions as text.
func bothWays(ctx context.Context, h *ResultHandler, c *compiled, scanned ast.Object) (fast, slow string) {
	long := ast.NewObject()
	scanned.Foreach(func(key, v *ast.Term) {
		if !key.Equal(keyScan) {
			long.Insert(key, v)
		}
	})
	return decisionText(h.engine.decideWith(ctx, c, scanned, time.Minute, "result")), decisionText(h.engine.decideWith(ctx, c, long, time.Minute, "result"))
}

// The gateway's scan reads a blob's mimeType as the policy does: null as
// none, another value that is not a string withheld, a charset other than
// UTF-8 withheld for text, a blob labelled text that is not UTF-8
// withheld. Every mimeType of the table with every blob, decided with the
// scan and by the policy's long way, gives one decision.
func TestScanReadsMimeTypesAsThePolicy(t *testing.T) {
	c, call, h := shippedScanFixture(t)
	mimes := []string{``, `"mimeType":null,`, `"mimeType":0,`, `"mimeType":true,`, `"mimeType":[],`, `"mimeType":{},`,
		`"mimeType":"",`, `"mimeType":" ",`, `"mimeType":"text/plain",`, `"mimeType":"TEXT/PLAIN",`, `"mimeType":"text/plain; charset=utf-16",`,
		`"mimeType":"text/plain;charset=\"utf-8\"",`, `"mimeType":"text/plain; charset= UTF8 ",`, `"mimeType":"text/plain; charset",`,
		`"mimeType":"text/plain; charset=utf-8; charset=latin1",`, `"mimeType":"; charset=utf-16",`, `"mimeType":"image/png; charset=utf-16",`,
		`"mimeType":"application/json;charset=ascii",`, `"mimeType":"text/plain; CHARSET=US-ASCII",`, `"mimeType":"text/plain; char\u017fet=utf-16",`,
		`"mimeType":"text/plain; charset=\u212aoi8-r",`, `"mimeType":"text/plain; charset==utf-8",`, `"mimeType":"application/vnd.a+json; charset='utf-8'",`}
	blob := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	blobs := []string{blob("plain"), blob("a\u200bb"), blob("key AKIAIOSFODNN7EXAMPLE"), blob("\xff\xfek\x00"), blob("k\x00e\x00y\x00"), "not base64!"}
	kinds := []struct{ channel, method, payload string }{
		{channelResult, "resources/read", `{"contents":[{"uri":"b",%s"blob":"%s"}]}`},
		{channelResult, "tools/call", `{"content":[{"type":"resource","resource":{"uri":"b",%s"blob":"%s"}}]}`},
		{channelResult, "prompts/get", `{"messages":[{"role":"user","content":{"type":"resource","resource":{"uri":"b",%s"blob":"%s"}}}]}`},
	}
	ctx := context.Background()
	for _, k := range kinds {
		for _, m := range mimes {
			for _, b := range blobs {
				payload := fmt.Sprintf(k.payload, m, b)
				scanned, err := h.input(c, call, subject{channel: k.channel, method: k.method, view: call}, []byte(payload), map[*ast.Term]string{})
				if err != nil {
					t.Fatalf("%s: %v", payload, err)
				}
				fast, slow := bothWays(ctx, h, c, scanned)
				if fast != slow {
					t.Errorf("%s %s:\nwith the gateway's scan %.400s\nthe policy's long way   %.400s", k.method, payload, fast, slow)
				}
			}
		}
	}
}
