package regoplan

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/util"
)

// outcome is what an evaluation gave, written so that two evaluators'
// outcomes compare: the query's value as JSON, "undefined", or "error".
func topdownOutcome(t *testing.T, compiler *ast.Compiler, data map[string]any, query string, input ast.Value) string {
	t.Helper()
	opts := []func(*rego.Rego){rego.Query(query), rego.Compiler(compiler), rego.Store(inmem.NewFromObject(data))}
	if input != nil {
		opts = append(opts, rego.ParsedInput(input))
	}
	rs, err := rego.New(opts...).Eval(context.Background())
	switch {
	case err != nil:
		return "error"
	case len(rs) == 0:
		return "undefined"
	case len(rs) > 1 || len(rs[0].Expressions) != 1:
		t.Fatalf("%s: %d results", query, len(rs))
	}
	b, err := json.Marshal(rs[0].Expressions[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func planOutcome(t *testing.T, prog *Program, data map[string]any, input ast.Value) string {
	t.Helper()
	d, err := ast.InterfaceToValue(data)
	if err != nil {
		t.Fatal(err)
	}
	var in *ast.Term
	if input != nil {
		in = ast.NewTerm(input)
	}
	rs, err := prog.Eval(context.Background(), in, ast.NewTerm(d), nil)
	switch {
	case err != nil:
		return "error"
	case len(rs) == 0:
		return "undefined"
	case len(rs) > 1 || rs[0].Len() != 1:
		t.Fatalf("%d results", len(rs))
	}
	var v *ast.Term
	rs[0].Foreach(func(_, t *ast.Term) { v = t })
	j, err := ast.JSON(v.Value)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func compile(t testing.TB, modules map[string]string) *ast.Compiler {
	t.Helper()
	parsed := map[string]*ast.Module{}
	for name, src := range modules {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Fatal(err)
		}
		parsed[name] = m
	}
	c := ast.NewCompiler()
	c.Compile(parsed)
	if c.Failed() {
		t.Fatal(c.Errors)
	}
	return c
}

func program(t *testing.T, compiler *ast.Compiler, query string) *Program {
	t.Helper()
	p, err := Plan(context.Background(), compiler, query)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

func parseInput(t *testing.T, s string) ast.Value {
	t.Helper()
	if s == "" {
		return nil
	}
	v, err := ast.ValueFromReader(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// compare evaluates data.p.r on each input with prog and with topdown and
// wants the same outcome; then, twice over, with prog's Value, which may
// recall an evaluation of another input (see recall.go).
func compare(t *testing.T, compiler *ast.Compiler, prog *Program, data map[string]any, inputs []string) {
	t.Helper()
	wants := make([]string, len(inputs))
	for i, in := range inputs {
		input := parseInput(t, in)
		wants[i] = topdownOutcome(t, compiler, data, "data.p.r", input)
		if got := planOutcome(t, prog, data, input); got != wants[i] {
			t.Errorf("input %s: plan gives %s, topdown %s", in, got, wants[i])
		}
	}
	d, err := ast.InterfaceToValue(data)
	if err != nil {
		t.Fatal(err)
	}
	dt := ast.NewTerm(d)
	for range 2 {
		for i, in := range inputs {
			var input *ast.Term
			if v := parseInput(t, in); v != nil {
				input = ast.NewTerm(v)
			}
			got := valueOutcome(prog, input, dt)
			if got == "undefined" && wants[i] == "undefined" || strings.HasSuffix(got, " results") {
				continue // Value tells no more
			}
			if got != wants[i] {
				t.Errorf("input %s: plan's Value gives %s, topdown %s", in, got, wants[i])
			}
		}
	}
}

// sameAsTopdown is compare for modules, on data written as JSON.
func sameAsTopdown(t *testing.T, modules map[string]string, data string, inputs ...string) {
	t.Helper()
	var d map[string]any
	if err := util.UnmarshalJSON([]byte(data), &d); err != nil {
		t.Fatal(err)
	}
	compiler := compile(t, modules)
	compare(t, compiler, program(t, compiler, "data.p.r"), d, inputs)
}

// TestSameAsTopdown evaluates small policies, each exercising statements
// of the plan (lookups, iteration, negation, else chains, comprehensions,
// partial sets and objects, functions, built-ins that fail, conflicts,
// with), with this package and with topdown, and wants the same outcome.
func TestSameAsTopdown(t *testing.T) {
	const data = `{"settings": {"services": {"tracker": {"read_only": true, "pin": {"a": 1}}, "mail": {}}, "admins": ["root"], "n": 3}, "arr": [10, 20, 30]}`
	var d map[string]any
	if err := util.UnmarshalJSON([]byte(data), &d); err != nil {
		t.Fatal(err)
	}
	cases := []sameCase{
		{"lookups", `package p
r := data.settings.services[input.service].read_only
`, []string{`{"service":"tracker"}`, `{"service":"mail"}`, `{"service":"none"}`, `{}`, `{"service":3}`}},
		{"else", `package p
r := "deny" if { input.a > 3 } else := "ask" if { input.a > 1 } else := "allow"
`, []string{`{"a":5}`, `{"a":2}`, `{"a":0}`, `{"a":"x"}`, `{}`}},
		{"default and not", `package p
default r := false
r if { not input.x; input.y == 1 }
`, []string{`{"y":1}`, `{"x":true,"y":1}`, `{"x":false,"y":1}`, `{}`}},
		{"partial set", `package p
r contains msg if { some g in input.groups; g in data.settings.admins; msg := sprintf("%s is admin", [g]) }
r contains "many" if count(input.groups) > 2
`, []string{`{"groups":["root","x"]}`, `{"groups":["a","b","c","root"]}`, `{"groups":[]}`, `{"groups":"root"}`, `{}`}},
		{"partial object", `package p
r[k] := v if { some k, v in data.settings.services[input.s].pin }
r["m"] := input.m if input.m
`, []string{`{"s":"tracker","m":"x"}`, `{"s":"mail"}`, `{"s":"tracker","m":false}`}},
		{"conflict", `package p
r := 1 if input.a
r := 2 if input.b
`, []string{`{"a":true}`, `{"a":true,"b":true}`, `{}`}},
		{"object conflict", `package p
r[k] := 1 if { some k in input.a }
r[k] := 2 if { some k in input.b }
`, []string{`{"a":["x"],"b":["y"]}`, `{"a":["x"],"b":["x"]}`}},
		{"functions", `package p
f(x) := y if { y := x * 2 } else := 0
g(x) if startswith(x, "a")
r := {"f": f(input.n), "g": g(input.s), "h": [y | some x in input.l; y := f(x)]}
`, []string{`{"n":2,"s":"abc","l":[1,2,3]}`, `{"n":"x","s":"b","l":[]}`, `{"n":2,"s":3,"l":[1]}`}},
		{"builtin errors are undefined", `package p
r := x if x := to_number(input.s) else := "not a number"
`, []string{`{"s":"12"}`, `{"s":"twelve"}`, `{"s":[1]}`}},
		{"comprehensions", `package p
r := {"arr": [x | some x in input.l; x > 1], "set": {x | some x in input.l}, "obj": {k: v | some k, v in input.o; v != null}, "n": count([1 | some _ in input.l])}
`, []string{`{"l":[1,2,3,2],"o":{"a":1,"b":null}}`, `{"l":[],"o":{}}`, `{"l":"x","o":1}`}},
		{"every and some", `package p
r if { every x in input.l { x > 0 }; some y in input.l; y == 2 }
`, []string{`{"l":[1,2]}`, `{"l":[0,2]}`, `{"l":[1]}`, `{"l":[]}`}},
		{"walk", `package p
r := [p | walk(input, [p, v]); is_string(v); contains(v, "secret")]
`, []string{`{"a":{"b":["x","a secret"]},"c":"secret"}`, `{}`}},
		{"walk stopped early and negated", `package p
found if { walk(input, [_, v]); v == "secret" }
clean if { not found }
first := [p | walk(input, [p, v]); v == "secret"][0]
r := {"found": found, "clean": clean, "first": first} if true else := "none"
`, []string{`{"a":{"b":["x","secret"]},"c":"secret"}`, `{"a":[1,2]}`, `{}`}},
		{"unify arrays", `package p
r := {"a": a, "b": b} if [a, b] = input.pair
`, []string{`{"pair":[1,2]}`, `{"pair":[1]}`, `{"pair":{"0":1,"1":2}}`, `{"pair":"ab"}`}},
		{"with input and data", `package p
q := input.x + data.settings.n
r := {"plain": q, "input": a, "data": b, "deep": c} if {
	a := q with input as {"x": 10}
	b := q with data.settings.n as 100
	c := data.settings.services.tracker with data.settings.services.tracker.pin.b as 2
}
`, []string{`{"x":1}`}},
		{"numbers", `package p
r := {"eq": input.a == input.b, "sum": input.a + input.b, "range": numbers.range(1, input.a), "big": 12345678901234567890 > input.a}
`, []string{`{"a":1,"b":1.0}`, `{"a":3,"b":2.5}`}},
		{"clock and per-evaluation state", `package p
r := {"now": time.now_ns() > 1700000000000000000, "same": rand.intn("k", 1000) == rand.intn("k", 1000), "id": uuid.rfc4122("a") == uuid.rfc4122("a")}
`, []string{`{}`}},
		{"sets and objects", `package p
s := {x | some x in input.l}
r := {"has": "a" in s, "dot": s["b"], "union": s | {"z"}, "keys": object.keys(input.o), "get": object.get(input.o, ["x", "y"], "none")}
`, []string{`{"l":["a","b"],"o":{"x":{"y":1}}}`, `{"l":["c"],"o":{}}`}},
	}
	for _, c := range append(cases, edgeCases...) {
		t.Run(c.name, func(t *testing.T) {
			compiler := compile(t, map[string]string{"p.rego": c.module})
			compare(t, compiler, program(t, compiler, "data.p.r"), d, c.inputs)
		})
	}
}

// sameCase is a policy (package p, deciding r) and inputs to evaluate it on.
type sameCase struct {
	name, module string
	inputs       []string
}

// TestRefusesWhatItCannotRun: a plan with a statement this package does
// not run is refused when compiled, so that the caller uses topdown.
func TestRefusesWhatItCannotRun(t *testing.T) {
	// A reference into data that mixes a rule and a base document is
	// planned as a merge of the two (ObjectMergeStmt).
	compiler := compile(t, map[string]string{"p.rego": `package p
r := data.q
`, "q.rego": `package q
x := 1
`})
	p, err := Plan(context.Background(), compiler, "data.p.r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(p); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("Compile: %v, want a statement that is not supported", err)
	}
}

// TestImpure: a program is impure when it calls a built-in that reads the
// clock, keeps state for the evaluation or reaches outside the process,
// wherever in the policy the call is, and only then.
func TestImpure(t *testing.T) {
	for _, c := range []struct {
		body   string
		impure bool
	}{
		{`r := count(input)`, false},
		{`r := replace(input.s, "a", "b")`, false},
		{`r := time.now_ns()`, true},
		{`r := f(1)` + "\n" + `f(x) := http.send({"method": "GET", "url": input.url}).status_code if x > 0`, true},
		{`r := net.lookup_ip_addr(input.host)`, true},
		{`r := io.jwt.decode_verify(input.token, {"secret": "s"})`, true},
	} {
		prog := program(t, compile(t, map[string]string{"p.rego": "package p\n\n" + c.body + "\n"}), "data.p.r")
		if prog.Impure() != c.impure {
			t.Errorf("%s: Impure() = %v, want %v", c.body, prog.Impure(), c.impure)
		}
	}
}

// TestCancel: a cancelled evaluation stops with ErrCancelled.
func TestCancel(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := count([x | some x in input; x % 7 == 0])
`})
	prog := program(t, compiler, "data.p.r")
	input := ast.NewArray()
	for i := range 10000 {
		input = input.Append(ast.InternedTerm(i))
	}
	c := topdown.NewCancel()
	c.Cancel()
	if _, err := prog.Eval(context.Background(), ast.NewTerm(input), ast.NewTerm(ast.NewObject()), c); err != ErrCancelled {
		t.Fatalf("Eval: %v, want ErrCancelled", err)
	}
	rs, err := prog.Eval(context.Background(), ast.NewTerm(input), ast.NewTerm(ast.NewObject()), topdown.NewCancel())
	if err != nil || len(rs) != 1 {
		t.Fatalf("Eval: %v, %v", rs, err)
	}
}

// TestConcurrentEvaluations: one program, evaluated from several
// goroutines at once on shared input and data (as the gateway does), gives
// every one of them the same answer. Run with -race.
func TestConcurrentEvaluations(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
admins := {g | some g in data.admins}
r := {"n": count([x | some x in input.l; x > 1]), "admin": count(admins & {g | some g in input.groups}) > 0, "f": f(input.s), "none": none, "some": some_of}
none contains x if { some x in input.l; x > 5 }
some_of contains x if { some x in input.l; x > 2 }
f(s) := upper(s) if startswith(s, "a") else := s
`})
	prog := program(t, compiler, "data.p.r")
	data := ast.NewTerm(ast.MustParseTerm(`{"admins": ["root", "ops"]}`).Value)
	input := ast.NewTerm(ast.MustParseTerm(`{"l": [1, 2, 3], "groups": ["ops"], "s": "abc"}`).Value)
	want := `{"admin": true, "f": "ABC", "n": 2, "none": set(), "some": {3}}`
	concurrently(t, prog, input, data, func(v *ast.Term) error {
		if v.String() != want {
			return fmt.Errorf("got %v, want %s", v, want)
		}
		return nil
	})
	// New sets and objects start as shared empty values until their first
	// member; no evaluation may have put one into them.
	if emptySet.(ast.Set).Len() != 0 || emptyObject.(ast.Object).Len() != 0 {
		t.Fatalf("the shared empty values were changed: %v %v", emptySet, emptyObject)
	}
}

// TestSharedTermsUnchanged: evaluations from several goroutines on
// one input and one data term, through with (on input and data paths),
// walk, object iteration, set and object building from shared values, and
// sorting; run with -race. Every evaluation gives the first one's answer,
// and input and data are unchanged.
func TestSharedTermsUnchanged(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
g := [input.a.b, data.s.n]
s := {x | some x in input.l}
o := {k: v | some k, v in input.o}
r := {
	"w1": x, "w2": y, "w3": z,
	"walk": [p | walk(input, [p, v]); is_string(v)],
	"keys": [k | some k, _ in input.o],
	"dkeys": [k | some k, _ in data.s],
	"s": s, "o": o, "sorted": sort(input.l), "u": object.union(input.o, data.s),
	"g": g,
} if {
	x := g with input.a.b as 5
	y := g with data.s.n as 6
	z := g with input.a as {"b": [1]} with data.s as {"n": 0}
}
`})
	prog := program(t, compiler, "data.p.r")
	data := ast.NewTerm(ast.MustParseTerm(`{"s": {"n": 1, "z": 2, "a": 3}}`).Value)
	input := ast.NewTerm(ast.MustParseTerm(`{"a": {"b": 2, "c": "x"}, "l": ["q", "b", "a", 1], "o": {"z": 1, "y": "s", "x": [1]}}`).Value)
	dataText, inputText := data.String(), input.String()
	first, n, err := prog.Value(context.Background(), input, data, nil)
	if err != nil || n != 1 || first == nil {
		t.Fatal(first, n, err)
	}
	want := first.String()
	concurrently(t, prog, input, data, func(v *ast.Term) error {
		if v.String() != want {
			return fmt.Errorf("got %v, want %s", v, want)
		}
		return nil
	})
	if data.String() != dataText || input.String() != inputText {
		t.Fatalf("shared terms changed:\n%s\n%s", data, input)
	}
}

// concurrently evaluates prog on input and data 300 times from each of 4
// goroutines and checks each value (the result's one binding).
func concurrently(t *testing.T, prog *Program, input, data *ast.Term, check func(*ast.Term) error) {
	t.Helper()
	done := make(chan error)
	for range 4 {
		go func() {
			for range 300 {
				v, n, err := prog.Value(context.Background(), input, data, nil)
				if err != nil || n != 1 || v == nil {
					done <- fmt.Errorf("%d results, %v, %v", n, v, err)
					return
				}
				if err := check(v); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
