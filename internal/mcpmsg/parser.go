package mcpmsg

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The strict parser itself: one pass over the message's bytes, which
// refuses what JSON leaves open (see the package documentation) and
// decodes only the strings that are asked for.

// parser validates JSON text strictly. It never allocates for ASCII keys
// without escapes in objects of up to smallObject members.
type parser struct {
	data      []byte
	pos       int
	maxDepth  int
	maxValues int // 0: no bound
	values    int
	// spelled, when not nil, are the members whose case variants the next
	// object value read must not have (see checkSpelling).
	spelled *spelling
}

const smallObject = 16

func (p *parser) fail(msg string) error { return &SyntaxError{Offset: p.pos, Msg: msg} }

func (p *parser) failAt(off int, msg string) error { return &SyntaxError{Offset: off, Msg: msg} }

// duplicate refuses a key that repeats one of its object's.
func (p *parser) duplicate(off int, key []byte) error {
	q := strconv.Quote(string(key))
	return &SyntaxError{Offset: off, Msg: "duplicate key " + q + " (keys may not repeat, even in another case)", Quoted: q}
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value checks the value at p.pos (after spaces) and returns where it ends.
func (p *parser) value(depth int) (int, error) {
	p.skipSpace()
	if p.pos >= len(p.data) {
		return 0, p.fail("unexpected end of input")
	}
	if p.values++; p.maxValues > 0 && p.values > p.maxValues {
		return 0, &SyntaxError{Offset: p.pos, Msg: fmt.Sprintf("more than %d JSON values in one message", p.maxValues), OverLimit: true}
	}
	var err error
	switch c := p.data[p.pos]; {
	case c == '{':
		if depth > p.maxDepth {
			return 0, p.fail("nesting too deep (deeper than the gateway's max_json_depth)")
		}
		spelled := p.spelled
		p.spelled = nil
		err = p.object(depth, func(key []byte, start int) error {
			if spelled != nil {
				if err := p.checkSpelling(key, start, spelled); err != nil {
					return err
				}
			}
			_, err := p.value(depth + 1)
			return err
		})
	case c == '[':
		if depth > p.maxDepth {
			return 0, p.fail("nesting too deep (deeper than the gateway's max_json_depth)")
		}
		err = p.array(depth)
	case c == '"':
		_, err = p.str(false)
	case c == 't':
		err = p.literal("true")
	case c == 'f':
		err = p.literal("false")
	case c == 'n':
		err = p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		err = p.number()
	default:
		return 0, p.fail("unexpected character")
	}
	return p.pos, err
}

// object reads an object at p.pos, calling member for each key with p.pos
// at the start of the value; member must consume the value. Keys are
// checked for duplicates, exactly and ignoring case.
func (p *parser) object(depth int, member func(key []byte, valueStart int) error) error {
	p.pos++ // '{'
	var small [smallObject][]byte
	keys := small[:0]
	var many map[string]struct{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return p.fail("expected a string key")
		}
		keyStart := p.pos
		key, err := p.str(true)
		if err != nil {
			return err
		}
		if many == nil {
			for _, k := range keys {
				if bytes.EqualFold(k, key) {
					return p.duplicate(keyStart, key)
				}
			}
			if len(keys) < smallObject {
				keys = append(keys, key)
			} else {
				many = make(map[string]struct{}, 2*smallObject)
				for _, k := range keys {
					many[FoldKey(string(k))] = struct{}{}
				}
			}
		}
		if many != nil {
			f := FoldKey(string(key))
			if _, dup := many[f]; dup {
				return p.duplicate(keyStart, key)
			}
			many[f] = struct{}{}
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return p.fail("expected ':' after key")
		}
		p.pos++
		p.skipSpace()
		if err := member(key, p.pos); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.fail("unexpected end of input in object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return nil
		default:
			return p.fail("expected ',' or '}' in object")
		}
	}
}

func (p *parser) array(depth int) error {
	p.pos++ // '['
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return nil
	}
	for {
		if _, err := p.value(depth + 1); err != nil {
			return err
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return nil
		default:
			return p.fail("expected ',' or ']' in array")
		}
	}
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.fail("invalid literal")
	}
	p.pos += len(word)
	return nil
}

