package regoplan

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// Recall: the value of an earlier evaluation, given again to an input that
// reads the same.
//
// A gateway evaluates its policies on every call, and most calls are
// decided by a few members of the input (the method, the tool's hints, the
// service, the result scan's verdict), never by the arguments or the text
// a rule of the policy would look at only on another path. An evaluation
// of a pure program (no clock, no randomness, nothing from outside the
// process, no print) is a function of its input and data; so an
// evaluation records what it read of the input, and the next one, when
// its input reads the same, has the same value without being run.
//
// What is read is recorded as readings, in the order the evaluation made
// them: a member of a part of the input that was looked up (present or
// not); a part of the input compared to another value, measured, or asked
// its kind, and what came of it; a built-in called with parts of the input,
// and its outcome. Every local of the evaluation carries a tag saying what
// it holds of the input (nothing, the part at a path, or the outcome of a
// reading), copied with the local and passed with it into the functions it
// is given to: a tag follows the statements, not the terms (two members of
// the input may share one interned term, true or "", that only the
// statements tell apart).
//
// An input reads the same as a recorded one when every reading, made
// again on it in order, comes out the same: the lookups find the same
// members present, the comparisons and kinds agree, and the built-ins give
// the same outcome (the same scalar: outcomes that are collections are not
// recorded). Each reading comes out the same, so every value the
// evaluation computed from the input is the same, and so is its
// value: by induction over the evaluation's statements, which see nothing
// of the input but through readings.
//
// An evaluation is not recorded when it uses a part of the input in a way
// whose outcome is not a scalar reading: iterates over it, puts it into a
// collection or the result, passes it to a relation (walk), replaces input
// or data (with), or looks up a member of a built-in's outcome. Nor when
// its readings or the values it would keep are many or large (see the
// limits below): a recall must stay much cheaper than the evaluation.
// After an evaluation that could not be recorded, the next recallCool are
// not recorded either, so that a policy whose evaluations never can be
// costs next to nothing.
//
// What a recall keeps (constants it compared with, outcomes, the value)
// is copied out of the evaluation's memory: the input's text may be
// reused once its evaluation is over.
type recollection struct {
	recallable bool                      // the program is pure: see Compile
	recalls    atomic.Pointer[[]*recall] // newest first, at most recallEntries
	cool       atomic.Int32              // evaluations still to run unrecorded
	recalled   atomic.Int64              // evaluations given a recalled value (tests)
}

const (
	recallEntries  = 8    // evaluations a program keeps
	recallReadings = 128  // the most readings a kept evaluation has
	recallString   = 64   // the longest string a built-in's outcome may be to be recorded
	recallWeight   = 4096 // bytes (and members) of the constants and value a kept evaluation copies
	recallCool     = 64   // evaluations not recorded after one that could not be
)

// A reading's kind.
const (
	readMember = iota // the member key of node parent: node, or -1 when absent
	readKey           // node's value, a key into other data: equal to out
	readEqual         // a and b are equal (n: 1) or not (n: 0)
	readKind          // a is of collection kind kind (n: 1) or not (n: 0)
	readLen           // a's size is n
	readCall          // call's outcome on args is out (nil: undefined)
)

// ref is an operand of a reading: a constant, a part of the input (a
// node), or the outcome of an earlier reading.
type ref struct {
	from int8 // refConst, refNode or refOutcome
	i    int32
	t    *ast.Term
}

const (
	refConst = iota
	refNode
	refOutcome
)

type reading struct {
	kind         int8
	parent, node int32
	key          *ast.Term
	a, b         ref
	call         *callBuiltin
	args         []ref
	out          *ast.Term
	n            int
}

// recall is one evaluation kept: its readings, and its value and number
// of results (as Value gives them).
type recall struct {
	data     *ast.Term // the data it was evaluated with
	nodes    int
	readings []reading
	value    *ast.Term
	n        int
}

// recorder is what an evaluation being recorded keeps. A tag (in
// vm.tags, beside each local) is 0 for a value not read from the input,
// 1+i for node i (the part of the input at a path), -1-i for the outcome
// of reading i.
type recorder struct {
	vm       *vm
	nodes    int32
	readings []reading
	ret      int32   // the tag of the value the last function returned
	memo     []int32 // by function index, the tag of its kept value
}

func (r *recorder) start(funcs int) *recorder {
	r.nodes = 1 // node 0: the input
	if cap(r.memo) < funcs {
		r.memo = make([]int32, funcs)
	}
	r.memo = r.memo[:funcs]
	return r
}

