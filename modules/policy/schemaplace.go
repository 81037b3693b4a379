package policy

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// The places of a tool's inputSchema that the argument-name check
// (keys.go) compares each object and array of the arguments with.

// The schema keywords places are read by.
var (
	keyProperties  = ast.StringTerm("properties")
	keyItems       = ast.StringTerm("items")
	keyPrefixItems = ast.StringTerm("prefixItems")
	keyAddItems    = ast.StringTerm("additionalItems")
	keyAdditional  = ast.StringTerm("additionalProperties")
	keyUnevaluated = ast.StringTerm("unevaluatedProperties")
	keyPatterns    = ast.StringTerm("patternProperties")
	keysRefs       = [...]*ast.Term{ast.StringTerm("$ref"), ast.StringTerm("$dynamicRef"), ast.StringTerm("$recursiveRef")}
	keySchemaID    = ast.StringTerm("$id")
	keysAnchors    = [...]*ast.Term{ast.StringTerm("$anchor"), ast.StringTerm("$dynamicAnchor")}
	// The members whose subschemas describe the same value as the schema
	// holding them: as branches (arrays), as one schema, or as the values
	// of an object. Gathering them all over-approximates what is declared
	// at a place, as a refusal of a key that folds onto any of it should.
	keysBranches = [...]*ast.Term{ast.StringTerm("anyOf"), ast.StringTerm("oneOf"), ast.StringTerm("allOf")}
	keysSame     = [...]*ast.Term{ast.StringTerm("then"), ast.StringTerm("else")}
	keysByName   = [...]*ast.Term{ast.StringTerm("dependentSchemas"), ast.StringTerm("dependencies")}
)

// A place is where a value of the arguments stands in the schema: the
// schemas that describe it there (its own, and those its subschemas of
// the same value and its local $refs lead to), and the places of its
// members and items, found on first need: one per declared member and per
// tuple position, one for every other member, one for every other item.
type place struct {
	doc      *schemaDoc
	schemas  []ast.Object
	first    [4]ast.Object       // room for the schemas of most places
	seen     map[ast.Object]bool // while gathering, past len(first) schemas
	tooMany  bool                // more than maxSchemas lead here
	members  map[string]*place   // declared members'
	rest     *place              // any other member's
	restDone bool
	tuple    map[int]*place // tuple positions'
	items    *place         // any other item's
	itemDone bool
}

// maxSchemas bounds the schemas gathered for one place; a place more
// lead to is refused (a schema of thousands of branches costs its size
// once, not once per key).
const maxSchemas = 256

// newPlace gathers the schemas of a place from those given (values that
// are not objects describe no object).
func newPlace(doc *schemaDoc, given []ast.Value) *place {
	p := &place{doc: doc}
	p.schemas = p.first[:0]
	for _, v := range given {
		p.add(v)
	}
	p.seen = nil
	return p
}

// add gathers the schema v (if it is one) and those it leads to.
func (p *place) add(v ast.Value) {
	s, ok := v.(ast.Object)
	if !ok || p.has(s) {
		return
	}
	if len(p.schemas) == maxSchemas {
		p.tooMany = true
		return
	}
	p.schemas = append(p.schemas, s)
	if p.seen != nil {
		p.seen[s] = true
	} else if len(p.schemas) == len(p.first) {
		p.seen = make(map[ast.Object]bool, 2*len(p.first))
		for _, o := range p.schemas {
			p.seen[o] = true
		}
	}
	for _, k := range keysRefs {
		if ref, ok := getValue(s, k).(ast.String); ok {
			for _, v := range p.doc.resolve(string(ref)) {
				p.add(v)
			}
		}
	}
	for _, k := range keysBranches {
		if arr, ok := getValue(s, k).(*ast.Array); ok {
			for i := range arr.Len() {
				p.add(arr.Elem(i).Value)
			}
		}
	}
	for _, k := range keysSame {
		p.add(getValue(s, k))
	}
	for _, k := range keysByName {
		if obj, ok := getValue(s, k).(ast.Object); ok {
			obj.Foreach(func(_, v *ast.Term) { p.add(v.Value) })
		}
	}
}

// has reports whether s was gathered already.
func (p *place) has(s ast.Object) bool {
	if p.seen != nil {
		return p.seen[s]
	}
	for _, o := range p.schemas {
		if o == s {
			return true
		}
	}
	return false
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
	f := mcpmsg.FoldKey(string(key.Value.(ast.String)))
	for _, s := range p.schemas {
		if name, ok := p.doc.names(s)[f]; ok {
			return name, true
		}
	}
	return "", false
}

