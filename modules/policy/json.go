package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/bigbuf"
)

// JSON text to OPA AST and back, for the policy input and the values a
// decision replaces.
//
// The text the policy steps convert has already been checked by mcpmsg
// (valid JSON and UTF-8, no duplicate keys, no lone surrogates), so the
// parser below only has to be fast: strings are found with IndexByte and
// share the memory of one copy of the text, object keys are interned per
// conversion, small integers come from OPA's interned terms, terms are
// allocated many at a time. It still
// reports malformed text instead of guessing, and callers deny on that.

// maxJSONDepth bounds the nesting the parser follows (mcpmsg's own limit
// is lower; this one only protects the stack).
const maxJSONDepth = 1000

var errJSON = errors.New("malformed JSON")

// jsonTerm converts the JSON text raw to an AST term.
func jsonTerm(raw []byte) (*ast.Term, error) {
	p := jsonParser{src: string(raw)}
	return p.parse()
}

// jsonParser is one conversion.
type jsonParser struct {
	src   string
	pos   int
	keys  map[string]*ast.Term // interned object keys
	nkeys int                  // keys read so far
	slab  []ast.Term           // terms are allocated from here, many at once
	nslab int                  // the size of the next slab
	items [][2]*ast.Term       // scratch: members of the objects being built

	// visit, when set, is called for every string value and every object
	// key of the document, with the path to it (for a key, the path to its
	// member). The result step uses it to scan the result.
	visit func(path []pathStep, s string, key bool)
	track bool
	path  []pathStep

	// spans, when not nil, receives the text of every value of at least
	// spanMin bytes, so that what is unchanged of it can be written back
	// as it was (see appendJSON).
	spans map[*ast.Term]string
}

// spanMin is the size from which a value's text is remembered.
const spanMin = 512

// pathStep is one step of a path into a JSON value: an object key or an
// array index.
type pathStep struct {
	key   *ast.Term // nil for an array index
	index int
}

func (p *jsonParser) parse() (*ast.Term, error) {
	p.track = p.visit != nil
	p.skipSpace()
	t, err := p.value(1)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, p.fail("trailing data")
	}
	return t, nil
}

func (p *jsonParser) fail(what string) error {
	return fmt.Errorf("%w at byte %d: %s", errJSON, p.pos, what)
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (*ast.Term, error) {
	if p.spans == nil {
		return p.value1(depth)
	}
	start := p.pos
	t, err := p.value1(depth)
	if err == nil && p.pos-start >= spanMin {
		p.spans[t] = p.src[start:p.pos]
	}
	return t, err
}

func (p *jsonParser) value1(depth int) (*ast.Term, error) {
	if depth > maxJSONDepth {
		return nil, p.fail("nested too deeply")
	}
	if p.pos >= len(p.src) {
		return nil, p.fail("unexpected end")
	}
	switch c := p.src[p.pos]; {
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		if p.track {
			p.visit(p.path, s, false)
		}
		if s == "" {
			return ast.InternedEmptyString, nil
		}
		return p.term(ast.String(s)), nil
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == 't':
		return p.literal("true", ast.InternedTerm(true))
	case c == 'f':
		return p.literal("false", ast.InternedTerm(false))
	case c == 'n':
		return p.literal("null", ast.InternedNullTerm)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return nil, p.fail("unexpected character")
}

func (p *jsonParser) literal(word string, t *ast.Term) (*ast.Term, error) {
	if !strings.HasPrefix(p.src[p.pos:], word) {
		return nil, p.fail("invalid literal")
	}
	p.pos += len(word)
	return t, nil
}

func (p *jsonParser) number() (*ast.Term, error) {
	start := p.pos
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			p.pos++
			continue
		}
		break
	}
	text := p.src[start:p.pos]
	if !validNumber(text) {
		return nil, p.fail("invalid number")
	}
	if t := ast.InternedIntNumberTermFromString(text); t != nil {
		return t, nil
	}
	return p.term(ast.Number(text)), nil
}

// term returns a new term holding v. Terms come from slabs that grow with
// the document: one allocation for many terms.
func (p *jsonParser) term(v ast.Value) *ast.Term {
	if len(p.slab) == 0 {
		p.nslab = min(max(2*p.nslab, 4), 256)
		p.slab = make([]ast.Term, p.nslab)
	}
	t := &p.slab[0]
	p.slab = p.slab[1:]
	t.Value = v
	return t
}

// validNumber reports whether s is a JSON number.
func validNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			return false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || s[i] < '0' || s[i] > '9' {
			return false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	return i == len(s)
}

