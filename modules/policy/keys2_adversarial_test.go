package policy

import (
	"fmt"
	"strings"
	"testing"
)

// copyTarget is a schema whose nested object (the destination) declares
// "Path" (a Go struct field without a json tag, which encoding/json fills
// from "path", "PATH" or "paTH").
const copyTarget = `{"type":"object","properties":{"Path":{"type":"string"},"Overwrite":{"type":"boolean"}}}`

// keys2Refused asserts that args, whose key under the destination folds
// onto "Path" without being spelled like it, is refused against tool.
func keys2Refused(t *testing.T, args, tool string) {
	t.Helper()
	if err := keysCheck(t, args, tool); err == nil {
		t.Errorf("accepted: %s\n  the schema declares Path at that place; a case-insensitive upstream fills Path from the variant, the policy reads the variant", args)
	} else {
		t.Logf("refused: %v", err)
	}
}

// Attack (fixed): draft-07 tuples. Draft-07 (and zod-to-json-schema's default
// target, jsonSchema7, for z.tuple) writes a tuple's item schemas as an
// array under "items" (`"items":[{…},{…}]`), and a rest element under
// "additionalItems". place.item (keys.go:230) takes "items" whatever it
// is, newPlace (keys.go:76) drops it since it is not an object, and
// "additionalItems" is not read at all: every item of such a tuple is a
// place with no properties, whose keys are "of its own". So
// {"pair":["a",{"path":"/etc/cron.d/x"}]} is accepted where items[1]
// declares Path. Contract (keys.go header, policies/README "Pitfalls"):
// places are followed "through properties, items, prefixItems and
// additionalProperties" and a key folding onto a property its place
// declares is refused.
// Fixed: items as an array is a tuple, additionalItems the rest.
func TestKeysAttackDraft07TupleItems(t *testing.T) {
	tool := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"pair":{"type":"array","minItems":2,"maxItems":2,"items":[{"type":"string"},` + copyTarget + `]}}}}`
	keys2Refused(t, `{"pair":["a",{"path":"/etc/cron.d/x"}]}`, tool)
	rest := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"pair":{"type":"array","items":[{"type":"string"}],"additionalItems":` + copyTarget + `}}}}`
	keys2Refused(t, `{"pair":["a",{"path":"/etc/cron.d/x"}]}`, rest)
}

