package regoplan

import (
	"maps"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Constant collections are built once, when the plan is compiled.
//
// A plan builds every collection the policy writes out, constant or not,
// statement by statement on each evaluation: `{"action": "allow"}` is a
// MakeObject and an ObjectInsert, `x in {"tools/list", "prompts/list"}` a
// MakeSet and a SetAdd per member. For the default result policy that was
// two thirds of the allocations of a decision. A collection that a make
// statement makes and the statements right after it fill with constants,
// and that no other statement adds to, becomes one constant that every
// evaluation shares, like the plan's strings. That is safe because no
// statement changes a collection it did not make: checked for the whole
// program first (see collections), which is folded only where it holds.

// collections is what fold needs to know of a function's collections.
type collections struct {
	// fresh: every addition adds to a collection a make statement made;
	// so none changes a collection that another local, a function's
	// result or a constant holds too.
	fresh bool
	// adds counts, per make statement, the additions to the collection it
	// made.
	adds map[instr]int
	// inherited holds the locals that a top-level block adds to without
	// making them, as a partial set rule's bodies add to the set its first
	// body made: none of their make statements is folded.
	inherited map[int]bool
}

// collectionsOf finds, for every addition of fn, the make statement whose
// collection it adds to: one that ran before it in its block or a block
// around it, with nothing setting the local since (in a loop's body: in
// any iteration). An addition with no such make statement adds to what an
// earlier top-level block (which runs once, before it) made, if nothing
// but make statements set the local in the top-level blocks up to its own
// and it is no parameter; otherwise fn is not fresh.
func collectionsOf(fn *function) collections {
	c := collections{fresh: true, adds: map[instr]int{}, inherited: map[int]bool{}}
	params := map[int]bool{}
	for _, l := range fn.params {
		params[l] = true
	}
	setBy := make([]map[int]bool, len(fn.blocks)) // by top-level block: the locals set by other than a make
	for j, b := range fn.blocks {
		setBy[j] = setInside(b, false)
	}
	for j, b := range fn.blocks {
		var visit func(b block, made map[int]instr)
		visit = func(b block, made map[int]instr) {
			for _, in := range b {
				if l, ok := made1(in); ok {
					made[l] = in
				} else {
					if l, adds := mutated(in); adds {
						if mk := made[l]; mk != nil {
							c.adds[mk]++
						} else if addsToFirst(l, j, setBy, params) {
							c.inherited[l] = true
						} else {
							c.fresh = false
						}
					}
					writes(in, func(l int) { delete(made, l) })
				}
				for _, inner := range innerBlocks(in) {
					set := setInside(*inner, true)
					m := maps.Clone(made)
					if loops(in) {
						// A later iteration's statement runs after every
						// statement of the body, make statements too.
						forget(m, set)
					}
					visit(*inner, m)
					forget(made, set)
				}
			}
		}
		visit(b, map[int]instr{})
	}
	return c
}

// made1 is the local a make statement sets.
func made1(in instr) (int, bool) {
	switch in := in.(type) {
	case *makeSet:
		return in.dst, true
	case *makeObject:
		return in.dst, true
	case *makeArray:
		return in.dst, true
	}
	return 0, false
}

// loops reports whether in runs its block more than once.
func loops(in instr) bool {
	switch in.(type) {
	case *scan, *relationScan:
		return true
	}
	return false
}

// addsToFirst reports whether an addition to l in top-level block j,
// which no make statement of its block precedes, adds to what a make
// statement of an earlier block made: l is no parameter, and nothing but
// make statements set it up to block j.
func addsToFirst(l, j int, setBy []map[int]bool, params map[int]bool) bool {
	if params[l] {
		return false
	}
	for i := 0; i <= j; i++ {
		if setBy[i][l] {
			return false
		}
	}
	return true
}

// setInside is the locals that statements of b (and of the blocks inside
// it) set: all of them, or only those other than make statements.
func setInside(b block, makes bool) map[int]bool {
	set := map[int]bool{}
	walkInstrs(b, func(in instr) {
		if l, ok := made1(in); ok {
			if makes {
				set[l] = true
			}
			return
		}
		writes(in, func(l int) { set[l] = true })
	})
	return set
}

// innerBlocks are the blocks inside in, to read or to replace.
func innerBlocks(in instr) []*block {
	switch in := in.(type) {
	case *blockStmt:
		bs := make([]*block, len(in.blocks))
		for i := range in.blocks {
			bs[i] = &in.blocks[i]
		}
		return bs
	case *scan:
		return []*block{&in.body}
	case *relationScan:
		return []*block{&in.scan.body}
	case *not:
		return []*block{&in.body}
	case *with:
		return []*block{&in.body}
	}
	return nil
}

// fold folds the constant collections of every function of p, if every
// function of p is fresh (see collections); otherwise it folds nothing.
func fold(p *Program) {
	fns := append([]*function{p.plan}, p.funcs...)
	cs := make([]collections, len(fns))
	for i, fn := range fns {
		if cs[i] = collectionsOf(fn); !cs[i].fresh {
			return
		}
	}
	for i, fn := range fns {
		for j, b := range fn.blocks {
			fn.blocks[j] = cs[i].fold(b, map[int]*ast.Term{})
		}
	}
}

// pendingCollection is a collection being filled with constants.
type pendingCollection struct {
	at    int       // the index of its make statement in the block
	value ast.Value // what it holds so far
	adds  []int     // the indices of the statements that filled it
}

// fold folds b's constant collections; known holds the locals whose
// constant value is set when b starts (and is b's to change).
func (c collections) fold(b block, known map[int]*ast.Term) block {
	pending := map[int]*pendingCollection{}
	finish := func(l int) {
		p := pending[l]
		delete(pending, l)
		if c.inherited[l] || len(p.adds) != c.adds[b[p.at]] {
			return // added to elsewhere too: built as the plan says
		}
		if arr, ok := p.value.(*ast.Array); ok {
			// Without room to grow in place: an Append to the constant (no
			// built-in makes one) could not write into what others share.
			elems := make([]*ast.Term, arr.Len())
			for i := range elems {
				elems[i] = arr.Elem(i)
			}
			p.value = ast.NewArray(elems...)
		}
		t := ast.NewTerm(p.value)
		b[p.at] = &makeConst{v: t, dst: l}
		for _, i := range p.adds {
			b[i] = nil // all before the statement the loop is at
		}
		known[l] = t
	}
	// konst is o's constant value, if it has one here.
	konst := func(o operand) *ast.Term {
		if o.local < 0 {
			return o.konst
		}
		if _, ok := pending[o.local]; ok {
			finish(o.local)
		}
		return known[o.local]
	}
	for i, in := range b {
		if len(pending) > 0 && !fillsPending(in, pending) {
			// Anything else may read a collection or leave the block:
			// what is filled by now is complete or not folded.
			for l := range pending {
				finish(l)
			}
		}
		switch in := in.(type) {
		case *makeConst:
			delete(pending, in.dst)
			known[in.dst] = in.v
			continue
		case *makeSet:
			c.start(b, i, in.dst, ast.NewSet(), pending, known)
			continue
		case *makeObject:
			c.start(b, i, in.dst, ast.NewObject(), pending, known)
			continue
		case *makeArray:
			c.start(b, i, in.dst, ast.NewArray(), pending, known)
			continue
		case *setAdd:
			if p := pending[in.set]; p != nil {
				if v := konst(in.v); v != nil {
					p.value.(ast.Set).Add(v)
					p.adds = append(p.adds, i)
				} else {
					delete(pending, in.set)
				}
			}
		case *arrayAppend:
			if p := pending[in.arr]; p != nil {
				if v := konst(in.v); v != nil {
					p.value = p.value.(*ast.Array).Append(v)
					p.adds = append(p.adds, i)
				} else {
					delete(pending, in.arr)
				}
			}
		case *objectInsert:
			if p := pending[in.obj]; p != nil {
				k, v := konst(in.k), konst(in.v)
				if k == nil || v == nil {
					delete(pending, in.obj)
					break
				}
				obj := p.value.(ast.Object)
				if cur := obj.Get(k); in.once && cur != nil {
					if ast.Compare(cur.Value, v.Value) != 0 {
						delete(pending, in.obj) // the evaluation's error to report
					} else {
						p.adds = append(p.adds, i) // equal values: the first stays
					}
					break
				}
				obj.Insert(k, v)
				p.adds = append(p.adds, i)
			}
		}
		// A scan sets its key and value, and with its local, before its
		// body runs.
		writes(in, func(l int) { delete(known, l) })
		for _, inner := range innerBlocks(in) {
			set := setInside(*inner, true)
			k := maps.Clone(known)
			if loops(in) {
				forget(k, set)
			}
			*inner = c.fold(*inner, k)
			forget(known, set)
		}
	}
	for l := range pending {
		finish(l)
	}
	return compact(b)
}

// forget deletes the locals of set from m.
func forget[V any](m map[int]V, set map[int]bool) {
	for l := range set {
		delete(m, l)
	}
}

// compact is b without the statements removed from it (nil).
func compact(b block) block {
	return slices.DeleteFunc(b, func(in instr) bool { return in == nil })
}

// start begins folding the collection that the make statement b[i] makes
// in l; one that nothing adds to is a constant at once.
func (c collections) start(b block, i, l int, empty ast.Value, pending map[int]*pendingCollection, known map[int]*ast.Term) {
	delete(pending, l)
	delete(known, l)
	if c.inherited[l] {
		return
	}
	if c.adds[b[i]] == 0 {
		t := ast.NewTerm(empty)
		b[i] = &makeConst{v: t, dst: l}
		known[l] = t
		return
	}
	pending[l] = &pendingCollection{at: i, value: empty}
}

// fillsPending reports whether in is a statement that folding a pending
// collection may pass over: one that makes or fills a collection or sets
// a constant, none of which can fail or read a collection being filled.
func fillsPending(in instr, pending map[int]*pendingCollection) bool {
	switch in := in.(type) {
	case *makeConst, *makeSet, *makeObject, *makeArray:
		return true
	case *setAdd:
		return pending[in.set] != nil
	case *arrayAppend:
		return pending[in.arr] != nil
	case *objectInsert:
		return pending[in.obj] != nil
	}
	return false
}

// walkInstrs calls fn on every statement of b and of the blocks inside it.
func walkInstrs(b block, fn func(instr)) {
	for _, in := range b {
		fn(in)
		for _, inner := range innerBlocks(in) {
			walkInstrs(*inner, fn)
		}
	}
}

// writes calls fn on every local in sets (not the statements of blocks
// inside it).
func writes(in instr, fn func(int)) {
	switch in := in.(type) {
	case *dot:
		fn(in.dst)
	case *assign:
		fn(in.dst)
	case *assignOnce:
		fn(in.dst)
	case *callFunc:
		fn(in.result)
	case *callBuiltin:
		fn(in.result)
	case *relationScan:
		fn(in.call.result)
		fn(in.scan.key)
		fn(in.scan.value)
	case *scan:
		fn(in.key)
		fn(in.value)
	case *length:
		fn(in.dst)
	case *reset:
		fn(in.dst)
	case *makeConst:
		fn(in.dst)
	case *makeArray:
		fn(in.dst)
	case *makeObject:
		fn(in.dst)
	case *makeSet:
		fn(in.dst)
	case *with:
		fn(in.local)
	}
}

// reads calls fn on every local in reads (not the statements of blocks
// inside it).
func reads(in instr, fn func(int)) {
	op := func(o operand) {
		if o.local >= 0 {
			fn(o.local)
		}
	}
	ops := func(os []operand) {
		for _, o := range os {
			op(o)
		}
	}
	switch in := in.(type) {
	case *resultAdd:
		fn(in.src)
	case *returnLocal:
		fn(in.src)
	case *callFunc:
		ops(in.args)
	case *callBuiltin:
		ops(in.args)
	case *relationScan:
		ops(in.call.args)
		fn(in.scan.src)
	case *assign:
		op(in.src)
	case *assignOnce:
		op(in.src)
		fn(in.dst)
	case *scan:
		fn(in.src)
	case *dot:
		op(in.src)
		op(in.key)
	case *length:
		op(in.src)
	case *equal:
		op(in.a)
		op(in.b)
	case *isKind:
		op(in.src)
	case *isDefined:
		fn(in.src)
	case *arrayAppend:
		op(in.v)
		fn(in.arr)
	case *objectInsert:
		op(in.k)
		op(in.v)
		fn(in.obj)
	case *setAdd:
		op(in.v)
		fn(in.set)
	case *with:
		op(in.v)
		fn(in.local)
	}
}

// mutated is the local whose collection in adds to, if it does.
func mutated(in instr) (int, bool) {
	switch in := in.(type) {
	case *setAdd:
		return in.set, true
	case *arrayAppend:
		return in.arr, true
	case *objectInsert:
		return in.obj, true
	}
	return 0, false
}
