package approval

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
)

// Visible is text with its invisible characters written as \u escapes, so
// that no argument or reason hides text or shows it reordered to a person
// judging a call: on the console's pages, in webhook announcements and in
// in-band questions. Invisible means every format character (Unicode's Cf:
// bidirectional controls, zero-width spaces, …) and every other
// Default_Ignorable_Code_Point (Other_Default_Ignorable_Code_Point, such as
// the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0 or the combining
// grapheme joiner U+034F, and the variation selectors), which render as
// nothing. Ordinary whitespace (space, tab, line breaks) is kept as it is.
// In JSON text every such character is inside a string (outside strings
// JSON is ASCII), where the escape means the same character.
func Visible(text string) string {
	if !strings.ContainsFunc(text, isInvisible) {
		return text
	}
	var b strings.Builder
	for _, r := range text {
		if !isInvisible(r) {
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

// VisibleCut is Visible of text cut to at most n bytes (marked "…" when
// cut): outside text of any length shown to a person, such as a provider's
// error description or a name taken from a link.
func VisibleCut(text string, n int) string { return Visible(cut(text, n)) }

// isInvisible reports whether Visible escapes r: a format character or
// another default-ignorable code point (none of which is whitespace).
func isInvisible(r rune) bool {
	return unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}