func (r *recorder) reset() {
	clear(r.readings)
	r.readings = r.readings[:0]
	clear(r.memo)
	r.nodes, r.ret = 0, 0
}

// giveUp stops the recording: this evaluation will not be kept.
func (r *recorder) giveUp() {
	r.vm.rec = nil
}

func (r *recorder) add(rd reading) int32 {
	if len(r.readings) >= recallReadings {
		r.giveUp()
		return 0
	}
	r.readings = append(r.readings, rd)
	return int32(len(r.readings) - 1)
}

func tagOf(ft []int32, o operand) int32 {
	if o.local < 0 {
		return 0
	}
	return ft[o.local]
}

func anyTag(ft []int32, os []operand) bool {
	for _, o := range os {
		if tagOf(ft, o) != 0 {
			return true
		}
	}
	return false
}

// refOf is the reading operand for o, whose value is t. A collection
// given as a constant is copied at once: the plan may add to a collection
// after a reading used it (no planned policy does), and the reading is of
// the collection as it was.
func (r *recorder) refOf(ft []int32, o operand, t *ast.Term) ref {
	switch tag := tagOf(ft, o); {
	case tag > 0:
		return ref{from: refNode, i: tag - 1}
	case tag < 0:
		return ref{from: refOutcome, i: -tag - 1}
	}
	if t != nil && !scalar(t) {
		budget := recallWeight
		c, ok := clone(t, &budget)
		if !ok {
			r.giveUp()
			return ref{}
		}
		t = c
	}
	return ref{from: refConst, t: t}
}

// dot records a lookup of k in in.src, which found v (nil: nothing).
func (r *recorder) dot(ft []int32, in *dot, k, v *ast.Term) {
	st, kt := tagOf(ft, in.src), tagOf(ft, in.key)
	switch {
	case st == 0 && kt <= 0:
		// In data or a value of the evaluation's own, by a key that is
		// not the input's or is a reading's outcome (recorded already).
	case st > 0 && kt == 0:
		if v == nil {
			r.add(reading{kind: readMember, parent: st - 1, node: -1, key: k})
			return
		}
		node := r.member(st-1, k, v)
		if r.vm.rec == nil {
			return
		}
		ft[in.dst] = node + 1
		return
	case st == 0 && kt > 0:
		if !scalar(k) {
			r.giveUp()
			return
		}
		r.add(reading{kind: readKey, node: kt - 1, out: k})
	default:
		// A member of a built-in's outcome, or a lookup by a key read from
		// the input in the input: not recorded.
		r.giveUp()
		return
	}
	if v != nil {
		ft[in.dst] = 0
	}
}

// member is the node of parent's member k, found as v: a reading made
// before, or a new one.
func (r *recorder) member(parent int32, k, v *ast.Term) int32 {
	for i := range r.readings {
		rd := &r.readings[i]
		if rd.kind == readMember && rd.parent == parent && rd.node >= 0 && (rd.key == k || sameScalar(rd.key, k)) {
			return rd.node
		}
	}
	node := r.nodes
	r.nodes++
	r.add(reading{kind: readMember, parent: parent, node: node, key: k})
	return node
}

// called records a built-in's call whose operands hold parts of the input
// or outcomes: its outcome v (nil: undefined). An operand not defined
// means the built-in was not called: nothing is read.
func (r *recorder) called(frame []*ast.Term, ft []int32, in *callBuiltin, v *ast.Term) {
	if !anyTag(ft, in.args) {
		if v != nil {
			ft[in.result] = 0
		}
		return
	}
	args := make([]ref, len(in.args))
	for i, a := range in.args {
		t := r.vm.val(frame, a)
		if t == nil {
			return
		}
		if args[i] = r.refOf(ft, a, t); r.vm.rec == nil {
			return
		}
	}
	if v != nil && !smallScalar(v) {
		r.giveUp()
		return
	}
	i := r.add(reading{kind: readCall, call: in, args: args, out: v})
	if v != nil { // else the result is not written: its local keeps its value and tag
		ft[in.result] = -1 - i
	}
}

// compared records an equality test that involves the input.
func (r *recorder) compared(frame []*ast.Term, ft []int32, in *equal, eq bool) {
	if tagOf(ft, in.a) == 0 && tagOf(ft, in.b) == 0 {
		return
	}
	a, b := r.refOf(ft, in.a, r.vm.val(frame, in.a)), r.refOf(ft, in.b, r.vm.val(frame, in.b))
	if r.vm.rec == nil {
		return
	}
	r.add(reading{kind: readEqual, a: a, b: b, n: boolInt(eq)})
}

