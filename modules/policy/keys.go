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
// property the tool's inputSchema declares without being spelled like it.
// Nested objects are checked against the schema's nested properties, arrays
// against its items.

var (
	keyInputSchema = ast.StringTerm("inputSchema")
	keyProperties  = ast.StringTerm("properties")
	keyItems       = ast.StringTerm("items")
)

// checkArgumentKeys checks args (the arguments as an AST term) against the
// inputSchema of tool (the policy's tool term; nil or a bare name when the
// definition is unknown, and then only keys of one object are compared).
func checkArgumentKeys(args, tool *ast.Term) error {
	var schema ast.Value
	if tool != nil {
		if obj, ok := tool.Value.(ast.Object); ok {
			if s := obj.Get(keyInputSchema); s != nil {
				schema = s.Value
			}
		}
	}
	return checkKeys(args.Value, schema, "arguments")
}

func checkKeys(v, schema ast.Value, at string) error {
	switch x := v.(type) {
	case ast.Object:
		var props ast.Object
		if s, ok := schema.(ast.Object); ok {
			if p := s.Get(keyProperties); p != nil {
				props, _ = p.Value.(ast.Object)
			}
		}
		keys := x.Keys()
		var seen map[string]string   // folded key → key, for objects past smallObject keys
		var folded map[string]string // the schema's folded property names → names, built on first need
		if len(keys) > smallObject {
			seen = make(map[string]string, len(keys))
		}
		for i, k := range keys {
			name, ok := k.Value.(ast.String)
			if !ok {
				// A key a policy wrote as a number: it would go upstream as
				// a string, maybe one of another key.
				return fmt.Errorf("%s has a key that is not a string", at)
			}
			if other, dup := sameFoldKey(keys[:i], seen, string(name)); dup {
				return fmt.Errorf("%s has the keys %q and %q, which differ only in letter case; send one of them", at, other, string(name))
			}
			var sub ast.Value
			if props != nil {
				if p := props.Get(k); p != nil {
					sub = p.Value
				} else {
					if folded == nil {
						folded = make(map[string]string, props.Len())
						props.Foreach(func(pk, _ *ast.Term) {
							if p, ok := pk.Value.(ast.String); ok {
								folded[mcpmsg.FoldKey(string(p))] = string(p)
							}
						})
					}
					if p, ok := folded[mcpmsg.FoldKey(string(name))]; ok {
						return fmt.Errorf("%s.%s is not a parameter of the tool, but it differs from the parameter %q only in letter case; spell it exactly as the tool's inputSchema does", at, string(name), p)
					}
				}
			}
			if err := checkKeys(x.Get(k).Value, sub, at+"."+string(name)); err != nil {
				return err
			}
		}
	case *ast.Array:
		var items ast.Value
		if s, ok := schema.(ast.Object); ok {
			if it := s.Get(keyItems); it != nil {
				items = it.Value
			}
		}
		for i := range x.Len() {
			if err := checkKeys(x.Elem(i).Value, items, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
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
