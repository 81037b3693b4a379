package regoplan

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/builtins"
)

// What running a block ends with, besides a break out of it and n more
// enclosing blocks (n ≥ 0).
const (
	completed = -1 // its last statement ran
	returned  = -2 // a function returned (vm.ret holds its value)
	failed    = -3 // the evaluation failed (vm.err says why)
)

// vm is the state of one evaluation; pooled per Program.
type vm struct {
	prog    *Program
	stack   []*ast.Term // the frames of the calls in progress
	tags    []int32     // beside stack: what each local holds of the input (see recorder)
	sp      int
	high    int         // the most of stack the evaluation used
	scratch []*ast.Term // a built-in call's operands
	memo    []memoEntry // by function index; a rule's value for this evaluation
	saved   [][]memoEntry
	results []result
	ret     *ast.Term
	err     error
	cancel  topdown.Cancel
	steps   int
	bctx    topdown.BuiltinContext
	out     *ast.Term
	outs    []*ast.Term
	called  bool
	iterOne func(*ast.Term) error
	iterAll func(*ast.Term) error
	// scanObject is the callback of a scan over an object: a step of the
	// scan in scanning.
	scanObject func(k, v *ast.Term) bool
	scanning   scanning
	// takeValue keeps a binding's value in value (for Value).
	takeValue func(_, v *ast.Term)
	value     *ast.Term
	// rec records what the evaluation reads of its input, for Program's
	// recall; nil when it does not (or no longer can).
	rec    *recorder
	recBuf recorder
	// rnodes and routs are a recall's scratch (see recalled).
	rnodes, routs []*ast.Term
}

// result is one result of the query: obj, or the binding of key to v.
type result struct {
	obj    ast.Object
	key, v *ast.Term
}

func (r result) object() ast.Object {
	if r.obj == nil {
		return ast.NewObject([2]*ast.Term{r.key, r.v})
	}
	return r.obj
}

// scanning is a scan over an object in progress: where it runs and what
// its last step ended with.
type scanning struct {
	frame []*ast.Term
	ft    []int32
	in    *scan
	res   int
}

type memoEntry struct {
	state int8 // 0: not computed, 1: defined, 2: undefined
	v     *ast.Term
}

func newVM(p *Program) *vm {
	m := &vm{prog: p, stack: make([]*ast.Term, p.stack), tags: make([]int32, p.stack), scratch: make([]*ast.Term, p.scratch),
		memo: make([]memoEntry, len(p.funcs))}
	m.iterOne = func(t *ast.Term) error {
		if !m.called {
			m.called, m.out = true, t
		}
		return nil
	}
	m.iterAll = func(t *ast.Term) error {
		m.outs = append(m.outs, t)
		return nil
	}
	m.takeValue = func(_, v *ast.Term) { m.value = v }
	m.recBuf.vm = m
	m.scanObject = func(k, v *ast.Term) bool {
		var stop bool
		m.scanning.res, stop = m.scanStep(m.scanning.frame, m.scanning.ft, m.scanning.in, k, v)
		return stop
	}
	return m
}

// ErrCancelled is the error of an evaluation stopped by its Cancel.
var ErrCancelled = errors.New("regoplan: evaluation cancelled")

// Eval evaluates the program's query on input and data (the policy's
// base documents). Each result is the query's bindings (for a rule
// reference, one binding: its value). cancel, if not nil, stops the
// evaluation when cancelled; ctx is what built-ins such as http.send see.
func (p *Program) Eval(ctx context.Context, input, data *ast.Term, cancel topdown.Cancel) ([]ast.Object, error) {
	m, err := p.run(ctx, input, data, cancel, false)
	var out []ast.Object
	if err == nil {
		for _, r := range m.results {
			out = append(out, r.object())
		}
	}
	p.release(m)
	return out, err
}

// Value is Eval for a query of one rule reference: the value of its one
// result's one binding, and the number of results (the value is nil
// unless there is one result of one binding). It allocates nothing for
// the results.
//
// An evaluation of a pure program (see recall.go) may instead give the
// value an earlier one gave for an input it read the same: the value is
// then shared, and the caller must not change it (nor any value Value
// returns). A recall is kept for the data term it was made with, which
// must not change while the program is used: new data is a new term.
// (The policy engine builds one per policy version and never changes it.)
func (p *Program) Value(ctx context.Context, input, data *ast.Term, cancel topdown.Cancel) (v *ast.Term, n int, err error) {
	v, n, _, err = p.Decide(ctx, input, data, cancel)
	return v, n, err
}

