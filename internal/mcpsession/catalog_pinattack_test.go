package mcpsession

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// Attack: every tools/list answer passes registry's allowlistTools, which
// called Session.ToolListed once per allowlisted tool; each definition that
// differed from the one known built a whole new catalog (Catalog.With →
// NewCatalog: every definition copied, JSON-encoded and hashed). A listing
// of n tools that all differ a little from the previous one (a counter in
// _meta, which the pins ignore) costs n times the whole catalog: the
// square of the listing. An upstream of 100 allowlisted tools of 160 KiB
// (one 16 MiB answer) makes each listing of each runner cost gigabytes of
// copying. Here 40 tools of 32 KiB (1.3 MiB): one listing should allocate
// a small multiple of what it lists (Session.ToolsListed takes the whole
// listing now, and makes one catalog of it).
func TestPinAttackToolListedCopiesCatalogPerTool(t *testing.T) {
	const n, size = 40, 32 << 10
	pad := strings.Repeat("x", size)
	listing := func(round int) map[string][]byte {
		out := make(map[string][]byte, n)
		for i := range n {
			name := fmt.Sprintf("tool%02d", i)
			out[name] = fmt.Appendf(nil, `{"name":%q,"description":"A tool.","inputSchema":{"type":"object"},"_meta":{"round":%d,"pad":%q}}`, name, round, pad)
		}
		return out
	}
	s := &Session{}
	s.ToolsListed(listing(0))
	next := listing(1)
	total := 0
	for _, raw := range next {
		total += len(raw)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s.ToolsListed(next)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a listing of %d tools, %d KiB: %d KiB allocated", n, total>>10, alloc>>10)
	if alloc > uint64(16*total) {
		t.Errorf("one listing of %d KiB allocated %d MiB (%.0f times its size): each changed tool copies, encodes and hashes the whole catalog",
			total>>10, alloc>>20, float64(alloc)/float64(total))
	}
	if got := s.Tool("tool07"); got == nil || !strings.Contains(string(got.Raw), `"round":1`) {
		t.Fatal("the catalog does not hold the latest listing")
	}
}
