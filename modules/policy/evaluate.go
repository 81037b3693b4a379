package policy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/toolgate/toolgate/internal/regoplan"
)

// Which evaluator decides (Config.Evaluator).
const (
	// evaluatorPlan runs the plan OPA's planner makes of the decision rule
	// (package regoplan), and OPA's own evaluator for a policy whose plan
	// cannot be run. The default.
	evaluatorPlan = "plan"
	// evaluatorTopdown always runs OPA's own evaluator.
	evaluatorTopdown = "topdown"
)

// planned compiles the plan of query; a nil program and the reason when
// it cannot be run (the policy then runs on topdown).
func planned(ctx context.Context, compiler *ast.Compiler, query string, data map[string]any) (*regoplan.Program, *ast.Term, string) {
	p, err := regoplan.Plan(ctx, compiler, query)
	if err != nil {
		return nil, nil, err.Error()
	}
	prog, err := regoplan.Compile(p)
	if err != nil {
		return nil, nil, err.Error()
	}
	var d ast.Value = ast.NewObject()
	if data != nil {
		if d, err = ast.InterfaceToValue(data); err != nil {
			return nil, nil, "the policy's data: " + err.Error()
		}
	}
	return prog, ast.NewTerm(d), ""
}

// evaluateBy evaluates the decision rule on input (see evaluate) with a
// deadline, and reports whether the deadline stopped it. started, given
// to evaluate, is called as the evaluation starts (an evaluation by OPA's
// evaluator may first wait for one).
//
// A pure plan (the default policies' case) is stopped by a deadline that
// reads the clock when asked: the plan asks every few hundred steps, and
// built-ins that can run long (replace, concat, numbers.range) on each
// piece they write. That costs no timer and no context of its own per
// decision, which were a fifth of a decision's time in a loop. A plan that
// can block in a built-in (http.send) and OPA's evaluator get a timer that
// cancels both the evaluation and the context the built-ins see. (Given a
// context with a deadline, OPA would start a goroutine per evaluation to
// watch it.)
func (c *compiled) evaluateBy(ctx context.Context, input ast.Value, by time.Time) (ev evaluation, err error) {
	if c.program != nil && !c.program.Impure() {
		d := &deadline{at: by}
		ev, err = c.evaluate(ctx, input, d, func() {})
		ev.timedOut = d.expired.Load()
		return ev, err
	}
	// The time an evaluation waited for an evaluator (others' evaluations
	// running) is not its own: its deadline starts when it does.
	ctx, cancel := context.WithCancel(ctx)
	halt := topdown.NewCancel()
	timeout := time.Until(by)
	var timer *time.Timer
	ev, err = c.evaluate(ctx, input, halt, func() { timer = time.AfterFunc(timeout, func() { halt.Cancel(); cancel() }) })
	ev.timedOut = timer != nil && !timer.Stop()
	cancel()
	return ev, err
}

// evaluation is what an evaluation gave: the decision rule's value (nil
// when it is undefined or not a single value), how many results there
// were, whether the plan recalled the value of an earlier evaluation (see
// internal/regoplan's recall) and whether the deadline stopped it.
type evaluation struct {
	value    *ast.Term
	n        int
	recalled bool
	timedOut bool
}

// deadline is a topdown.Cancel that is cancelled once its time has come,
// read from the clock on each call of Cancelled: its callers already ask
// sparingly (the plan every few hundred steps, a built-in once per piece
// of its output), and a reading more often than they ask would let a
// decision run past its deadline by as many steps again.
type deadline struct {
	at      time.Time
	expired atomic.Bool // the time came, or Cancel was called
}

func (d *deadline) Cancel() { d.expired.Store(true) }

func (d *deadline) Cancelled() bool {
	if d.expired.Load() {
		return true
	}
	if time.Now().Before(d.at) {
		return false
	}
	d.expired.Store(true)
	return true
}

// evaluate evaluates the decision rule on input (see evaluation).
//
// A plan runs on the request's goroutine: it recurses only as deep as the
// policy's blocks nest. topdown runs on an evaluator goroutine (see
// evalstack.go).
func (c *compiled) evaluate(ctx context.Context, input ast.Value, halt topdown.Cancel, started func()) (evaluation, error) {
	if c.program != nil {
		started()
		t, n, recalled, err := c.program.Decide(ctx, ast.NewTerm(input), c.data, halt)
		return evaluation{value: t, n: n, recalled: recalled}, err
	}
	var rs rego.ResultSet
	var err error
	if perr := onEvaluator(func() {
		started()
		rules := getRuleCache()
		rs, err = c.query.Eval(ctx, rego.EvalParsedInput(input), rego.EvalExternalCancel(halt), rego.EvalMetrics(noMetrics),
			rego.EvalVirtualCache(rules))
		putRuleCache(rules)
	}); perr != nil {
		err = perr
	}
	if err != nil || len(rs) != 1 {
		return evaluation{n: len(rs)}, err
	}
	if len(rs[0].Expressions) != 1 {
		return evaluation{n: len(rs[0].Expressions)}, nil
	}
	t, _ := rs[0].Expressions[0].Value.(*ast.Term)
	return evaluation{value: t, n: 1}, nil
}
