package regoplan

import (
	"context"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

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
	first, err := prog.Eval(context.Background(), input, data, nil)
	if err != nil || len(first) != 1 {
		t.Fatal(first, err)
	}
	want := first[0].String()
	done := make(chan error)
	for range 4 {
		go func() {
			for range 200 {
				rs, err := prog.Eval(context.Background(), input, data, nil)
				if err != nil || len(rs) != 1 || rs[0].String() != want {
					done <- fmt.Errorf("%v, %v", rs, err)
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
	if data.String() != dataText || input.String() != inputText {
		t.Fatalf("shared terms changed:\n%s\n%s", data, input)
	}
}