func (p *parser) number() error {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	intStart := p.pos
	if digits() == 0 {
		return p.failAt(start, "invalid number")
	}
	if p.data[intStart] == '0' && p.pos-intStart > 1 {
		return p.failAt(start, "invalid number: leading zero")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return p.failAt(start, "invalid number")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return p.failAt(start, "invalid number")
		}
	}
	return nil
}

// str reads a string at p.pos. With decode set it returns the decoded
// contents (aliasing the input when there are no escapes).
func (p *parser) str(decode bool) ([]byte, error) {
	start := p.pos
	p.pos++ // '"'
	contentStart := p.pos
	escaped := false
	for p.pos < len(p.data) {
		p.pos = len(p.data) - len(plainPrefixRest(p.data[p.pos:]))
		if p.pos >= len(p.data) {
			break
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			content := p.data[contentStart:p.pos]
			p.pos++
			if !decode {
				return nil, nil
			}
			if !escaped {
				return content, nil
			}
			return p.unescape(content), nil
		case c == '\\':
			escaped = true
			if err := p.escape(); err != nil {
				return nil, err
			}
		case c < 0x20:
			return nil, p.fail("control character in string")
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return nil, p.fail("invalid UTF-8 in string")
			}
			p.pos += size
		}
	}
	return nil, p.failAt(start, "unterminated string")
}

// plainPrefixRest is b after its first bytes that are plainASCII: eight
// at a time, the first byte that is not found in its word by the word's
// mask (a word of text in short lines has a \n to stop at every few
// dozen bytes: walking its last bytes one by one cost half the time).
func plainPrefixRest(b []byte) []byte {
	for len(b) >= 8 {
		if m := unplainBytes(binary.LittleEndian.Uint64(b)); m != 0 {
			return b[bits.TrailingZeros64(m)/8:]
		}
		b = b[8:]
	}
	for len(b) > 0 && plainASCII[b[0]] {
		b = b[1:]
	}
	return b
}

// plainASCII marks the bytes a string may hold as they are: printable
// ASCII except the quote and the backslash.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// unplainBytes has the high bit of a byte of w set where it is not
// plainASCII (below 0x20, a quote, a backslash, or 0x80 and above), at least for the first such byte (in memory order, the
// lowest): the tests borrow from a byte that matches into the next, so a
// byte after one that matches may be marked too, never one before.
func unplainBytes(w uint64) uint64 {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	below := (w - ones*0x20) & ^w & highs // a byte below 0x20 (or ≥ 0x80)
	quote := w ^ (ones * '"')
	quote = (quote - ones) & ^quote & highs
	slash := w ^ (ones * '\\')
	slash = (slash - ones) & ^slash & highs
	return below | quote | slash | w&highs
}

// escape checks the escape sequence at p.pos.
func (p *parser) escape() error {
	if p.pos+1 >= len(p.data) {
		return p.fail("unterminated escape")
	}
	switch p.data[p.pos+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		p.pos += 2
		return nil
	case 'u':
		r, ok := hex4(p.data, p.pos+2)
		if !ok {
			return p.fail(`invalid \u escape`)
		}
		p.pos += 6
		if utf16.IsSurrogate(r) {
			// Only a high surrogate followed by a low one is a character.
			lo, ok := rune(0), false
			if r < 0xDC00 && p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
				lo, ok = hex4(p.data, p.pos+2)
			}
			if !ok || utf16.DecodeRune(r, lo) == utf8.RuneError {
				return p.fail("lone surrogate in string")
			}
			p.pos += 6
		}
		return nil
	}
	return p.fail("invalid escape")
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[at:at+4]), 16, 32)
	return rune(v), err == nil
}

// unescape decodes the contents of a valid string with escapes.
func (p *parser) unescape(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			out = append(out, s[i])
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, _ := hex4(s, i+2)
			if utf16.IsSurrogate(r) {
				lo, _ := hex4(s, i+8)
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			out = utf8.AppendRune(out, r)
			i += 6
			continue
		default:
			out = append(out, s[i+1])
		}
		i += 2
	}
	return out
}

// stringValue decodes raw, the JSON text of a value, if it is a string.
func (p *parser) stringValue(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	sub := parser{data: raw}
	s, err := sub.str(true)
	if err != nil {
		return "", false
	}
	return string(s), true
}
