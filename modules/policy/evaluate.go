package policy

import (
	"context"

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

// evaluate evaluates the decision rule on input: its value (nil when the
// rule is undefined or not a single value) and how many results there
// were.
//
// A plan runs on the request's goroutine: it recurses only as deep as the
// policy's blocks nest. topdown runs on an evaluator goroutine (see
// evalstack.go).
func (c *compiled) evaluate(ctx context.Context, input ast.Value, halt topdown.Cancel) (*ast.Term, int, error) {
	if c.program != nil {
		return c.program.Value(ctx, ast.NewTerm(input), c.data, halt)
	}
	var rs rego.ResultSet
	var err error
	if perr := onEvaluator(func() {
		rules := getRuleCache()
		rs, err = c.query.Eval(ctx, rego.EvalParsedInput(input), rego.EvalExternalCancel(halt), rego.EvalMetrics(noMetrics),
			rego.EvalVirtualCache(rules))
		putRuleCache(rules)
	}); perr != nil {
		err = perr
	}
	if err != nil || len(rs) != 1 {
		return nil, len(rs), err
	}
	if len(rs[0].Expressions) != 1 {
		return nil, len(rs[0].Expressions), nil
	}
	t, _ := rs[0].Expressions[0].Value.(*ast.Term)
	return t, 1, nil
}
