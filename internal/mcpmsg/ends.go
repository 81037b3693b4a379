package mcpmsg

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// StringEnds decodes the ends of raw, the JSON text of a string of a
// message Parse accepted, leaving out the characters skip reports: its
// first n bytes or more (head) and its last n bytes or more (tail), or all
// of it (whole, in head) when they meet. Only the ends are read: a check
// of what spans two strings (a secret split across two text items) need
// not decode megabytes between them.
func StringEnds(raw []byte, n int, skip func(rune) bool) (head, tail string, whole bool) {
	s := raw[1 : len(raw)-1]
	var hb []byte
	i := 0
	for i < len(s) && len(hb) < n {
		r, size := decodeAt(s, i)
		if !skip(r) {
			hb = utf8.AppendRune(hb, r)
		}
		i += size
	}
	if i == len(s) {
		return string(hb), "", true
	}
	for back := 4*n + 16; ; back *= 2 {
		j := decodeStart(s, i, max(i, len(s)-back))
		var tb []byte
		for k := j; k < len(s); {
			r, size := decodeAt(s, k)
			if !skip(r) {
				tb = utf8.AppendRune(tb, r)
			}
			k += size
		}
		switch {
		case j == i:
			return string(hb) + string(tb), "", true
		case len(tb) >= n:
			return string(hb), string(tb), false
		}
	}
}

// decodeAt decodes the character at s[i:], the contents of a valid
// string: as it is, or escaped (a surrogate pair of escapes is one).
func decodeAt(s []byte, i int) (rune, int) {
	if s[i] != '\\' {
		return utf8.DecodeRune(s[i:])
	}
	switch s[i+1] {
	case 'u':
		r, _ := hex4(s, i+2)
		if utf16.IsSurrogate(r) {
			lo, _ := hex4(s, i+8)
			return utf16.DecodeRune(r, lo), 12
		}
		return r, 6
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	}
	return rune(s[i+1]), 2
}

// decodeStart is where decoding may start at or before j, and not before
// lo (itself such a place), in s, the contents of a valid string: not
// inside a character's UTF-8 bytes, an escape, or a surrogate pair.
func decodeStart(s []byte, lo, j int) int {
	for j > lo && !utf8.RuneStart(s[j]) {
		j--
	}
	if j > lo && backslashesBefore(s, lo, j)%2 == 1 {
		j-- // after the backslash of an escape
	}
	for d := 2; d <= 5; d++ { // among the hexadecimal digits of a \u escape
		if p := j - d; p >= lo && s[p] == '\\' && s[p+1] == 'u' && backslashesBefore(s, lo, p)%2 == 0 {
			j = p
			break
		}
	}
	// The second half of a surrogate pair.
	if j-6 >= lo && s[j] == '\\' && s[j+1] == 'u' {
		if r, _ := hex4(s, j+2); r >= 0xDC00 && r <= 0xDFFF && backslashesBefore(s, lo, j)%2 == 0 {
			j -= 6
		}
	}
	return j
}

// backslashesBefore is how many backslashes come just before s[j], back
// to lo.
func backslashesBefore(s []byte, lo, j int) int {
	k := 0
	for j-k-1 >= lo && s[j-k-1] == '\\' {
		k++
	}
	return k
}

// Elements calls f with the JSON text of each element of arr, a JSON
// array of a message Parse accepted, until f returns false; it calls
// nothing when arr is not an array. It does not validate again: strings
// are skipped quote to quote (bytes.IndexByte), so that an element of a
// megabyte costs little.
func Elements(arr []byte, f func(elem []byte) bool) {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return
	}
	for i++; ; i++ { // past '[' or ','
		i = skipSpace(arr, i)
		if i >= len(arr) || arr[i] == ']' {
			return
		}
		end := skipValue(arr, i)
		if end < 0 || !f(arr[i:end]) {
			return
		}
		if i = skipSpace(arr, end); i >= len(arr) || arr[i] != ',' {
			return
		}
	}
}

// Members calls f with each key of obj, a JSON object of a message Parse
// accepted, decoded, and the JSON text of its value; it calls nothing when
// obj is not an object. Like Elements, it does not validate again.
func Members(obj []byte, f func(key, value []byte)) {
	members(obj, func(key []byte, start, end int) bool {
		f(key, obj[start:end])
		return true
	})
}

// MemberSpan is where the value of key (decoded, as a runner reads it) is
// in obj, a JSON object of a message Parse accepted: obj[start:end] is its
// JSON text; ok is false when obj has no such member. Like Members, it
// skips strings quote to quote, so that finding a member after a megabyte
// of text costs little; it does not validate (Parse already did). MemberOf
// and the other member helpers are built on it.
func MemberSpan(obj []byte, key string) (start, end int, ok bool) {
	members(obj, func(k []byte, s, e int) bool {
		if string(k) != key {
			return true
		}
		start, end, ok = s, e, true
		return false
	})
	return start, end, ok
}

// members calls f with each key of obj, decoded, and where its value is,
// until f returns false.
func members(obj []byte, f func(key []byte, start, end int) bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	for i++; ; i++ { // past '{' or ','
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return
		}
		kEnd := stringEnd(obj, i)
		if kEnd < 0 {
			return
		}
		key := obj[i+1 : kEnd-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			k, _ := String(obj[i:kEnd])
			key = []byte(k)
		}
		if i = skipSpace(obj, kEnd); i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipSpace(obj, i+1)
		end := skipValue(obj, i)
		if end < 0 || !f(key, i, end) {
			return
		}
		if i = skipSpace(obj, end); i >= len(obj) || obj[i] != ',' {
			return
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue is where the valid JSON value at b[i:] ends; -1 when b ends
// first.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); {
			switch b[j] {
			case '"':
				if j = stringEnd(b, j); j < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
			j++
		}
		return -1
	}
	j := i // a number or a literal
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j
		}
		j++
	}
	return j
}

// stringEnd is where the string at b[i] (its opening quote) ends, past its
// closing quote; -1 when b ends first.
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return -1
		}
		j += q
		if backslashesBefore(b, i+1, j)%2 == 0 {
			return j + 1
		}
		j++
	}
}