// A schemaDoc is a tool's inputSchema as one call's check reads it: the
// declared names of each schema folded once (however many places share
// it), and the schemas its references name, found on first need. A
// reference is resolved to every schema it may name — a pointer from the
// root and from every embedded resource (a schema with an $id), an $id as
// written, as resolved against the root's and by its last path segment,
// an anchor wherever it is — so that scoping rules read otherwise can
// only make a place declare more, and a check refuse more.
type schemaDoc struct {
	root      ast.Object
	resolved  map[string][]ast.Value // by reference
	folded    map[ast.Object]map[string]string
	indexed   bool
	resources []ast.Object            // the embedded resources
	ids       map[string][]ast.Object // by $id as written, as resolved, and by its last path segment
	anchors   map[string][]ast.Object // by $anchor, $dynamicAnchor, and "#name" $ids
}

// names is the property names s declares, by folded form.
func (d *schemaDoc) names(s ast.Object) map[string]string {
	if n, ok := d.folded[s]; ok {
		return n
	}
	var n map[string]string
	if props, ok := getValue(s, keyProperties).(ast.Object); ok {
		props.Foreach(func(k, _ *ast.Term) {
			if name, ok := k.Value.(ast.String); ok {
				if n == nil {
					n = map[string]string{}
				}
				if f := mcpmsg.FoldKey(string(name)); n[f] == "" {
					n[f] = string(name)
				}
			}
		})
	}
	if d.folded == nil {
		d.folded = map[ast.Object]map[string]string{}
	}
	d.folded[s] = n
	return n
}

// resolve is every schema a $ref (or $dynamicRef, $recursiveRef) may
// name within the inputSchema (see schemaDoc); none for anything else (a
// schema elsewhere, which describes nothing here).
func (d *schemaDoc) resolve(ref string) []ast.Value {
	if v, ok := d.resolved[ref]; ok {
		return v
	}
	v := d.resolveOnce(ref)
	if d.resolved == nil {
		d.resolved = map[string][]ast.Value{}
	}
	d.resolved[ref] = v
	return v
}

func (d *schemaDoc) resolveOnce(ref string) []ast.Value {
	target, frag, _ := strings.Cut(ref, "#")
	if f, err := url.PathUnescape(frag); err == nil {
		frag = f
	}
	d.index()
	var bases []ast.Object
	if target != "" {
		bases = d.byID(target)
	} else {
		bases = append([]ast.Object{d.root}, d.resources...)
	}
	var out []ast.Value
	switch {
	case frag == "":
		for _, b := range bases {
			out = append(out, b)
		}
	case strings.HasPrefix(frag, "/"):
		for _, b := range bases {
			if v := pointer(b, frag[1:]); v != nil {
				out = append(out, v)
			}
		}
	default:
		for _, a := range d.anchors[frag] {
			out = append(out, a)
		}
	}
	return out
}

// byID is every schema whose $id may be target.
func (d *schemaDoc) byID(target string) []ast.Object {
	out := append([]ast.Object(nil), d.ids[target]...)
	if base, err := url.Parse(d.rootID()); err == nil {
		if t, err := base.Parse(target); err == nil && t.String() != target {
			out = append(out, d.ids[t.String()]...)
		}
	}
	if last := lastSegment(target); last != target {
		out = append(out, d.ids[last]...)
	}
	return out
}

func (d *schemaDoc) rootID() string {
	id, _ := getValue(d.root, keySchemaID).(ast.String)
	return string(id)
}

