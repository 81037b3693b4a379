package regoplan

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestKnownDifferences pins down where the plan's outcome differs from
// topdown's, and that it differs only so:
//
//   - A conflict (a rule or function with two values) that topdown never
//     reaches, because it stops a rule of constant value at its first
//     success (early exit) or its rule index skips a body before
//     evaluating it, is an error from the plan, which runs every body and
//     iteration: a deny, never another value.
//   - Of two values that compare equal but are written differently (1 and
//     1.0) under one key, the plan keeps the first; topdown keeps the
//     first for a rule and the last for a comprehension.
func TestKnownDifferences(t *testing.T) {
	for _, tc := range []struct {
		name, module, input string
		planErrors          bool // else: the outcomes are equal values
	}{
		{"early exit", `package p
default r := false
r if { some x in input.l; f(x) }
f(x) := true if x > 0
f(x) := false if x > 1
`, `{"l":[1,2]}`, true},
		{"rule index", `package p
default r := false
r if { g; input.m == "a" }
g := 1 if input.x
g := 2 if input.y
`, `{"m":"b","x":true,"y":true}`, true},
		{"equal values of one key", `package p
r := {k: v | some v in input.l; k := "x"}
`, `{"l":[1,1.0]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			compiler := compile(t, map[string]string{"p.rego": tc.module})
			prog := program(t, compiler, "data.p.r")
			input := parseInput(t, tc.input)
			want := topdownOutcome(t, compiler, map[string]any{}, "data.p.r", input)
			got := planOutcome(t, prog, map[string]any{}, input)
			switch {
			case want == "error" || want == "undefined":
				t.Fatalf("topdown gives %s: the case no longer shows a difference", want)
			case tc.planErrors && got != "error":
				t.Fatalf("plan gives %s, want an error (topdown %s)", got, want)
			case !tc.planErrors:
				a, b := ast.MustParseTerm(got), ast.MustParseTerm(want)
				if a.Value.Compare(b.Value) != 0 {
					t.Fatalf("plan gives %s, topdown %s: not equal values", got, want)
				}
			}
		})
	}
}

// edgeCases are policies on the edges of the language (duplicate keys,
// numbers that compare equal, unification, negation and with in odd
// places, built-ins that fail), for TestSameAsTopdown.
var edgeCases = []sameCase{
	{"object literal dup keys", `package p
r := {input.a: 1, input.b: 2}
`, []string{`{"a":"x","b":"x"}`, `{"a":1,"b":1.0}`}},
	{"object comprehension dup keys", `package p
r := {k: v | some v in input.l; k := "x"}
`, []string{`{"l":[1,2]}`, `{"l":[1]}`}},
	{"object comprehension dup keys in not", `package p
default r := "allow"
r := "deny" if not bad
bad if { x := {k: v | some v in input.l; k := "x"}; x.x > 5 }
`, []string{`{"l":[1,2]}`, `{"l":[6]}`}},
	{"set literal", `package p
r := {input.a, input.b}
`, []string{`{"a":1,"b":1.0}`}},
	{"array literal in set", `package p
r := count({[input.a], [input.b]})
`, []string{`{"a":1,"b":1.0}`}},
	{"order of object iteration", `package p
r := [[k, v] | some k, v in input.o]
`, []string{`{"o":{"b":1,"a":2,"c":0,"10":1,"9":2}}`}},
	{"order of set iteration", `package p
s := {x | some x in input.l}
r := {"arr": [x | some x in s], "concat": concat(",", {x | some x in input.l; is_string(x)}), "first": [x | some x in s][0]}
`, []string{`{"l":["b","a",1,[1],{"a":1},null,true,"c"]}`}},
	{"order with walk", `package p
r := [v | walk(input, [_, v]); is_number(v)]
`, []string{`{"b":1,"a":{"z":2,"y":3},"c":[4,5]}`}},
	{"pattern args", `package p
f([a, b]) := a + b
f({"k": v}) := v
f(1) := "one"
r := [f(input.x)]
`, []string{`{"x":[1,2]}`, `{"x":{"k":5}}`, `{"x":1}`, `{"x":1.0}`, `{"x":[1]}`, `{"x":{"k":5,"j":1}}`}},
	{"every with", `package p
default r := false
r if { every x in input.l { g with input.y as x } }
g if input.y > 0
`, []string{`{"l":[1,2]}`, `{"l":[1,0]}`, `{"l":[]}`}},
	{"not with", `package p
default r := false
r if { not input.x with input.x as input.z }
`, []string{`{"x":true,"z":false}`, `{"x":false,"z":true}`, `{"x":true}`}},
	{"with in function", `package p
f(x) := y if { y := g with input.k as x }
g := input.k
r := [f(1), f(2), g]
`, []string{`{"k":0}`, `{}`}},
	{"with then memo outside", `package p
g := input.k
h := x if { x := g with input.k as 5 }
r := [h, g, h]
`, []string{`{"k":0}`}},
	{"nested with memo", `package p
g := input.k
h := [g, i] if { i := g with input.k as 7 }
r := [h, g, r2]
r2 := [a, b, h, c] if { a := h with input.k as 5; b := g; c := h with input.k as 5 }
`, []string{`{"k":0}`}},
	{"with data base doc", `package p
g := data.settings.n
h := [g, i] if { i := g with data.settings as {"n": 9} }
r := [h, g, data.settings.n]
`, []string{`{}`}},
	{"with input on undefined input", `package p
g := input
r := x if { x := g with input.a as 1 }
`, []string{``}},
	{"special builtins", `package p
r := {"rt": is_object(opa.runtime()), "now": time.now_ns() == time.now_ns(), "rand": rand.intn("k", 1000) == rand.intn("k", 1000), "uuid": uuid.rfc4122("a") == uuid.rfc4122("a")} if { print("x", input); trace("y") }
`, []string{`{}`}},
	{"http.send bad", `package p
default r := "d"
r := x if { x := http.send({"method": "get", "url": input.u}) }
`, []string{`{"u":"::bad"}`, `{"u":1}`}},
	{"json and base64 errors", `package p
r := {"j": object.get({"v": v}, "v", "none"), "b": object.get({"v": b}, "v", "none")} if { v := [x | x := json.unmarshal(input.j)]; b := [x | x := base64.decode(input.b)] }
`, []string{`{"j":"{","b":"%%%"}`, `{"j":"1","b":"aGk="}`}},
	{"func else conflict", `package p
f(x) := 1 if x > 0 else := 2
f(x) := 3 if x > 5
r := f(input.x)
`, []string{`{"x":10}`, `{"x":1}`, `{"x":0}`, `{"x":-1}`}},
	{"func else same", `package p
f(x) := 1 if x > 0 else := 2
f(x) := 2 if x < 0
r := f(input.x)
`, []string{`{"x":10}`, `{"x":-1}`, `{"x":0}`}},
	{"shadowing", `package p
r := [[x, y] | some x in input.l; y := [x | some x in input.m; x > 1]]
`, []string{`{"l":[1,2],"m":[1,2,3]}`}},
	{"every closure", `package p
default r := false
r if { every x in input.l { some y in input.m; y == x } }
`, []string{`{"l":[1,2],"m":[2,1,3]}`, `{"l":[1,4],"m":[2,1,3]}`, `{"l":[1],"m":[]}`}},
	{"nested combos", `package p
r := [x | some x in input.l; not bad(x); every y in input.m { y != x }] if { count(input.l) > 0 } else := "empty"
bad(x) if { some z in input.bad; not z != x }
`, []string{`{"l":[1,2,3],"m":[3],"bad":[1]}`, `{"l":[],"m":[],"bad":[]}`, `{"l":[1],"m":"s","bad":"t"}`}},
	{"deep break levels", `package p
r := {k: n | some k, v in input.o; n := count([1 | some a in v; not a in input.skip; every b in input.req { b in v }])}
`, []string{`{"o":{"x":[1,2,3],"y":[2],"z":"s"},"skip":[2],"req":[1]}`, `{"o":{"x":[1,2,3]},"skip":[],"req":[]}`}},
	{"undefined in head", `package p
default r := "d"
r := input.missing if true
`, []string{`{}`, `{"missing":false}`}},
	{"false vs undefined", `package p
default r := "deny"
r := "allow" if { input.ok == true; not input.blocked }
`, []string{`{"ok":true,"blocked":false}`, `{"ok":true,"blocked":null}`, `{"ok":true,"blocked":0}`, `{"ok":"true"}`, `{"ok":1}`}},
	{"pattern args with constants", `package p
f([p, false]) := concat("/", p)
f([p, true]) := "key"
r := [f([input.p, input.b]), f(input.pair)]
`, []string{`{"p":["a","b"],"b":false,"pair":[["x"],true]}`, `{"p":["a"],"b":0,"pair":[["x"],1]}`, `{"p":"a","b":true,"pair":[]}`}},
	{"array keyed partial objects", `package p
bp[["c", i]] := b if { some i, b in input.c }
bp[["m", i, "c"]] := b if { some i, m in input.m; b := m.c }
bp[["c", 0]] := "fixed" if input.fix
r := {"all": bp, "look": [bp[p] | some p in input.paths], "keys": [k | some k, _ in bp]}
`, []string{`{"c":["x","y"],"m":[{"c":1}],"paths":[["c",0],["m",0,"c"],["z"]]}`, `{"c":["fixed"],"fix":true,"paths":[]}`, `{"c":["other"],"fix":true,"paths":[]}`, `{"c":"s","m":{"a":{"c":2}},"paths":[["m","a","c"]]}`}},
	{"walk with object keys", `package p
sk[path] := k if { walk(input, [p, v]); is_object(v); some k, _ in v; path := array.concat(p, [k]) }
r := sk
`, []string{`{"a":{"b":{"c":1}},"d":[{"e":2}]}`, `[]`}},
	{"float index", `package p
r := input.a[input.i]
`, []string{`{"a":[1,2,3],"i":1.0}`, `{"a":[1,2,3],"i":1}`, `{"a":[1,2,3],"i":1.5}`, `{"a":[1,2,3],"i":-1}`, `{"a":[1,2,3],"i":"1"}`, `{"a":{"1":2},"i":"1"}`, `{"a":"abc","i":1}`, `{"a":[1,2,3],"i":1e0}`, `{"a":[1,2,3],"i":10000000000000000000000}`}},
	{"data float index", `package p
r := data.arr[input.i]
`, []string{`{"i":1.0}`, `{"i":2}`, `{"i":2.0000}`, `{"i":1e0}`}},
	{"complete conflict numbers", `package p
r := 1 if input.a
r := 1.0 if input.b
`, []string{`{"a":true,"b":true}`}},
	{"object conflict numbers", `package p
r[k] := 1 if { some k in input.a }
r[k] := 1.0 if { some k in input.b }
`, []string{`{"a":["x"],"b":["x"]}`}},
	{"func conflict", `package p
f(x) := 1 if x > 0
f(x) := 2 if x > 1
r := f(input.x)
`, []string{`{"x":1}`, `{"x":2}`, `{"x":0}`}},
	{"func else default", `package p
f(x) := "a" if x == 1 else := "b" if x == 2
f(x) := "c" if x == 3
default r := "d"
r := f(input.x)
`, []string{`{"x":1}`, `{"x":2}`, `{"x":3}`, `{"x":4}`}},
	{"every not", `package p
default r := false
allpos if { every x in input.l { x > 0 } }
r if { not allpos }
`, []string{`{"l":[1,2]}`, `{"l":[0,2]}`, `{"l":[]}`, `{}`, `{"l":"x"}`, `{"l":{"a":1,"b":-1}}`}},
	{"every over object and set", `package p
default r := false
r if { every k, v in input.o { startswith(k, "a"); v > 0 } }
`, []string{`{"o":{"a":1,"ab":2}}`, `{"o":{"a":1,"b":2}}`, `{"o":{}}`, `{"o":[1]}`, `{"o":5}`}},
	{"not with undefined builtin", `package p
default r := "allow"
r := "deny" if not regex.match(input.p, input.s)
`, []string{`{"p":"^a","s":"abc"}`, `{"p":"(","s":"abc"}`, `{"p":"^b","s":"abc"}`, `{"p":1,"s":"abc"}`}},
	{"sprintf errors", `package p
r := sprintf(input.f, input.a)
`, []string{`{"f":"%s-%d","a":["x",1]}`, `{"f":"%s","a":"x"}`, `{"f":"%d","a":[]}`, `{"f":1,"a":[]}`}},
	{"object.get nonobject", `package p
r := object.get(input.o, input.k, "dflt")
`, []string{`{"o":[1,2],"k":0}`, `{"o":"s","k":"a"}`, `{"o":{"a":{"b":1}},"k":["a","b"]}`, `{"o":{"a":{"b":1}},"k":["a","c"]}`, `{"o":{"a":[5]},"k":["a",0]}`}},
	{"numbers.range", `package p
r := numbers.range(input.a, input.b)
`, []string{`{"a":1,"b":3}`, `{"a":1.5,"b":3}`, `{"a":3,"b":1}`, `{"a":"1","b":3}`}},
	{"walk paths", `package p
r := {[p, v] | walk(input, [p, v])}
`, []string{`{"a":[1,{"b":2}]}`, `[]`, `1`}},
	{"walk unbound value", `package p
r := [p | walk(input, [p, 2])]
`, []string{`{"a":[1,{"b":2}],"c":2}`}},
	{"strings vs arrays", `package p
r := {"c": count(input.x), "first": input.x[0], "in": "a" in input.x}
`, []string{`{"x":"abc"}`, `{"x":["a"]}`, `{"x":{"0":"a"}}`, `{"x":5}`}},
	{"unify object pattern", `package p
r := {"a": a, "b": b} if {"x": a, "y": b} = input.o
`, []string{`{"o":{"x":1,"y":2}}`, `{"o":{"x":1,"y":2,"z":3}}`, `{"o":{"x":1}}`, `{"o":[1,2]}`}},
	{"unify nested", `package p
r := x if [_, {"k": [x, _]}] = input.v
`, []string{`{"v":[0,{"k":[1,2]}]}`, `{"v":[0,{"k":[1]}]}`, `{"v":[0,{"k":"ab"}]}`, `{"v":[0,{"k":[1,2],"j":1}]}`}},
	{"ref with vars", `package p
r := [[x, y] | input.a[x].b[y] == true]
`, []string{`{"a":[{"b":[true,false,true]},{"b":{"k":true}},{"c":1},"s"]}`, `{"a":{"z":{"b":{"q":true}}}}`}},
	{"with input path on array", `package p
q := input
r := x if { x := q with input.a.b as 1 }
`, []string{`{"a":[1,2]}`, `[1,2]`, `"s"`, `{"a":{"b":0,"c":1}}`, `{"a":"x"}`}},
	{"with nested twice", `package p
q := input
r := [a, b] if { a := q with input.a as 1 with input.a.b as 2; b := q with input.a.b as 2 with input.a as 1 }
`, []string{`{"a":{"c":1}}`}},
	{"with memo", `package p
q := input.x
s := q + 1
r := [s, t, s] if { t := s with input.x as 10 }
`, []string{`{"x":1}`}},
	{"with data on rule", `package p
q := 1
s := q + 1
r := [s, t] if { t := s with data.p.q as 10 }
`, []string{`{"x":1}`}},
	{"with function mocks", `package p
f(x) := x + 1
g(x) := 100
s := f(input.x)
r := [s, t] if { t := s with f as g }
`, []string{`{"x":1}`}},
	{"with undefined body", `package p
default r := "no"
q := input.x
r := "yes" if { q with input.x as input.y }
`, []string{`{"x":true,"y":false}`, `{"x":false}`, `{"y":true}`}},
	{"partial set iteration", `package p
s contains x if { some x in input.l }
t[k] := v if { some k, v in input.o }
r := {"s": [x | s[x]], "t": [[k, v] | t[k] = v], "ts": count(t), "in": s[input.q]}
`, []string{`{"l":[1,2,1],"o":{"a":1,"b":2},"q":1}`, `{"l":[],"o":{},"q":1}`}},
	{"set with floats", `package p
s := {x | some x in input.l}
r := {"n": count(s), "has": s[input.q]}
`, []string{`{"l":[1,1.0,2],"q":1.0}`, `{"l":[1,2],"q":1.0}`}},
	{"object keys floats", `package p
o := {k: true | some k in input.l}
r := {"n": count(o), "v": o[input.q]}
`, []string{`{"l":[1,1.0],"q":1.0}`, `{"l":[1],"q":1.0}`}},
	{"big ints", `package p
r := {"a": input.a + 1, "b": input.a == 12345678901234567890, "c": input.a > 1e19, "d": input.a * 2}
`, []string{`{"a":12345678901234567890}`, `{"a":1e400}`}},
	{"to_number", `package p
r := to_number(input.s)
`, []string{`{"s":"1e400"}`, `{"s":"0x10"}`, `{"s":" 1"}`, `{"s":true}`, `{"s":null}`, `{"s":"NaN"}`, `{"s":"Inf"}`}},
	{"division", `package p
r := input.a / input.b
`, []string{`{"a":1,"b":0}`, `{"a":1,"b":3}`, `{"a":"1","b":3}`}},
	{"compare mixed", `package p
r := {"lt": input.a < input.b, "eq": input.a == input.b}
`, []string{`{"a":"1","b":1}`, `{"a":null,"b":false}`, `{"a":[1],"b":{"0":1}}`, `{"a":[],"b":{}}`}},
	{"comprehension closures", `package p
r := {x: [y | some y in input.m[x]] | some x, _ in input.m}
`, []string{`{"m":{"a":[1,2],"b":"z","c":{"k":1}}}`}},
	{"multiple bodies partial set errors", `package p
s contains x if { x := to_number(input.a) }
s contains x if { x := 1 / input.b }
r := s
`, []string{`{"a":"1","b":0}`, `{"a":"x","b":2}`}},
	{"else with error", `package p
r := 1 if { input.a == 1 } else := x if { x := 1 / input.d } else := 3
`, []string{`{"a":1,"d":0}`, `{"a":2,"d":0}`, `{"a":2,"d":2}`}},
	{"else conflict", `package p
r := 1 if { input.a } else := 2
r := 3 if { input.b } else := 4
`, []string{`{"a":true,"b":true}`, `{"a":true}`, `{}`}},
	{"default func", `package p
default f(_) := "d"
f(x) := "m" if x == 1
r := [f(input.x), f(2)]
`, []string{`{"x":1}`, `{"x":2}`, `{}`}},
	{"input undefined", `package p
default r := "deny"
r := "allow" if { not input.deny }
`, []string{``, `{}`, `{"deny":true}`, `null`, `false`}},
	{"data and input same", `package p
r := [x | some x in data.settings.admins; not x in input.l]
`, []string{`{"l":["root"]}`, `{"l":"root"}`}},
	{"some in object iteration key types", `package p
r := [k | some k, _ in input.o; k > 1]
`, []string{`{"o":{"a":1}}`}},
	{"set operations", `package p
r := {"u": {1,2} | {x | some x in input.l}, "i": {1,2} & {x | some x in input.l}, "d": {1,2} - {x | some x in input.l}}
`, []string{`{"l":[1.0,3]}`, `{"l":[]}`}},
	{"array concat", `package p
r := array.concat(input.a, input.b)
`, []string{`{"a":[1],"b":[2]}`, `{"a":"x","b":[2]}`}},
	{"json ops", `package p
r := json.patch(input.o, input.p)
`, []string{`{"o":{"a":1},"p":[{"op":"add","path":"/b","value":2}]}`, `{"o":{"a":1},"p":[{"op":"remove","path":"/zz"}]}`}},
	{"object.union", `package p
r := object.union(input.a, input.b)
`, []string{`{"a":{"x":{"y":1}},"b":{"x":{"z":2}}}`}},
	{"object.remove", `package p
r := [object.remove(input.a, ["x"]), input.a]
`, []string{`{"a":{"x":1,"y":2}}`}},
	{"equal refs with sets", `package p
r if input.a == {1, 2}
`, []string{`{"a":[1,2]}`}},
	{"nested not with scan", `package p
r := [x | some x in input.l; not any_bad(x)]
any_bad(x) if { some y in input.bad; y == x }
`, []string{`{"l":[1,2,3],"bad":[2]}`, `{"l":[1,2,3]}`}},
	{"count undefined", `package p
default r := 0
r := count(input.l)
`, []string{`{"l":5}`, `{"l":null}`}},
	{"array pattern with count", `package p
r := y if [_, y] := input.l
`, []string{`{"l":[1,2]}`, `{"l":[1,2,3]}`, `{"l":"ab"}`}},
	{"string key into array", `package p
r := input.l["0"]
`, []string{`{"l":[1,2]}`}},
	{"regex bad pattern", `package p
default r := false
r := regex.match(input.p, "abc")
`, []string{`{"p":"["}`, `{"p":"a"}`}},
	{"graph.reachable", `package p
r := graph.reachable(input.g, ["a"])
`, []string{`{"g":{"a":["b"],"b":["c"]}}`, `{"g":{"a":"b"}}`}},
}
