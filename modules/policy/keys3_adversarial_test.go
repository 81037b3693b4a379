package policy

import (
	"fmt"
	"strings"
	"testing"
)

// keys3Copy is a copy tool whose destination's schema (a struct with the
// fields Path and Overwrite, as copyTarget) is reached from "dest" through
// ref, and whose root schema also holds extra (members written as
// `,"name":value`).
func keys3Copy(ref, extra, defsExtra string) string {
	return `{"name":"copy","inputSchema":{"type":"object"` + extra + `,` +
		`"$defs":{"Target":{"type":"object"` + defsExtra + `,"properties":{"Path":{"type":"string"},"Overwrite":{"type":"boolean"}}}},` +
		`"properties":{"path":{"type":"string"},"dest":{"$ref":` + ref + `}}}}`
}

// keys3Variant is a call whose dest.path folds onto the destination's
// Path without being spelled like it.
const keys3Variant = `{"path":"/srv/report.txt","dest":{"path":"/etc/cron.d/x"}}`

// Attack (fixed): a $ref to a plain-name fragment ("#Target", naming a schema by
// its "$anchor", JSON Schema 2019-09/2020-12 §8.2.2) is a local $ref, but
// resolveRef (keys.go:199-201) returns nil for any fragment that is not a
// JSON pointer ("an anchor name"), so dest's place has no schemas, its
// keys are "of its own", and dest.path is accepted while dest declares
// Path: a case-insensitive upstream (encoding/json) fills Path from it, a
// policy on input.params.arguments.dest.Path never sees the value.
// Contract (keys.go header, policies/README "Pitfalls"): properties are
// gathered "through … local $refs" and a key folding onto a property its
// place declares is refused.
// Fixed: anchors ($anchor, $dynamicAnchor, "#name" $ids) are indexed and
// resolved.
func TestKeys3AttackAnchorRef(t *testing.T) {
	keys2Refused(t, keys3Variant, keys3Copy(`"#Target"`, "", `,"$anchor":"Target"`))
	// 2019-09's anchor form: "$id":"#Target".
	keys2Refused(t, keys3Variant, keys3Copy(`"#Target"`, "", `,"$id":"#Target"`))
	// draft-07's: "$id":"#Target" under definitions.
	tool := strings.Replace(keys3Copy(`"#Target"`, "", `,"$id":"#Target"`), `"$defs"`, `"definitions"`, 1)
	keys2Refused(t, keys3Variant, tool)
}

// Attack (fixed): a $ref written as a URI naming the schema itself through its
// "$id" (the root's absolute URI, or a reference relative to it), or a
// subschema by the "$id" it declares, is as local as "#/$defs/Target" —
// every validator (and the go-sdk jsonschema resolver) resolves it
// against the schema's own base URI without fetching anything — but
// resolveRef (keys.go:189-192) takes only references that start with
// "#". dest's place is left without schemas and dest.path is accepted.
// Contract: as TestKeys3AttackAnchorRef.
// Fixed: a reference's document part is looked up among the schema's $ids
// (as written, resolved against the root's, and by last path segment).
func TestKeys3AttackRefThroughOwnID(t *testing.T) {
	id := `,"$id":"https://tools.example/schemas/copy.json"`
	for _, ref := range []string{
		`"https://tools.example/schemas/copy.json#/$defs/Target"`,
		`"copy.json#/$defs/Target"`,
	} {
		keys2Refused(t, keys3Variant, keys3Copy(ref, id, ""))
	}
	// A subschema identified by its own $id, referred to by it.
	keys2Refused(t, keys3Variant, keys3Copy(`"target.json"`, id, `,"$id":"target.json"`))
	keys2Refused(t, keys3Variant, keys3Copy(`"https://tools.example/schemas/target.json"`, id, `,"$id":"target.json"`))
}

