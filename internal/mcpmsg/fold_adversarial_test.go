package mcpmsg

import (
	"strings"
	"testing"
	"unicode"
)

// Holds: FoldKey's ASCII shortcut (strings.ToLower) agrees with the
// ToLower(ToUpper) it replaced on every ASCII byte and on keys mixing them
// with non-ASCII runes that fold into ASCII (ſ, K), so folded values
// stored by one path (mcpmsg's duplicate-key map, keys.go's names) meet
// those computed by the other.
func TestFoldHoldsASCIIShortcut(t *testing.T) {
	for b := range 0x80 {
		k := "ab" + string(rune(b)) + "Z"
		if got, old := FoldKey(k), strings.ToLower(strings.ToUpper(k)); got != old {
			t.Errorf("FoldKey(%q) = %q, the old fold %q", k, got, old)
		}
	}
	for _, pair := range [][2]string{{"visibility", "viſibility"}, {"KEY", "\u212aey"}, {"ss", "ſſ"}, {"Path", "paTH"}} {
		if FoldKey(pair[0]) != FoldKey(pair[1]) || !SameFold(pair[0], pair[1]) {
			t.Errorf("%q and %q: FoldKey %q, %q; SameFold %v", pair[0], pair[1], FoldKey(pair[0]), FoldKey(pair[1]), SameFold(pair[0], pair[1]))
		}
	}
}

// Holds: every pair of runes of one simple-folding orbit (what
// encoding/json's EqualFold joins), alone and after an ASCII prefix, has
// one FoldKey, and SameFold says so.
func TestFoldHoldsEveryOrbit(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		for o := unicode.SimpleFold(r); o != r; o = unicode.SimpleFold(o) {
			a, b := "id_"+string(r), "ID_"+string(o)
			if FoldKey(a) != FoldKey(b) || !SameFold(a, b) {
				t.Fatalf("%q and %q fold apart: %q, %q", a, b, FoldKey(a), FoldKey(b))
			}
		}
	}
}
