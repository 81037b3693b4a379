package regoplan

// What held: the recall attacks below found no input sequence on which
// Value after another input differs from Eval (each passes today). Kept
// as regression tests for recall; the attacks that succeeded are in
// recall_attack_test.go.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"unsafe"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"
)

var probePolicies = []string{
	`package p
f(x) := upper(x)
g(x) := lower(x)
r := y if { y := f(input.a) with f as g }`,
	`package p
r := y if { y := upper(input.a) with upper as lower }`,
	`package p
t if data.m[input.a] == "A"
r := "t" if { t with data.m as {"b": "A"} } else := "f"`,
	`package p
q := input.a
r := y if { y := q with input.a as input.b }`,
	`package p
q := input.a == 1
r := [q, y] if { y := q with input.a as 1 }`,
	`package p
r := "t" if { every _, v in input.x { v == 1 } } else := "f"`,
	`package p
r := "t" if { some x in input.x; x == 1 } else := "f"`,
	`package p
r := "t" if { input.x[_] == 1 } else := "f"`,
	`package p
r := "t" if { input.x[0] == 1; input.x[1] == 2 } else := "f"`,
	`package p
r := x if { x := input.x[input.i] } else := "none"`,
	`package p
r := x if { x := data.arr[input.i] } else := "none"`,
	`package p
r := x if { x := data.arr[count(input.x)] } else := "none"`,
	`package p
r := x if { x := data.arr[to_number(input.a)] } else := "none"`,
	`package p
r := {"t": type_name(input.a), "b": type_name(input.b)}`,
	`package p
r := sum([input.n, 1]) if is_number(input.n) else := "x"`,
	`package p
r := [input.n | true]`,
	`package p
r := x if { x := {"v": to_number(input.n)} } else := "x"`,
	`package p
r := object.get(data.m, input.a, "none")`,
	`package p
r := object.get(data.m, [input.a], "none")`,
	`package p
r := x if { input.a == "a"; x := "A" } else := x if { input.a == "b"; x := input.a } else := 0`,
	`package p
f(x) := "a" if x == 1 else := "b" if x == 2 else := "c"
g(x, y) := f(x) if y == true else := f(y)
r := [g(input.a, input.b), g(input.b, input.a)]`,
	`package p
default f(_) := "d"
f(x) := "one" if x == 1
r := {"fa": f(input.a), "fb": f(input.b)}`,
	`package p
q := input.a
s := q
t := s == 1
r := [t, s == q] if true`,
	`package p
z := input.a == 1
r := data.p.z`,
	`package p
a := input.a == 1
b := input.b == 1
c := a == b
r := c`,
	`package p
o[k] := 1 if { k := upper(input.a) }
o[k] := 2 if { k := lower(input.b) }
r := o`,
	`package p
s contains x if { x := upper(input.a) }
s contains x if { x := upper(input.b) }
r := count(s)`,
	`package p
r := "all" if { every x in data.arr { x > input.n } } else := "notall"`,
	`package p
r := [k | some k, v in data.m; v == input.a]`,
	`package p
r := x if { some k, v in data.m; k == input.a; x := v }`,
	`package p
r := x if { x := json.filter(input, ["a"]) }`,
	`package p
r := x if { x := object.union({"q": 1}, input) }`,
	`package p
r := "t" if { not f(input.a) } else := "f"
f(x) if x == true`,
	`package p
r := "t" if { f(input.a) == f(input.b) } else := "f"
f(x) := y if { y := x } else := "none"`,
	`package p
r := "t" if { h(input.a) == h(input.b) } else := "f"
h(x) := y if { y := x }`,
	`package p
m := input.a
n := input.b
r := "t" if { m == n } else := "f"`,
	`package p
m := [input.a]
r := "t" if { m[0] == 1 } else := "f"`,
	`package p
r := "t" if { startswith(input.a, input.b) } else := "f"`,
	`package p
r := "t" if { input.a == data.m[input.b] } else := "f"`,
	`package p
r := "t" if { data.m[input.a] == data.m[input.b] } else := "f"`,
	`package p
r := "t" if { data.m[input.a] == input.b } else := "f"`,
	`package p
r := "t" if { x := {input.a: 1}; x[input.b] == 1 } else := "f"`,
	`package p
r := "t" if { input.a == input.b; input.a == 1 } else := "f"`,
	`package p
r := "t" if { data.sset[input.a] == input.b } else := "f"`,
	`package p
r := y if { y := data.sset[input.a] }`,
	`package p
r := y if { y := {data.sset[input.a]: data.m[data.sset[input.a]]} }`,
	`package p
r := count(input.a) if is_string(input.a) else := count(input.a) if is_array(input.a) else := "x"`,
	`package p
r := "t" if { [x, y] := input.a; x == y } else := "f"`,
	`package p
r := "t" if { {"x": v} := input.a; v == 1 } else := "f"`,
	`package p
r := "t" if { input.a.x == input.b.c } else := "f"`,
	`package p
r := "t" if { input.a > 0; input.a < 2 } else := "f"`,
	`package p
r := "same" if input.a == input.b else := "apart"`,
	`package p
r := data.m[input.k]`,
	`package p
r := data.arr[input.i]`,
	`package p
r := input.x[0]`,
	`package p
r := count(input.x)`,
	`package p
r := [input.x[0], input.x[1]] if true`,
	`package p
r := 1 if { [a, b] := input.x; a == 1 }`,
	`package p
r := {"a": a, "b": b} if { [a, b] := input.x }`,
	`package p
r := y if { y := input.x[0] + 0 }`,
	`package p
r := z if { z := object.get(input, "a", "dflt") }`,
	`package p
r := z if { z := substring(input.a, 0, 2) }`,
	`package p
f(x) := x
g(x) := f(x)
r := "one" if g(input.a) == 1 else := "other"`,
	`package p
v := input.a
w := v
r := "t" if { w == true; input.b == true } else := "f"`,
	`package p
r := "in" if input.a in {1, "1", true} else := "out"`,
	`package p
r := "in" if input.a in data.s else := "out"`,
	`package p
r := data.sset[input.a]`,
	`package p
r := "y" if { input.a == input.b.c } else := "n"`,
	`package p
r := x if { some x; data.m[x] == input.a }`,
	`package p
default r := "d"
r := "n" if not input.a`,
	`package p
r := "n" if { not input.a == false } else := "f"`,
	`package p
r := input.a == input.b`,
	`package p
r := sprintf("%v", [input.a])`,
	`package p
r := input.a + input.b`,
	`package p
r := to_number(input.a)`,
	`package p
r := {"k": is_object(input.a), "a": is_array(input.a), "s": is_set(input.a), "str": is_string(input.a), "n": is_number(input.a)}`,
	`package p
r := {"u": upper(input.a)} if is_string(input.a)`,
	`package p
r := data.m[lower(input.a)]`,
	`package p
r := x if { x := data.m[input.a]; input.b == x }`,
	`package p
r := x if { x := {"q": data.m[input.a]}; x.q == input.b }`,
	`package p
x := trim(input.a, " ")
r := data.m[x]`,
	`package p
r := count(input.a) + count(input.b)`,
	`package p
r := input.a[input.b]`,
	`package p
r := data.m[input.a][input.b]`,
	`package p
r := "yes" if { input.a == [1, 2] } else := "no"`,
	`package p
r := "yes" if { input.a == {"x": 1} } else := "no"`,
	`package p
r := "yes" if { input.a < input.b } else := "no"`,
	`package p
r := object.get(input.a, "x", 0)`,
	`package p
s := {x | x := data.arr[_]; x > input.n}
r := count(s)`,
	`package p
r := [x | x := data.arr[_]; x == input.n]`,
	`package p
r := {k: v | some k; v := data.m[k]; v == input.a}`,
	`package p
r := numbers.range(0, input.n)`,
	`package p
r := x if { x := input.a; x == "a" } else := x if { x := input.b; x == "b" } else := "none"`,
	`package p
t := input.a
r := {t: 1}`,
	`package p
r := {data.m[input.a]: 1}`,
	`package p
r := {data.m[input.a]}`,
	`package p
r := [input.a == 1, input.a == 1.0, input.a == "1"]`,
	`package p
r := json.marshal(input.a) if input.a == 1`,
	`package p
r := format_int(input.a, 10) if input.a == 1`,
}

