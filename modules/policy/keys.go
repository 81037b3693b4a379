package policy

import (
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// The policy reads argument names exactly; many upstreams do not (Go's
// encoding/json, for one, fills a field named visibility from "VISIBILITY"
// or "viſibility"). So before the request policy runs, and again on the
// arguments a policy rewrote, the gateway refuses keys that fold (case and
// Unicode simple folding) onto another key of the same object, or onto a
// property the tool's inputSchema declares at that place without being
// spelled like it. The schema's place of each object and array of the
// arguments is followed through properties, additionalProperties,
// patternProperties, unevaluatedProperties, items, prefixItems and
// additionalItems (draft-07 tuples too), and its properties are gathered
// through anyOf, oneOf, allOf, then, else, dependentSchemas, dependencies
// and what $ref, $dynamicRef and $recursiveRef name within the schema (a
// JSON pointer, an anchor, an $id: an object behind a $ref, as Go and Python
// SDKs describe nested structs, or an optional one behind anyOf). A place
// whose schema declares no properties (a free-form map: an environment,
// headers) has keys of its own; one that more than maxSchemas schemas lead
// to is refused.

var keyInputSchema = ast.StringTerm("inputSchema")

// checkArgumentKeys checks args (the arguments as an AST term) against the
// inputSchema of tool (the policy's tool term; nil or a bare name when the
// definition is unknown, and then only keys of one object are compared).
func checkArgumentKeys(args, tool *ast.Term) error {
	var top *place
	if tool != nil {
		if obj, ok := tool.Value.(ast.Object); ok {
			if s := obj.Get(keyInputSchema); s != nil {
				if root, ok := s.Value.(ast.Object); ok {
					doc := &schemaDoc{root: root}
					top = newPlace(doc, []ast.Value{root})
				}
			}
		}
	}
	return checkKeys(args.Value, top, "arguments")
}

func checkKeys(v ast.Value, at *place, path string) error {
	if at != nil && at.tooMany {
		return fmt.Errorf("%s: the tool's inputSchema leads to more than %d schemas for it, too many to check the argument names against; the tool cannot be called through toolgate", path, maxSchemas)
	}
	switch x := v.(type) {
	case ast.Object:
		keys := x.Keys()
		var seen map[string]string // folded key → key, for objects past smallObject keys
		if len(keys) > smallObject {
			seen = make(map[string]string, len(keys))
		}
		for i, k := range keys {
			name, ok := k.Value.(ast.String)
			if !ok {
				// A key a policy wrote as a number: it would go upstream as
				// a string, maybe one of another key.
				return fmt.Errorf("%s has a key that is not a string", path)
			}
			if other, dup := sameFoldKey(keys[:i], seen, string(name)); dup {
				return fmt.Errorf("%s has the keys %q and %q, which differ only in letter case; send one of them", path, other, string(name))
			}
			if p, ok := at.variant(k); ok {
				return fmt.Errorf("%s.%s is not a parameter of the tool, but it differs from the parameter %q only in letter case; spell it exactly as the tool's inputSchema does", path, string(name), p)
			}
			if child := x.Get(k).Value; hasKeys(child) {
				if err := checkKeys(child, at.member(k), path+"."+string(name)); err != nil {
					return err
				}
			}
		}
	case *ast.Array:
		for i := range x.Len() {
			if child := x.Elem(i).Value; hasKeys(child) {
				if err := checkKeys(child, at.item(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// hasKeys reports whether v is an object or an array, which may hold keys.
func hasKeys(v ast.Value) bool {
	switch v.(type) {
	case ast.Object, *ast.Array:
		return true
	}
	return false
}

// smallObject is how many keys an object may have for its keys to be
// compared pairwise; beyond, they are compared through a map of their
// folded forms (an object of many keys must not cost their square).
const smallObject = 16

// sameFoldKey reports the key among earlier (or, past smallObject keys,
// in seen, which it adds name to) that folds together with name.
func sameFoldKey(earlier []*ast.Term, seen map[string]string, name string) (string, bool) {
	if seen != nil {
		f := mcpmsg.FoldKey(name)
		if other, dup := seen[f]; dup {
			return other, true
		}
		seen[f] = name
		return "", false
	}
	for _, other := range earlier {
		if o, ok := other.Value.(ast.String); ok && mcpmsg.SameFold(name, string(o)) {
			return string(o), true
		}
	}
	return "", false
}
