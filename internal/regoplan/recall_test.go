package regoplan

import (
	"fmt"
	"sync"
	"testing"
	"unsafe"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"
)

// recallCase is a policy and inputs evaluated one after the other through
// one program, each against topdown: every input after the first may be
// given a value recalled from one before it.
type recallCase struct {
	name, module string
	inputs       []string
	recalls      int // how many evaluations (of the inputs, twice over) must be recalled at least
}

const recallData = `{"settings": {"services": {"tracker": {"read_only": true, "allow": ["read"]}, "mail": {}}, "n": 3}}`

func TestRecall(t *testing.T) {
	cases := []recallCase{
		{"a decision read from a few members", `package p
r := {"action": "allow", "reason": "read-only"} if {
	input.tool.hints.readOnly == true
	input.method == "tools/call"
	not data.settings.services[input.service].read_only == false
} else := {"action": "ask", "reason": sprintf("tool %s is not read-only", [input.tool.name])}
`, []string{
			`{"method":"tools/call","tool":{"name":"read","hints":{"readOnly":true}},"service":"tracker","arguments":{"a":1}}`,
			`{"method":"tools/call","tool":{"name":"read","hints":{"readOnly":true}},"service":"tracker","arguments":{"a":2,"b":[1,2]}}`,
			`{"method":"tools/call","tool":{"name":"write","hints":{}},"service":"tracker","arguments":{}}`,
			`{"method":"tools/call","tool":{"name":"erase","hints":{}},"service":"tracker","arguments":{}}`,
			`{"method":"tools/list","tool":{"name":"read","hints":{"readOnly":true}},"service":"tracker"}`,
			`{"method":"tools/call","tool":{"name":"read","hints":{"readOnly":"true"}},"service":"tracker"}`,
		}, 2},
		// Two members holding the same interned term (true) are told apart
		// by the statements that read them, not by the term.
		{"interned terms of two members", `package p
r := "both" if { input.a == true; input.b == true } else := "not both"
`, []string{`{"a":true,"b":true}`, `{"a":true,"b":false}`, `{"a":true,"b":true}`, `{"a":false,"b":true}`, `{"a":true}`, `{"b":true,"a":true,"c":1}`}, 2},
		{"interned empty strings and small numbers", `package p
x := input.a
r := "all empty" if { x == ""; input.b == ""; input.n == 0; input.m == 0 } else := "not all"
`, []string{`{"a":"","b":"","n":0,"m":0}`, `{"a":"","b":"x","n":0,"m":0}`, `{"a":"","b":"","n":1,"m":0}`, `{"a":"","b":"","n":0,"m":1}`, `{"a":"","b":"","n":0,"m":0}`}, 1},
		// 1 and 1.0 compare equal, but a built-in prints them apart.
		{"numbers written apart", `package p
r := [json.marshal(input.n), abs(input.m)] if input.n == 1
`, []string{`{"n":1,"m":2}`, `{"n":1,"m":2.0}`, `{"n":1.0,"m":2}`, `{"n":1e0,"m":2}`, `{"n":1,"m":2}`, `{"n":2,"m":2}`}, 1},
		{"bounds", `package p
r := "small" if { input.scan.clean == true; input.scan.bytes <= 100 } else := "large"
`, []string{`{"scan":{"clean":true,"bytes":10}}`, `{"scan":{"clean":true,"bytes":99}}`, `{"scan":{"clean":true,"bytes":101}}`, `{"scan":{"clean":false,"bytes":1}}`, `{"scan":{"clean":true,"bytes":"1"}}`, `{"scan":{"clean":true}}`, `{"scan":[1]}`}, 3},
		{"kinds, sizes and absent members", `package p
r := {"n": count(input.l), "arr": is_array(input.l), "obj": is_object(input.o), "has": object.get(input, "x", "none")}
`, []string{`{"l":[1,2],"o":{}}`, `{"l":[3,4],"o":{"a":1}}`, `{"l":[1],"o":{}}`, `{"l":"ab","o":[]}`, `{"l":[1,2],"o":{},"x":"here"}`, `{"l":[5,6],"o":{"b":2}}`}, 2},
		{"functions given parts of the input", `package p
f(x) := y if { y := x * 2 } else := 0
g(s) if startswith(s, "a")
r := {"f": f(input.n), "g": g(input.s)}
`, []string{`{"n":2,"s":"abc"}`, `{"n":2,"s":"axe"}`, `{"n":3,"s":"abc"}`, `{"n":2,"s":"b"}`, `{"n":"x","s":"abc"}`}, 1},
		{"data looked up by the input", `package p
r := data.settings.services[input.service].allow
`, []string{`{"service":"tracker"}`, `{"service":"mail"}`, `{"service":"tracker","x":1}`, `{"service":"none"}`, `{"service":["tracker"]}`}, 1},
		// Iterating over a part of the input, putting one into a
		// collection, walking it or replacing it: not recorded, and right.
		{"uses that are not recorded", `package p
a := [x | some x in input.l]
b := {"v": input.v}
c := [p | walk(input.o, [p, v]); v == 1]
d := x if { x := input.v + 1 with input.v as 5 }
r := {"a": a, "b": b, "c": c, "d": d}
`, []string{`{"l":[1],"v":1,"o":{"k":1}}`, `{"l":[2],"v":1,"o":{"k":1}}`, `{"l":[1],"v":2,"o":{"k":2}}`, `{"l":[1],"v":1,"o":{"k":1}}`}, 0},
		{"rule values and else over the input", `package p
kind := "read" if input.m == "get" else := "write" if input.m == "put" else := "other"
r := {"kind": kind, "n": count(input.m)}
`, []string{`{"m":"get"}`, `{"m":"put"}`, `{"m":"del"}`, `{"m":"get","x":[1]}`, `{"m":"other"}`}, 1},
		{"input itself compared", `package p
r := "empty" if input == {} else := "same" if input == {"a": 1} else := "other"
`, []string{`{}`, `{"a":1}`, `{"a":1.0}`, `{"a":2}`, `{}`, `{"a":1}`}, 2},
	}
	var d map[string]any
	if err := util.UnmarshalJSON([]byte(recallData), &d); err != nil {
		t.Fatal(err)
	}
	dv, err := ast.InterfaceToValue(d)
	if err != nil {
		t.Fatal(err)
	}
	data := ast.NewTerm(dv)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			compiler := compile(t, map[string]string{"p.rego": c.module})
			prog := program(t, compiler, "data.p.r")
			if !prog.recallable {
				t.Fatal("a pure program is not recallable")
			}
			for round := range 2 {
				for _, in := range c.inputs {
					input := parseInput(t, in)
					want := topdownOutcome(t, compiler, d, "data.p.r", input)
					if got := valueOutcome(prog, ast.NewTerm(input), data); got != want && !(want == "undefined" && got == "undefined") {
						t.Errorf("round %d, input %s: %s, topdown %s", round, in, got, want)
					}
				}
			}
			if got := prog.Recalled(); got < int64(c.recalls) {
				t.Errorf("%d evaluations recalled, want at least %d", got, c.recalls)
			}
			if c.recalls == 0 && prog.Recalled() != 0 {
				t.Errorf("%d evaluations recalled of a policy that reads what is not recorded", prog.Recalled())
			}
		})
	}
}

