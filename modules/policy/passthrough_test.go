package policy

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// passingHandler is a result step with the shipped policies and
// max_result_bytes raised to 2 MiB, so that a result of a megabyte passes
// unchanged.
func passingHandler(t testing.TB) *ResultHandler {
	t.Helper()
	dir := shippedPolicies(t, map[string]string{"data.json": `{"toolgate": {"settings": {"max_result_bytes": 2097152}}}`})
	e, err := newEngine(newSource(dir), "data.toolgate.result.decision", stageResult, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	return &ResultHandler{Config{Timeout: caddy.Duration(time.Minute), engine: e, audit: benchAudit(), logger: zap.NewNop()}}
}

// bigText is size bytes of lines of 56 bytes, so that its JSON has an
// escaped line end every 56 bytes.
func bigText(size int) string {
	line := "lorem ipsum dolor sit amet, consectetur adipiscing elit\n"
	return strings.Repeat(line, size/len(line)+1)[:size]
}

// A result the policy allows unchanged reaches the runner as the upstream
// wrote it, with the decision's _meta put first, and without being copied:
// the hook hands back the mark and the upstream's own bytes. What the step
// allocates is about one copy of the text, the string the policy reads.
func TestLargeResultPassesUncopied(t *testing.T) {
	h := passingHandler(t)
	ctx := context.Background()
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
	result := []byte(textResult(bigText(1 << 20)))

	out, err := h.check(ctx, call, result, "")
	if err != nil || len(out) != 2 {
		t.Fatalf("check: %d pieces, %v", len(out), err)
	}
	head, tail := out[0], out[1]
	if unsafe.SliceData(tail) != &result[1] || len(tail) != len(result)-1 {
		t.Errorf("the result's text was copied, not passed on")
	}
	want := `{"_meta":{"toolgate/decision":{"id":"` + call.Decision.ID + `","action":"allow"}},`
	if string(head) != want {
		t.Errorf("mark %s, want %s", head, want)
	}
	joined := out.Bytes()
	if !bytes.Equal(joined[len(head)-1:], append([]byte{','}, result[1:]...)) {
		t.Errorf("the upstream's bytes changed")
	}
	if err := mcpmsg.Validate(joined, mcpmsg.Limits{}); err != nil {
		t.Errorf("the answer is not valid JSON: %v", err)
	}

	r := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			if out, err := h.check(ctx, call, result, ""); err != nil || len(out) != 2 {
				b.Fatalf("check: %d pieces, %v", len(out), err)
			}
		}
	})
	got := float64(r.AllocedBytesPerOp())
	t.Logf("%.0f bytes allocated to pass a result of %d (%.2f×)", got, len(result), got/float64(len(result)))
	if got > 1.5*float64(len(result)) {
		t.Errorf("%.0f bytes allocated to pass a result of %d (%.2f×)", got, len(result), got/float64(len(result)))
	}
}
