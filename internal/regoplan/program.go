// Package regoplan evaluates a Rego query from the plan OPA's planner makes
// of it (OPA's intermediate representation, package ir) instead of walking
// the policy's syntax tree as OPA's own evaluator (topdown) does.
//
// The gateway evaluates its request and result policies on every call.
// topdown resolves every reference through the rule tree, unifies through
// bindings and continues through closures: about 25 µs for the default
// request policy in a loop, and several times that in a loaded process,
// where its pointer-linked trees fall out of the caches between calls. The
// planner has already done that work once, when the policy was loaded: a
// plan is a list of statements over numbered locals (look up a key, compare,
// call a function or a built-in, scan a collection), and running it is a
// loop over those statements. What the plan would build the same on every
// evaluation is built once, when it is compiled: collections the policy
// writes with constants (see fold.go), and the query's result, which is
// its value, not an object holding it.
//
// The semantics are OPA's: the plan is OPA's own (the one its WebAssembly
// compiler turns into code, which is the reference for what each statement
// does), built-in functions are topdown's own implementations, called as
// topdown calls them (an error makes the call undefined, a halt stops the
// evaluation), a rule's value is computed once per evaluation, and `with`
// replaces input or data for its body. A plan with a statement or a
// built-in this package does not run is refused when it is compiled, never
// half run: the caller evaluates that policy with topdown instead.
//
// Value may not run the plan at all: an evaluation that reads its input
// as an earlier one did is given that one's value (recall.go).
//
// Where the outcome can differ from topdown's (TestKnownDifferences): a
// conflict (a rule with two values) that topdown never reaches, because it
// stops a rule of constant value at its first success or its rule index
// skips a body unevaluated, is an error here, where every body and
// iteration runs; and of two equal values written differently (1 and 1.0)
// under one key, the first is kept. A policy with conflicting rules is
// wrong either way, and an error denies.
package regoplan

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// Program is a compiled plan of one query, safe for concurrent evaluations.
type Program struct {
	plan    *function   // the query: its blocks add to the result set
	funcs   []*function // the plan's functions (rules), by index
	stack   int         // locals the deepest chain of calls needs
	scratch int         // operands of the built-in call that has the most
	// impure: the program calls a built-in that reads the clock or keeps
	// state for the evaluation (BuiltinContext.Time and Cache): the
	// non-deterministic ones (time.now_ns, http.send, rand.intn, …) and
	// io.jwt.decode_verify, which checks expiry against the clock.
	impure bool
	pool   sync.Pool // *vm
	recollection
}

// function is a planned function (a rule, or the query itself).
type function struct {
	name   string
	index  int
	params []int
	blocks []block
	locals int  // the frame's size: the highest local it uses, plus one
	memo   bool // its only parameters are input and data: its value is kept for the evaluation
}

// Impure reports whether the program calls a built-in that reads the
// clock, keeps state for the evaluation, or reaches outside the process
// (http.send, net.lookup_ip_addr): only these see the context an
// evaluation is given. A pure program is stopped by its Cancel alone.
func (p *Program) Impure() bool { return p.impure }

// Plan returns OPA's plan of query, a reference to a rule of the policy
// compiler holds. The planner is OPA's; it is reached through the target
// plugin interface of package rego, which hands a plugin the plan of the
// query it prepares.
func Plan(ctx context.Context, compiler *ast.Compiler, query string) (*ir.Policy, error) {
	planMu.Lock()
	defer planMu.Unlock()
	planned = nil
	_, err := rego.New(rego.Query(query), rego.Compiler(compiler), rego.Target(captureTarget)).PrepareForEval(ctx)
	p := planned
	planned = nil
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("the planner made no plan")
	}
	return p, nil
}

// captureTarget names the target plugin that keeps the plan it is given.
const captureTarget = "toolgate-plan-capture"

var (
	planMu  sync.Mutex
	planned *ir.Policy
)

