package policy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/bigbuf"
	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// Strings with escapes around the size from which their unescaped text is
// gathered into populated memory, starting with an escape of every width
// (one byte, two, three, a surrogate pair of four), read as encoding/json
// reads them.
func TestJSONTermLargeEscapedStrings(t *testing.T) {
	firsts := []string{`\n`, `\u0000`, `\u00e9`, `\u2028`, `\ud83d\udc4d`, `\\`, `a`, `é`}
	for _, size := range []int{bigbuf.Threshold - 13, bigbuf.Threshold - 1, bigbuf.Threshold, bigbuf.Threshold + 1, 4 * bigbuf.Threshold} {
		for _, first := range firsts {
			for _, fill := range []string{"x", `\u00e9`, `\ud83d\udc4d`, `\"`} {
				body := first + strings.Repeat(fill, (size-len(first))/len(fill)+1)
				for len(body) > size && len(body)-len(fill) >= len(first) && len(body)-len(fill) >= size {
					body = body[:len(body)-len(fill)]
				}
				for _, last := range []string{"", `\ud83d\udc4d`, "é"} {
					doc := `{"s":"` + body + last + `"}`
					got, err := jsonTerm([]byte(doc))
					if err != nil {
						t.Fatalf("a string of %d bytes starting %s, of %s: %v", len(body), first, fill, err)
					}
					if want := referenceValue(t, doc); got.Value.Compare(want) != 0 {
						t.Fatalf("a string of %d bytes starting %s, of %s, ending %q: not encoding/json's reading", len(body), first, fill, last)
					}
				}
			}
		}
	}
}

// BenchmarkUnescape decodes a megabyte of JSON string contents: prose with
// a line break every 56 bytes (as the side-by-side harness's large
// result), every other character escaped, and one escape at the end.
func BenchmarkUnescape(b *testing.B) {
	line := strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit\n", 1<<20/56+1)[:1<<20]
	for _, c := range []struct{ name, s string }{
		{"lines", strings.TrimSuffix(strings.TrimPrefix(string(mcpmsg.Quote(line)), `"`), `"`)},
		{"dense", strings.Repeat(`a\u00e9\n\"`, 1<<20/12)},
		{"one", strings.Repeat("x", 1<<20) + `\n`},
	} {
		s := c.s
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				if _, ok := unescape(s); !ok {
					b.Fatal("invalid")
				}
			}
		})
	}
}

func TestHex4(t *testing.T) {
	for _, s := range []string{"0000", "00e9", "00E9", "ffff", "FFFF", "d83d", "12ab", "0x12", "+123", "12_3", "g000", "123", "00é"} {
		want, err := strconv.ParseUint(s, 16, 32)
		got, ok := hex4(s, 0)
		if ok != (err == nil && len(s) == 4) || ok && got != rune(want) {
			t.Errorf("hex4(%q) = %x %v, strconv reads %x %v", s, got, ok, want, err)
		}
	}
}
