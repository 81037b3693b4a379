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
		for i, k := range keys {
			name, ok := k.Value.(ast.String)
			if !ok {
				continue
			}
			for _, other := range keys[:i] {
				if o, ok := other.Value.(ast.String); ok && mcpmsg.SameFold(string(name), string(o)) {
					return fmt.Errorf("%s has the keys %q and %q, which differ only in letter case; send one of them", at, string(o), string(name))
				}
			}
			var sub ast.Value
			if props != nil {
				if p := props.Get(k); p != nil {
					sub = p.Value
				} else if err := props.Iter(func(pk, _ *ast.Term) error {
					if p, ok := pk.Value.(ast.String); ok && mcpmsg.SameFold(string(name), string(p)) {
						return fmt.Errorf("%s.%s is not a parameter of the tool, but it differs from the parameter %q only in letter case; spell it exactly as the tool's inputSchema does", at, string(name), string(p))
					}
					return nil
				}); err != nil {
					return err
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