// index finds every $id and anchor of the inputSchema, once.
func (d *schemaDoc) index() {
	if d.indexed {
		return
	}
	d.indexed = true
	d.ids, d.anchors = map[string][]ast.Object{}, map[string][]ast.Object{}
	addTo := func(m map[string][]ast.Object, k string, s ast.Object) {
		if len(m[k]) < maxSchemas {
			m[k] = append(m[k], s)
		}
	}
	base, _ := url.Parse(d.rootID())
	var walk func(v ast.Value, base *url.URL, depth int)
	walk = func(v ast.Value, base *url.URL, depth int) {
		if depth > 1000 {
			return
		}
		switch x := v.(type) {
		case ast.Object:
			if id, ok := getValue(x, keySchemaID).(ast.String); ok {
				doc, name, _ := strings.Cut(string(id), "#")
				if name != "" {
					addTo(d.anchors, name, x)
				}
				if doc != "" {
					if x != d.root && len(d.resources) < maxSchemas {
						d.resources = append(d.resources, x)
					}
					addTo(d.ids, doc, x)
					if last := lastSegment(doc); last != doc {
						addTo(d.ids, last, x)
					}
					if base != nil {
						if abs, err := base.Parse(doc); err == nil {
							if abs.String() != doc {
								addTo(d.ids, abs.String(), x)
							}
							base = abs
						}
					}
				}
			}
			for _, k := range keysAnchors {
				if a, ok := getValue(x, k).(ast.String); ok {
					addTo(d.anchors, string(a), x)
				}
			}
			x.Foreach(func(_, e *ast.Term) { walk(e.Value, base, depth+1) })
		case *ast.Array:
			for i := range x.Len() {
				walk(x.Elem(i).Value, base, depth+1)
			}
		}
	}
	walk(d.root, base, 0)
}

// lastSegment is the last segment of a URI reference's path.
func lastSegment(ref string) string {
	return ref[strings.LastIndexByte(ref, '/')+1:]
}

// pointer is the value a JSON pointer (RFC 6901, without its leading
// "/") names from v; nil when it names nothing.
func pointer(v ast.Value, ptr string) ast.Value {
	for seg := range strings.SplitSeq(ptr, "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case ast.Object:
			v = getValue(x, ast.StringTerm(seg))
		case *ast.Array:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= x.Len() || seg != strconv.Itoa(i) {
				return nil
			}
			v = x.Elem(i).Value
		default:
			return nil
		}
		if v == nil {
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

// member is the place of the member k of an object at p: its property
// schemas where p declares k; else the place of every other member, made
// of p's additionalProperties, patternProperties (all of them: which
// pattern matches is not worked out) and unevaluatedProperties.
func (p *place) member(k *ast.Term) *place {
	if p == nil {
		return nil
	}
	key := string(k.Value.(ast.String))
	if q, ok := p.members[key]; ok {
		return q
	}
	var buf [4]ast.Value
	given := buf[:0]
	for _, s := range p.schemas {
		if props, ok := getValue(s, keyProperties).(ast.Object); ok {
			if v := getValue(props, k); v != nil {
				given = append(given, v)
			}
		}
	}
	if len(given) == 0 {
		return p.other()
	}
	q := p.child(given)
	if p.members == nil {
		p.members = map[string]*place{}
	}
	p.members[key] = q
	return q
}

// other is the place of the members p does not declare.
func (p *place) other() *place {
	if !p.restDone {
		var given []ast.Value
		for _, s := range p.schemas {
			given = append(given, getValue(s, keyAdditional), getValue(s, keyUnevaluated))
			if pats, ok := getValue(s, keyPatterns).(ast.Object); ok {
				pats.Foreach(func(_, v *ast.Term) { given = append(given, v.Value) })
			}
		}
		p.rest, p.restDone = p.child(given), true
	}
	return p.rest
}

// item is the place of the i-th item of an array at p: its tuple schemas
// (prefixItems, or items as an array) where they reach i, else those of
// every other item (items, additionalItems).
func (p *place) item(i int) *place {
	if p == nil {
		return nil
	}
	if q, ok := p.tuple[i]; ok {
		return q
	}
	var given []ast.Value
	for _, s := range p.schemas {
		for _, k := range [...]*ast.Term{keyPrefixItems, keyItems} {
			if arr, ok := getValue(s, k).(*ast.Array); ok && i < arr.Len() {
				given = append(given, arr.Elem(i).Value)
			}
		}
	}
	if len(given) == 0 {
		if !p.itemDone {
			var rest []ast.Value
			for _, s := range p.schemas {
				if items := getValue(s, keyItems); items != nil {
					if _, tuple := items.(*ast.Array); !tuple {
						rest = append(rest, items)
					}
				}
				rest = append(rest, getValue(s, keyAddItems))
			}
			p.items, p.itemDone = p.child(rest), true
		}
		return p.items
	}
	q := p.child(given)
	if p.tuple == nil {
		p.tuple = map[int]*place{}
	}
	p.tuple[i] = q
	return q
}

func (p *place) child(given []ast.Value) *place {
	for _, v := range given {
		if _, ok := v.(ast.Object); ok {
			return newPlace(p.doc, given)
		}
	}
	return nil
}