// Attack (fixed): a local $ref whose JSON pointer goes through an array. zod-to-
// json-schema's default $refStrategy ("root") refers to a schema it has
// already written by its path, and that path goes through anyOf, allOf or
// items arrays: reusing one z.object in an optional field and in another
// field gives {"$ref":"#/properties/src/anyOf/0"}. resolveRef
// (keys.go:157-160) only steps into objects, so the pointer resolves to
// nothing and the place has no properties: {"dest":{"path":…}} is
// accepted while dest's schema (the referenced one) declares Path. The
// same for pointers through prefixItems/0 or allOf/1. Contract: properties
// are gathered "through … local $refs (resolveRef, a JSON pointer into the
// inputSchema)" — RFC 6901 pointers index arrays.
// Fixed: resolveRef steps into arrays by decimal index (RFC 6901).
func TestKeysAttackRefPointerThroughArray(t *testing.T) {
	tool := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"src":{"anyOf":[` + copyTarget + `,{"type":"null"}]},` +
		`"dest":{"$ref":"#/properties/src/anyOf/0"}}}}`
	// Control: src itself is checked.
	if err := keysCheck(t, `{"src":{"path":"/tmp/a"}}`, tool); err == nil {
		t.Fatal("control: src.path accepted")
	}
	keys2Refused(t, `{"src":{"Path":"/tmp/a"},"dest":{"path":"/etc/cron.d/x"}}`, tool)
}

// Attack (fixed): percent-encoded $ref pointers. A $ref is a URI reference; its
// fragment is percent-encoded (RFC 6901 §6: "#/$defs/a%20b", and
// generators that escape $defs names such as a Go generic type's
// "Page[pkg.Item]" write "%5B"/"%5D"), and every validator decodes it
// before reading the pointer. resolveRef (keys.go:156) only unescapes ~0
// and ~1, so "#/$defs/Page%5BItem%5D" names nothing, the place has no
// properties, and dest.path is accepted against a dest declaring Path.
// Contract: properties gathered through local $refs.
// Fixed: the fragment is percent-decoded before it is split.
func TestKeysAttackPercentEncodedRef(t *testing.T) {
	tool := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"dest":{"$ref":"#/$defs/Page%5BItem%5D"}},"$defs":{"Page[Item]":` + copyTarget + `}}}`
	keys2Refused(t, `{"dest":{"path":"/etc/cron.d/x"}}`, tool)
	tool2 := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"dest":{"$ref":"#/$defs/my%20target"}},"$defs":{"my target":` + copyTarget + `}}}`
	keys2Refused(t, `{"dest":{"path":"/etc/cron.d/x"}}`, tool2)
}

// Attack (fixed): properties declared under if/then/else, dependentSchemas (2019+)
// and dependencies (draft-07's schema form) describe the same object as
// the schema that holds them (a hand-written "when kind is file, Path is
// required" schema), but newPlace (keys.go:84-87) follows only $ref,
// anyOf, oneOf and allOf. {"kind":"file","path":…} is accepted while the
// place declares Path (in then): a Go upstream fills Path from it, the
// policy reads arguments.path. Contract: "a key that folds onto a property
// its place declares without being spelled like one is refused".
// Fixed: then, else, dependentSchemas and dependencies are gathered too.
func TestKeysAttackConditionalSubschemas(t *testing.T) {
	for name, schema := range map[string]string{
		"then": `{"type":"object","properties":{"kind":{"type":"string"}},` +
			`"if":{"properties":{"kind":{"const":"file"}}},"then":` + copyTarget + `,"else":{"properties":{"Url":{"type":"string"}}}}`,
		"else": `{"type":"object","properties":{"kind":{"type":"string"}},` +
			`"if":{"properties":{"kind":{"const":"url"}}},"then":{"properties":{"Url":{"type":"string"}}},"else":` + copyTarget + `}`,
		"dependentSchemas": `{"type":"object","properties":{"kind":{"type":"string"}},"dependentSchemas":{"kind":` + copyTarget + `}}`,
		"dependencies":     `{"type":"object","properties":{"kind":{"type":"string"}},"dependencies":{"kind":` + copyTarget + `}}`,
	} {
		t.Run(name, func(t *testing.T) {
			keys2Refused(t, `{"kind":"file","path":"/etc/cron.d/x"}`, `{"name":"copy","inputSchema":`+schema+`}`)
		})
	}
}

// Attack (fixed): patternProperties and unevaluatedProperties. A map whose values
// are structs can be described by patternProperties (`"^[a-z]+$":{…}`) or
// unevaluatedProperties (2019+); place.member (keys.go:186-197) follows
// only properties and additionalProperties, so each value is a place
// without properties and {"targets":{"a":{"path":…}}} is accepted where
// each value declares Path. Contract: as above.
// Fixed: undeclared members take patternProperties and unevaluatedProperties
// with additionalProperties.
func TestKeysAttackPatternAndUnevaluatedProperties(t *testing.T) {
	for name, kw := range map[string]string{
		"patternProperties":     `"patternProperties":{"^[a-z]+$":` + copyTarget + `}`,
		"unevaluatedProperties": `"unevaluatedProperties":` + copyTarget,
	} {
		t.Run(name, func(t *testing.T) {
			tool := `{"name":"copy","inputSchema":{"type":"object","properties":{"targets":{"type":"object",` + kw + `}}}}`
			keys2Refused(t, `{"targets":{"a":{"path":"/etc/cron.d/x"}}}`, tool)
		})
	}
}

// Attack (fixed): a $ref chain longer than newPlace's depth bound (32, keys.go:77)
// stops gathering silently: the properties at the end of the chain are not
// the place's, and the place's keys are "of its own". The bound was meant
// for cycles (seen already stops those); a chain of distinct schemas is
// schema-size work, not a loop. Here 40 aliases ($defs a0 → a1 → … →
// Target) and {"dest":{"path":…}} accepted.
// Fixed: no depth bound (cycles end at schemas gathered already); a place
// more than maxSchemas schemas lead to is refused.
func TestKeysAttackLongRefChain(t *testing.T) {
	var defs strings.Builder
	const n = 40
	for i := range n {
		fmt.Fprintf(&defs, `"a%d":{"$ref":"#/$defs/a%d"},`, i, i+1)
	}
	fmt.Fprintf(&defs, `"a%d":%s`, n, copyTarget)
	tool := `{"name":"copy","inputSchema":{"type":"object","properties":{"dest":{"$ref":"#/$defs/a0"}},"$defs":{` + defs.String() + `}}}`
	keys2Refused(t, `{"dest":{"path":"/etc/cron.d/x"}}`, tool)
}

// keys2Work counts the allocations of one check (a count of work that
// does not depend on the machine's speed).
func keys2Work(t *testing.T, args, tool string) float64 {
	t.Helper()
	a, d := keysTerms(t, args, tool)
	if err := checkArgumentKeys(a, d); err != nil {
		t.Fatalf("refused: %v", err)
	}
	return testing.AllocsPerRun(3, func() { _ = checkArgumentKeys(a, d) })
}

// keys2Struct is an object schema of n properties p0…p{n-1}.
func keys2Struct(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string"}`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