// TestRecallKeepsItsOwnCopies: what a recall keeps does not share the
// memory of the input it was recorded on, which the gateway reuses once
// the evaluation is over (its strings point into the message's bytes).
func TestRecallKeepsItsOwnCopies(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
x := trim_space(input.a)
r := sprintf("kept %s", [x]) if { x == input.b }
`})
	prog := program(t, compiler, "data.p.r")
	data := ast.NewTerm(ast.NewObject())
	buf := []byte(` k `)
	input := func(b string) *ast.Term {
		a := unsafe.String(unsafe.SliceData(buf), len(buf))
		return ast.ObjectTerm(ast.Item(ast.StringTerm("a"), ast.StringTerm(a)), ast.Item(ast.StringTerm("b"), ast.StringTerm(b)))
	}
	if got := valueOutcome(prog, input("k"), data); got != `"kept k"` {
		t.Fatalf("first evaluation: %s", got)
	}
	copy(buf, ` z `) // the memory reused for the next message
	if got := valueOutcome(prog, input("z"), data); got != `"kept z"` {
		t.Fatalf("after the input's memory was reused: %s, want \"kept z\"", got)
	}
	if got := valueOutcome(prog, input("z"), data); got != `"kept z"` || prog.Recalled() == 0 {
		t.Fatalf("the same input again: %s, recalled %d", got, prog.Recalled())
	}
}

// TestRecallConcurrently evaluates inputs of a few shapes from many
// goroutines through one program: every value is the one its input gives.
func TestRecallConcurrently(t *testing.T) {
	compiler := compile(t, map[string]string{"p.rego": `package p
r := sprintf("%s:%v", [input.tool, input.n <= 3]) if input.ok == true else := "no"
`})
	prog := program(t, compiler, "data.p.r")
	data := ast.NewTerm(ast.NewObject())
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 400 {
				tool, n, ok := fmt.Sprintf("t%d", (g+i)%5), i%7, (g+i)%3 != 0
				in := fmt.Sprintf(`{"tool":%q,"n":%d,"ok":%v,"pad":%d}`, tool, n, ok, i)
				want := `"no"`
				if ok {
					want = fmt.Sprintf(`"%s:%v"`, tool, n <= 3)
				}
				if got := valueOutcome(prog, ast.NewTerm(parseInput(t, in)), data); got != want {
					select {
					case errs <- fmt.Sprintf("input %s: %s, want %s", in, got, want):
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if prog.Recalled() == 0 {
		t.Error("no evaluation was recalled")
	}
}

// TestRecallNotForPrintingPolicies: a policy that prints is evaluated
// every time (a recalled evaluation would not print).
func TestRecallNotForPrintingPolicies(t *testing.T) {
	m, err := ast.ParseModuleWithOpts("p.rego", `package p
r := input.a if { print("a is", input.a) }
`, ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		t.Fatal(err)
	}
	compiler := ast.NewCompiler().WithEnablePrintStatements(true)
	if compiler.Compile(map[string]*ast.Module{"p.rego": m}); compiler.Failed() {
		t.Fatal(compiler.Errors)
	}
	if program(t, compiler, "data.p.r").recallable {
		t.Error("a policy that prints is recallable")
	}
}