// Decide is Value, and says whether the value was recalled rather than
// evaluated.
func (p *Program) Decide(ctx context.Context, input, data *ast.Term, cancel topdown.Cancel) (v *ast.Term, n int, recalled bool, err error) {
	// (Without input, no member of it is looked up: nothing to record.)
	if p.recallable && input != nil {
		if v, n, ok := p.recall(ctx, input, data, cancel); ok {
			return v, n, true, nil
		}
	}
	m, err := p.run(ctx, input, data, cancel, input != nil && p.recording())
	if err == nil {
		n = len(m.results)
		switch r := m.results; {
		case n != 1:
		case r[0].obj == nil:
			v = r[0].v
		case r[0].obj.Len() == 1:
			r[0].obj.Foreach(m.takeValue)
			v = m.value
		}
		p.remember(m, data, v, n)
	}
	p.release(m)
	return v, n, false, err
}

// run evaluates the program on a vm of the pool, which holds the results
// until it is released.
func (p *Program) run(ctx context.Context, input, data *ast.Term, cancel topdown.Cancel, record bool) (m *vm, err error) {
	m = p.pool.Get().(*vm)
	defer func() {
		if r := recover(); r != nil {
			// A plan that does not hold together (a statement on a value of
			// the wrong kind) is an error of the evaluation, not a crash.
			err = fmt.Errorf("regoplan: %v", r)
			m = newVM(p) // the pooled one may be mid-way
		}
	}()
	m.start(ctx, cancel)
	frame, ft := m.stack[:p.plan.locals], m.tags[:p.plan.locals]
	m.sp, m.high = p.plan.locals, p.plan.locals
	frame[0], frame[1] = input, data
	if record {
		m.rec = m.recBuf.start(len(p.funcs))
		ft[0] = 1 // node 0: the input
	}
	for _, b := range p.plan.blocks {
		if m.exec(frame, ft, b) == failed {
			return m, m.err
		}
	}
	return m, nil
}

// release returns m to the pool, keeping nothing of its evaluation.
func (p *Program) release(m *vm) {
	m.finish()
	p.pool.Put(m)
}

func (m *vm) start(ctx context.Context, cancel topdown.Cancel) {
	m.cancel = cancel
	m.bctx = topdown.BuiltinContext{
		Context:      ctx,
		Metrics:      noMetrics,
		Seed:         rand.Reader,
		Cancel:       cancel,
		Capabilities: capabilities,
	}
	if m.prog.impure {
		// The clock and the evaluation's cache, for the built-ins that read
		// them (see Program.impure); the others never do.
		m.bctx.Time = ast.NewTerm(jsonInt(time.Now().UnixNano()))
		m.bctx.Cache = builtins.Cache{}
	}
}

// finish drops what the evaluation referenced, so that a pooled vm keeps
// no input alive.
func (m *vm) finish() {
	clear(m.stack[:m.high])
	clear(m.tags[:m.high])
	clear(m.scratch)
	m.rec = nil
	m.recBuf.reset()
	clear(m.memo)
	m.saved = m.saved[:0]
	clear(m.results)
	m.results = m.results[:0]
	m.ret, m.err, m.out, m.cancel, m.value = nil, nil, nil, nil, nil
	m.scanning = scanning{}
	clear(m.outs)
	m.outs = m.outs[:0]
	if cap(m.outs) > 1024 {
		m.outs = nil // a pooled vm does not keep a large walk's room
	}
	m.bctx = topdown.BuiltinContext{}
	m.sp, m.high, m.steps = 0, 0, 0
}

// emptyObject and emptySet are what a new object or set holds until its
// first member: most sets of reasons (deny, ask) and rewrite objects of a
// decision stay empty, so they cost a term, not a collection. They are
// never changed: inserting replaces them by a collection of the term's
// own.
var (
	emptyObject ast.Value = ast.NewObject()
	emptySet    ast.Value = ast.NewSet()
)

var (
	noMetrics    = metrics.NoOp()
	capabilities = ast.CapabilitiesForThisVersion()
)

func (m *vm) val(frame []*ast.Term, o operand) *ast.Term {
	if o.local < 0 {
		return o.konst
	}
	return frame[o.local]
}

// halted reports whether the evaluation was cancelled; checked every few
// hundred steps (calls and iterations).
func (m *vm) halted() bool {
	m.steps++
	if m.cancel == nil || m.steps&255 != 0 || !m.cancel.Cancelled() {
		return false
	}
	m.err = ErrCancelled
	return true
}