// Attack (fixed): "$dynamicRef" (2020-12) and "$recursiveRef" (2019-09) are
// references too; without a matching dynamic anchor, a "$dynamicRef" with
// a JSON-pointer fragment resolves exactly like "$ref", and
// "$recursiveRef":"#" is the root (recursive trees: a node whose children
// are nodes). newPlace (keys.go:123-125) follows "$ref" only, so a
// child's place declares nothing and children[0].name folds onto Name
// unrefused. Contract: as TestKeys3AttackAnchorRef.
// Fixed: $dynamicRef and $recursiveRef are followed as $ref is.
func TestKeys3AttackDynamicAndRecursiveRef(t *testing.T) {
	keys2Refused(t, keys3Variant, strings.Replace(keys3Copy(`"#/$defs/Target"`, "", ""), `"$ref"`, `"$dynamicRef"`, 1))
	tree := `{"name":"tree","inputSchema":{"type":"object","properties":{"Name":{"type":"string"},` +
		`"children":{"type":"array","items":{"%s":"#"}}}}}`
	for _, kw := range []string{"$recursiveRef", "$dynamicRef"} {
		keys2Refused(t, `{"Name":"root","children":[{"name":"/etc/cron.d/x"}]}`, fmt.Sprintf(tree, kw))
	}
}

// keys3Shared is a schema of q properties f0…f{q-1}, each a $ref to one
// struct of p properties in $defs (pydantic's and zod-to-json-schema's
// way of writing a model used by many fields), and arguments giving each
// field an object holding one undeclared key.
func keys3Shared(q, p int) (args, tool string) {
	var a, s strings.Builder
	a.WriteByte('{')
	s.WriteString(`{"name":"t","inputSchema":{"type":"object","$defs":{"S":` + keys2Struct(p) + `},"properties":{`)
	for i := range q {
		if i > 0 {
			a.WriteByte(',')
			s.WriteByte(',')
		}
		fmt.Fprintf(&a, `"f%d":{"note":"x"}`, i)
		fmt.Fprintf(&s, `"f%d":{"$ref":"#/$defs/S"}`, i)
	}
	a.WriteByte('}')
	s.WriteString(`}}}`)
	return a.String(), s.String()
}

// Attack (fixed; performance): one $defs schema reached through many declared
// members is a new place for each member (place.member, keys.go:236-262,
// caches by member name), and each place folds every property name of
// the shared schema again (place.variant, keys.go:167-180) as soon as one
// key there is not declared as spelled. q fields sharing a struct of p
// properties cost q×p folds: allocations grow as the product of the
// schema's size (q+p) and the arguments' (q). Measured below: q=p=400
// (a 12 kB schema, 7 kB of arguments) is ~320,000 allocations, 100× one
// field's; q=p=20,000 is 400 M folds per call. Contract (keys.go header
// and the fixed TestKeysLargeSchemaAndArguments): "a schema … costs its
// size once, not once per key".
// Fixed: each schema's names are folded once per call, whatever places share
// it.
func TestKeys3AttackSharedDefsFoldedPerMember(t *testing.T) {
	const q, p = 400, 400
	args, tool := keys3Shared(q, p)
	work := keys2Work(t, args, tool)
	args1, tool1 := keys3Shared(1, p)
	base := keys2Work(t, args1, tool1)
	t.Logf("%d fields sharing a struct of %d properties: %.0f allocations; 1 field: %.0f", q, p, work, base)
	if limit := 8*float64(q) + 2*base; work > limit {
		t.Errorf("%.0f allocations (> %.0f): each member reaching the shared $defs schema folds all its %d names again", work, limit, p)
	}
}

