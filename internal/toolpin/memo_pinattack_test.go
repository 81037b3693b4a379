package toolpin

import (
	"fmt"
	"strings"
	"testing"
)

// Attack: the memo of digests (Pins.digests) keeps each definition's whole
// text as its key, and is bounded by its number of entries (10,000), not
// by bytes. Every tool of every tools/list answer and call passes through
// it (Pins.check). An upstream whose listings each show a tool of a few
// MiB that differs a little each time (a counter in _meta or in the
// description: a member the pin ignores is enough) makes the gateway keep
// every one: 10,000 listings of max_response_size (16 MiB) hold 160 GiB.
// Here 64 listings of a 1 MiB tool: the memo should keep a bounded number
// of bytes (say, keyed by a hash of the text), not the texts.
func TestPinAttackDigestMemoHoldsWholeDefinitions(t *testing.T) {
	var d digests
	filler := strings.Repeat("x", 1<<20)
	for i := range 64 {
		raw := fmt.Sprintf(`{"name":"weather","description":"Weather.","inputSchema":{"type":"object"},"_meta":{"n":%d,"pad":%q}}`, i, filler)
		d.of([]byte(raw))
	}
	held := 0
	d.mu.Lock()
	for k, v := range d.m {
		held += len(k) + len(v)
	}
	d.mu.Unlock()
	t.Logf("the memo holds %d entries, %d bytes", len(d.m), held)
	if held > 8<<20 {
		t.Errorf("after 64 listings of a 1 MiB tool the memo of digests holds %d MiB (it grows to 10,000 definitions, whatever their size)", held>>20)
	}
}