// str reads the string at p.pos. Without escapes it is a substring of the
// text, not a copy.
func (p *jsonParser) str() (string, error) {
	p.pos++ // '"'
	start := p.pos
	// Short strings (keys, identifiers) end sooner than IndexByte gets
	// going; look at their first bytes one by one.
	for i := start; i < len(p.src) && i < start+24; i++ {
		switch p.src[i] {
		case '"':
			p.pos = i + 1
			return p.src[start:i], nil
		case '\\':
			return p.escapedStr(start, i)
		}
	}
	end := strings.IndexByte(p.src[start:], '"')
	if end < 0 {
		return "", p.fail("unterminated string")
	}
	end += start
	if b := strings.IndexByte(p.src[start:end], '\\'); b >= 0 {
		return p.escapedStr(start, start+b)
	}
	p.pos = end + 1
	return p.src[start:end], nil
}

// escapedStr reads the rest of a string that starts at start and has a
// backslash at b.
func (p *jsonParser) escapedStr(start, b int) (string, error) {
	end := strings.IndexByte(p.src[b:], '"')
	if end < 0 {
		return "", p.fail("unterminated string")
	}
	end += b
	// Escapes: the string ends at the first quote not escaped, that is
	// not preceded by an odd number of backslashes.
	i := end
	for {
		n := 0
		for i-1-n >= start && p.src[i-1-n] == '\\' {
			n++
		}
		if n%2 == 0 {
			break
		}
		j := strings.IndexByte(p.src[i+1:], '"')
		if j < 0 {
			return "", p.fail("unterminated string")
		}
		i += 1 + j
	}
	s, ok := unescape(p.src[start:i])
	if !ok {
		return "", p.fail("invalid escape")
	}
	p.pos = i + 1
	return s, nil
}

// unescape decodes the contents of a JSON string that has escapes, into
// one allocation of its length (a large one populated at once, see package
// bigbuf), written in place: a megabyte of text in short lines holds tens
// of thousands of escapes, each a call when written through a builder.
func unescape(s string) (string, bool) {
	ok := true
	out := bigbuf.Fill(len(s), func(dst []byte) int {
		n := 0
		for {
			i := strings.IndexByte(s, '\\')
			if i < 0 {
				return n + copy(dst[n:], s)
			}
			n += copy(dst[n:], s[:i])
			if i+1 >= len(s) {
				ok = false
				return 0
			}
			var c byte
			switch c = s[i+1]; c {
			case '"', '\\', '/':
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'u':
				r, valid := hex4(s, i+2)
				if valid && utf16.IsSurrogate(r) {
					lo := rune(0)
					valid = i+7 < len(s) && s[i+6] == '\\' && s[i+7] == 'u'
					if valid {
						lo, valid = hex4(s, i+8)
					}
					if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
						valid = false
					}
					i += 6
				}
				if !valid {
					ok = false
					return 0
				}
				// The escape is longer than its UTF-8: there is room.
				n += utf8.EncodeRune(dst[n:], r)
				s = s[i+6:]
				continue
			default:
				ok = false
				return 0
			}
			dst[n] = c
			n++
			s = s[i+2:]
		}
	})
	if !ok {
		return "", false
	}
	return out, true
}

