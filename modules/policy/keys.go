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
// against its items. A key its own level does not declare (there a schema
// declares properties through anyOf, oneOf, allOf, $ref, additionalProperties
// or prefixItems, or nothing) is checked against every property name the
// schema declares anywhere: spelled like one of them it passes, folding onto
// one without being spelled like it it is refused.

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
	c := keyChecker{schema: schema}
	return c.check(args.Value, schema, "arguments")
}

// keyChecker checks the keys of one call's arguments.
type keyChecker struct {
	schema ast.Value // the tool's inputSchema; nil when unknown
	// declared maps the folded form of every property name the schema
	// declares anywhere to those names; built on first need.
	declared map[string][]string
}

// anywhere returns a property name declared somewhere in the schema that
// name folds onto without being spelled like any of them, and whether
// there is one.
func (c *keyChecker) anywhere(name string) (string, bool) {
	if c.schema == nil {
		return "", false
	}
	if c.declared == nil {
		c.declared = map[string][]string{}
		declaredNames(c.schema, c.declared, 0)
	}
	names := c.declared[mcpmsg.FoldKey(name)]
	for _, n := range names {
		if n == name {
			return "", false
		}
	}
	if len(names) == 0 {
		return "", false
	}
	return names[0], true
}

// declaredNames adds to out the property names of every "properties"
// object in schema, by their folded form. depth bounds the walk (a schema
// passed the message parser's depth limit already).
func declaredNames(schema ast.Value, out map[string][]string, depth int) {
	if depth > 256 {
		return
	}
	switch x := schema.(type) {
	case ast.Object:
		x.Foreach(func(k, v *ast.Term) {
			if k.Equal(keyProperties) {
				if props, ok := v.Value.(ast.Object); ok {
					props.Foreach(func(pk, _ *ast.Term) {
						if p, ok := pk.Value.(ast.String); ok {
							f := mcpmsg.FoldKey(string(p))
							out[f] = append(out[f], string(p))
						}
					})
				}
			}
			declaredNames(v.Value, out, depth+1)
		})
	case *ast.Array:
		for i := range x.Len() {
			declaredNames(x.Elem(i).Value, out, depth+1)
		}
	}
}

func (c *keyChecker) check(v, schema ast.Value, at string) error {
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
			if p := getProp(props, k); p != nil {
				sub = p.Value
			} else {
				if props != nil && folded == nil {
					folded = make(map[string]string, props.Len())
					props.Foreach(func(pk, _ *ast.Term) {
						if p, ok := pk.Value.(ast.String); ok {
							folded[mcpmsg.FoldKey(string(p))] = string(p)
						}
					})
				}
				p, ok := folded[mcpmsg.FoldKey(string(name))]
				if !ok {
					p, ok = c.anywhere(string(name))
				}
				if ok {
					return fmt.Errorf("%s.%s is not a parameter of the tool, but it differs from the parameter %q only in letter case; spell it exactly as the tool's inputSchema does", at, string(name), p)
				}
			}
			if err := c.check(x.Get(k).Value, sub, at+"."+string(name)); err != nil {
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
			if err := c.check(x.Elem(i).Value, items, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// getProp is props' member k; nil when there is none, or no props.
func getProp(props ast.Object, k *ast.Term) *ast.Term {
	if props == nil {
		return nil
	}
	return props.Get(k)
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