// exec runs b in frame: completed, returned, failed, or the number of
// enclosing blocks to leave after b (0: just b).
func (m *vm) exec(frame []*ast.Term, ft []int32, b block) int {
	for _, in := range b {
		switch in := in.(type) {
		case *dot:
			s, k := m.val(frame, in.src), m.val(frame, in.key)
			if s == nil || k == nil {
				return 0
			}
			v := get(s, k)
			if m.rec != nil {
				m.rec.dot(ft, in, k, v)
			}
			if v == nil {
				return 0
			}
			frame[in.dst] = v
		case *assign:
			frame[in.dst] = m.val(frame, in.src)
			if m.rec != nil {
				ft[in.dst] = tagOf(ft, in.src)
			}
		case *callFunc:
			v, ok := m.call(frame, ft, in.fn, in.args)
			if !ok {
				return failed
			}
			if v == nil {
				return 0
			}
			frame[in.result] = v
			if m.rec != nil {
				ft[in.result] = m.rec.ret
			}
		case *callBuiltin:
			v, r := m.builtin(frame, in)
			if m.rec != nil && r != failed {
				m.rec.called(frame, ft, in, v)
			}
			if r != completed {
				return r
			}
			frame[in.result] = v
		case *equal:
			a, b := m.val(frame, in.a), m.val(frame, in.b)
			if a == nil || b == nil {
				return 0
			}
			eq := a == b || ast.Compare(a.Value, b.Value) == 0
			if m.rec != nil {
				m.rec.compared(frame, ft, in, eq)
			}
			if eq == in.not {
				return 0
			}
		case *isDefined:
			if (frame[in.src] != nil) == in.not {
				return 0
			}
		case *assignOnce:
			v := m.val(frame, in.src)
			if cur := frame[in.dst]; cur != nil {
				if m.rec != nil && (ft[in.dst] != 0 || tagOf(ft, in.src) != 0) {
					m.rec.giveUp() // two values of a rule, one of them read from the input
				}
				if v == nil || ast.Compare(cur.Value, v.Value) != 0 {
					m.err = errors.New("regoplan: complete rules must not produce multiple outputs")
					return failed
				}
				continue
			}
			frame[in.dst] = v
			if m.rec != nil {
				ft[in.dst] = tagOf(ft, in.src)
			}
		case *reset:
			frame[in.dst] = nil
			ft[in.dst] = 0
		case *makeConst:
			frame[in.dst] = in.v
			ft[in.dst] = 0
		case *makeArray:
			frame[in.dst] = ast.NewTerm(ast.NewArrayWithCapacity(in.capacity))
			ft[in.dst] = 0
		case *makeObject:
			frame[in.dst] = &ast.Term{Value: emptyObject}
			ft[in.dst] = 0
		case *makeSet:
			frame[in.dst] = &ast.Term{Value: emptySet}
			ft[in.dst] = 0
		case *arrayAppend:
			if m.rec != nil {
				m.rec.stored(ft, in.arr, operand{local: -1}, in.v)
			}
			t := frame[in.arr]
			t.Value = t.Value.(*ast.Array).Append(m.val(frame, in.v))
		case *objectInsert:
			if m.rec != nil {
				m.rec.stored(ft, in.obj, in.k, in.v)
			}
			t := frame[in.obj]
			if t.Value == emptyObject {
				t.Value = ast.NewObject()
			}
			o := t.Value.(ast.Object)
			k, v := m.val(frame, in.k), m.val(frame, in.v)
			if in.once {
				if cur := o.Get(k); cur != nil {
					if ast.Compare(cur.Value, v.Value) != 0 {
						m.err = errors.New("regoplan: object keys must be unique")
						return failed
					}
					continue // equal values (1 and 1.0): the first stays
				}
			}
			o.Insert(k, v)
		case *setAdd:
			if m.rec != nil {
				m.rec.stored(ft, in.set, operand{local: -1}, in.v)
			}
			t := frame[in.set]
			if t.Value == emptySet {
				t.Value = ast.NewSet()
			}
			t.Value.(ast.Set).Add(m.val(frame, in.v))
		case *blockStmt:
			for _, b := range in.blocks {
				switch r := m.exec(frame, ft, b); {
				case r == returned || r == failed:
					return r
				case r > 0:
					return r - 1
				}
			}
		case *breakStmt:
			return in.index
		case *scan:
			if m.rec != nil && ft[in.src] != 0 {
				m.rec.giveUp() // what it reads is every member
			}
			if r := m.scan(frame, ft, in); r != completed {
				return r
			}
		case *relationScan:
			if m.rec != nil && anyTag(ft, in.call.args) {
				m.rec.giveUp()
			}
			if r := m.relationScan(frame, ft, in); r != completed {
				return r
			}
		case *not:
			switch r := m.exec(frame, ft, in.body); {
			case r == returned || r == failed:
				return r
			case r == completed:
				return 0 // the negated block held: not is undefined
			case r > 0:
				return r - 1
			}
		case *length:
			s := m.val(frame, in.src)
			if s == nil {
				return 0
			}
			frame[in.dst] = ast.InternedTerm(size(s.Value))
			if m.rec != nil {
				m.rec.measured(ft, in, s)
			}
		case *isKind:
			s := m.val(frame, in.src)
			if s == nil {
				return 0
			}
			ok := ofKind(s.Value, in.kind)
			if m.rec != nil {
				m.rec.kinded(ft, in, ok)
			}
			if !ok {
				return 0
			}
		case *returnLocal:
			m.ret = frame[in.src]
			if m.rec != nil {
				m.rec.ret = ft[in.src]
			}
			return returned
		case *resultAdd:
			if m.rec != nil && ft[in.src] > 0 {
				m.rec.giveUp() // a value of the input's own as the result
			}
			switch t := frame[in.src]; {
			case t == nil:
			case in.key != nil:
				m.results = append(m.results, result{key: in.key, v: t})
			default:
				if obj, ok := t.Value.(ast.Object); ok {
					m.results = append(m.results, result{obj: obj})
				}
			}
		case *with:
			if m.rec != nil {
				m.rec.giveUp()
			}
			if r := m.with(frame, ft, in); r != completed {
				return r
			}
		default:
			panic(fmt.Sprintf("statement %T", in))
		}
	}
	return completed
}

