package regoplan

import (
	"context"
	"runtime"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/toolgate/toolgate/internal/testproc"
)

// TestWalkMemory: walk is a relation, whose outputs are a path each, as
// long as the document is deep. The plan runs the scan's body on each
// output as walk gives it, as topdown does: held at once, the outputs of a
// 60 KB input nested 1000 deep took hundreds of MB. The plan's peak heap
// stays in topdown's range.
func TestWalkMemory(t *testing.T) {
	doc := testproc.DeepJSON(1000, 30)
	in := ast.MustParseTerm(doc)
	compiler := compile(t, map[string]string{"p.rego": `package p
scanned[path] := s if { walk(input, [path, s]); is_string(s) }
r := count(scanned)
`})
	prog := program(t, compiler, "data.p.r")
	var planErr error
	pp := testproc.PeakHeap(func() {
		_, planErr = prog.Eval(context.Background(), in, ast.NewTerm(ast.NewObject()), nil)
	})
	pq, err := rego.New(rego.Query("data.p.r"), rego.Compiler(compiler)).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var tdErr error
	tp := testproc.PeakHeap(func() {
		_, tdErr = pq.Eval(context.Background(), rego.EvalParsedInput(in.Value))
	})
	if planErr != nil || tdErr != nil {
		t.Fatal(planErr, tdErr)
	}
	if pp > 4*tp+32<<20 {
		t.Errorf("peak heap of %d bytes of input: plan %d MB, topdown %d MB", len(doc), pp>>20, tp>>20)
	}
}

// TestWalkStopsWhenCancelled: an evaluation cancelled before it starts
// stops within walk's first outputs, as topdown does, rather than after
// walking the whole input. Measured in bytes allocated, not time.
func TestWalkStopsWhenCancelled(t *testing.T) {
	doc := testproc.DeepJSON(1000, 30)
	in := ast.MustParseTerm(doc)
	compiler := compile(t, map[string]string{"p.rego": `package p
r := count([p | walk(input, [p, s]); is_string(s)])
`})
	prog := program(t, compiler, "data.p.r")
	c := topdown.NewCancel()
	c.Cancel()
	allocated := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		return after.TotalAlloc - before.TotalAlloc
	}
	var planErr, tdErr error
	pa := allocated(func() { _, planErr = prog.Eval(context.Background(), in, ast.NewTerm(ast.NewObject()), c) })
	pq, err := rego.New(rego.Query("data.p.r"), rego.Compiler(compiler)).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ta := allocated(func() {
		_, tdErr = pq.Eval(context.Background(), rego.EvalParsedInput(in.Value), rego.EvalExternalCancel(c))
	})
	if planErr != ErrCancelled || tdErr == nil {
		t.Fatalf("plan %v, topdown %v: both should be cancelled", planErr, tdErr)
	}
	if pa > 4*ta+16<<20 {
		t.Errorf("cancelled before it started: plan allocated %d MB, topdown %d MB", pa>>20, ta>>20)
	}
}