// kinded records a test of a part of the input's kind.
func (r *recorder) kinded(ft []int32, in *isKind, ok bool) {
	if tagOf(ft, in.src) == 0 {
		return
	}
	r.add(reading{kind: readKind, a: r.refOf(ft, in.src, nil), parent: int32(in.kind), n: boolInt(ok)})
}

// measured records the size of a part of the input, s.
func (r *recorder) measured(ft []int32, in *length, s *ast.Term) {
	a := r.refOf(ft, in.src, nil) // before the result's tag: it may be the same local
	ft[in.dst] = 0
	if a.from != refConst {
		r.add(reading{kind: readLen, a: a, n: size(s.Value)})
	}
}

// stored gives up when a part of the input is put into a collection (its
// every member would be read by whoever reads the collection) or a
// collection that is one is changed. Outcomes may be: they are scalars
// whose value the readings fix.
func (r *recorder) stored(ft []int32, coll int, k, v operand) {
	if ft[coll] != 0 || tagOf(ft, k) > 0 || tagOf(ft, v) > 0 {
		r.giveUp()
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recording reports whether the next evaluation is recorded.
func (p *Program) recording() bool {
	if !p.recallable {
		return false
	}
	if p.cool.Load() > 0 {
		p.cool.Add(-1)
		return false
	}
	return true
}

// remember keeps the evaluation m recorded, whose value was v of n
// results, when it can.
func (p *Program) remember(m *vm, data, v *ast.Term, n int) {
	if !p.recallable {
		return
	}
	rec := m.rec
	if rec == nil {
		if m.recBuf.nodes > 0 {
			p.cool.Store(recallCool) // recorded, and given up
		}
		return
	}
	budget := recallWeight
	e := &recall{data: data, nodes: int(rec.nodes), n: n, readings: make([]reading, len(rec.readings))}
	ok := true
	keep := func(t *ast.Term) *ast.Term {
		if t == nil || !ok {
			return t
		}
		var c *ast.Term
		c, ok = clone(t, &budget)
		return c
	}
	keepRef := func(x ref) ref {
		if x.from == refConst {
			x.t = keep(x.t)
		}
		return x
	}
	for i, rd := range rec.readings {
		rd.key, rd.out = keep(rd.key), keep(rd.out)
		rd.a, rd.b = keepRef(rd.a), keepRef(rd.b)
		if rd.args != nil {
			args := make([]ref, len(rd.args))
			for j, x := range rd.args {
				args[j] = keepRef(x)
			}
			rd.args = args
		}
		e.readings[i] = rd
	}
	e.value = keep(v)
	if !ok {
		p.cool.Store(recallCool)
		return
	}
	var kept []*recall
	if old := p.recalls.Load(); old != nil {
		kept = *old
	}
	next := make([]*recall, 0, recallEntries)
	next = append(next, e)
	next = append(next, kept[:min(len(kept), recallEntries-1)]...)
	p.recalls.Store(&next)
}

// recall gives the value of a kept evaluation whose readings of input (with
// data) come out the same, if there is one.
func (p *Program) recall(ctx context.Context, input, data *ast.Term, cancel topdown.Cancel) (v *ast.Term, n int, ok bool) {
	kept := p.recalls.Load()
	if kept == nil {
		return nil, 0, false
	}
	m := p.pool.Get().(*vm)
	defer func() {
		if recover() != nil {
			ok = false // a built-in that panics: the evaluation will say so
			m = newVM(p)
		}
		p.release(m)
	}()
	m.start(ctx, cancel)
	for _, e := range *kept {
		if e.data == data && m.recalled(e, input) {
			p.recalled.Add(1)
			return e.value, e.n, true
		}
	}
	return nil, 0, false
}

// recalled reports whether every reading of e comes out the same on input.
func (m *vm) recalled(e *recall, input *ast.Term) bool {
	if cap(m.rnodes) < e.nodes {
		m.rnodes = make([]*ast.Term, e.nodes)
	}
	if cap(m.routs) < len(e.readings) {
		m.routs = make([]*ast.Term, len(e.readings))
	}
	nodes, outs := m.rnodes[:e.nodes], m.routs[:len(e.readings)]
	defer clear(nodes)
	defer clear(outs)
	nodes[0] = input
	at := func(x ref) *ast.Term {
		switch x.from {
		case refNode:
			return nodes[x.i]
		case refOutcome:
			return outs[x.i]
		}
		return x.t
	}
	for i := range e.readings {
		rd := &e.readings[i]
		switch rd.kind {
		case readMember:
			v := get(nodes[rd.parent], rd.key)
			if (v != nil) != (rd.node >= 0) {
				return false
			}
			if v != nil {
				nodes[rd.node] = v
			}
		case readKey:
			if !sameScalar(nodes[rd.node], rd.out) {
				return false
			}
		case readEqual:
			a, b := at(rd.a), at(rd.b)
			if boolInt(a == b || ast.Compare(a.Value, b.Value) == 0) != rd.n {
				return false
			}
		case readKind:
			if boolInt(ofKind(at(rd.a).Value, int(rd.parent))) != rd.n {
				return false
			}
		case readLen:
			if size(at(rd.a).Value) != rd.n {
				return false
			}
		case readCall:
			if m.halted() {
				return false
			}
			ops := m.scratch[:len(rd.args)]
			for j, x := range rd.args {
				ops[j] = at(x)
			}
			out, r := m.invoke(rd.call, ops)
			switch {
			case r == failed:
				m.err = nil
				return false
			case r != completed:
				out = nil
			}
			if (out == nil) != (rd.out == nil) || out != nil && !sameScalar(out, rd.out) {
				return false
			}
			outs[i] = out
		default:
			return false
		}
	}
	return true
}

// scalar reports whether t is a string, number, boolean or null.
func scalar(t *ast.Term) bool {
	switch t.Value.(type) {
	case ast.String, ast.Number, ast.Boolean, ast.Null:
		return true
	}
	return false
}

// smallScalar: a scalar, and a string of at most recallString bytes.
func smallScalar(t *ast.Term) bool {
	if s, ok := t.Value.(ast.String); ok {
		return len(s) <= recallString
	}
	return scalar(t)
}

// sameScalar reports whether a and b are the same scalar, written the same
// (1 and 1.0 compare equal, but a built-in may print them apart).
func sameScalar(a, b *ast.Term) bool {
	switch av := a.Value.(type) {
	case ast.String:
		bv, ok := b.Value.(ast.String)
		return ok && av == bv
	case ast.Number:
		bv, ok := b.Value.(ast.Number)
		return ok && av == bv
	case ast.Boolean:
		bv, ok := b.Value.(ast.Boolean)
		return ok && av == bv
	case ast.Null:
		_, ok := b.Value.(ast.Null)
		return ok
	}
	return false
}

// clone copies t into memory of its own (strings and numbers included),
// taking its size from budget; false when t is over budget or holds
// something that is not JSON.
func clone(t *ast.Term, budget *int) (*ast.Term, bool) {
	*budget--
	switch v := t.Value.(type) {
	case ast.String:
		*budget -= len(v)
		return ast.StringTerm(strings.Clone(string(v))), *budget >= 0
	case ast.Number:
		*budget -= len(v)
		return ast.NewTerm(ast.Number(strings.Clone(string(v)))), *budget >= 0
	case ast.Boolean, ast.Null:
		return t, *budget >= 0
	case *ast.Array:
		elems := make([]*ast.Term, v.Len())
		for i := range elems {
			var ok bool
			if elems[i], ok = clone(v.Elem(i), budget); !ok {
				return nil, false
			}
		}
		return ast.ArrayTerm(elems...), true
	case ast.Object:
		items := make([][2]*ast.Term, 0, v.Len())
		ok := true
		v.Foreach(func(k, x *ast.Term) {
			if !ok {
				return
			}
			var ck, cx *ast.Term
			if ck, ok = clone(k, budget); ok {
				cx, ok = clone(x, budget)
			}
			items = append(items, [2]*ast.Term{ck, cx})
		})
		if !ok {
			return nil, false
		}
		return ast.ObjectTerm(items...), true
	case ast.Set:
		elems := make([]*ast.Term, 0, v.Len())
		ok := true
		v.Foreach(func(x *ast.Term) {
			if !ok {
				return
			}
			var c *ast.Term
			c, ok = clone(x, budget)
			elems = append(elems, c)
		})
		if !ok {
			return nil, false
		}
		return ast.SetTerm(elems...), true
	}
	return nil, false
}

// Recalled is how many evaluations were given a recalled value.
func (p *Program) Recalled() int64 { return p.recalled.Load() }