// Attack (fixed; cost, schema size × argument size): a map of structs — Go's
// map[string]Item, which go-sdk's jsonschema writes as
// additionalProperties with the struct's properties inline — makes a new
// place for every key of the map: place.member caches places by key
// (keys.go:183, 202), so each of m distinct keys gathers the value schema
// again, and the first undeclared key in each value builds that place's
// names map, folding every one of the struct's P properties (keys.go:126-
// 138, two string allocations per name). m values × P properties: here
// P = m = 400 (a 10 kB schema entry, 6 kB of arguments) is 320,000
// allocations per call, 100× what the same arguments cost with one key.
// Contract (keys_adversarial_test, "each place of the schema is gathered
// once per call"; the brief: work no faster than schema + arguments). The
// same with prefixItems: place.item caches by index once the schema has
// any prefixItems (keys.go:218-238), so every item past the prefix is a
// new place. Fix: key the cache by the schemas a member or item gets (all
// undeclared keys share additionalProperties' place; items past
// prefixItems share one).
// Fixed: every undeclared member shares one place, and every item past a
// tuple another.
func TestKeysAttackMapOfStructsCostsSchemaTimesArguments(t *testing.T) {
	const p, m = 400, 400
	item := keys2Struct(p)
	var args, one strings.Builder
	args.WriteString(`{"items":{`)
	for i := range m {
		if i > 0 {
			args.WriteByte(',')
		}
		fmt.Fprintf(&args, `"k%d":{"note":"x"}`, i)
	}
	args.WriteString(`}}`)
	one.WriteString(`{"items":{"k":{"note":"x"}}}`)
	mapTool := `{"name":"t","inputSchema":{"type":"object","properties":{"items":{"type":"object","additionalProperties":` + item + `}}}}`
	work, base := keys2Work(t, args.String(), mapTool), keys2Work(t, one.String(), mapTool)
	t.Logf("map: %d values: %.0f allocations; 1 value: %.0f", m, work, base)
	// Linear in the arguments: m values cost at most m× one value's
	// non-schema work plus one value's schema work, with room to spare.
	if limit := 8*float64(m) + 2*base; work > limit {
		t.Errorf("map of %d structs of %d properties: %.0f allocations (> %.0f): each map key gathers the struct's schema and folds all its names again", m, p, work, limit)
	}

	var arr strings.Builder
	arr.WriteString(`{"rows":["head"`)
	for range m {
		arr.WriteString(`,{"note":"x"}`)
	}
	arr.WriteString(`]}`)
	tupleTool := `{"name":"t","inputSchema":{"type":"object","properties":{"rows":{"type":"array","prefixItems":[{"type":"string"}],"items":` + item + `}}}}`
	work, base = keys2Work(t, arr.String(), tupleTool), keys2Work(t, `{"rows":["head",{"note":"x"}]}`, tupleTool)
	t.Logf("prefixItems+items: %d items: %.0f allocations; 1 item: %.0f", m, work, base)
	if limit := 8*float64(m) + 2*base; work > limit {
		t.Errorf("array of %d items past prefixItems, %d properties each: %.0f allocations (> %.0f): each item index is a new place", m, p, work, limit)
	}
}