var probeInputs = []string{
	`{}`, `{"a":1}`, `{"a":1.0}`, `{"a":1e0}`, `{"a":"1"}`, `{"a":true}`, `{"a":null}`, `{"a":false}`,
	`{"a":1,"b":1}`, `{"a":1,"b":1.0}`, `{"a":true,"b":true}`, `{"a":true,"b":false}`, `{"a":"","b":""}`, `{"a":"x","b":"x"}`,
	`{"a":[1,2]}`, `{"a":{"x":1}}`, `{"a":{"x":1.0}}`, `{"a":[1,2],"b":0}`, `{"a":{"0":5},"b":"0"}`, `{"a":[5],"b":0}`,
	`{"x":[1,2]}`, `{"x":"ab"}`, `{"x":{"0":1,"1":2}}`, `{"x":[1.0,2]}`, `{"x":[1]}`,
	`{"k":"a"}`, `{"k":"b"}`, `{"k":1}`, `{"i":0}`, `{"i":1}`, `{"i":0.0}`, `{"i":1.0}`, `{"i":"0"}`,
	`{"a":"A"}`, `{"a":"a"}`, `{"a":" a "}`, `{"a":"a","b":"A"}`, `{"a":"a","b":"a"}`, `{"a":"a","b":{"c":"a"}}`, `{"a":"a","b":{"c":"b"}}`,
	`{"n":1}`, `{"n":2}`, `{"n":1.0}`, `{"n":3}`, `{"a":"b","b":"b"}`, `{"a":"é"}`, `{"a":"e\u0301"}`,
	`{"a":12345678901234567890}`, `{"a":12345678901234567891}`, `{"a":1e400}`,
}

