package approval

import (
	"encoding/json"
	"testing"
	"unicode"
)

// TestVisibleEscapesDefaultIgnorables: every default-ignorable code point
// (format characters, Other_Default_Ignorable_Code_Point, variation
// selectors), which renders as nothing, is written as a \u escape (a
// surrogate pair past U+FFFF); ordinary whitespace and visible text stay as
// they are, and JSON text stays the same JSON.
func TestVisibleEscapesDefaultIgnorables(t *testing.T) {
	for _, c := range []struct {
		r    rune
		want string
	}{
		{'\u00ad', `\u00ad`},           // SOFT HYPHEN (Cf)
		{'\u034f', `\u034f`},           // COMBINING GRAPHEME JOINER
		{'\u115f', `\u115f`},           // HANGUL CHOSEONG FILLER
		{'\u1160', `\u1160`},           // HANGUL JUNGSEONG FILLER
		{'\u17b4', `\u17b4`},           // KHMER VOWEL INHERENT AQ
		{'\u180b', `\u180b`},           // MONGOLIAN FREE VARIATION SELECTOR ONE
		{'\u200b', `\u200b`},           // ZERO WIDTH SPACE (Cf)
		{'\u202e', `\u202e`},           // RIGHT-TO-LEFT OVERRIDE (Cf)
		{'\u2065', `\u2065`},           // unassigned, default ignorable
		{'\u3164', `\u3164`},           // HANGUL FILLER
		{'\ufe00', `\ufe00`},           // VARIATION SELECTOR-1
		{'\ufe0f', `\ufe0f`},           // VARIATION SELECTOR-16
		{'\uffa0', `\uffa0`},           // HALFWIDTH HANGUL FILLER
		{'\U000e0001', `\udb40\udc01`}, // LANGUAGE TAG (Cf)
		{'\U000e0100', `\udb40\udd00`}, // VARIATION SELECTOR-17
		{'\U000e01ef', `\udb40\uddef`}, // VARIATION SELECTOR-256
	} {
		text := "acct-1234" + string(c.r) + "!"
		if got, want := Visible(text), "acct-1234"+c.want+"!"; got != want {
			t.Errorf("Visible(%q) = %q, want %q", text, got, want)
		}
		// In a JSON string the escape means the same character.
		var back string
		if err := json.Unmarshal([]byte(`"`+Visible(text)+`"`), &back); err != nil || back != text {
			t.Errorf("U+%04X: the escaped JSON string reads %q (%v), want %q", c.r, back, err, text)
		}
	}
	for _, text := range []string{"", "pay to acct-1234", "a b\tc\nd\r\ne", "naïve — 日本語 한글 😀", "\u00a0\u2003\u3000"} {
		if got := Visible(text); got != text {
			t.Errorf("Visible(%q) = %q, want it unchanged", text, got)
		}
	}
	// Every default-ignorable code point Go knows of is escaped.
	for _, tab := range []*unicode.RangeTable{unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector} {
		for _, rg := range tab.R16 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				if Visible(string(r)) == string(r) {
					t.Errorf("U+%04X is not escaped", r)
				}
			}
		}
		for _, rg := range tab.R32 {
			for r := rune(rg.Lo); r <= rune(rg.Hi); r += rune(rg.Stride) {
				if Visible(string(r)) == string(r) {
					t.Errorf("U+%04X is not escaped", r)
				}
			}
		}
	}
}
