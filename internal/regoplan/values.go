package regoplan

import (
	"strconv"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The values the statements read and write: members looked up and set,
// kinds and sizes.

// jsonInt is n as a number term's value.
func jsonInt(n int64) ast.Number { return ast.Number(strconv.FormatInt(n, 10)) }

// upsert returns doc with v at path, copying the objects on the way (doc
// is not changed); a missing or non-object node on the way becomes an
// object.
func upsert(doc *ast.Term, path []*ast.Term, v *ast.Term) *ast.Term {
	var obj ast.Object
	if doc != nil {
		if o, ok := doc.Value.(ast.Object); ok {
			obj = o.Copy()
		}
	}
	if obj == nil {
		obj = ast.NewObject()
	}
	if len(path) == 1 {
		obj.Insert(path[0], v)
	} else {
		obj.Insert(path[0], upsert(obj.Get(path[0]), path[1:], v))
	}
	return ast.NewTerm(obj)
}

// get is a DotStmt's lookup: an object's value, an array's element, a
// set's member; nil when there is none.
func get(s, k *ast.Term) *ast.Term {
	switch c := s.Value.(type) {
	case ast.Object:
		return c.Get(k)
	case *ast.Array:
		n, ok := k.Value.(ast.Number)
		if !ok {
			return nil
		}
		i, ok := n.Int()
		if !ok || i < 0 || i >= c.Len() {
			return nil
		}
		return c.Elem(i)
	case ast.Set:
		if c.Contains(k) {
			return k
		}
	}
	return nil
}

// ofKind reports whether v is a collection of kind (kindArray, …).
func ofKind(v ast.Value, kind int) bool {
	var ok bool
	switch kind {
	case kindArray:
		_, ok = v.(*ast.Array)
	case kindObject:
		_, ok = v.(ast.Object)
	case kindSet:
		_, ok = v.(ast.Set)
	}
	return ok
}

// size is a LenStmt's length: of a collection, or of a string in
// characters (as count).
func size(v ast.Value) int {
	switch c := v.(type) {
	case *ast.Array:
		return c.Len()
	case ast.Object:
		return c.Len()
	case ast.Set:
		return c.Len()
	case ast.String:
		return utf8.RuneCountInString(string(c))
	}
	return 0
}
