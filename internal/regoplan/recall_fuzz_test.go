package regoplan

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/util"
)

// recallPolicies are the policies FuzzRecall evaluates: between them they
// read the input in every way a recording records or gives up on.
var recallPolicies = []string{
	`package p
r := {"action": "allow"} if {
	input.tool.hints.readOnly == true
	not input.tool.hints.destructive == true
	input.method == "tools/call"
	not data.settings.services[input.service].read_only == false
} else := {"action": "ask", "reason": sprintf("tool %s on %s", [object.get(input, ["tool", "name"], ""), object.get(input, "service", "")])}
`,
	`package p
r := "small" if { input.scan.clean == true; input.scan.bytes <= 100; not input.method in {"tools/list", "prompts/list"} } else := "large"
`,
	`package p
r := "both" if { input.a == true; input.b == true } else := concat("/", ["not", json.marshal(input.a)])
`,
	`package p
x := trim_space(input.a)
r := {"x": x, "up": upper(x), "n": count(input.a), "eq": x == input.b, "pre": startswith(input.a, input.b)}
`,
	`package p
f(v) := v * 2 if is_number(v) else := "nan"
g(s) if { is_string(s); contains(s, "k") }
r := {"f": f(input.n), "g": g(input.a), "h": f(input.m)}
`,
	`package p
r := data.settings.services[input.service].allow[input.n]
`,
	`package p
kind := "read" if input.m == "get" else := "write" if input.m == "put" else := "other"
default r := "none"
r := {"kind": kind, "n": count(input.l), "arr": is_array(input.l), "obj": is_object(input.o), "set": is_set(input.l), "get": object.get(input.o, ["x", "y"], null)} if input.m
`,
	`package p
r := [x | some x in input.l; x != 1]
`,
	`package p
r := "same" if input.a == input.b else := "apart" if input.a != input.b else := "none"
`,
	`package p
r := {"o": input.o == {"x": 1}, "l": input.l == [1, 2], "n": input.n < 10, "s": input.a > "m", "abs": abs(input.n), "num": to_number(input.a)}
`,
	`package p
deny contains msg if { input.scan.clean != true; msg := "not clean" }
deny contains msg if { input.n > 3; msg := sprintf("n is %v", [input.n]) }
r := {"deny": deny, "c": count(deny)}
`,
	`package p
r := x if { input.b == "x"; x := input.a with input.a as "w" } else := object.keys(input.o)
`,
}

// recallSeeds are inputs in the members recallPolicies read.
var recallSeeds = []string{
	`{"tool":{"name":"read","hints":{"readOnly":true}},"method":"tools/call","service":"tracker","scan":{"clean":true,"bytes":10},"a":true,"b":true,"n":1,"m":"get","l":[1,2],"o":{"x":1}}`,
	`{"tool":{"name":"write","hints":{"readOnly":true,"destructive":true}},"method":"tools/call","service":"mail","scan":{"clean":true,"bytes":101},"a":" k ","b":"k","n":1.0,"m":"put","l":"ab","o":{"x":{"y":2}}}`,
	`{"tool":{"name":"read","hints":{}},"method":"tools/list","service":"none","scan":{"clean":false},"a":"","b":"","n":0,"m":null,"l":[],"o":[]}`,
	`{"method":"tools/call","service":"tracker","scan":[1],"a":false,"b":true,"n":12345678901234567890,"l":[1],"o":{}}`,
	`{}`,
}

// FuzzRecall evaluates two inputs one after the other through a new
// program of one of recallPolicies, so that the second may be recalled
// from the first, and wants the second's value to be the one evaluating
// it gives (Eval, which never recalls).
func FuzzRecall(f *testing.F) {
	var d map[string]any
	if err := util.UnmarshalJSON([]byte(recallData), &d); err != nil {
		f.Fatal(err)
	}
	dv, err := ast.InterfaceToValue(d)
	if err != nil {
		f.Fatal(err)
	}
	data := ast.NewTerm(dv)
	plans := make([]*ir.Policy, len(recallPolicies))
	for i, src := range recallPolicies {
		compiler := compile(f, map[string]string{"p.rego": src})
		if plans[i], err = Plan(context.Background(), compiler, "data.p.r"); err != nil {
			f.Fatal(err)
		}
	}
	for i := range recallPolicies {
		for j, a := range recallSeeds {
			for _, b := range recallSeeds[j:] {
				f.Add(uint8(i), a, b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, a, b string) {
		first, second := fuzzInput(a), fuzzInput(b)
		if first == nil || second == nil {
			return
		}
		prog, err := Compile(plans[int(which)%len(plans)])
		if err != nil {
			t.Fatal(err)
		}
		valueOutcome(prog, first, data)
		got := valueOutcome(prog, second, data)
		if want := evalOutcome(prog, second, data); got != want {
			t.Fatalf("policy %d, after %s: %s gives %s, evaluated %s", int(which)%len(plans), a, b, got, want)
		}
	})
}

// fuzzInput is s as an input, or nil when it is not a JSON object.
func fuzzInput(s string) *ast.Term {
	if !json.Valid([]byte(s)) || !strings.HasPrefix(strings.TrimSpace(s), "{") {
		return nil
	}
	v, err := ast.ValueFromReader(strings.NewReader(s))
	if err != nil {
		return nil
	}
	return ast.NewTerm(v)
}

// evalOutcome is valueOutcome's outcome from Eval.
func evalOutcome(prog *Program, input, data *ast.Term) string {
	rs, err := prog.Eval(context.Background(), input, data, nil)
	switch {
	case err != nil:
		return "error"
	case len(rs) == 0:
		return "undefined"
	case len(rs) > 1 || rs[0].Len() != 1:
		return fmt.Sprintf("%d results", len(rs))
	}
	var v *ast.Term
	rs[0].Foreach(func(_, t *ast.Term) { v = t })
	return jsonOutcome(v)
}
