package stdio

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A program's log lines are searched for its secrets in the forms a
// program writes them besides the plain one — its headers or config
// logged as JSON (every character escaped), a token in base64 (standard
// or URL-safe) —, as the relay searches an upstream's messages: a word of
// the line (between blanks) whose JSON escapes or base64 runs decode to
// text holding a secret is redacted whole.

// encodedForms is how many bytes of a line a secret of n bytes may take
// in the longest form searched (each byte a \u escape).
func encodedForms(n int) int { return 6 * n }

// maskEncoded marks in masked (for line[:len(masked)]) each word of line
// that holds one of secrets encoded.
func maskEncoded(line []byte, masked []bool, secrets []string) {
	for i := 0; i < len(masked); {
		for i < len(line) && isBlank(line[i]) {
			i++
		}
		j := i
		for j < len(line) && !isBlank(line[j]) {
			j++
		}
		if j > i && wordHolds(line[i:j], secrets) {
			for k := i; k < min(j, len(masked)); k++ {
				masked[k] = true
			}
		}
		if j == i {
			break
		}
		i = j
	}
}

func isBlank(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }

// wordHolds reports whether word, its JSON escapes decoded, or one of its
// base64 runs decoded holds one of secrets.
func wordHolds(word []byte, secrets []string) bool {
	views := [][]byte{withoutInvisible(word)}
	if bytes.IndexByte(word, '\\') >= 0 {
		views = append(views, withoutInvisible(jsonUnescaped(word)))
	}
	for i, v := range views {
		// A plain occurrence in the word itself is redacted where it is.
		if (i > 0 || len(v) != len(word)) && holdsAny(v, secrets) {
			return true
		}
		for _, run := range base64Runs(v) {
			for off := 0; off < 4 && off < len(run); off++ {
				seg := run[off:]
				if len(seg)%4 == 1 {
					seg = seg[:len(seg)-1]
				}
				if dec, err := base64.RawStdEncoding.DecodeString(string(seg)); err == nil && holdsAny(dec, secrets) {
					return true
				}
			}
		}
	}
	return false
}

func holdsAny(b []byte, secrets []string) bool {
	for _, s := range secrets {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// base64Runs are the runs of b of 8 or more base64 characters (the
// URL-safe alphabet's written as the standard one's), padding left out.
func base64Runs(b []byte) [][]byte {
	var runs [][]byte
	for i := 0; i < len(b); {
		j := i
		var run []byte
		for ; j < len(b); j++ {
			c := b[j]
			switch {
			case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
			case c == '-':
				c = '+'
			case c == '_':
				c = '/'
			default:
				goto end
			}
			run = append(run, c)
		}
	end:
		if len(run) >= 8 {
			runs = append(runs, run)
		}
		i = j + 1
	}
	return runs
}

// jsonUnescaped is b with JSON string escapes decoded (\uXXXX with
// surrogate pairs, and the one-character ones); what is not an escape is
// kept as it is.
func jsonUnescaped(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			out = append(out, b[i])
			continue
		}
		switch c := b[i+1]; c {
		case 'u':
			r, ok := hex4(b[i+2:])
			if !ok {
				out = append(out, b[i])
				continue
			}
			i += 5
			if utf16.IsSurrogate(r) && i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
				if r2, ok := hex4(b[i+3:]); ok {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						r = d
						i += 6
					}
				}
			}
			out = utf8.AppendRune(out, r)
		case '"', '\\', '/':
			out = append(out, c)
			i++
		case 'b', 'f', 'n', 'r', 't':
			out = append(out, ' ')
			i++
		default:
			out = append(out, b[i])
		}
	}
	return out
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(v), err == nil
}

// withoutInvisible is b without the invisible characters a program (or
// what it logs) may break a secret up with: zero-width spaces and joiners,
// the word joiner, the byte order mark, the soft hyphen.
func withoutInvisible(b []byte) []byte {
	if bytes.IndexFunc(b, isInvisible) < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if !isInvisible(r) {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

func isInvisible(r rune) bool {
	return r == '\u200b' || r == '\u200c' || r == '\u200d' || r == '\u2060' || r == '\ufeff' || r == '\u00ad'
}
