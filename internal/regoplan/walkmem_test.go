package regoplan

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

func peak(f func()) uint64 {
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var max atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var m runtime.MemStats
		for {
			select {
			case <-done:
				return
			default:
			}
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > max.Load() {
				max.Store(m.HeapAlloc)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	f()
	close(done)
	<-stopped
	if h := max.Load(); h > base.HeapAlloc {
		return h - base.HeapAlloc
	}
	return 0
}

// TestPlanWalkMemory: walk is a relation; the plan collects every
// [path, value] it gives into one array before scanning it, where topdown
// consumes them one at a time. Paths are as long as the input is deep, so
// a 60 KB input nested 1000 deep holds 30 000 paths of up to 1000 elements
// at once (hundreds of MB) while topdown keeps only the ones the rule
// keeps. The plan's peak heap should stay in topdown's range.
func TestPlanWalkMemory(t *testing.T) {
	var b strings.Builder
	const depth, k = 1000, 30
	for range depth {
		b.WriteString("[" + strings.Repeat("0,", k))
	}
	b.WriteString(`"s"`)
	b.WriteString(strings.Repeat("]", depth))
	in := ast.MustParseTerm(b.String())
	compiler := compile(t, map[string]string{"p.rego": `package p
scanned[path] := s if { walk(input, [path, s]); is_string(s) }
r := count(scanned)
`})
	prog := program(t, compiler, "data.p.r")
	var planErr error
	pp := peak(func() {
		_, planErr = prog.Eval(context.Background(), in, ast.NewTerm(ast.NewObject()), nil)
	})
	pq, err := rego.New(rego.Query("data.p.r"), rego.Compiler(compiler)).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var tdErr error
	tp := peak(func() {
		_, tdErr = pq.Eval(context.Background(), rego.EvalParsedInput(in.Value))
	})
	if planErr != nil || tdErr != nil {
		t.Fatal(planErr, tdErr)
	}
	if pp > 4*tp+32<<20 {
		t.Errorf("peak heap of %d bytes of input: plan %d MB, topdown %d MB", b.Len(), pp>>20, tp>>20)
	}
}

// TestPlanWalkIgnoresCancel: an evaluation cancelled before it starts
// still runs walk over the whole input (a built-in call is not
// interrupted, and the plan's first cancellation check comes after it),
// allocating what the whole walk needs; topdown stops at walk's first
// output. Measured in bytes allocated, not time.
func TestPlanWalkIgnoresCancel(t *testing.T) {
	var b strings.Builder
	const depth, k = 1000, 30
	for range depth {
		b.WriteString("[" + strings.Repeat("0,", k))
	}
	b.WriteString(`"s"`)
	b.WriteString(strings.Repeat("]", depth))
	in := ast.MustParseTerm(b.String())
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
