package regoplan

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// foldAttacks are policies that use constant collections where folding
// them could go wrong: nested, in else chains, comprehensions and every,
// partial rules mixing constant and dynamic members, functions returning
// constants that built-ins then combine with input, with, equal values
// written differently, constants as keys, sets of sets, walk.
var foldAttacks = map[string]string{
	"else": `package p
r := x if { input.a == 1; x := {"s": {1, 2}, "a": [1, [2, {3}]]} } else := {"s": {1, 2}} if input.a == 2 else := [{"k": {1}}]
`,
	"comprehensions": `package p
e if every x in {1, 2} { x in {1, 2, 3} }
r := {"c": [y | some x in input.l; y := {"x": x, "k": ["c"]}], "e": e, "f": [z | some z in [{"a": 1}, {"a": 1}, {"b": {2}}]],
	"o": {k: {"v": [k]} | some k in input.l}, "s": {{"c": [1]} | some _ in input.l}}
`,
	"partial": `package p
s contains {"a": 1}
s contains {"a": input.x}
s contains [1, 2]
s contains x if some x in input.l
o["k"] := {"c": 1}
o[k] := {"d": [k]} if some k in input.l
r := {"s": s, "o": o}
`,
	"functions": `package p
f(_) := {"a": {"b": 1}}
g(_) := [1, 2, 3]
h(_) := {1, 2}
r := {"u": object.union(f(1), {"a": {"c": input.x}}), "c": array.concat(g(1), [input.x]), "su": h(1) | {input.x},
	"p": json.patch(f(1), [{"op": "add", "path": "/a/z", "value": input.x}]), "pa": json.patch(g(1), [{"op": "add", "path": "/-", "value": input.x}]),
	"rm": object.remove(f(1), ["a"]), "again": f(2), "g2": g(2), "h2": h(2),
	"un": object.union_n([f(1), {"a": {"b": input.x}}, f(3)]), "rev": array.reverse(g(1)), "sl": array.slice(g(1), 0, 2),
	"jr": json.remove(f(1), ["a/b"]), "jf": json.filter(f(1), ["a"]), "og": object.get(f(1), ["a", "b"], input.x),
	"srt": sort(g(1)), "ss": sort(h(1)), "i": h(1) & {input.x, 1}, "d": h(1) - {input.x}, "uu": union({h(1), {input.x}}),
	"ofl": object.filter(f(1), ["a"]), "keys": object.keys(f(1)), "mp": json.marshal(f(1)), "cnt": count(h(1))}
`,
	"with": `package p
q := input.x
t := {"k": q}
a := x if x := q with input.x as {"a": [1]}
b := x if x := q with input as {"x": {1, 2}}
c := x if x := t with input.x as [1, 2]
d := x if x := t with data.p.q as {"z": {1}}
r := [a, b, q, c, t, d]
`,
	"equal values": `package p
r := {"s": {1, 1.0, 2.0, 2}, "a": [1, 1.0], "k": {{1}: 1, [1.0]: 2}, "in": input.x in {1, 2.0}, "eq": {1, 2} == {1.0, 2}}
`,
	"keys": `package p
m := {{"a"}: 1, ["x"]: 2, {"o": 1}: 3}
r := [[[k, v] | some k, v in m; is_set(k)], object.get(m, {"a"}, 0), m[input.k], object.get(m, input.k, 0), {"a"} in object.keys(m)]
`,
	"sets of sets": `package p
s := {{1, 2}, {2, 1}, {{3}}, set()}
r := {"s": s, "n": count(s), "in": {input.x} in s, "u": s | {{input.x}}}
`,
	"walk": `package p
c := {"a": {{1}, {2}}, "b": [1, {"c": 2}]}
r := {"p": [p | walk(c, [p, _])], "v": [v | walk(c, [_, v])], "i": [p | walk(input, [p, _])], "pv": {p: v | walk(c, [p, v])}}
`,
	"appended": `package p
a := [1, 2, 3]
r := {"c": array.concat(a, [input.x]), "c2": array.concat(a, ["y"]), "a": a, "p": [x | some x in a] }
`,
	"nested with": `package p
q := input
g := y if y := q with input.a.c as input.a.b
b := x if x := g with input as {"a": {"b": 1}}
d := x if x := g with input.a as {"b": [2]}
r := [b, d, g, b]
`,
	"partial object conflicts": `package p
o["k"] := {"v": 1}
o["k"] := {"v": 1.0} if input.a == 1
o["k"] := {"v": 2} if input.a == 2
o["j"] := [1] if input.a == 3
r := [v | some v in o]
`,
	"loops": `package p
r := [object.union({"k": {"c": 1}, "i": i}, {"k": {"d": i}}) | some i in input.l]
`,
}

var foldAttackInputs = []string{`{"a": 1, "x": 5, "l": ["p", "q"], "k": ["x"]}`, `{"a": 2, "x": {"b": 2}, "l": [], "k": ["y"]}`, `{"a": 3, "x": "z", "l": ["k", 1], "k": {"o": 1}}`, `{}`}

