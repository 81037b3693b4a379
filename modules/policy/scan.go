package policy

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
)

// The result scan (input.scan, see policies/README.md) is the gateway's
// quick pass over a tools/call result, made while the result is converted
// for the policy. It lists the inspected strings the result policy has to
// look at: those longer than scanThreshold bytes, and those holding an
// invisible character or a secret marker. Everything else needs no
// cleaning, so the policy never visits it: a megabyte of text, or ten
// thousand strings of structured content, cost the policy a few
// microseconds instead of a pass of Rego over every character.
//
// What counts as a marker or an invisible character is the policy's own
// business: the scan uses its secret_markers and invisible_ranges rules
// (read once, when the policy is loaded), so the gateway and `opa test`
// agree, and a policy without them simply gets no scan.

// scanThreshold is the size in bytes above which every inspected string is
// listed. Strings this long are not searched for markers (the policy looks
// in the part it keeps), which bounds the scan's cost on large texts.
const scanThreshold = 4096

var (
	keyThreshold = ast.StringTerm("threshold")
	keyStrings   = ast.StringTerm("strings")
	keyPath      = ast.StringTerm("path")
	keyBytes     = ast.StringTerm("bytes")
	keyInvisible = ast.StringTerm("invisible")
	keyMarkers   = ast.StringTerm("markers")
	keyContent   = ast.StringTerm("content")
	keyType      = ast.StringTerm("type")
	keyText      = ast.StringTerm("text")
	keyResource  = ast.StringTerm("resource")
)

// scanner holds what the scan looks for.
type scanner struct {
	markers   []string    // every marker of every kind
	invisible []runeRange // sorted, not overlapping
	leads     []byte      // the first UTF-8 bytes of the invisible characters
}

type runeRange struct{ lo, hi rune }

// loadScanner reads the scan's settings from the package of the decision
// rule: secret_markers ({"kind": ["marker", …]}) and invisible_ranges
// ([["200B", "200F"], …], hexadecimal code points). It returns nil when the
// package defines neither, and an error when they are malformed.
func loadScanner(ctx context.Context, compiler *ast.Compiler, store storage.Store, decision string) (*scanner, error) {
	ref, err := ast.ParseRef(decision)
	if err != nil || len(ref) < 2 {
		return nil, nil
	}
	pkg := ref[:len(ref)-1].String()
	markers, err := evalConstant(ctx, compiler, store, pkg+".secret_markers")
	if err != nil {
		return nil, err
	}
	ranges, err := evalConstant(ctx, compiler, store, pkg+".invisible_ranges")
	if err != nil {
		return nil, err
	}
	if markers == nil && ranges == nil {
		return nil, nil
	}
	sc := &scanner{}
	kinds, ok := markers.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s.secret_markers must be an object of arrays of strings", pkg)
	}
	for kind, list := range kinds {
		ms, ok := list.([]any)
		if !ok {
			return nil, fmt.Errorf("%s.secret_markers[%q] must be an array of strings", pkg, kind)
		}
		for _, m := range ms {
			s, ok := m.(string)
			if !ok || s == "" {
				return nil, fmt.Errorf("%s.secret_markers[%q] must hold non-empty strings", pkg, kind)
			}
			sc.markers = append(sc.markers, s)
		}
	}
	slices.Sort(sc.markers)
	sc.markers = slices.Compact(sc.markers)
	list, ok := ranges.([]any)
	if !ok {
		return nil, fmt.Errorf("%s.invisible_ranges must be an array of [first, last] pairs", pkg)
	}
	for _, r := range list {
		pair, ok := r.([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("%s.invisible_ranges must be an array of [first, last] pairs", pkg)
		}
		lo, okLo := codePoint(pair[0])
		hi, okHi := codePoint(pair[1])
		if !okLo || !okHi || hi < lo {
			return nil, fmt.Errorf("%s.invisible_ranges: %v is not a range of hexadecimal code points", pkg, pair)
		}
		sc.invisible = append(sc.invisible, runeRange{lo, hi})
	}
	slices.SortFunc(sc.invisible, func(a, b runeRange) int { return int(a.lo - b.lo) })
	var leads [256]bool
	var buf [utf8.UTFMax]byte
	for _, r := range sc.invisible {
		for c := r.lo; c <= r.hi; c++ {
			utf8.EncodeRune(buf[:], c)
			leads[buf[0]] = true
		}
	}
	for b, ok := range leads {
		if ok {
			sc.leads = append(sc.leads, byte(b))
		}
	}
	return sc, nil
}

