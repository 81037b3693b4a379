package policy

import (
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// ruleCache is the cache of rule values one evaluation keeps (OPA's
// topdown.VirtualCache), in a form that costs next to nothing per call.
//
// OPA's own cache is a tree with a hash map and a node per step of every
// cached reference, built anew for every evaluation: for the default
// policies, about a third of what an evaluation allocated. This one is a
// list of entries, an index from a reference's hash to the last entry with
// that hash, and the references' terms copied into one slice; all of it
// is kept for the next evaluation (ruleCaches), so an evaluation in the
// steady state allocates nothing for its cache. It behaves as OPA's does:
// frames pushed and popped (for `with`), a lookup seeing the top frame
// only, an undefined mark that a later value does not clear.
type ruleCache struct {
	frames  []ruleFrame
	entries []ruleEntry // of every frame, the top frame's last
	terms   []*ast.Term // the cached references' terms, entry after entry
	spare   []map[int]int32
}

type ruleFrame struct {
	first int           // the frame's first entry
	index map[int]int32 // a reference's hash → 1 + its last entry
}

type ruleEntry struct {
	ref       ast.Ref // a copy, in terms
	value     *ast.Term
	undefined bool
	prev      int32 // 1 + the frame's previous entry with the same hash, or 0
}

// ruleCaches keeps ruleCaches between evaluations.
var ruleCaches = sync.Pool{New: func() any { return newRuleCache() }}

func newRuleCache() *ruleCache {
	c := &ruleCache{}
	c.Push()
	return c
}

// getRuleCache returns an empty cache for one evaluation; putRuleCache
// takes it back when the evaluation is over.
func getRuleCache() *ruleCache { return ruleCaches.Get().(*ruleCache) }

func putRuleCache(c *ruleCache) {
	for len(c.frames) > 1 {
		c.Pop()
	}
	clear(c.frames[0].index)
	// Values and terms are dropped, so the cache keeps no input alive.
	clear(c.entries)
	c.entries = c.entries[:0]
	clear(c.terms)
	c.terms = c.terms[:0]
	ruleCaches.Put(c)
}

// Push starts a new, empty frame.
func (c *ruleCache) Push() {
	var m map[int]int32
	if n := len(c.spare); n > 0 {
		m, c.spare = c.spare[n-1], c.spare[:n-1]
	} else {
		m = make(map[int]int32)
	}
	c.frames = append(c.frames, ruleFrame{first: len(c.entries), index: m})
}

// Pop drops the top frame and what it holds.
func (c *ruleCache) Pop() {
	n := len(c.frames) - 1
	f := c.frames[n]
	clear(f.index)
	c.spare = append(c.spare, f.index)
	clear(c.entries[f.first:])
	c.entries = c.entries[:f.first]
	c.frames = c.frames[:n]
}

// find returns the index of ref's entry in the top frame, or -1.
func (c *ruleCache) find(ref ast.Ref, h int) int {
	for i := c.frames[len(c.frames)-1].index[h]; i > 0; i = c.entries[i-1].prev {
		if c.entries[i-1].ref.Equal(ref) {
			return int(i - 1)
		}
	}
	return -1
}

// Get returns the value cached for ref in the top frame; nil and true when
// ref is marked undefined, nil and false when nothing is cached.
func (c *ruleCache) Get(ref ast.Ref) (*ast.Term, bool) {
	i := c.find(ref, ref.Hash())
	switch {
	case i < 0:
		return nil, false
	case c.entries[i].undefined:
		return nil, true
	}
	return c.entries[i].value, false
}

// Put caches value for ref in the top frame, or marks ref undefined when
// value is nil.
func (c *ruleCache) Put(ref ast.Ref, value *ast.Term) {
	h := ref.Hash()
	if i := c.find(ref, h); i >= 0 {
		if value != nil {
			c.entries[i].value = value
		} else {
			c.entries[i].undefined = true
		}
		return
	}
	// OPA may reuse the slice it passes; the terms are kept, not the slice.
	start := len(c.terms)
	c.terms = append(c.terms, ref...)
	index := c.frames[len(c.frames)-1].index
	c.entries = append(c.entries, ruleEntry{ref: c.terms[start:len(c.terms):len(c.terms)], value: value,
		undefined: value == nil, prev: index[h]})
	index[h] = int32(len(c.entries))
}

// Keys returns the references cached with a value in the top frame.
func (c *ruleCache) Keys() []ast.Ref {
	var keys []ast.Ref
	for _, e := range c.entries[c.frames[len(c.frames)-1].first:] {
		if e.value != nil {
			keys = append(keys, e.ref)
		}
	}
	return keys
}

// Interface guards
var _ topdown.VirtualCache = (*ruleCache)(nil)
