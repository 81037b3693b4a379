package policy

import (
	"fmt"
	"strings"

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
// arguments is followed through properties, additionalProperties, items
// and prefixItems, and its properties are gathered through anyOf, oneOf,
// allOf and local $refs (an object behind a $ref, as Go and Python SDKs
// describe nested structs, or an optional one behind anyOf). A place
// whose schema declares no properties (a free-form map: an environment,
// headers) has keys of its own.

var (
	keyInputSchema = ast.StringTerm("inputSchema")
	keyProperties  = ast.StringTerm("properties")
	keyItems       = ast.StringTerm("items")
	keyPrefixItems = ast.StringTerm("prefixItems")
	keyAdditional  = ast.StringTerm("additionalProperties")
	keyRef         = ast.StringTerm("$ref")
	combinators    = [...]*ast.Term{ast.StringTerm("anyOf"), ast.StringTerm("oneOf"), ast.StringTerm("allOf")}
)

// checkArgumentKeys checks args (the arguments as an AST term) against the
// inputSchema of tool (the policy's tool term; nil or a bare name when the
// definition is unknown, and then only keys of one object are compared).
func checkArgumentKeys(args, tool *ast.Term) error {
	var top *place
	if tool != nil {
		if obj, ok := tool.Value.(ast.Object); ok {
			if s := obj.Get(keyInputSchema); s != nil {
				if root, ok := s.Value.(ast.Object); ok {
					top = newPlace(root, []ast.Value{root})
				}
			}
		}
	}
	return checkKeys(args.Value, top, "arguments")
}

// A place is where a value of the arguments stands in the schema: the
// schemas that describe it there (its own, and those its anyOf, oneOf,
// allOf and local $refs lead to), and the places of its members and items,
// found on first need.
type place struct {
	root    ast.Object
	schemas []ast.Object
	names   map[string]string // declared names by folded form, built on first need
	members map[string]*place
	items   map[int]*place
}

// maxSchemas bounds the schemas gathered for one place (a schema of
// thousands of branches costs its size once, not once per key).
const maxSchemas = 256

// newPlace gathers the schemas of a place from those given (values that
// are not objects describe no object).
func newPlace(root ast.Object, given []ast.Value) *place {
	p := &place{root: root}
	var seen map[ast.Value]bool // made for a schema that leads to others
	var add func(v ast.Value, depth int)
	add = func(v ast.Value, depth int) {
		s, ok := v.(ast.Object)
		if !ok || depth > 32 || len(p.schemas) >= maxSchemas || seen[v] {
			return
		}
		p.schemas = append(p.schemas, s)
		ref, _ := getValue(s, keyRef).(ast.String)
		var branches [len(combinators)]*ast.Array
		leads := ref != ""
		for i, k := range combinators {
			branches[i], _ = getValue(s, k).(*ast.Array)
			leads = leads || branches[i] != nil
		}
		if !leads {
			return
		}
		if seen == nil {
			seen = map[ast.Value]bool{}
			for _, s := range p.schemas {
				seen[s] = true
			}
		}
		seen[v] = true
		if ref != "" {
			add(resolveRef(root, string(ref)), depth+1)
		}
		for _, arr := range branches {
			if arr != nil {
				for i := range arr.Len() {
					add(arr.Elem(i).Value, depth+1)
				}
			}
		}
	}
	for _, v := range given {
		add(v, 0)
	}
	return p
}

// variant is the property p declares that key folds onto without being
// spelled like any it declares.
func (p *place) variant(key *ast.Term) (string, bool) {
	if p == nil {
		return "", false
	}
	for _, s := range p.schemas {
		if props, ok := getValue(s, keyProperties).(ast.Object); ok && props.Get(key) != nil {
			return "", false // declared as spelled
		}
	}
	if p.names == nil {
		p.names = map[string]string{}
		for _, s := range p.schemas {
			if props, ok := getValue(s, keyProperties).(ast.Object); ok {
				props.Foreach(func(k, _ *ast.Term) {
					if name, ok := k.Value.(ast.String); ok {
						if f := mcpmsg.FoldKey(string(name)); p.names[f] == "" {
							p.names[f] = string(name)
						}
					}
				})
			}
		}
	}
	name, ok := p.names[mcpmsg.FoldKey(string(key.Value.(ast.String)))]
	return name, ok
}

// resolveRef is the schema a local $ref ("#", "#/$defs/x", any JSON
// pointer into the tool's inputSchema) names; nil for any other.
func resolveRef(root ast.Object, ref string) ast.Value {
	ptr, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil
	}
	var v ast.Value = root
	for seg := range strings.SplitSeq(strings.TrimPrefix(ptr, "/"), "/") {
		if ptr == "" {
			break
		}
		seg = strings.NewReplacer("~1", "/", "~0", "~").Replace(seg)
		obj, ok := v.(ast.Object)
		if !ok {
			return nil
		}
		if v = getValue(obj, ast.StringTerm(seg)); v == nil {
			return nil
		}
	}
	return v
}

// getValue is obj's member k, nil when it has none.
func getValue(obj ast.Object, k *ast.Term) ast.Value {
	if t := obj.Get(k); t != nil {
		return t.Value
	}
	return nil
}

// member is the place of the member key of an object at p: its property
// schemas where p declares key, else p's additionalProperties.
func (p *place) member(k *ast.Term) *place {
	if p == nil {
		return nil
	}
	key := string(k.Value.(ast.String))
	if q, ok := p.members[key]; ok {
		return q
	}
	var given []ast.Value
	for _, s := range p.schemas {
		if props, ok := getValue(s, keyProperties).(ast.Object); ok {
			if v := getValue(props, k); v != nil {
				given = append(given, v)
				continue
			}
		}
		if v := getValue(s, keyAdditional); v != nil {
			given = append(given, v)
		}
	}
	q := p.child(given)
	if p.members == nil {
		p.members = map[string]*place{}
	}
	p.members[key] = q
	return q
}

// item is the place of the i-th item of an array at p: p's prefixItems[i],
// else its items.
func (p *place) item(i int) *place {
	if p == nil {
		return nil
	}
	prefixed := false
	for _, s := range p.schemas {
		if arr, ok := getValue(s, keyPrefixItems).(*ast.Array); ok && arr.Len() > 0 {
			prefixed = true
		}
	}
	if !prefixed {
		i = -1 // every item has one place
	}
	if q, ok := p.items[i]; ok {
		return q
	}
	var given []ast.Value
	for _, s := range p.schemas {
		if arr, ok := getValue(s, keyPrefixItems).(*ast.Array); ok && i >= 0 && i < arr.Len() {
			given = append(given, arr.Elem(i).Value)
			continue
		}
		if v := getValue(s, keyItems); v != nil {
			given = append(given, v)
		}
	}
	q := p.child(given)
	if p.items == nil {
		p.items = map[int]*place{}
	}
	p.items[i] = q
	return q
}

func (p *place) child(given []ast.Value) *place {
	if len(given) == 0 {
		return nil
	}
	return newPlace(p.root, given)
}

func checkKeys(v ast.Value, at *place, path string) error {
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
