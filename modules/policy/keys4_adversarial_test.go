package policy

import (
	"strings"
	"testing"
)

// keys4Tool wraps an inputSchema in a tool definition.
func keys4Tool(schema string) string {
	return `{"name":"copy","inputSchema":` + schema + `}`
}

// Attack (fixed): a JSON pointer $ref ("#/$defs/Target", or "#") written inside an
// embedded schema resource (a subschema with its own absolute "$id", as
// bundlers and 2020-12 compound documents write them) is relative to that
// resource (JSON Schema 2020-12 §9.1.2, §12.3: "#" is the resource's
// root), not to the document root. resolveOnce (keys.go:238-253) always
// takes d.root as the base of a ref without a document part, so the
// pointer names nothing (or the wrong schema), dest has no schemas, and
// dest.path is accepted while the resource declares Path there. The
// per-call cache keyed by the ref string alone (keys.go:224) would also
// hand one resource's resolution to another.
// Fixed: a pointer is resolved from the root and from every embedded
// resource, and all it names is gathered.
func TestKeys4AttackPointerInsideEmbeddedResource(t *testing.T) {
	resource := `{"$id":"https://tools.example/schemas/copy-req.json","type":"object",` +
		`"$defs":{"Target":` + copyTarget + `},` +
		`"properties":{"dest":{"$ref":"#/$defs/Target"}}}`
	tool := keys4Tool(`{"type":"object","properties":{"req":{"$ref":"https://tools.example/schemas/copy-req.json"}},` +
		`"$defs":{"Req":` + resource + `}}`)
	keys2Refused(t, `{"req":{"dest":{"path":"/etc/cron.d/x"}}}`, tool)

	// "#" inside the resource is the resource itself (a recursive struct
	// bundled under the root), not the document root.
	node := `{"$id":"https://tools.example/schemas/node.json","type":"object",` +
		`"properties":{"Path":{"type":"string"},"children":{"type":"array","items":{"$ref":"#"}}}}`
	tool = keys4Tool(`{"type":"object","properties":{"tree":{"$ref":"https://tools.example/schemas/node.json"}},"$defs":{"Node":` + node + `}}`)
	keys2Refused(t, `{"tree":{"Path":"/a","children":[{"path":"/etc/cron.d/x"}]}}`, tool)
}

// Attack (fixed): two embedded resources each declare a relative "$id":"item.json"
// under different bases (https://x/a/ and https://x/b/), so their
// absolute URIs differ. A $ref "item.json" inside resource a names a's
// item (resolved against a's base). byID (keys.go:258-275) looks the
// reference up first "as written" in d.ids, where index (keys.go:299-300)
// stored both under the same key "item.json" — the later one wins — and
// never resolves the reference against the base of the schema holding it.
// a's dest is described by b's item, which does not declare Path.
// Fixed: every schema an $id may name is gathered.
func TestKeys4AttackSameRelativeIDUnderTwoBases(t *testing.T) {
	mk := func(dir, item string) string {
		return `{"$id":"https://tools.example/` + dir + `/","type":"object",` +
			`"$defs":{"Item":` + strings.Replace(item, `{`, `{"$id":"item.json",`, 1) + `},` +
			`"properties":{"dest":{"$ref":"item.json"}}}`
	}
	other := `{"type":"object","properties":{"name":{"type":"string"}}}`
	for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		// a's item declares Path; b's does not. Both orders ($defs A and
		// Z), so the result does not hang on which one the index meets last.
		defs := map[string]string{"a": mk("a", copyTarget), "b": mk("b", other)}
		tool := keys4Tool(`{"type":"object","properties":{"a":{"$ref":"https://tools.example/a/"},"b":{"$ref":"https://tools.example/b/"}},` +
			`"$defs":{"A":` + defs[order[0]] + `,"Z":` + defs[order[1]] + `}}`)
		keys2Refused(t, `{"a":{"dest":{"path":"/etc/cron.d/x"}}}`, tool)
	}
}

// Attack (fixed): anchors are scoped to their schema resource (2020-12 §8.2.2):
// two bundled resources may each declare "$anchor":"Target". A "#Target"
// inside resource a names a's. index (keys.go:307-311) keeps one schema
// per anchor name in d.anchors — the last met — so the other resource's
// "#Target" resolves to the wrong schema and its dest place misses Path.
// Fixed: every schema carrying the anchor is gathered.
func TestKeys4AttackSameAnchorInTwoResources(t *testing.T) {
	mk := func(id, target string) string {
		return `{"$id":"https://tools.example/` + id + `.json","type":"object",` +
			`"$defs":{"T":` + strings.Replace(target, `{`, `{"$anchor":"Target",`, 1) + `},` +
			`"properties":{"dest":{"$ref":"#Target"}}}`
	}
	other := `{"type":"object","properties":{"name":{"type":"string"}}}`
	for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		defs := map[string]string{"a": mk("a", copyTarget), "b": mk("b", other)}
		tool := keys4Tool(`{"type":"object","properties":{"a":{"$ref":"https://tools.example/a.json"},"b":{"$ref":"https://tools.example/b.json"}},` +
			`"$defs":{"A":` + defs[order[0]] + `,"Z":` + defs[order[1]] + `}}`)
		keys2Refused(t, `{"a":{"dest":{"path":"/etc/cron.d/x"}}}`, tool)
	}
}