const probeData = `{"m":{"a":"A","b":"B","1":"one","A":"a"},"arr":[10,20,30],"s":["a",1],"sset":["a","b"]}`

// probeDataValue is probeData as a value.
func probeDataValue(t *testing.T) ast.Value {
	t.Helper()
	var d map[string]any
	if err := util.UnmarshalJSON([]byte(probeData), &d); err != nil {
		t.Fatal(err)
	}
	dv, err := ast.InterfaceToValue(d)
	if err != nil {
		t.Fatal(err)
	}
	return dv
}

func TestRecallAttackHeldPairs(t *testing.T) {
	dv := probeDataValue(t)
	// make sset a set
	dv.(ast.Object).Insert(ast.StringTerm("sset"), ast.SetTerm(ast.StringTerm("a"), ast.StringTerm("b"), ast.IntNumberTerm(1)))
	data := ast.NewTerm(dv)
	pairsAgree(t, data, probeInputs, 6, func(s string) *ast.Term { return ast.NewTerm(parseInput(t, s)) })
}

func TestRecallAttackHeldNonJSONInputs(t *testing.T) {
	dv := probeDataValue(t)
	data := ast.NewTerm(dv)
	inputs := []string{
		`{"a": {1, 2}}`, `{"a": {"x", 1}}`, `{"a": [1, 2]}`, `{"a": {1: 1, 2: 2}}`, `{"a": {1.0: 1}}`, `{"a": {"x"}, "b": "x"}`,
		`{"a": {"x": 1}, "b": "x"}`, `{"a": ["x"], "b": 0}`, `{"a": {0: "x"}, "b": 0}`, `{"a": {0}, "b": 0}`, `{"a": set(), "b": 0}`,
		`{"x": {1, 2}}`, `{"x": {0: 1, 1: 2}}`, `{"x": [1, 2]}`, `{"a": 1, "b": {1}}`, `{"a": {[1]: 1}}`, `{"a": {{"x": 1}}}`,
		`{"a": "x", "b": {"c": {"x"}}}`, `{1: 2}`, `{"a": true, "b": true}`,
	}
	pairsAgree(t, data, inputs, 4, ast.MustParseTerm)
}

// pairsAgree evaluates, for every probe policy, input b after input a on a
// new program, for a 1/stride of the ordered pairs of inputs (another for
// each policy, so that make test stays short), and wants b's value to be
// Eval's.
func pairsAgree(t *testing.T, data *ast.Term, inputs []string, stride int, parse func(string) *ast.Term) {
	t.Helper()
	fails := 0
	for pi, src := range probePolicies {
		compiler := compile(t, map[string]string{"p.rego": src})
		p, err := Plan(context.Background(), compiler, "data.p.r")
		if err != nil {
			t.Fatal(err)
		}
		for ia, a := range inputs {
			for ib, b := range inputs {
				if (ia*7+ib+pi)%stride != 0 {
					continue
				}
				prog, err := Compile(p)
				if err != nil {
					t.Fatal(err)
				}
				valueOutcome(prog, parse(a), data)
				got := valueOutcome(prog, parse(b), data)
				if want := evalOutcome(prog, parse(b), data); got != want {
					fails++
					if fails < 40 {
						t.Errorf("policy %d after %s: %s gives %s, eval %s", pi, a, b, got, want)
					}
				}
			}
		}
	}
}

