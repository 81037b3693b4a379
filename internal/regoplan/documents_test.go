package regoplan

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/util"
)

// TestSameAsTopdownVirtualDocuments: references to rules through their
// package (its extent), ref heads, and rules that read other packages;
// a plan this package refuses (the caller then uses topdown) is skipped.
func TestSameAsTopdownVirtualDocuments(t *testing.T) {
	const data = `{"settings": {"n": 3}}`
	var d map[string]any
	if err := util.UnmarshalJSON([]byte(data), &d); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		modules map[string]string
		inputs  []string
	}{
		{"package extent", map[string]string{"p.rego": `package p
r := data.q
`, "q.rego": `package q
a := 1
b contains x if some x in input.l
c[k] := 1 if some k in input.l
f(x) := x
default d := "d"
e := input.e
`}, []string{`{"l":["x","y"],"e":1}`, `{}`}},
		{"ref heads", map[string]string{"p.rego": `package p
r := data.q.a
`, "q.rego": `package q
a.b[x] := 1 if some x in input.l
a.c := 2
a.d.e := input.e
a.s contains x if some x in input.l
`}, []string{`{"l":["x","y"],"e":1}`, `{}`, `{"l":"x"}`}},
		{"ref heads var key", map[string]string{"p.rego": `package p
r := data.q.a
`, "q.rego": `package q
a[x].y := 1 if some x in input.l
a[x].z := 2 if some x in input.m
`}, []string{`{"l":["x","y"],"m":["x"]}`, `{}`, `{"l":["x"],"m":["z"]}`}},
		{"ref heads var key conflict", map[string]string{"p.rego": `package p
r := data.q.a
`, "q.rego": `package q
a[x].y := 1 if some x in input.l
a[x].y := 2 if some x in input.m
`}, []string{`{"l":["x"],"m":["x"]}`, `{"l":["x"],"m":["z"]}`}},
		{"dynamic lookup into package", map[string]string{"p.rego": `package p
r := data.q[input.k]
`, "q.rego": `package q
a := 1
b := input.b
c contains 1 if true
`}, []string{`{"k":"a"}`, `{"k":"b","b":2}`, `{"k":"b"}`, `{"k":"c"}`, `{"k":"z"}`}},
		{"iterate package", map[string]string{"p.rego": `package p
r := [[k, v] | some k, v in data.q]
`, "q.rego": `package q
a := 1
b := input.b
`}, []string{`{"b":2}`, `{}`}},
		{"ref head default and else", map[string]string{"p.rego": `package p
r := data.q.a
`, "q.rego": `package q
default a.b := "d"
a.b := "x" if input.x
a.c := "y" if input.y else := "n"
`}, []string{`{"x":true,"y":true}`, `{}`}},
		{"multi-level ref head conflicts", map[string]string{"p.rego": `package p
r := data.q.a
`, "q.rego": `package q
a.b := 1 if input.x
a.b := 2 if input.y
`}, []string{`{"x":true,"y":true}`, `{"x":true}`}},
		{"deep virtual extent", map[string]string{"p.rego": `package p
r := data.q
`, "q.rego": `package q.s.t
a := input.a
`, "q2.rego": `package q.u
b := 2
`}, []string{`{"a":1}`, `{}`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			compiler := compile(t, c.modules)
			p, err := Plan(t.Context(), compiler, "data.p.r")
			if err != nil {
				t.Fatal(err)
			}
			prog, err := Compile(p)
			if err != nil {
				t.Skipf("refused: %v", err)
			}
			compare(t, compiler, prog, d, c.inputs)
		})
	}
}

// TestSameAsTopdownWithData: with on data paths, nested, inside
// functions and else chains, against remembered rule values.
func TestSameAsTopdownWithData(t *testing.T) {
	cases := []struct {
		name    string
		modules map[string]string
		inputs  []string
	}{
		{"with data package of rules", map[string]string{"p.rego": `package p
r := [x, data.q.a] if { x := data.q.a with data.q as {"a": 5} }
`, "q.rego": `package q
a := input.a
`}, []string{`{"a":1}`, `{}`}},
		{"with data rule partial path", map[string]string{"p.rego": `package p
r := [x, y] if { x := data.q.a.b with data.q.a as {"b": 5}; y := data.q.c with data.q.a as 1 }
`, "q.rego": `package q
a := {"b": input.a}
c := a
`}, []string{`{"a":1}`, `{}`}},
		{"with data base doc used by function", map[string]string{"p.rego": `package p
f(x) := data.settings.n + x
r := [f(1), y] if { y := f(1) with data.settings.n as 10 }
`}, []string{`{}`}},
		{"with input used by partial set", map[string]string{"p.rego": `package p
s contains x if some x in input.l
r := [count(s), n] if { n := count(s) with input.l as [1, 2, 3] }
`}, []string{`{"l":[1]}`, `{}`}},
		{"with in else", map[string]string{"p.rego": `package p
g := input.k
r := 1 if { g with input.k as false } else := 2 if { g with input.k as true } else := 3
`}, []string{`{"k":true}`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			compiler := compile(t, c.modules)
			p, err := Plan(t.Context(), compiler, "data.p.r")
			if err != nil {
				t.Skipf("not planned: %v", err)
			}
			prog, err := Compile(p)
			if err != nil {
				t.Skipf("refused: %v", err)
			}
			d := map[string]any{"settings": map[string]any{"n": 3}}
			compare(t, compiler, prog, d, c.inputs)
		})
	}
}

// TestSameAsTopdownDataAtRulePaths: base documents at the paths of rules.
func TestSameAsTopdownDataAtRulePaths(t *testing.T) {
	mods := map[string]string{"p.rego": `package p
s contains x if some x in input.l
r := {"s": s, "t": t, "u": data.p.u, "n": count(s)}
t := input.t
`}
	sameAsTopdown(t, mods, `{"p": {"r": "allow", "s": ["evil"], "t": "base", "u": 1}}`, `{"l":[1]}`, `{}`, `{"t":2}`)
	mods2 := map[string]string{"p.rego": `package p
r if input.x
`}
	sameAsTopdown(t, mods2, `{"p": {"r": true}}`, `{"x":false}`, `{}`)
}