// call runs fn with args (operands of frame); nil when its value is
// undefined, ok false when the evaluation failed.
func (m *vm) call(frame []*ast.Term, ft []int32, fn *function, args []operand) (v *ast.Term, ok bool) {
	if fn.memo {
		switch e := m.memo[fn.index]; e.state {
		case 1:
			if m.rec != nil {
				m.rec.ret = m.rec.memo[fn.index]
			}
			return e.v, true
		case 2:
			return nil, true
		}
	}
	if m.halted() {
		return nil, false
	}
	base := m.sp
	callee := m.stack[base : base+fn.locals]
	ct := m.tags[base : base+fn.locals]
	m.sp += fn.locals
	m.high = max(m.high, m.sp)
	for i, p := range fn.params {
		callee[p] = m.val(frame, args[i])
		ct[p] = tagOf(ft, args[i])
	}
	var tag int32
	for _, b := range fn.blocks {
		r := m.exec(callee, ct, b)
		if r == failed {
			return nil, false
		}
		if r == returned {
			v, m.ret = m.ret, nil
			if m.rec != nil {
				tag = m.rec.ret
			}
			break
		}
	}
	clear(callee)
	clear(ct)
	m.sp = base
	if m.rec != nil {
		m.rec.ret = tag
		if fn.memo {
			m.rec.memo[fn.index] = tag
		}
	}
	if fn.memo {
		e := memoEntry{state: 2}
		if v != nil {
			e = memoEntry{state: 1, v: v}
		}
		m.memo[fn.index] = e
	}
	return v, true
}

// builtin calls one of OPA's built-ins as topdown does: an error makes the
// call undefined, except a halt, which stops the evaluation.
func (m *vm) builtin(frame []*ast.Term, in *callBuiltin) (*ast.Term, int) {
	if m.halted() {
		return nil, failed
	}
	ops := m.scratch[:len(in.args)]
	for i, a := range in.args {
		if ops[i] = m.val(frame, a); ops[i] == nil {
			clear(ops)
			return nil, 0
		}
	}
	return m.invoke(in, ops)
}

