package mcpmsg

import "strings"

// Many JSON decoders match object keys to the fields they know without
// regard to case: Go's encoding/json folds each key with Unicode simple case
// folding, so "TICKET_ID" fills ticket_id and "viſibility" (with U+017F LONG
// S) fills visibility. Parse refuses two keys of one object that fold
// together; the gateway also refuses an argument that folds onto a parameter
// a tool declares without being spelled like it, because the policy reads
// keys exactly and the upstream may not.

// FoldKey maps keys that bytes.EqualFold considers equal to one string. It
// may merge a few more (it is at least as strict as EqualFold), never fewer.
func FoldKey(k string) string {
	if isASCII(k) {
		return strings.ToLower(k) // the same, without a copy when k is in lower case already
	}
	return strings.ToLower(strings.ToUpper(k))
}

// SameFold reports whether a and b are different spellings of keys that a
// case-insensitive decoder would take for one another.
func SameFold(a, b string) bool {
	switch {
	case a == b:
		return false
	case strings.EqualFold(a, b):
		return true
	case isASCII(a) && isASCII(b):
		return false // FoldKey joins no two ASCII strings EqualFold keeps apart
	}
	return FoldKey(a) == FoldKey(b)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
