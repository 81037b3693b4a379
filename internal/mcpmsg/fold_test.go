package mcpmsg

import (
	"bytes"
	"testing"
	"unicode"
	"unicode/utf8"
)

// Objects of up to smallObject keys compare keys with bytes.EqualFold; larger
// ones switch to a map keyed by FoldKey. A key pair EqualFold calls equal but
// foldKey keeps apart would be a duplicate that only big objects let through.
func TestFoldKeyIsAtLeastAsStrictAsEqualFold(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		a := string(r)
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			b := string(f)
			if !bytes.EqualFold([]byte(a), []byte(b)) {
				t.Fatalf("EqualFold(%q, %q) = false for a SimpleFold orbit", a, b)
			}
			if FoldKey(a) != FoldKey(b) {
				t.Errorf("foldKey(%q) = %q but foldKey(%q) = %q: EqualFold says they are equal", a, FoldKey(a), b, FoldKey(b))
			}
		}
	}
}

// encoding/json matches struct fields by folding each rune to
// ToUpper(ToLower(r)); every pair it treats as equal must be a duplicate for
// Parse, in small objects and in big ones.
func TestKeysEncodingJSONFoldsAreDuplicates(t *testing.T) {
	byFold := map[rune][]rune{}
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		f := unicode.ToUpper(unicode.ToLower(r))
		byFold[f] = append(byFold[f], r)
	}
	for r := rune('a'); r <= 'z'; r++ {
		byFold[r-'a'+'A'] = append(byFold[r-'a'+'A'], r)
	}
	for f, rs := range byFold {
		group := append([]rune{f}, rs...)
		for _, a := range group {
			for _, b := range group {
				if a == b {
					continue
				}
				ka, kb := []byte(string(a)), []byte(string(b))
				if !bytes.EqualFold(ka, kb) && FoldKey(string(ka)) != FoldKey(string(kb)) {
					t.Errorf("encoding/json folds %U and %U together, but Parse sees distinct keys", a, b)
				}
			}
		}
	}
}
