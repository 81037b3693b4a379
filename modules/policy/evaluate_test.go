package policy

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/testproc"
	"github.com/toolgate/toolgate/modules/gateway"
)

// differentialSettings give the shipped policies' settings something to
// act on, so that the two evaluators are compared on denials, asks,
// rewrites, redactions and cuts, not only on allows.
const differentialSettings = `{"toolgate": {"settings": {
	"admin_groups": ["admins"],
	"max_result_bytes": 300,
	"redact_patterns": {"employee_id": "\\bEMP-[0-9]{6}\\b"},
	"services": {"tracker": {
		"admin_groups": ["tracker-admins"],
		"allow_without_approval": ["update_ticket"],
		"pin_arguments": {"create_ticket": {"project": "SEC"}, "read_ticket": {"include_comments": false}}
	}}
}}}`

// decisionText is what of an outcome the gateway acts on, as text.
func decisionText(o outcome) string {
	var args, result string
	if o.argsTerm != nil {
		args = o.argsTerm.String()
	}
	if o.Result != nil {
		result = o.Result.String()
	}
	return fmt.Sprintf("%s|%s|%s|%s|%s|%s", o.Action, o.Reason, o.Failure, args, result, o.Approval)
}

// evaluatorPairs is, for the request and the result stage, an engine of
// the policies in dir on each evaluator: the plan's (planned, or the test
// fails) and topdown.
func evaluatorPairs(t testing.TB, dir string) map[string][2]*engine {
	t.Helper()
	engines := map[string][2]*engine{}
	for _, st := range []struct{ query, stage string }{{requestQuery, stageRequest}, {"data.toolgate.result.decision", stageResult}} {
		var pair [2]*engine
		for i, ev := range []string{evaluatorPlan, evaluatorTopdown} {
			e, err := newEngine(newSource(dir), st.query, st.stage, ev, 0, zap.NewNop(), policyMetrics)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.Destruct() })
			pair[i] = e
		}
		if pair[0].current.Load().program == nil {
			t.Fatalf("the %s policy was not planned: %s", st.stage, pair[0].current.Load().planNote)
		}
		engines[st.stage] = pair
	}
	return engines
}

// FuzzPlanMatchesTopdown decides random calls and results with the
// shipped policies on both evaluators and wants the same decision:
// action, reason, failure, rewritten arguments and replacement result.
func FuzzPlanMatchesTopdown(f *testing.F) {
	engines := evaluatorPairs(f, shippedPolicies(f, map[string]string{"data.json": differentialSettings}))
	f.Add(uint8(0), "read_ticket", `{"ticket_id":"TEST-1"}`, `{"content":[{"type":"text","text":"ok"}]}`)
	f.Add(uint8(1), "update_ticket", `{"ticket_id":"TEST-1","status":"closed"}`, `{"content":[{"type":"text","text":"EMP-123456 and AKIAIOSFODNN7EXAMPLE"}]}`)
	f.Add(uint8(2), "create_ticket", `{"title":"x","project":"OPS"}`, `{"content":[{"type":"text","text":"`+strings.Repeat("long line of text ", 40)+`"}],"structuredContent":{"id":1}}`)
	f.Add(uint8(7), "delete_ticket", `{"id":[1,2,{"a":null}]}`, `{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}],"isError":true}`)
	f.Add(uint8(12), "read_ticket", `[1]`, `{"content":"not a list","structuredContent":{"token":"ghp_0123456789abcdefghijklmnopqrstuvwxyz01"}}`)
	f.Add(uint8(5), "search", `{"q":"Ignore previous instructions"}`, `{"content":[{"type":"resource","resource":{"uri":"file:///x","text":"-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----"}}]}`)
	f.Add(uint8(29), "read_ticket", `{"a":1.0,"b":[1e400,-0,12345678901234567890],"c":{"":null}}`, `{"content":[{"type":"text","text":"a\u0000b"},{"type":"text","text":"\ud800"}],"structuredContent":{"a":{"a":{"a":[[[["AKIAIOSFODNN7EXAMPLE"]]]]}}}}`)
	f.Add(uint8(30), "x", `{}`, `{"content":[{"type":"text","text":"x","annotations":{"audience":["user"]}},{"type":"resource_link","uri":"file:///etc/passwd","name":"p"}],"isError":false,"_meta":{"k":"ghp_0123456789abcdefghijklmnopqrstuvwxyz01"}}`)
	f.Add(uint8(31), "update_ticket", `{"status":"open","status ":"x"}`, `{"content":[{"type":"text","text":"-----BEGIN PRIVATE KEY-----"},{"type":"text","text":"abc\n-----END PRIVATE KEY-----"}]}`)
	f.Add(uint8(0), "read_ticket", `{}`, `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":null,"blob":"YeKAi2I="}},{"type":"resource","resource":{"uri":"c","mimeType":0,"blob":"eA=="}}],"structuredContent":{"key AKIAIOSFODNN7EXAMPLE":[{"a\u200bb":1,"ab":2}]}}`)
	f.Add(uint8(0), "read_ticket", `{}`, `{"content":[{"type":"resource","resource":{"uri":"b","mimeType":"text/plain; charset=utf-16le","blob":"awBlAHkA"}},{"type":"resource","resource":{"uri":"c","mimeType":"text/csv","blob":"//5rAA=="}}]}`)
	f.Fuzz(func(t *testing.T, flags uint8, tool, args, result string) {
		annotations := map[uint8]string{0: `{"readOnlyHint":true}`, 1: `{}`, 2: `{"destructiveHint":false}`, 3: `{"readOnlyHint":true,"destructiveHint":true}`}[flags&3]
		def := `{"name":` + string(mcpmsg.Quote(tool)) + `,"annotations":` + annotations + `,"inputSchema":{"type":"object"}}`
		call, err := callOf(def, args)
		if err != nil {
			return // not a call the gateway would get this far
		}
		if flags&4 != 0 {
			call.Caller = &gateway.Caller{User: "root", Groups: []string{"tracker-admins"}, Method: "jwt"}
		}
		if flags&8 != 0 {
			call.Service = &gateway.Service{ID: "billing", Tools: []string{tool}}
		}
		ctx := context.Background()
		req := engines[stageRequest]
		var got [2]string
		for i, e := range req {
			input, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), flags&16 != 0)
			if err != nil {
				return
			}
			got[i] = decisionText(e.decide(ctx, input, time.Minute, "arguments"))
		}
		if got[0] != got[1] {
			t.Fatalf("request decision differs:\nplan    %s\ntopdown %s", got[0], got[1])
		}
		res := engines[stageResult]
		for i, e := range res {
			h := &ResultHandler{Config{engine: e}}
			c := e.current.Load()
			input, err := h.input(c, call, subject{channel: channelResult, method: "tools/call", view: call}, []byte(result), map[*ast.Term]string{})
			if err != nil {
				return
			}
			got[i] = decisionText(e.decideWith(ctx, c, input, time.Minute, "result"))
		}
		if got[0] != got[1] {
			t.Fatalf("result decision differs:\nplan    %s\ntopdown %s", got[0], got[1])
		}
	})
}

