package regoplan

import (
	"context"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// statements counts the statements of prog by kind.
func statements(prog *Program) map[string]int {
	counts := map[string]int{}
	for _, fn := range append([]*function{prog.plan}, prog.funcs...) {
		for _, b := range fn.blocks {
			walkInstrs(b, func(in instr) { counts[fmt.Sprintf("%T", in)]++ })
		}
	}
	return counts
}

// foldPolicy builds constant collections (nested, with duplicates, in an
// else chain, in a loop, as a function's argument) next to collections
// that are not constant: a partial set with a constant member, a
// comprehension, collections holding input values, and a constant
// collection that built-ins combine with input.
const foldPolicy = `package p
kinds := {"tools/list", "prompts/list", "tools/list"}
base := {"action": "allow", "meta": {"tags": ["a", "b", 1], "on": true, "none": null}}
s contains "fixed"
s contains x if some x in input.l
r := {
	"listing": input.method in {"tools/list", "prompts/list"},
	"kinds": kinds,
	"base": base,
	"union": object.union(base, {"meta": input.meta}),
	"more": kinds | {m | some m in input.l},
	"arr": array.concat(["x", "y"], input.l),
	"s": s,
	"chain": chain,
	"loop": [[i, "k", {"k": 1}] | some i in input.l],
	"held": {"m": input.method, "c": ["c", input.method]},
	"f": f({"a": 1}),
}
chain := {"first": [1]} if input.method == "a" else := {"second": {2}}
f(o) := object.union(o, {"b": 2})
`

// TestConstantCollectionsFolded: a collection made and filled with
// constants is one constant of the compiled program; the outcome is
// topdown's for every input, evaluation after evaluation, and no
// evaluation changes a constant another one sees.
func TestConstantCollectionsFolded(t *testing.T) {
	modules := map[string]string{"p.rego": foldPolicy}
	compiler := compile(t, modules)
	prog := program(t, compiler, "data.p.r")
	// Constant collections are the same term in every evaluation; those
	// built from input are new in each.
	shared := func(input string) ast.Object {
		v, n, err := prog.Value(context.Background(), ast.NewTerm(parseInput(t, input)), ast.NewTerm(ast.NewObject()), nil)
		if err != nil || n != 1 {
			t.Fatal(v, n, err)
		}
		return v.Value.(ast.Object)
	}
	a, b := shared(`{"method": "a", "l": [1], "meta": 1}`), shared(`{"method": "a", "l": [1], "meta": 1}`)
	for _, key := range []string{"kinds", "base", "chain"} {
		if k := ast.StringTerm(key); a.Get(k) != b.Get(k) {
			t.Errorf("%s is built on each evaluation", key)
		}
	}
	for _, key := range []string{"s", "held", "loop"} {
		if k := ast.StringTerm(key); a.Get(k) == b.Get(k) {
			t.Errorf("%s, which holds input, is shared", key)
		}
	}
	inputs := []string{
		`{"method": "tools/list", "l": ["tools/list", "z"], "meta": {"x": 1}}`,
		`{"method": "a", "l": [], "meta": 2}`,
		`{"method": "b", "l": ["fixed", 3]}`,
		`{}`,
	}
	for range 3 {
		compare(t, compiler, prog, map[string]any{}, inputs)
	}
	// Concurrent evaluations (run with -race) each get the answer of the
	// first.
	input := ast.NewTerm(parseInput(t, inputs[0]))
	data := ast.NewTerm(ast.NewObject())
	first, _, err := prog.Value(context.Background(), input, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := first.String()
	concurrently(t, prog, input, data, func(v *ast.Term) error {
		if v.String() != want {
			return fmt.Errorf("got %v, want %s", v, want)
		}
		return nil
	})
}

// TestFoldOnlyWhereAdditionsAreToFreshCollections: a program where an
// addition could reach a collection some other statement set (a
// parameter, an assignment after the make, a loop that sets the local
// again) is not folded at all.
func TestFoldOnlyWhereAdditionsAreToFreshCollections(t *testing.T) {
	k := operand{local: -1, konst: ast.StringTerm("x")}
	for _, c := range []struct {
		name   string
		params []int
		blocks []block
		fresh  bool
	}{
		{"made, then filled", nil, []block{{&makeSet{dst: 3}, &setAdd{v: k, set: 3}}}, true},
		{"a partial set's bodies", nil, []block{
			{&makeSet{dst: 3}},
			{&scan{src: 0, key: 4, value: 5, body: block{&setAdd{v: operand{local: 5}, set: 3}}}},
			{&returnLocal{src: 3}},
		}, true},
		{"made in a loop's body", nil, []block{{&scan{src: 0, key: 4, value: 5, body: block{
			&makeArray{dst: 3}, &arrayAppend{v: k, arr: 3}, &assign{src: operand{local: 5}, dst: 3}}}}}, true},
		{"one body's local is another's collection", nil, []block{
			{&assign{src: operand{local: 0}, dst: 3}},
			{&makeObject{dst: 3}, &objectInsert{k: k, v: k, obj: 3}},
		}, true},
		{"a parameter", []int{0, 1, 2}, []block{{&setAdd{v: k, set: 2}}}, false},
		{"set again after the make", nil, []block{{&makeSet{dst: 3}, &assign{src: operand{local: 0}, dst: 3}, &setAdd{v: k, set: 3}}}, false},
		{"set again in a loop", nil, []block{{&makeSet{dst: 3}, &scan{src: 0, key: 4, value: 5, body: block{
			&setAdd{v: k, set: 3}, &assign{src: operand{local: 5}, dst: 3}}}}}, false},
		{"set in an earlier body", nil, []block{
			{&callFunc{fn: &function{}, result: 3}},
			{&setAdd{v: k, set: 3}},
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fn := &function{params: c.params, blocks: c.blocks}
			if got := collectionsOf(fn).fresh; got != c.fresh {
				t.Fatalf("fresh = %v, want %v", got, c.fresh)
			}
			// A program with such a function folds nothing, not even the
			// constants of its other functions.
			constant := &function{blocks: []block{{&makeSet{dst: 2}, &setAdd{v: k, set: 2}, &returnLocal{src: 2}}}}
			prog := &Program{plan: &function{params: []int{0, 1}}, funcs: []*function{constant, fn}}
			fold(prog)
			_, folded := constant.blocks[0][0].(*makeConst)
			if folded != c.fresh {
				t.Fatalf("folded = %v, want %v", folded, c.fresh)
			}
		})
	}
}

// TestResultBindings: the query's result is a binding, not an object,
// for Value; Eval still gives the result objects.
func TestResultBindings(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := {"a": input.a}
`})
	prog := program(t, compiler, "data.p.r")
	if n := statements(prog)["*regoplan.makeObject"]; n != 1 {
		t.Fatalf("%d objects made, want only r's", n)
	}
	input := ast.NewTerm(ast.MustParseTerm(`{"a": 1}`).Value)
	v, n, err := prog.Value(context.Background(), input, ast.NewTerm(ast.NewObject()), nil)
	if err != nil || n != 1 || v.String() != `{"a": 1}` {
		t.Fatalf("Value: %v, %d, %v", v, n, err)
	}
	rs, err := prog.Eval(context.Background(), input, ast.NewTerm(ast.NewObject()), nil)
	if err != nil || len(rs) != 1 || rs[0].Len() != 1 {
		t.Fatalf("Eval: %v, %v", rs, err)
	}
	rs[0].Foreach(func(k, v *ast.Term) {
		if v.String() != `{"a": 1}` {
			t.Fatalf("Eval: binding %v of %v", v, k)
		}
	})
}

// TestFoldedArraysHaveNoRoomToGrow: two appends to a folded array (which
// no built-in makes, but a later one could) each get their own copy
// rather than writing into the room the shared constant would have had.
func TestFoldedArraysHaveNoRoomToGrow(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := ["a", "b", "c"]
`})
	prog := program(t, compiler, "data.p.r")
	v, _, err := prog.Value(context.Background(), ast.NewTerm(ast.NewObject()), ast.NewTerm(ast.NewObject()), nil)
	if err != nil {
		t.Fatal(err)
	}
	arr := v.Value.(*ast.Array)
	x, y := arr.Append(ast.StringTerm("x")), arr.Append(ast.StringTerm("y"))
	if x.Elem(3).String() != `"x"` || y.Elem(3).String() != `"y"` || arr.Len() != 3 {
		t.Fatalf("appends share the constant's room: %v %v %v", x, y, arr)
	}
}