// Attack (fixed; hot path): the check of an ordinary small call (four keys, one
// nested object, every key declared as spelled: BenchmarkKeysSmallCall)
// allocates 34 times. Nearly all of it is sameFoldKey (keys.go:313-316):
// for objects up to smallObject keys it compares each key with each
// earlier one through mcpmsg.SameFold, which, when strings.EqualFold says
// no (the ordinary case: different names), computes FoldKey of both,
// ToUpper then ToLower, four string allocations per pair. A 16-key object
// (the largest compared pairwise) is 120 pairs, ~480 allocations, for
// keys that are plain ASCII and could be compared without any. Fix: for
// two ASCII keys EqualFold is the answer; fold only keys with a byte ≥
// 0x80 (and fold each key once, not once per pair).
// Fixed: SameFold compares ASCII keys without folding them, and a place
// gathers its schemas without closures or maps for a few: 7 allocations.
func TestKeysAttackSmallCallAllocations(t *testing.T) {
	small := keys2Work(t, `{"ticket_id":"T-1","visibility":"private","comment":"looks good","filter":{"env":"prod"}}`,
		`{"name":"update_ticket","inputSchema":{"type":"object","properties":{`+
			`"ticket_id":{"type":"string"},"visibility":{"type":"string"},"comment":{"type":"string"},`+
			`"filter":{"type":"object","properties":{"env":{"type":"string"}}}},"required":["ticket_id"]}}`)
	var args strings.Builder
	args.WriteString(`{`)
	for i := range 16 {
		if i > 0 {
			args.WriteByte(',')
		}
		fmt.Fprintf(&args, `"p%d":"v"`, i)
	}
	args.WriteString(`}`)
	wide := keys2Work(t, args.String(), `{"name":"t","inputSchema":`+keys2Struct(16)+`}`)
	t.Logf("small call: %.0f allocations; 16 declared ASCII keys: %.0f", small, wide)
	if small > 12 {
		t.Errorf("small call: %.0f allocations per check (want ≤ 12)", small)
	}
	if wide > 24 {
		t.Errorf("16 declared ASCII keys: %.0f allocations per check (want ≤ 24): each pair of keys is folded with 4 string allocations", wide)
	}
}

