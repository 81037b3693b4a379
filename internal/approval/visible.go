package approval

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
)

// Visible is text with its format characters (Unicode's Cf: bidirectional
// controls, zero-width spaces, …) written as \u escapes, so that no
// argument or reason hides text or shows it reordered to a person judging
// a call: on the console's pages and in webhook announcements. In JSON
// text every such character is inside a string (outside strings JSON is
// ASCII), where the escape means the same character.
func Visible(text string) string {
	if !strings.ContainsFunc(text, isFormat) {
		return text
	}
	var b strings.Builder
	for _, r := range text {
		if !isFormat(r) {
			b.WriteRune(r)
			continue
		}
		if r > 0xFFFF {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			continue
		}
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

func isFormat(r rune) bool { return unicode.Is(unicode.Cf, r) }
