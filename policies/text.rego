# METADATA
# title: toolgate text helpers
# description: |
#   Helpers for rules of both stages that match text: the invisible
#   characters toolgate removes before it compares anything, and a function
#   that removes them. Use text.clean(s) before matching keywords in
#   arguments or results, so that "ig\u200bnore" or a soft hyphen does not
#   dodge a rule.
package toolgate.text

# invisible_ranges: every character that renders as nothing or changes the
# direction or shape of text without a visible mark, as [first, last] code
# points (hexadecimal): Unicode's Default_Ignorable_Code_Point, its
# Bidi_Control characters, and every other format character (Cf) except the
# visible Prepended_Concatenation_Marks (the interlinear annotation
# characters U+FFF9..U+FFFB and the Egyptian hieroglyph format controls).
# Derived from the Unicode 15.0 tables; policies_test.go checks the list
# against them (and, when the Unicode data files are installed, against
# DerivedCoreProperties.txt, PropList.txt and UnicodeData.txt).
invisible_ranges := [
	["00AD", "00AD"], # SOFT HYPHEN
	["034F", "034F"], # COMBINING GRAPHEME JOINER
	["061C", "061C"], # ARABIC LETTER MARK
	["115F", "1160"], # HANGUL CHOSEONG and JUNGSEONG FILLER
	["17B4", "17B5"], # KHMER VOWEL INHERENT AQ and AA
	["180B", "180F"], # MONGOLIAN FREE VARIATION SELECTORS, VOWEL SEPARATOR
	["200B", "200F"], # ZERO WIDTH SPACE, (NON-)JOINER, LRM, RLM
	["202A", "202E"], # bidirectional embeddings and overrides
	["2060", "206F"], # WORD JOINER, invisible operators, isolates, deprecated format characters
	["3164", "3164"], # HANGUL FILLER
	["FE00", "FE0F"], # VARIATION SELECTORS
	["FEFF", "FEFF"], # ZERO WIDTH NO-BREAK SPACE (BOM)
	["FFA0", "FFA0"], # HALFWIDTH HANGUL FILLER
	["FFF0", "FFFB"], # unassigned, INTERLINEAR ANNOTATION characters
	["13430", "1343F"], # EGYPTIAN HIEROGLYPH format controls
	["1BCA0", "1BCA3"], # SHORTHAND FORMAT controls
	["1D173", "1D17A"], # MUSICAL SYMBOL format controls
	["E0000", "E0FFF"], # TAG characters, VARIATION SELECTORS SUPPLEMENT, reserved
]

# invisible_pattern matches one invisible character:
# [\x{00AD}-\x{00AD}\x{034F}-\x{034F}…].
invisible_pattern := concat("", ["[", concat("", [sprintf(`\x{%s}-\x{%s}`, r) | some r in invisible_ranges]), "]"])

# clean(s) is s without its invisible characters.
clean(s) := s if {
	not has_invisible(s)
} else := regex.replace(s, invisible_pattern, "")

# has_invisible(s) is true when s holds an invisible character. Every
# invisible character is outside ASCII, so only the part of s from its
# first character outside ASCII to its last is matched: trim is a quick
# loop, where a regular expression without a literal reads a few tens of
# MB/s, and most text is ASCII.
has_invisible(s) := regex.match(invisible_pattern, trim(s, ascii))

# ascii holds every ASCII character, U+0000 to U+007F.
ascii := "\u0000\u0001\u0002\u0003\u0004\u0005\u0006\u0007\u0008\u0009\u000a\u000b\u000c\u000d\u000e\u000f\u0010\u0011\u0012\u0013\u0014\u0015\u0016\u0017\u0018\u0019\u001a\u001b\u001c\u001d\u001e\u001f !\u0022#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\u005c]^_`abcdefghijklmnopqrstuvwxyz{|}~\u007f"
