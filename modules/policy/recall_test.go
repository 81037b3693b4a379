package policy

import (
	"context"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"testing"

	"github.com/toolgate/toolgate/modules/gateway"
)

// TestShippedDecisionsAreRecalled: the shipped policies' commonest
// decisions — on a call (allowed, or asked about) and on a result with
// nothing to clean — read few enough members of the input that the next
// such decision is recalled (regoplan's recall), whatever the arguments
// and the result's text; a result that needs cleaning is decided afresh.
// A change to the policies that made them read more on these paths (say,
// put a part of the input into a collection) would make every decision
// run the plan again: this test says so.
func TestShippedDecisionsAreRecalled(t *testing.T) {
	ctx := context.Background()
	req := benchEngine(t, requestQuery, stageRequest)
	for _, c := range []struct {
		name, tool, want string
		args             [3]string
	}{
		{"read-only", benchTool, gateway.ActionAllow, [3]string{`{"ticket_id":"TEST-1"}`, `{"ticket_id":"TEST-2","include_comments":true}`, `{"ticket_id":"OPS-77"}`}},
		{"unmarked", benchUnmarkedTool, gateway.ActionAsk, [3]string{`{"ticket_id":"TEST-1","status":"closed"}`, `{"ticket_id":"TEST-9","status":"open"}`, `{"ticket_id":"X","status":"x"}`}},
	} {
		prog := req.current.Load().program
		before := prog.Recalled()
		for _, args := range c.args {
			call := benchCall(t, c.tool, args)
			input, err := requestInput(call, toolTerm(call.Tool, call.Message.Name, call.Service), false)
			if err != nil {
				t.Fatal(err)
			}
			if o := req.decide(ctx, input, benchTimeout, "arguments"); o.Action != c.want {
				t.Fatalf("%s %s: %+v, want %s", c.name, args, o, c.want)
			}
		}
		if got := prog.Recalled() - before; got < 2 {
			t.Errorf("%s: %d of the 3 decisions recalled, want the last 2", c.name, got)
		}
	}

	h := &ResultHandler{Config{engine: benchEngine(t, "data.toolgate.result.decision", stageResult), audit: benchAudit()}}
	prog := h.engine.current.Load().program
	// The metric counts what the program recalled (this package's tests
	// run one at a time).
	counted := func() float64 { return testutil.ToFloat64(policyMetrics.recalled.WithLabelValues(stageResult)) }
	countedBefore := counted()
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
	for _, text := range []string{"TEST-1: printer on fire", "TEST-2: fixed, see the log", "a longer answer with more words in it than the others"} {
		if _, err := h.check(ctx, call, []byte(textResult(text)), ""); err != nil || call.Decision.Action != gateway.ActionAllow {
			t.Fatalf("%q: %v, %+v", text, err, call.Decision)
		}
	}
	if got := prog.Recalled(); got < 2 {
		t.Errorf("clean results: %d of 3 decisions recalled, want the last 2", got)
	}
	before := prog.Recalled()
	if _, err := h.check(ctx, call, []byte(textResult("the key is AKIAIOSFODNN7EXAMPLE")), ""); err != nil {
		t.Fatal(err)
	}
	if got := prog.Recalled() - before; got != 0 {
		t.Errorf("a result with a secret to redact was recalled (%d), not decided", got)
	}
	if got, want := counted()-countedBefore, float64(prog.Recalled()); got != want {
		t.Errorf("toolgate_policy_recalled_total{stage=\"result\"} went up by %v, want %v", got, want)
	}
}