// Holds: $ref cycles, "#" (the root), ~0/~1 escapes, definitions,
// $ref next to properties, boolean schemas, arrays of arrays, a $ref into
// another property, pydantic's Optional[Model] (anyOf [$ref, null]).
func TestKeysHoldsRefShapes(t *testing.T) {
	for _, c := range []struct{ name, schema, args string }{
		{"cycle", `{"type":"object","properties":{"dest":{"$ref":"#/$defs/A"}},"$defs":{"A":{"$ref":"#/$defs/B"},"B":{"anyOf":[{"$ref":"#/$defs/A"},` + copyTarget + `]}}}`, `{"dest":{"path":"x"}}`},
		{"root", `{"type":"object","properties":{"Path":{"type":"string"},"child":{"$ref":"#"}}}`, `{"child":{"child":{"path":"x"}}}`},
		{"escaped", `{"type":"object","properties":{"dest":{"$ref":"#/$defs/a~1b~0c"}},"$defs":{"a/b~c":` + copyTarget + `}}`, `{"dest":{"path":"x"}}`},
		{"definitions", `{"type":"object","properties":{"dest":{"$ref":"#/definitions/T"}},"definitions":{"T":` + copyTarget + `}}`, `{"dest":{"path":"x"}}`},
		{"ref beside properties", `{"type":"object","properties":{"dest":{"$ref":"#/$defs/T","properties":{"mode":{}}}},"$defs":{"T":` + copyTarget + `}}`, `{"dest":{"mode":1,"path":"x"}}`},
		{"pydantic optional", `{"type":"object","properties":{"dest":{"anyOf":[{"$ref":"#/$defs/T"},{"type":"null"}],"default":null}},"$defs":{"T":` + copyTarget + `}}`, `{"dest":{"path":"x"}}`},
		{"arrays of arrays", `{"type":"object","properties":{"grid":{"type":"array","items":{"type":"array","items":{"$ref":"#/$defs/T"}}}},"$defs":{"T":` + copyTarget + `}}`, `{"grid":[[{"Path":"a"}],[{"path":"x"}]]}`},
		{"ref to property", `{"type":"object","properties":{"src":` + copyTarget + `,"dest":{"$ref":"#/properties/src"}}}`, `{"dest":{"path":"x"}}`},
		{"map of refs", `{"type":"object","properties":{"m":{"type":"object","additionalProperties":{"$ref":"#/$defs/T"}}},"$defs":{"T":` + copyTarget + `}}`, `{"m":{"a":{"path":"x"}}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			keys2Refused(t, c.args, `{"name":"copy","inputSchema":`+c.schema+`}`)
		})
	}
	// Boolean schemas, false additionalProperties, and an object where a
	// scalar is expected: ordinary calls accepted, no panic.
	for _, c := range []struct{ schema, args string }{
		{`{"type":"object","properties":{"a":true,"b":false},"additionalProperties":false}`, `{"a":{"X":1},"b":[1]}`},
		{`{"type":"object","properties":{"n":{"type":"string"}},"additionalProperties":true}`, `{"n":{"N":1},"m":{"Path":1}}`},
		{`{"type":"object","properties":{"d":{"$ref":"https://example.com/s.json"},"e":{"$ref":"#/nope/0/x"},"f":{"$ref":7}}}`, `{"d":{"a":1},"e":{"b":1},"f":{"c":1}}`},
		{`{"type":"object","properties":{"t":{"items":[true,false],"prefixItems":"x"}}}`, `{"t":[{"a":1},{"b":2},[3]]}`},
	} {
		if err := keysCheck(t, c.args, `{"name":"t","inputSchema":`+c.schema+`}`); err != nil {
			t.Errorf("%s: refused: %v", c.args, err)
		}
	}
}

// Attack (fixed; cost, repeated schemas): newPlace's seen set (keys.go:91-97)
// records only schemas that lead elsewhere ($ref or a combinator), so a
// plain schema reached many times — anyOf of many $refs to one $defs
// entry, as a generator writes for a union of aliases, or allOf repeating
// a mixin — is appended to the place again each time, up to maxSchemas.
// Every lookup then runs once per copy, and the names map folds the
// struct's properties once per copy: here 200 refs to one struct of 1,000
// properties (a 30 kB schema) make a call with one undeclared key cost
// about 257,000 allocations (127 copies kept before maxSchemas), 125× the
// same schema with one ref. Work is refs × properties (quadratic in the
// schema's size, up to maxSchemas×). Fix:
// mark every schema added in seen (a set keyed by identity), not only
// leading ones.
// Fixed: every schema gathered is remembered.
func TestKeysAttackRepeatedRefTargetsAreGatheredAgain(t *testing.T) {
	def := keys2Struct(1000)
	schema := func(refs int) string {
		return `{"name":"t","inputSchema":{"type":"object","properties":{"dest":{"anyOf":[` +
			strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/T"},`, refs), ",") +
			`]}},"$defs":{"T":` + def + `}}}`
	}
	args := `{"dest":{"note":"x"}}`
	many, one := keys2Work(t, args, schema(200)), keys2Work(t, args, schema(1))
	t.Logf("200 refs to one struct: %.0f allocations; 1 ref: %.0f", many, one)
	if many > 2*one+2000 {
		t.Errorf("200 $refs to one $defs entry: %.0f allocations per check, %.0f with one: the entry is gathered, searched and folded once per ref", many, one)
	}
}