func codePoint(v any) (rune, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 16, 32)
	if err != nil || n > utf8.MaxRune {
		return 0, false
	}
	return rune(n), true
}

// evalConstant evaluates a rule that does not depend on input; nil when it
// is undefined.
func evalConstant(ctx context.Context, compiler *ast.Compiler, store storage.Store, query string) (any, error) {
	if len(compiler.GetRulesExact(ast.MustParseRef(query))) == 0 {
		return nil, nil
	}
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiler), rego.Store(store)).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", query, err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return nil, nil
	}
	return rs[0].Expressions[0].Value, nil
}

// hasInvisible reports whether s holds an invisible character.
func (sc *scanner) hasInvisible(s string) bool {
	for _, lead := range sc.leads {
		for i := 0; ; {
			j := strings.IndexByte(s[i:], lead)
			if j < 0 {
				break
			}
			i += j
			r, size := utf8.DecodeRuneInString(s[i:])
			if sc.isInvisible(r) {
				return true
			}
			i += size
		}
	}
	return false
}

func (sc *scanner) isInvisible(r rune) bool {
	_, found := slices.BinarySearchFunc(sc.invisible, r, func(rr runeRange, r rune) int {
		switch {
		case r < rr.lo:
			return 1
		case r > rr.hi:
			return -1
		}
		return 0
	})
	return found
}

// hasMarker reports whether s holds a secret marker.
func (sc *scanner) hasMarker(s string) bool {
	for _, m := range sc.markers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// scanEntries collects the scan's list.
type scanEntries struct {
	sc      *scanner
	entries []*ast.Term
}

// look adds s at path when the policy has to look at it.
func (l *scanEntries) look(path []pathStep, s string) {
	long := len(s) > scanThreshold
	invisible := l.sc.hasInvisible(s)
	markers := long || l.sc.hasMarker(s) // long strings are not searched
	if !long && !invisible && !markers {
		return
	}
	l.entries = append(l.entries, ast.ObjectTerm(
		ast.Item(keyPath, pathTerm(path)),
		ast.Item(keyBytes, ast.InternedTerm(len(s))),
		ast.Item(keyInvisible, ast.InternedTerm(invisible)),
		ast.Item(keyMarkers, ast.InternedTerm(markers)),
	))
}

// resultTerms converts a tools/call result (JSON text) to input.result
// and, with a scanner, input.scan (else scan is nil).
func resultTerms(raw []byte, sc *scanner) (result, scan *ast.Term, err error) {
	p := jsonParser{src: string(raw)}
	l := scanEntries{sc: sc}
	if sc != nil {
		p.visit, p.visitKey = l.look, "structuredContent"
	}
	result, err = p.parse()
	if err != nil || sc == nil {
		return result, nil, err
	}
	// The content items the policy inspects: the text of text items and
	// the text of embedded resources.
	var content *ast.Array
	if obj, ok := result.Value.(ast.Object); ok {
		if t := obj.Get(keyContent); t != nil {
			content, _ = t.Value.(*ast.Array)
		}
	}
	for i := range contentLen(content) {
		item, ok := content.Elem(i).Value.(ast.Object)
		if !ok {
			continue
		}
		typ := item.Get(keyType)
		switch {
		case typ == nil:
		case typ.Value.Compare(keyText.Value) == 0:
			if s, ok := stringAt(item, keyText); ok {
				l.look([]pathStep{{key: keyContent}, {index: i}, {key: keyText}}, s)
			}
		case typ.Value.Compare(keyResource.Value) == 0:
			if res := item.Get(keyResource); res != nil {
				if obj, ok := res.Value.(ast.Object); ok {
					if s, ok := stringAt(obj, keyText); ok {
						l.look([]pathStep{{key: keyContent}, {index: i}, {key: keyResource}, {key: keyText}}, s)
					}
				}
			}
		}
	}
	scan = ast.ObjectTerm(
		ast.Item(keyThreshold, ast.InternedTerm(scanThreshold)),
		ast.Item(keyStrings, ast.ArrayTerm(l.entries...)),
	)
	return result, scan, nil
}

func contentLen(a *ast.Array) int {
	if a == nil {
		return 0
	}
	return a.Len()
}

func stringAt(obj ast.Object, key *ast.Term) (string, bool) {
	t := obj.Get(key)
	if t == nil {
		return "", false
	}
	s, ok := t.Value.(ast.String)
	return string(s), ok
}