// invoke calls in's built-in on ops (clearing them), as builtin does.
func (m *vm) invoke(in *callBuiltin, ops []*ast.Term) (*ast.Term, int) {
	m.called, m.out = false, nil
	m.outs = m.outs[:0]
	iter := m.iterOne
	if in.relation {
		iter = m.iterAll
	}
	err := in.f(m.bctx, ops, iter)
	clear(ops)
	if err != nil {
		var halt topdown.Halt
		if errors.As(err, &halt) {
			m.err = halt.Err
			return nil, failed
		}
		return nil, 0
	}
	switch {
	case in.relation:
		outs := make([]*ast.Term, len(m.outs))
		copy(outs, m.outs)
		clear(m.outs)
		return ast.ArrayTerm(outs...), completed
	case !m.called:
		return nil, 0
	case m.out == nil || in.void:
		return ast.InternedTerm(true), completed
	}
	return m.out, completed
}

// scanStep runs a scan's body for one element: whether the scan stops
// there, and what it then ends with (completed, or what scan returns).
func (m *vm) scanStep(frame []*ast.Term, ft []int32, in *scan, k, v *ast.Term) (int, bool) {
	if m.halted() {
		return failed, true
	}
	frame[in.key], frame[in.value] = k, v
	ft[in.key], ft[in.value] = 0, 0
	switch r := m.exec(frame, ft, in.body); {
	case r == returned || r == failed:
		return r, true
	case r == 1:
		return completed, true
	case r > 1:
		return r - 2, true
	}
	return completed, false
}

// errStopRelation stops a relation's built-in from giving more outputs.
var errStopRelation = errors.New("regoplan: enough outputs")

// relationScan calls a relation's built-in and runs the scan's body on
// each output as it comes (the scan's key is the output's index), with the
// same endings as scan.
func (m *vm) relationScan(frame []*ast.Term, ft []int32, in *relationScan) int {
	if m.halted() {
		return failed
	}
	// The operands get a slice of their own: the body calls other
	// built-ins while this one runs.
	ops := make([]*ast.Term, len(in.call.args))
	for i, a := range in.call.args {
		if ops[i] = m.val(frame, a); ops[i] == nil {
			return 0
		}
	}
	res, i := completed, 0
	err := in.call.f(m.bctx, ops, func(t *ast.Term) error {
		var stop bool
		if res, stop = m.scanStep(frame, ft, in.scan, ast.InternedTerm(i), t); stop {
			return errStopRelation
		}
		i++
		return nil
	})
	if err != nil && res == completed && !errors.Is(err, errStopRelation) {
		var halt topdown.Halt
		if errors.As(err, &halt) {
			m.err = halt.Err
			return failed
		}
		// A built-in's error makes the call undefined: outputs the body
		// already saw stay seen, as in topdown.
	}
	return res
}

// scan runs in.body for every element of a collection (nothing for a
// scalar). Leaving the body continues with the next element; leaving it
// and one more block ends the scan (as WebAssembly's br 1 out of its loop).
func (m *vm) scan(frame []*ast.Term, ft []int32, in *scan) int {
	src := frame[in.src]
	if src == nil {
		return completed
	}
	res := completed
	switch c := src.Value.(type) {
	case *ast.Array:
		for i := range c.Len() {
			var stop bool
			if res, stop = m.scanStep(frame, ft, in, ast.InternedTerm(i), c.Elem(i)); stop {
				break
			}
		}
	case ast.Set:
		for _, t := range c.Slice() {
			var stop bool
			if res, stop = m.scanStep(frame, ft, in, t, t); stop {
				break
			}
		}
	case ast.Object:
		// The object's callback is made once per vm (see newVM); what it
		// needs is in the vm, kept aside for the scan it interrupts.
		outer := m.scanning
		m.scanning = scanning{frame: frame, ft: ft, in: in, res: completed}
		c.Until(m.scanObject)
		res = m.scanning.res
		m.scanning = outer
	}
	return res
}

// with runs in.body with a local (input or data) replaced, or a value
// put at a path inside it, and rule values computed afresh.
func (m *vm) with(frame []*ast.Term, ft []int32, in *with) int {
	saved := frame[in.local]
	v := m.val(frame, in.v)
	if len(in.path) == 0 {
		frame[in.local] = v
	} else {
		frame[in.local] = upsert(saved, in.path, v)
	}
	m.saved = append(m.saved, m.memo)
	m.memo = make([]memoEntry, len(m.memo))
	r := m.exec(frame, ft, in.body)
	m.memo = m.saved[len(m.saved)-1]
	m.saved = m.saved[:len(m.saved)-1]
	frame[in.local] = saved
	switch {
	case r == returned || r == failed:
		return r
	case r == completed:
		return completed
	case r == 0:
		return 0 // the body was undefined
	}
	return r - 1
}