func TestRecallAttackHeldRandomSequences(t *testing.T) {
	dv := probeDataValue(t)
	data := ast.NewTerm(dv)
	vals := []string{`1`, `1.0`, `2`, `0`, `"1"`, `"a"`, `"b"`, `"A"`, `""`, `true`, `false`, `null`, `[1,2]`, `[1]`, `{"x":1}`, `{"x":"a"}`, `{"c":"a"}`, `{}`, `[]`, `"x"`, `" a "`, `"ab"`}
	keys := []string{"a", "b", "x", "n", "k", "i"}
	seed := uint64(12345)
	rnd := func(n int) int {
		seed = seed*6364136223846793005 + 1442695040888963407
		return int((seed >> 33) % uint64(n))
	}
	gen := func() string {
		s := "{"
		first := true
		for _, k := range keys {
			if rnd(3) == 0 {
				continue
			}
			if !first {
				s += ","
			}
			first = false
			s += `"` + k + `":` + vals[rnd(len(vals))]
		}
		return s + "}"
	}
	fails := 0
	for pi, src := range probePolicies {
		compiler := compile(t, map[string]string{"p.rego": src})
		p, err := Plan(context.Background(), compiler, "data.p.r")
		if err != nil {
			t.Fatal(err)
		}
		for range 40 {
			prog, err := Compile(p)
			if err != nil {
				t.Fatal(err)
			}
			var seq []string
			for range 6 {
				seq = append(seq, gen())
			}
			for _, in := range seq {
				got := valueOutcome(prog, ast.NewTerm(parseInput(t, in)), data)
				want := evalOutcome(prog, ast.NewTerm(parseInput(t, in)), data)
				if got != want {
					fails++
					if fails < 20 {
						t.Errorf("policy %d seq %v: %s gives %s, eval %s", pi, seq, in, got, want)
					}
				}
			}
		}
	}
}

// Run with -race: a recalled value (an object holding a set, an array
// and an outcome) read by many goroutines at once.
func TestRecallAttackHeldSharedValueConcurrently(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := {"action": "allow", "tags": {"b", "a", x}, "o": {"z": 1, "y": x, "w": {x: 1, "q": 2}}, "l": [x, 2]} if {
	x := upper(input.a)
}
`})
	prog := program(t, compiler, "data.p.r")
	data := ast.NewTerm(ast.NewObject())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				in := fmt.Sprintf(`{"a":"v%d","pad":%d}`, (g+i)%3, i)
				v, _, _ := prog.Value(t.Context(), ast.NewTerm(parseInput(t, in)), data, nil)
				_ = v.String()
				_, _ = ast.JSON(v.Value)
				_ = ast.Compare(v.Value, v.Value)
				_ = v.Hash()
				v.Value.(ast.Object).Get(ast.StringTerm("tags")).Value.(ast.Set).Contains(ast.StringTerm("a"))
			}
		})
	}
	wg.Wait()
	t.Logf("recalled %d", prog.Recalled())
}

// The input's memory reused after its evaluation: a key into data
// (readKey), a set member standing for the input's string (get returns the
// key itself), and a substring's outcome, all kept as copies.
func TestRecallAttackHeldReusedInputMemory(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := {"m": data.m[input.k], "s": data.sset[input.k], "sub": substring(input.k, 0, 1), "eq": data.sset[input.k] == input.j}
`})
	prog := program(t, compiler, "data.p.r")
	dv := ast.MustParseTerm(`{"m": {"a": "A", "b": "B"}, "sset": {"a", "b"}}`)
	buf := []byte("a")
	input := func(j string) *ast.Term {
		k := unsafe.String(unsafe.SliceData(buf), len(buf))
		return ast.ObjectTerm(ast.Item(ast.StringTerm("k"), ast.StringTerm(k)), ast.Item(ast.StringTerm("j"), ast.StringTerm(j)))
	}
	for i, step := range []struct{ k, j string }{{"a", "a"}, {"b", "a"}, {"a", "a"}, {"b", "b"}, {"a", "b"}} {
		copy(buf, step.k)
		got := valueOutcome(prog, input(step.j), dv)
		if want := evalOutcome(prog, input(step.j), dv); got != want {
			t.Errorf("step %d %+v: %s, evaluated %s", i, step, got, want)
		}
	}
	if prog.Recalled() == 0 {
		t.Error("nothing recalled")
	}
}