// Attack (fixed; performance): the same through nesting. A recursive schema (a
// node whose "next" is "#": a linked list, a tree) with p properties,
// and arguments nested d deep, each level holding one undeclared key:
// every level is a new place (member caches per place, not per schema)
// and folds all p names again — d×p.
// Fixed: as above.
func TestKeys3AttackRecursiveSchemaFoldedPerLevel(t *testing.T) {
	const d, p = 100, 1000
	var s strings.Builder
	s.WriteString(`{"name":"t","inputSchema":{"type":"object","properties":{"next":{"$ref":"#"}`)
	for i := range p {
		fmt.Fprintf(&s, `,"p%d":{"type":"string"}`, i)
	}
	s.WriteString(`}}}`)
	nest := func(n int) string {
		return strings.Repeat(`{"note":"x","next":`, n) + `{}` + strings.Repeat(`}`, n)
	}
	work, base := keys2Work(t, nest(d), s.String()), keys2Work(t, nest(1), s.String())
	t.Logf("depth %d, %d properties: %.0f allocations; depth 1: %.0f", d, p, work, base)
	if limit := 8*float64(d) + 2*base; work > limit {
		t.Errorf("%.0f allocations (> %.0f): each level of a recursive schema folds all %d names again", work, limit, p)
	}
}

// Holds: a key written with JSON escapes ("pa\u0054h", "\u0050ATH") is
// decoded before the check, and refused as the variant it is.
func TestKeys3HoldsEscapedKey(t *testing.T) {
	tool := keys3Copy(`"#/$defs/Target"`, "", "")
	for _, args := range []string{`{"dest":{"pa\u0054h":"/x"}}`, `{"dest":{"\u0050ATH":"/x"}}`, `{"dest":{"pat\u0048":"/x"}}`} {
		keys2Refused(t, args, tool)
	}
}

// Holds: odd schemas (a root that is not an object, properties that is
// not an object, boolean items, a $ref to a non-schema or out of range)
// neither panic nor refuse ordinary calls.
func TestKeys3HoldsOddSchemas(t *testing.T) {
	for _, tool := range []string{
		`{"name":"t","inputSchema":true}`,
		`{"name":"t","inputSchema":[1,2]}`,
		`{"name":"t","inputSchema":{"properties":[{"Path":1}]}}`,
		`{"name":"t","inputSchema":{"properties":{"a":{"items":true}},"items":false}}`,
		`{"name":"t","inputSchema":{"properties":{"a":{"$ref":"#/properties/a/items/9"}}}}`,
		`{"name":"t","inputSchema":{"properties":{"a":{"$ref":"#/-/%zz"}},"$ref":"#"}}`,
		`{"name":"t","inputSchema":{"$defs":{"A":{"$ref":"#/$defs/B"},"B":{"$ref":"#/$defs/A"}},"$ref":"#/$defs/A"}}`,
	} {
		if err := keysCheck(t, `{"a":[{"x":1},[{"Y":2}]],"b":{"c":1}}`, tool); err != nil {
			t.Errorf("%s: refused: %v", tool, err)
		}
	}
}

// Holds: an ordinary pydantic v2 call (a nested model in $defs behind
// anyOf with null, a list of models, a dict of str) is accepted as spelled.
func TestKeys3HoldsPydanticCall(t *testing.T) {
	tool := `{"name":"create","inputSchema":{"$defs":{"Label":{"properties":{"name":{"title":"Name","type":"string"},"color":{"anyOf":[{"type":"string"},{"type":"null"}],"default":null}},"required":["name"],"title":"Label","type":"object"}},` +
		`"properties":{"title":{"type":"string"},"labels":{"items":{"$ref":"#/$defs/Label"},"type":"array"},"primary":{"anyOf":[{"$ref":"#/$defs/Label"},{"type":"null"}]},"meta":{"additionalProperties":{"type":"string"},"type":"object"}},"required":["title"],"type":"object"}}`
	if err := keysCheck(t, `{"title":"x","labels":[{"name":"a","color":"red"}],"primary":{"name":"b"},"meta":{"Name":"k","COLOR":"v"}}`, tool); err != nil {
		t.Errorf("refused: %v", err)
	}
	keys2Refused(t, `{"title":"x","labels":[{"Name":"a"}]}`, tool)
	keys2Refused(t, `{"title":"x","primary":{"NAME":"b"}}`, tool)
}