// TestFoldAttacksSameAsTopdown: each attack gives topdown's outcome,
// evaluation after evaluation.
func TestFoldAttacksSameAsTopdown(t *testing.T) {
	for name, src := range foldAttacks {
		t.Run(name, func(t *testing.T) {
			compiler := compile(t, map[string]string{"p.rego": src})
			prog := program(t, compiler, "data.p.r")
			for range 3 {
				compare(t, compiler, prog, map[string]any{}, foldAttackInputs)
			}
		})
	}
}

// TestFoldAttacksConcurrently: evaluations of alternating inputs from
// several goroutines (run with -race) each get topdown's answer for its
// input: none sees a constant another one changed.
func TestFoldAttacksConcurrently(t *testing.T) {
	for name, src := range foldAttacks {
		t.Run(name, func(t *testing.T) {
			compiler := compile(t, map[string]string{"p.rego": src})
			prog := program(t, compiler, "data.p.r")
			inputs := make([]*ast.Term, len(foldAttackInputs))
			want := make([]string, len(foldAttackInputs))
			for i, in := range foldAttackInputs {
				v := parseInput(t, in)
				inputs[i] = ast.NewTerm(v)
				want[i] = topdownOutcome(t, compiler, map[string]any{}, "data.p.r", v)
			}
			data := ast.NewTerm(ast.NewObject())
			done := make(chan error)
			for g := range 4 {
				go func() {
					for i := range 200 {
						k := (i + g) % len(inputs)
						if got := valueOutcome(prog, inputs[k], data); got != want[k] {
							done <- fmt.Errorf("input %s: got %s, want %s", foldAttackInputs[k], got, want[k])
							return
						}
					}
					done <- nil
				}()
			}
			for range 4 {
				if err := <-done; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// valueOutcome is planOutcome through Value, safe to call from any
// goroutine.
func valueOutcome(prog *Program, input, data *ast.Term) string {
	v, n, err := prog.Value(context.Background(), input, data, nil)
	switch {
	case err != nil:
		return "error"
	case n == 0:
		return "undefined"
	case n > 1 || v == nil:
		return fmt.Sprintf("%d results", n)
	}
	return jsonOutcome(v)
}

// jsonOutcome is v as JSON, or why it is not.
func jsonOutcome(v *ast.Term) string {
	j, err := ast.JSON(v.Value)
	if err != nil {
		return err.Error()
	}
	b, err := json.Marshal(j)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// handProgram is a program of one plan of hand-built blocks over locals
// locals, folded or not as Compile would.
func handProgram(blocks []block, locals int, folded bool) *Program {
	prog := &Program{plan: &function{name: "hand", index: -1, params: []int{0, 1}, blocks: blocks, locals: locals}, stack: locals}
	if folded {
		fold(prog)
	}
	prog.pool.New = func() any { return newVM(prog) }
	return prog
}

// TestFoldScanSetsItsLocals: a scan sets its key and value, and with
// its local, before the body runs, so a constant those locals held before
// is not their value in the body: a collection the body fills with them
// is built from what the statement set, folded or not.
func TestFoldScanSetsItsLocals(t *testing.T) {
	str := func(s string) operand { return operand{local: -1, konst: ast.StringTerm(s)} }
	loc := func(l int) operand { return operand{local: l} }
	// The body puts local 5 in a set, the set in an object, the object in
	// the results.
	body := func() block {
		return block{
			&makeSet{dst: 3}, &setAdd{v: loc(5), set: 3},
			&makeObject{dst: 6}, &objectInsert{k: str("v"), v: loc(3), obj: 6},
			&resultAdd{src: 6},
		}
	}
	before := func() instr { return &makeConst{v: ast.StringTerm("before"), dst: 5} }
	input := ast.NewTerm(ast.MustParseTerm(`["x", "y"]`).Value)
	data := ast.NewTerm(ast.NewObject())
	for _, c := range []struct {
		name   string
		blocks func() []block
		want   string
	}{
		{"scan", func() []block { return []block{{before(), &scan{src: 0, key: 4, value: 5, body: body()}}} },
			`[{"v": {"x"}} {"v": {"y"}}]`},
		{"with", func() []block { return []block{{before(), &with{local: 5, v: str("w"), body: body()}}} },
			`[{"v": {"w"}}]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			outcome := func(prog *Program) string {
				rs, err := prog.Eval(context.Background(), input, data, nil)
				if err != nil {
					t.Fatal(err)
				}
				return fmt.Sprint(rs)
			}
			if got := outcome(handProgram(c.blocks(), 7, false)); got != c.want {
				t.Fatalf("unfolded: %s, want %s", got, c.want)
			}
			if got := outcome(handProgram(c.blocks(), 7, true)); got != c.want {
				t.Fatalf("folded: %s, want %s", got, c.want)
			}
		})
	}
}