// Attack (fixed): $dynamicRef resolves through the dynamic scope to the
// outermost schema with that $dynamicAnchor (2020-12 §8.2.3.2) — the
// spec's own extensible-tree example: a root resource extends a generic
// "tree" (whose children are {"$dynamicRef":"#node"}) and adds its own
// properties. The children of the extended tree are described by the
// root. index keeps one schema per anchor name — the last met, here the
// generic tree in $defs — so the children's place lacks the root's Path.
// Fixed: as above, $dynamicAnchor included.
func TestKeys4AttackDynamicRefOutermostScope(t *testing.T) {
	tree := `{"$id":"https://tools.example/tree.json","$dynamicAnchor":"node","type":"object",` +
		`"properties":{"children":{"type":"array","items":{"$dynamicRef":"#node"}}}}`
	tool := keys4Tool(`{"$id":"https://tools.example/path-tree.json","$dynamicAnchor":"node","$ref":"tree.json",` +
		`"properties":{"Path":{"type":"string"}},"$defs":{"tree":` + tree + `}}`)
	// The root's own Path is refused as a variant at the top.
	keys2Refused(t, `{"path":"/a"}`, tool)
	// And must be in each child, which the dynamic scope makes a path-tree.
	keys2Refused(t, `{"Path":"/a","children":[{"path":"/etc/cron.d/x"}]}`, tool)
}

// Holds: hostile $ids and anchors (non-string, empty, "#", a lone "#" as
// ref, a huge id, cyclic $id refs, ids with a trailing "#", a bad URI)
// neither panic nor refuse ordinary calls.
func TestKeys4HoldsHostileIDs(t *testing.T) {
	huge := strings.Repeat("x/", 50000)
	for _, schema := range []string{
		`{"$id":5,"properties":{"a":{"$id":{"x":1},"$anchor":7}}}`,
		`{"$id":"#","properties":{"a":{"$ref":"#"}}}`,
		`{"$id":"","$anchor":"","properties":{"a":{"$ref":"#"}}}`,
		`{"$id":"%zz:/#%zz","properties":{"a":{"$ref":"%zz:/#%zz"}}}`,
		`{"$id":"https://x/s.json#","properties":{"a":{"$ref":"https://x/s.json#"}}}`,
		`{"$id":"` + huge + `","properties":{"a":{"$ref":"` + huge + `#/properties/a"}}}`,
		`{"$defs":{"A":{"$id":"a","$ref":"b"},"B":{"$id":"b","$ref":"a"}},"$ref":"a"}`,
		`{"$defs":{"A":{"$id":"https://x/","$ref":"https://y/"},"B":{"$id":"https://y/","$ref":"https://x/"}},"$ref":"https://x/"}`,
		`{"$dynamicAnchor":"n","$recursiveAnchor":true,"properties":{"a":{"$dynamicRef":"#n","$recursiveRef":"#"}}}`,
	} {
		if err := keysCheck(t, `{"a":[{"x":1},[{"Y":2}]],"b":{"c":1}}`, keys4Tool(schema)); err != nil {
			t.Errorf("%.80s: refused: %v", schema, err)
		}
	}
}

// Holds: a relative $ref resolved against the root's $id, an $id with a
// trailing "#", and a nested relative $id resolved against its parent's
// base still lead to the target.
func TestKeys4HoldsIDForms(t *testing.T) {
	for _, schema := range []string{
		`{"$id":"https://x/s/root.json#","properties":{"dest":{"$ref":"t.json"}},"$defs":{"T":` + strings.Replace(copyTarget, `{`, `{"$id":"https://x/s/t.json#",`, 1) + `}}`,
		`{"properties":{"dest":{"$ref":"https://x/a/t.json"}},"$defs":{"A":{"$id":"https://x/a/","$defs":{"T":` + strings.Replace(copyTarget, `{`, `{"$id":"t.json",`, 1) + `}}}}`,
	} {
		keys2Refused(t, `{"dest":{"path":"/etc/cron.d/x"}}`, keys4Tool(schema))
	}
	// The attacks' resources, each alone, are resolved: only their
	// sharing a relative $id or an anchor name breaks them.
	for _, inner := range []string{
		`{"$id":"https://tools.example/a/","type":"object","$defs":{"Item":` + strings.Replace(copyTarget, `{`, `{"$id":"item.json",`, 1) + `},"properties":{"dest":{"$ref":"item.json"}}}`,
		`{"$id":"https://tools.example/a.json","type":"object","$defs":{"T":` + strings.Replace(copyTarget, `{`, `{"$anchor":"Target",`, 1) + `},"properties":{"dest":{"$ref":"#Target"}}}`,
	} {
		id := inner[len(`{"$id":"`):strings.Index(inner, `",`)]
		tool := keys4Tool(`{"type":"object","properties":{"a":{"$ref":"` + id + `"}},"$defs":{"a":` + inner + `}}`)
		keys2Refused(t, `{"a":{"dest":{"path":"/etc/cron.d/x"}}}`, tool)
	}
}
