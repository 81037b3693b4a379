package mcpmsg

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// Writing JSON, and changing the members and strings of a message that
// Parse (or an upstream's parser, when it is the upstream's) read: the
// bytes around what changes are kept as they were.

// Quote returns s as a JSON string.
func Quote(s string) []byte {
	return AppendQuote(nil, s)
}

// AppendQuote appends s as a JSON string to dst. Invalid UTF-8 becomes U+FFFD.
func AppendQuote(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// ReplaceMember returns a copy of the valid JSON object obj with the value
// of key replaced by value (JSON text), or with key added when absent.
func ReplaceMember(obj []byte, key string, value []byte) []byte {
	start, end, found := MemberSpan(obj, key)
	out := make([]byte, 0, len(obj)+len(value)+len(key)+4)
	if found {
		out = append(out, obj[:start]...)
		out = append(out, value...)
		return append(out, obj[end:]...)
	}
	closing := bytes.LastIndexByte(obj, '}')
	out = append(out, obj[:closing]...)
	if len(bytes.TrimSpace(obj[bytes.IndexByte(obj, '{')+1:closing])) > 0 {
		out = append(out, ',')
	}
	out = AppendQuote(out, key)
	out = append(out, ':')
	out = append(out, value...)
	return append(out, obj[closing:]...)
}

// RemoveMember returns a copy of the valid JSON object obj without key
// (obj itself when it has no such member).
func RemoveMember(obj []byte, key string) []byte {
	return removeMember(obj, func(k []byte) bool { return string(k) == key })
}

// RemoveMemberFold is RemoveMember for a member whose key is key in any
// case: what a decoder that ignores case (Go's encoding/json) reads as
// key. A parsed message holds at most one such member (the parser refuses
// case variants of a key).
func RemoveMemberFold(obj []byte, key string) []byte {
	return removeMember(obj, func(k []byte) bool { return bytes.EqualFold(k, []byte(key)) })
}

// RemoveMembersWithPrefix returns obj without every member whose key
// starts with prefix, in any case (as a decoder that ignores case reads
// it).
//
// It is one pass over obj, whatever the number of members removed (an
// upstream's _meta may hold tens of thousands of forged ones), and writes
// what removing them one by one with RemoveMember would.
func RemoveMembersWithPrefix(obj []byte, prefix string) []byte {
	match := func(k []byte) bool { return len(k) >= len(prefix) && bytes.EqualFold(k[:len(prefix)], []byte(prefix)) }
	open := bytes.IndexByte(obj, '{')
	var out []byte
	pos, lastKept := open+1, -1 // what is copied next; where the last kept member's value ended
	members(obj, func(k []byte, _, end int) bool {
		if !match(k) {
			lastKept = end
			return true
		}
		if out == nil {
			out = append(make([]byte, 0, len(obj)), obj[:open+1]...)
		}
		if lastKept >= 0 {
			// Cut from the end of the last member kept (a comma and the
			// member), as removeMember does after the first member.
			if pos < lastKept {
				out = append(out, obj[pos:lastKept]...)
			}
			pos = end
			return true
		}
		// No member kept before it: it is the first, cut up to the comma
		// after it (see removeMember).
		pos = end
		if i := bytes.IndexByte(obj[end:], ','); i >= 0 && len(bytes.TrimSpace(obj[end:end+i])) == 0 {
			pos = end + i + 1
		}
		return true
	})
	if out == nil {
		return obj
	}
	return append(out, obj[pos:]...)
}

func removeMember(obj []byte, match func(key []byte) bool) []byte {
	start, end, prev := -1, -1, -1
	last := -1 // where the previous member's value ended
	members(obj, func(k []byte, s, e int) bool {
		if match(k) {
			start, end, prev = s, e, last
			return false
		}
		last = e
		return true
	})
	if start < 0 {
		return obj
	}
	// Cut from the end of the previous member, or, for the first member,
	// from the opening brace up to the comma after it.
	out := make([]byte, 0, len(obj))
	if prev >= 0 {
		out = append(out, obj[:prev]...)
		return append(out, obj[end:]...)
	}
	rest := obj[end:]
	if i := bytes.IndexByte(rest, ','); i >= 0 && len(bytes.TrimSpace(rest[:i])) == 0 {
		rest = rest[i+1:]
	}
	out = append(out, obj[:bytes.IndexByte(obj, '{')+1]...)
	return append(out, rest...)
}

// String decodes raw, the JSON text of a value, if it is a string.
func String(raw []byte) (string, bool) {
	var p parser
	return p.stringValue(raw)
}

// ReplaceStrings calls f with each string of data, a valid JSON text
// (member names included), decoded; where f says so, the string is
// replaced by the one it returns. It returns the text with the
// replacements, and whether there were any (data itself when none).
func ReplaceStrings(data []byte, f func(s string) (string, bool)) ([]byte, bool) {
	var out []byte
	last := 0
	eachString(data, func(start, end int, _ bool) bool {
		s, ok := String(data[start:end])
		if !ok {
			return true
		}
		if repl, replace := f(s); replace {
			out = append(out, data[last:start]...)
			out = AppendQuote(out, repl)
			last = end
		}
		return true
	})
	if out == nil {
		return data, false
	}
	return append(out, data[last:]...), true
}

// ContainsString reports whether a string of data, a valid JSON text
// (member names included), holds needle once decoded, however it is
// escaped. Strings without escapes are searched as they are, without
// decoding them.
func ContainsString(data []byte, needle string) bool {
	if bytes.Contains(data, []byte(needle)) {
		return true
	}
	found := false
	eachString(data, func(start, end int, escaped bool) bool {
		if escaped {
			s, ok := String(data[start:end])
			found = ok && strings.Contains(s, needle)
		}
		return !found
	})
	return found
}

// eachString calls f with the bounds of each string of data (its quotes
// included) and whether it holds an escape, until f returns false. It
// jumps from quote to quote and backslash (bytes.IndexByte), so that a
// megabyte of text costs little.
func eachString(data []byte, f func(start, end int, escaped bool) bool) {
	for i := 0; i < len(data); {
		q := bytes.IndexByte(data[i:], '"')
		if q < 0 {
			return
		}
		start, escaped := i+q, false
		i = start + 1
		for {
			q := bytes.IndexByte(data[i:], '"')
			if q < 0 {
				return // not valid JSON
			}
			end := i + q
			for {
				b := bytes.IndexByte(data[i:end], '\\')
				if b < 0 {
					break
				}
				escaped = true
				if i += b + 2; i > end { // past the backslash and the byte it escapes
					break
				}
			}
			if i > end {
				continue // that quote was escaped: the string goes on
			}
			i = end + 1
			break
		}
		if !f(start, i, escaped) {
			return
		}
	}
}