type capturePlugin struct{}

func (capturePlugin) IsTarget(t string) bool { return t == captureTarget }

func (capturePlugin) PrepareForEval(_ context.Context, p *ir.Policy, _ ...rego.PrepareOption) (rego.TargetPluginEval, error) {
	planned = p
	return unusable{}, nil
}

// unusable is the evaluator the capture plugin gives rego: Plan never
// evaluates through it.
type unusable struct{}

func (unusable) Eval(context.Context, *rego.EvalContext, ast.Value) (ast.Value, error) {
	return nil, errors.New("regoplan: evaluate a Program, not the prepared query")
}

func init() { rego.RegisterPlugin(captureTarget, capturePlugin{}) }

// Compile makes a Program of the plan of a query (Plan). It refuses a plan
// with a statement or a built-in it cannot run.
func Compile(p *ir.Policy) (*Program, error) {
	if p.Static == nil || p.Plans == nil || len(p.Plans.Plans) != 1 {
		return nil, errors.New("regoplan: the policy must have exactly one plan")
	}
	c := &compiler{policy: p, funcs: map[string]*function{}}
	c.strings = make([]*ast.Term, len(p.Static.Strings))
	for i, s := range p.Static.Strings {
		c.strings[i] = ast.StringTerm(s.Value)
	}
	c.builtins = map[string]*ir.BuiltinFunc{}
	for _, b := range p.Static.BuiltinFuncs {
		c.builtins[b.Name] = b
	}
	prog := &Program{}
	if p.Funcs != nil {
		for i, f := range p.Funcs.Funcs {
			fn := &function{name: f.Name, index: i}
			for _, l := range f.Params {
				fn.params = append(fn.params, int(l))
			}
			fn.memo = len(f.Params) == 2 && f.Params[0] == ir.Input && f.Params[1] == ir.Data
			c.funcs[f.Name] = fn
			prog.funcs = append(prog.funcs, fn)
		}
		for i, f := range p.Funcs.Funcs {
			fn := prog.funcs[i]
			c.fn = fn
			c.note(int(f.Return))
			for _, l := range fn.params {
				c.note(l)
			}
			for _, b := range f.Blocks {
				blk, err := c.block(b)
				if err != nil {
					return nil, fmt.Errorf("regoplan: %s: %w", f.Name, err)
				}
				fn.blocks = append(fn.blocks, blk)
			}
		}
	}
	plan := p.Plans.Plans[0]
	prog.plan = &function{name: plan.Name, index: -1, params: []int{int(ir.Input), int(ir.Data)}}
	c.fn = prog.plan
	c.note(int(ir.Data))
	for _, b := range plan.Blocks {
		blk, err := c.block(b)
		if err != nil {
			return nil, fmt.Errorf("regoplan: plan %s: %w", plan.Name, err)
		}
		prog.plan.blocks = append(prog.plan.blocks, blk)
	}
	var err error
	if prog.stack, prog.scratch, err = c.depth(prog.plan, map[*function]bool{}, map[*function][2]int{}); err != nil {
		return nil, err
	}
	prog.impure = c.impure
	prog.recallable = !c.impure && !c.effects
	bindResults(prog.plan)
	fold(prog)
	prog.pool.New = func() any { return newVM(prog) }
	return prog, nil
}

// readsClock reports whether built-in name reads the clock although OPA
// does not mark it non-deterministic: a token's expiry
// (io.jwt.decode_verify) and a certificate chain's validity, which Go's
// verifier checks at the time of the call unless told another
// (crypto.x509.parse_and_verify_certificates, and its _with_options
// without CurrentTime). Such a call's outcome changes with no change of
// its operands: the evaluation is impure, and never recalled.
func readsClock(name string) bool {
	return strings.HasPrefix(name, "io.jwt.") || strings.HasPrefix(name, "crypto.x509.parse_and_verify_certificates")
}