// hex4 reads the four hexadecimal digits of a \u escape at s[at:].
func hex4(s string, at int) (rune, bool) {
	if at+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[at : at+4]) {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

func (p *jsonParser) key() (*ast.Term, error) {
	if p.pos >= len(p.src) || p.src[p.pos] != '"' {
		return nil, p.fail("expected a key")
	}
	s, err := p.str()
	if err != nil {
		return nil, err
	}
	return p.intern(s), nil
}

// intern returns a term for the key s, the same term for the same key once
// the document has had internAfter keys. That pays off for large
// documents, where keys repeat (a list of records); small ones (arguments)
// are not worth the map. (Values repeat less: most are unique, and then the
// map costs more than it saves.)
func (p *jsonParser) intern(s string) *ast.Term {
	if p.nkeys++; p.nkeys <= internAfter {
		return p.term(ast.String(s))
	}
	if t, ok := p.keys[s]; ok {
		return t
	}
	if p.keys == nil {
		p.keys = make(map[string]*ast.Term)
	}
	t := p.term(ast.String(s))
	p.keys[s] = t
	return t
}

// internAfter is how many keys a document has before they are interned.
const internAfter = 32

func (p *jsonParser) object(depth int) (*ast.Term, error) {
	p.pos++ // '{'
	mark := len(p.items)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return ast.ObjectTerm(), nil
	}
	for {
		p.skipSpace()
		k, err := p.key()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.pos >= len(p.src) || p.src[p.pos] != ':' {
			return nil, p.fail("expected ':'")
		}
		p.pos++
		p.skipSpace()
		var v *ast.Term
		if p.track {
			p.path = append(p.path, pathStep{key: k})
			p.visit(p.path, string(k.Value.(ast.String)), true)
			v, err = p.value(depth + 1)
			p.path = p.path[:len(p.path)-1]
		} else {
			v, err = p.value(depth + 1)
		}
		if err != nil {
			return nil, err
		}
		p.items = append(p.items, [2]*ast.Term{k, v})
		p.skipSpace()
		if p.pos >= len(p.src) {
			return nil, p.fail("unterminated object")
		}
		if p.src[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.src[p.pos] != '}' {
			return nil, p.fail("expected ',' or '}'")
		}
		p.pos++
		break
	}
	// NewObject copies the members, so the scratch space is reused.
	obj := ast.NewObject(p.items[mark:]...)
	clear(p.items[mark:])
	p.items = p.items[:mark]
	return p.term(obj), nil
}

func (p *jsonParser) array(depth int) (*ast.Term, error) {
	p.pos++ // '['
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		return ast.ArrayTerm(), nil
	}
	var elems []*ast.Term
	for i := 0; ; i++ {
		p.skipSpace()
		var v *ast.Term
		var err error
		if p.track {
			p.path = append(p.path, pathStep{index: i})
			v, err = p.value(depth + 1)
			p.path = p.path[:len(p.path)-1]
		} else {
			v, err = p.value(depth + 1)
		}
		if err != nil {
			return nil, err
		}
		elems = append(elems, v)
		p.skipSpace()
		if p.pos >= len(p.src) {
			return nil, p.fail("unterminated array")
		}
		if p.src[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.src[p.pos] != ']' {
			return nil, p.fail("expected ',' or ']'")
		}
		p.pos++
		break
	}
	return p.term(ast.NewArray(slices.Clip(elems)...)), nil
}

// pathTerm is path as the policy sees paths: an array of keys and indexes.
func pathTerm(path []pathStep) *ast.Term {
	steps := make([]*ast.Term, len(path))
	for i, s := range path {
		if s.key != nil {
			steps[i] = s.key
		} else {
			steps[i] = ast.InternedTerm(s.index)
		}
	}
	return ast.ArrayTerm(steps...)
}

// appendJSON appends t as JSON text. Sets become arrays (as OPA itself
// encodes them); object keys must be strings, and anything that JSON cannot
// hold is an error. A term found in spans (it came from a parsed document
// and is unchanged: terms are never modified) is written as the text it was
// parsed from.
func appendJSON(b []byte, t *ast.Term, spans map[*ast.Term]string) ([]byte, error) {
	if text, ok := spans[t]; ok {
		return append(b, text...), nil
	}
	switch x := t.Value.(type) {
	case ast.Null:
		return append(b, "null"...), nil
	case ast.Boolean:
		return strconv.AppendBool(b, bool(x)), nil
	case ast.Number:
		if !validNumber(string(x)) {
			return nil, fmt.Errorf("the number %s cannot be written as JSON", x)
		}
		return append(b, x...), nil
	case ast.String:
		return appendString(b, string(x)), nil
	case *ast.Array:
		b = append(b, '[')
		for i := range x.Len() {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, x.Elem(i), spans); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case ast.Set:
		return appendJSON(b, ast.NewTerm(x.Sorted()), spans)
	case ast.Object:
		b = append(b, '{')
		first := true
		err := x.Iter(func(k, v *ast.Term) error {
			s, ok := k.Value.(ast.String)
			if !ok {
				return fmt.Errorf("the object key %v is not a string", k)
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendString(b, string(s))
			b = append(b, ':')
			var err error
			b, err = appendJSON(b, v, spans)
			return err
		})
		if err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("a %s cannot be written as JSON", ast.ValueName(t.Value))
}

// appendString appends s as a JSON string, escaped as mcpmsg.AppendQuote
// does (control characters, quote, backslash, <, >, &, U+2028, U+2029;
// invalid UTF-8 becomes U+FFFD), copying runs of plain text at once.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = slices.Grow(b, len(s)+2)
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plainJSON[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
			i += size
			start = i
		default:
			i += size
		}
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// plainJSON marks the ASCII bytes a JSON string holds as they are.
var plainJSON = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()
