package policy

import (
	"context"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/testproc"
)

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
