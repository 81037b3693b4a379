package policy

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// The rule cache answers exactly as OPA's own: random sequences of puts
// (values and undefined marks), gets and frames, over references that are
// prefixes of one another and share hashes, give the same answers from
// both.
func TestRuleCacheAgreesWithOPA(t *testing.T) {
	refs := []ast.Ref{
		ast.MustParseRef("data.toolgate.request.deny"),
		ast.MustParseRef("data.toolgate.request.ask"),
		ast.MustParseRef("data.toolgate.request"),
		ast.MustParseRef(`data.toolgate.request.deny["x"]`),
		ast.MustParseRef(`data.toolgate.result.scanned[["content", 0, "text"]]`),
		ast.MustParseRef(`data.toolgate.result.scanned[["content", 1, "text"]]`),
		ast.MustParseRef("data.x.y"),
		ast.MustParseRef("data.y.x"), // the same hash as data.x.y: the hash is a sum
		ast.MustParseRef("data.z[1]"),
	}
	values := []*ast.Term{nil, ast.BooleanTerm(true), ast.StringTerm("a"), ast.NumberTerm("1"), ast.SetTerm(ast.StringTerm("m"))}
	r := rand.New(rand.NewPCG(7, 11))
	for run := range 300 {
		ours, theirs := getRuleCache(), topdown.NewVirtualCache()
		depth := 0
		for step := range 200 {
			ref := slices.Clone(refs[r.IntN(len(refs))])
			switch op := r.IntN(10); {
			case op < 4:
				v := values[r.IntN(len(values))]
				ours.Put(ref, v)
				theirs.Put(ref, v)
				// OPA may reuse the slice it passed.
				ref[len(ref)-1] = ast.StringTerm("reused")
			case op < 8:
				gv, gu := ours.Get(ref)
				wv, wu := theirs.Get(ref)
				if gu != wu || (gv == nil) != (wv == nil) || gv != nil && !gv.Equal(wv) {
					t.Fatalf("run %d step %d: Get(%v) = %v, %v; OPA's cache: %v, %v", run, step, ref, gv, gu, wv, wu)
				}
			case op == 8 && depth < 3:
				ours.Push()
				theirs.Push()
				depth++
			case op == 9 && depth > 0:
				ours.Pop()
				theirs.Pop()
				depth--
			}
		}
		gk, wk := ours.Keys(), theirs.Keys()
		sortRefs := func(k []ast.Ref) { slices.SortFunc(k, func(a, b ast.Ref) int { return a.Compare(b) }) }
		sortRefs(gk)
		sortRefs(wk)
		if !slices.EqualFunc(gk, wk, func(a, b ast.Ref) bool { return a.Equal(b) }) {
			t.Fatalf("run %d: Keys() = %v; OPA's cache: %v", run, gk, wk)
		}
		putRuleCache(ours)
	}
}

// A cache given back holds nothing for the next evaluation, whatever
// frames the last one left open.
func TestRuleCacheIsEmptyWhenReused(t *testing.T) {
	c := getRuleCache()
	ref := ast.MustParseRef("data.toolgate.request.decision")
	c.Put(ref, ast.StringTerm("allow"))
	c.Push()
	c.Put(ref, nil)
	putRuleCache(c)
	for range 4 {
		c := getRuleCache()
		if v, undefined := c.Get(ref); v != nil || undefined || len(c.frames) != 1 || len(c.Keys()) != 0 {
			t.Fatalf("a reused cache holds %v (undefined %v), %d frames", v, undefined, len(c.frames))
		}
		putRuleCache(c)
	}
}