// compiler turns ir statements into the program's own, with every local,
// constant and callee resolved.
type compiler struct {
	policy   *ir.Policy
	strings  []*ast.Term
	builtins map[string]*ir.BuiltinFunc
	funcs    map[string]*function
	fn       *function // the function being compiled
	impure   bool
	effects  bool // the plan prints (print, trace)
}

// note records that the current function uses local l.
func (c *compiler) note(l int) {
	if l+1 > c.fn.locals {
		c.fn.locals = l + 1
	}
}

func (c *compiler) local(l ir.Local) int {
	c.note(int(l))
	return int(l)
}

func (c *compiler) operand(o ir.Operand) (operand, error) {
	switch v := o.Value.(type) {
	case ir.Local:
		return operand{local: c.local(v)}, nil
	case ir.Bool:
		return operand{local: -1, konst: ast.InternedTerm(bool(v))}, nil
	case ir.StringIndex:
		if int(v) < 0 || int(v) >= len(c.strings) {
			return operand{}, fmt.Errorf("string constant %d out of range", v)
		}
		return operand{local: -1, konst: c.strings[v]}, nil
	}
	return operand{}, fmt.Errorf("unknown operand %v", o.Value)
}

func (c *compiler) operands(os []ir.Operand) ([]operand, error) {
	out := make([]operand, len(os))
	for i, o := range os {
		var err error
		if out[i], err = c.operand(o); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *compiler) block(b *ir.Block) (block, error) {
	out := make(block, 0, len(b.Stmts))
	for _, s := range b.Stmts {
		in, err := c.stmt(s)
		if err != nil {
			return nil, err
		}
		if in == nil {
			continue
		}
		// A relation's call (walk) and the scan of its outputs become one
		// statement that runs the scan's body on each output as the
		// built-in gives it, as topdown does: collected first, walk's
		// outputs (a path each, as long as the document is deep) would
		// all be held at once.
		if sc, ok := in.(*scan); ok && len(out) > 0 {
			if call, ok := out[len(out)-1].(*callBuiltin); ok && call.relation && call.result == sc.src {
				out[len(out)-1] = &relationScan{call: call, scan: sc}
				continue
			}
		}
		out = append(out, in)
	}
	return out, nil
}

func (c *compiler) blocks(bs []*ir.Block) ([]block, error) {
	out := make([]block, len(bs))
	for i, b := range bs {
		var err error
		if out[i], err = c.block(b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (c *compiler) stmt(s ir.Stmt) (instr, error) {
	switch s := s.(type) {
	case *ir.NopStmt:
		return nil, nil
	case *ir.ResultSetAddStmt:
		return &resultAdd{src: c.local(s.Value)}, nil
	case *ir.ReturnLocalStmt:
		return &returnLocal{src: c.local(s.Source)}, nil
	case *ir.BlockStmt:
		bs, err := c.blocks(s.Blocks)
		return &blockStmt{blocks: bs}, err
	case *ir.BreakStmt:
		return &breakStmt{index: int(s.Index)}, nil
	case *ir.CallStmt:
		args, err := c.operands(s.Args)
		if err != nil {
			return nil, err
		}
		if fn, ok := c.funcs[s.Func]; ok {
			if len(args) != len(fn.params) {
				return nil, fmt.Errorf("call of %s with %d arguments, it has %d parameters", s.Func, len(args), len(fn.params))
			}
			return &callFunc{fn: fn, args: args, result: c.local(s.Result)}, nil
		}
		decl, ok := c.builtins[s.Func]
		if !ok {
			return nil, fmt.Errorf("call of %s, neither a function of the plan nor a declared built-in", s.Func)
		}
		f := topdown.GetBuiltin(s.Func)
		if f == nil {
			return nil, fmt.Errorf("built-in %s is not one of OPA's", s.Func)
		}
		bi := ast.BuiltinMap[s.Func]
		relation := bi != nil && bi.Relation
		if bi == nil || bi.Nondeterministic || readsClock(s.Func) {
			c.impure = true
		}
		if s.Func == ast.InternalPrint.Name || s.Func == ast.Trace.Name {
			c.effects = true // an evaluation recalled would not print
		}
		return &callBuiltin{name: s.Func, f: f, relation: relation, void: decl.Decl != nil && decl.Decl.Result() == nil,
			args: args, result: c.local(s.Result)}, nil
	case *ir.AssignVarStmt:
		src, err := c.operand(s.Source)
		return &assign{src: src, dst: c.local(s.Target)}, err
	case *ir.AssignVarOnceStmt:
		src, err := c.operand(s.Source)
		return &assignOnce{src: src, dst: c.local(s.Target)}, err
	case *ir.AssignIntStmt:
		return &makeConst{v: ast.IntNumberTerm(int(s.Value)), dst: c.local(s.Target)}, nil
	case *ir.ScanStmt:
		body, err := c.block(s.Block)
		return &scan{src: c.local(s.Source), key: c.local(s.Key), value: c.local(s.Value), body: body}, err
	case *ir.NotStmt:
		body, err := c.block(s.Block)
		return &not{body: body}, err
	case *ir.DotStmt:
		src, err := c.operand(s.Source)
		if err != nil {
			return nil, err
		}
		key, err := c.operand(s.Key)
		return &dot{src: src, key: key, dst: c.local(s.Target)}, err
	case *ir.LenStmt:
		src, err := c.operand(s.Source)
		return &length{src: src, dst: c.local(s.Target)}, err
	case *ir.EqualStmt:
		a, err := c.operand(s.A)
		if err != nil {
			return nil, err
		}
		b, err := c.operand(s.B)
		return &equal{a: a, b: b}, err
	case *ir.NotEqualStmt:
		a, err := c.operand(s.A)
		if err != nil {
			return nil, err
		}
		b, err := c.operand(s.B)
		return &equal{a: a, b: b, not: true}, err
	case *ir.MakeNullStmt:
		return &makeConst{v: ast.InternedNullTerm, dst: c.local(s.Target)}, nil
	case *ir.MakeNumberIntStmt:
		return &makeConst{v: ast.IntNumberTerm(int(s.Value)), dst: c.local(s.Target)}, nil
	case *ir.MakeNumberRefStmt:
		if s.Index < 0 || s.Index >= len(c.strings) {
			return nil, fmt.Errorf("number constant %d out of range", s.Index)
		}
		return &makeConst{v: ast.NewTerm(ast.Number(c.policy.Static.Strings[s.Index].Value)), dst: c.local(s.Target)}, nil
	case *ir.MakeArrayStmt:
		return &makeArray{capacity: int(max(s.Capacity, 0)), dst: c.local(s.Target)}, nil
	case *ir.MakeObjectStmt:
		return &makeObject{dst: c.local(s.Target)}, nil
	case *ir.MakeSetStmt:
		return &makeSet{dst: c.local(s.Target)}, nil
	case *ir.IsArrayStmt:
		src, err := c.operand(s.Source)
		return &isKind{src: src, kind: kindArray}, err
	case *ir.IsObjectStmt:
		src, err := c.operand(s.Source)
		return &isKind{src: src, kind: kindObject}, err
	case *ir.IsSetStmt:
		src, err := c.operand(s.Source)
		return &isKind{src: src, kind: kindSet}, err
	case *ir.IsDefinedStmt:
		return &isDefined{src: c.local(s.Source)}, nil
	case *ir.IsUndefinedStmt:
		return &isDefined{src: c.local(s.Source), not: true}, nil
	case *ir.ResetLocalStmt:
		return &reset{dst: c.local(s.Target)}, nil
	case *ir.ArrayAppendStmt:
		v, err := c.operand(s.Value)
		return &arrayAppend{v: v, arr: c.local(s.Array)}, err
	case *ir.ObjectInsertStmt:
		k, err := c.operand(s.Key)
		if err != nil {
			return nil, err
		}
		v, err := c.operand(s.Value)
		return &objectInsert{k: k, v: v, obj: c.local(s.Object)}, err
	case *ir.ObjectInsertOnceStmt:
		k, err := c.operand(s.Key)
		if err != nil {
			return nil, err
		}
		v, err := c.operand(s.Value)
		return &objectInsert{k: k, v: v, obj: c.local(s.Object), once: true}, err
	case *ir.SetAddStmt:
		v, err := c.operand(s.Value)
		return &setAdd{v: v, set: c.local(s.Set)}, err
	case *ir.WithStmt:
		v, err := c.operand(s.Value)
		if err != nil {
			return nil, err
		}
		path := make([]*ast.Term, len(s.Path))
		for i, p := range s.Path {
			if p < 0 || p >= len(c.strings) {
				return nil, fmt.Errorf("string constant %d out of range", p)
			}
			path[i] = c.strings[p]
		}
		body, err := c.block(s.Block)
		return &with{local: c.local(s.Local), path: path, v: v, body: body}, err
	}
	// ObjectMergeStmt and CallDynamicStmt (and any statement a later OPA
	// adds) are not run here; the caller falls back to topdown.
	return nil, fmt.Errorf("statement %T is not supported", s)
}

// bindResults makes the plan's result objects of one binding bindings:
// a block that makes an object, inserts a constant key and a local's value
// and adds the object to the result set, and uses the object nowhere else,
// adds the binding instead (see resultAdd), for Value to read without an
// object made. (The plan of a query is one block of statements.)
func bindResults(plan *function) {
	uses := map[int]int{}
	for _, b := range plan.blocks {
		walkInstrs(b, func(in instr) {
			reads(in, func(l int) { uses[l]++ })
			writes(in, func(l int) { uses[l]++ })
		})
	}
	bind := func(b block) block {
		for i := 2; i < len(b); i++ {
			add, ok := b[i].(*resultAdd)
			if !ok || add.key != nil {
				continue
			}
			mk, ok1 := b[i-2].(*makeObject)
			ins, ok2 := b[i-1].(*objectInsert)
			if !ok1 || !ok2 || mk.dst != add.src || ins.obj != add.src || ins.once || ins.k.local >= 0 || ins.v.local < 0 || uses[add.src] != 3 {
				continue
			}
			b[i-2] = nil
			b[i-1] = nil
			b[i] = &resultAdd{src: ins.v.local, key: ins.k.konst}
		}
		return compact(b)
	}
	for j, b := range plan.blocks {
		plan.blocks[j] = bind(b)
	}
}

// depth returns the locals the deepest chain of calls from fn needs, and
// the most operands of a built-in call on the way. Rego has no recursion;
// a cycle is refused.
func (c *compiler) depth(fn *function, visiting map[*function]bool, done map[*function][2]int) (int, int, error) {
	if d, ok := done[fn]; ok {
		return d[0], d[1], nil
	}
	if visiting[fn] {
		return 0, 0, fmt.Errorf("regoplan: %s calls itself", fn.name)
	}
	visiting[fn] = true
	var locals, scratch int
	var err error
	for _, b := range fn.blocks {
		walkInstrs(b, func(in instr) {
			switch in := in.(type) {
			case *callFunc:
				if err != nil {
					return
				}
				var l, s int
				if l, s, err = c.depth(in.fn, visiting, done); err == nil {
					locals, scratch = max(locals, l), max(scratch, s)
				}
			case *callBuiltin:
				scratch = max(scratch, len(in.args))
			}
		})
	}
	visiting[fn] = false
	if err != nil {
		return 0, 0, err
	}
	d := [2]int{fn.locals + locals, scratch}
	done[fn] = d
	return d[0], d[1], nil
}