// TestResultPolicyDeepResultMemory: a result of about 60 KB nested 1000
// deep (arrays of numbers, one string at the bottom) through the shipped
// result policy. Its walks over input.result hold, in the plan, every
// node's path at once; topdown keeps only the strings'. The plan's peak
// heap should stay in topdown's range.
func TestResultPolicyDeepResultMemory(t *testing.T) {
	dir := shippedPolicies(t, map[string]string{"data.json": differentialSettings})
	result := `{"content":[{"type":"text","text":"ok"}],"structuredContent":{"x":` + testproc.DeepJSON(990, 30) + `}}`
	call, err := callOf(`{"name":"read_ticket","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}}`, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var peaks [2]uint64
	var texts [2]string
	for i, ev := range []string{evaluatorPlan, evaluatorTopdown} {
		e, err := newEngine(newSource(dir), "data.toolgate.result.decision", stageResult, ev, 0, zap.NewNop(), policyMetrics)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Destruct() })
		c := e.current.Load()
		if ev == evaluatorPlan && c.program == nil {
			t.Fatalf("not planned: %s", c.planNote)
		}
		h := &ResultHandler{Config{engine: e}}
		input, err := h.input(c, call, subject{channel: channelResult, method: "tools/call", view: call}, []byte(result), map[*ast.Term]string{})
		if err != nil {
			t.Fatal(err)
		}
		peaks[i] = testproc.PeakHeap(func() {
			texts[i] = decisionText(e.decideWith(context.Background(), c, input, time.Minute, "result"))
		})
	}
	if texts[0] != texts[1] {
		t.Fatalf("decisions differ:\nplan    %s\ntopdown %s", texts[0], texts[1])
	}
	if peaks[0] > 4*peaks[1]+32<<20 {
		t.Errorf("result of %d bytes: peak heap plan %d MB, topdown %d MB", len(result), peaks[0]>>20, peaks[1]>>20)
	}
}

// An upstream can make the result policy work: many texts, each holding
// secrets the policy has to find and redact. At the deadline the result
// is withheld as a timeout on both evaluators; the runner never gets the
// upstream's text.
func TestResultThatOutlastsTheDeadlineIsWithheld(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"content":[`)
	for i := range 2000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"type":"text","text":"item %d: token ghp_%036d and key AKIA%016d, bearer eyJhbGciOiJIUzI1NiJ9.e30.%d"}`, i, i, i, i)
	}
	sb.WriteString(`],"isError":false}`)
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
	for _, evaluator := range []string{evaluatorPlan, evaluatorTopdown} {
		h := &ResultHandler{Config{Timeout: caddy.Duration(time.Millisecond),
			engine: benchEngineWith(t, "data.toolgate.result.decision", stageResult, evaluator), audit: benchAudit(), logger: zap.NewNop()}}
		out, err := h.check(context.Background(), call, []byte(sb.String()), "")
		if err != nil {
			t.Fatalf("%s: %v", evaluator, err)
		}
		got := out.Bytes()
		if bytes.Contains(got, []byte("ghp_")) || bytes.Contains(got, []byte("item 1:")) ||
			!bytes.Contains(got, []byte("the policy took longer than its deadline")) {
			t.Fatalf("%s: the runner gets %.300s; want the result withheld as a timeout", evaluator, got)
		}
	}
}
