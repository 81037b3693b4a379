// Package mcpmsg reads one JSON-RPC 2.0 message sent by an MCP runner, once,
// strictly, and records where its routing fields are.
//
// The gateway inspects a message (policy, allowlist) and forwards the same
// bytes upstream, where another JSON parser reads them. Parsers disagree on
// inputs that JSON leaves open — gjson keeps the first of two duplicate keys,
// encoding/json the last, and encoding/json matches struct fields without
// regard to case — so a message that reads one way here could read another
// way upstream. Parse therefore rejects, anywhere in the message: duplicate
// keys, keys that differ only in case, invalid UTF-8, lone surrogate escapes,
// nesting deeper than the limit and trailing data; and in the message and its
// params, case variants of the members it reads ("Arguments"). What passes
// has exactly one reading, and that reading is what policy sees.
package mcpmsg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind says what a JSON-RPC message is.
type Kind uint8

// The kinds of JSON-RPC messages.
const (
	Request      Kind = iota + 1 // has a method and an id
	Notification                 // has a method and no id
	Response                     // has an id and a result or an error
)

func (k Kind) String() string {
	switch k {
	case Request:
		return "request"
	case Notification:
		return "notification"
	case Response:
		return "response"
	}
	return "invalid"
}

// Message is one JSON-RPC message. Byte-slice fields alias Raw: they are the
// exact JSON text of those members, never re-encoded.
type Message struct {
	Raw    []byte // the whole message as received
	Kind   Kind
	ID     []byte // JSON text of "id" (a string or an integer); nil for notifications
	Method string // "method"; empty for responses
	Params []byte // JSON text of "params"; nil when absent

	// Fields read from params, when present.
	Name            string // params.name (tools/call, prompts/get)
	Arguments       []byte // JSON text of params.arguments (tools/call, prompts/get)
	URI             string // params.uri (resources/read, resources/subscribe, …)
	ProgressToken   []byte // JSON text of params._meta.progressToken
	ProtocolVersion string // params.protocolVersion (initialize)
	Meta            []byte // JSON text of params._meta; nil when absent
	// InputResponses and RequestState are the JSON text of the members a
	// retry of a multi round-trip request carries (2026-07-28); nil when
	// absent.
	InputResponses []byte
	RequestState   []byte
	// Task is the JSON text of params.task, which asks for a task-augmented
	// request (tools/call, 2025-11-25); TaskID is params.taskId (tasks/get,
	// tasks/result, tasks/cancel).
	Task   []byte
	TaskID string

	// Result is the JSON text of "result" and Error of "error", for responses.
	Result []byte
	Error  []byte

	// Extra: the message has members beside those JSON-RPC defines
	// ("jsonrpc", "id", "method", "params", "result", "error"). Receivers
	// ignore them, and no policy sees them: what toolgate relays goes
	// without them (WithoutExtra).
	Extra bool
}

// WithoutExtra returns m's text with the members JSON-RPC defines only,
// each value as m holds it.
func (m *Message) WithoutExtra() []byte {
	b := make([]byte, 0, len(m.ID)+len(m.Method)+len(m.Params)+len(m.Result)+len(m.Error)+64)
	b = append(b, `{"jsonrpc":"2.0"`...)
	if m.ID != nil {
		b = append(append(b, `,"id":`...), m.ID...)
	}
	if m.Kind == Request || m.Kind == Notification {
		b = AppendQuote(append(b, `,"method":`...), m.Method)
	}
	if m.Params != nil {
		b = append(append(b, `,"params":`...), m.Params...)
	}
	if m.Result != nil {
		b = append(append(b, `,"result":`...), m.Result...)
	}
	if m.Error != nil {
		b = append(append(b, `,"error":`...), m.Error...)
	}
	return append(b, '}')
}

// Limits bound what Parse accepts.
type Limits struct {
	// MaxDepth is the deepest nesting of objects and arrays accepted. The
	// message object itself is depth 1.
	MaxDepth int
	// MaxValues, when positive, bounds how many JSON values (objects,
	// arrays, strings, numbers, literals, the message itself included) a
	// message may hold: what a policy evaluates is built from each of them
	// (tens of bytes of memory per byte of "{}," in the message).
	MaxValues int
}

// DefaultLimits are used when a Limits field is zero.
var DefaultLimits = Limits{MaxDepth: 64}

// Errors Parse returns. Each wraps ErrInvalid, except ErrBatch.
var (
	ErrInvalid = errors.New("invalid JSON-RPC message")
	// ErrBatch reports a JSON array at the top level: batches were removed
	// from MCP in protocol version 2025-06-18 and are not accepted.
	ErrBatch = errors.New("JSON-RPC batches are not supported")
)

// SyntaxError describes why a message was rejected and where.
type SyntaxError struct {
	Offset int
	Msg    string
	// Quoted is the message's own text that Msg quotes (a key), "" when
	// none.
	Quoted string
	// OverLimit: the message is well formed as far as it was read, but
	// holds more values than Limits.MaxValues allows.
	OverLimit bool
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON-RPC message at byte %d: %s", e.Offset, e.Msg)
}

// Redacted is Error without the message's own text: what may be told to
// someone other than the message's author (an upstream's key, shown to a
// runner, would be words of the upstream's that no policy inspected).
func (e *SyntaxError) Redacted() string {
	msg := e.Msg
	if e.Quoted != "" {
		msg = strings.ReplaceAll(msg, e.Quoted, `"…"`)
	}
	return fmt.Sprintf("invalid JSON-RPC message at byte %d: %s", e.Offset, msg)
}

func (e *SyntaxError) Unwrap() error { return ErrInvalid }

// Parse checks body and returns the message it holds.
func Parse(body []byte, limits Limits) (Message, error) {
	if limits.MaxDepth <= 0 {
		limits.MaxDepth = DefaultLimits.MaxDepth
	}
	p := parser{data: body, maxDepth: limits.MaxDepth, maxValues: limits.MaxValues}
	msg := Message{Raw: body}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '[' {
		return msg, ErrBatch
	}
	if p.pos >= len(p.data) || p.data[p.pos] != '{' {
		return msg, p.fail("the message must be a JSON object")
	}
	var (
		version          []byte
		hasID, hasMethod bool
		hasResult        bool
	)
	err := p.object(1, func(key []byte, start int) error {
		switch string(key) {
		case "result":
			p.spelled = resultMembers
		case "error":
			p.spelled = errorMembers
		}
		end, err := p.value(2)
		p.spelled = nil
		if err != nil {
			return err
		}
		raw := p.data[start:end]
		switch string(key) {
		case "jsonrpc":
			version = raw
		case "id":
			hasID = true
			msg.ID = raw
		case "method":
			hasMethod = true
			s, ok := p.stringValue(raw)
			if !ok {
				return p.failAt(start, `"method" must be a string`)
			}
			msg.Method = s
		case "params":
			msg.Params = raw
		case "result":
			hasResult = true
			msg.Result = raw
		case "error":
			msg.Error = raw
		default:
			if err := p.checkSpelling(key, start, messageMembers); err != nil {
				return err
			}
			msg.Extra = true
		}
		return nil
	})
	if err != nil {
		return msg, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return msg, p.fail("data after the message")
	}
	if string(version) != `"2.0"` {
		return msg, p.failAt(0, `"jsonrpc" must be "2.0"`)
	}
	if hasID {
		if err := checkID(msg.ID); err != nil {
			return msg, err
		}
	}
	switch {
	case hasMethod && (hasResult || msg.Error != nil):
		return msg, p.failAt(0, `a message cannot have both "method" and "result" or "error"`)
	case hasMethod && hasID:
		msg.Kind = Request
	case hasMethod:
		msg.Kind = Notification
	case hasID && hasResult != (msg.Error != nil):
		msg.Kind = Response
	default:
		return msg, p.failAt(0, `a message needs "method", or "id" with exactly one of "result" and "error"`)
	}
	if msg.Params != nil {
		if err := msg.readParams(); err != nil {
			return msg, err
		}
	}
	return msg, nil
}

// Validate checks that data is one JSON value with a single reading, with
// the rules Parse applies to a message: no duplicate or case-variant keys,
// valid UTF-8, no lone surrogates, bounded depth, nothing after the value.
// The gateway validates what an upstream sends before a policy inspects it
// and the runner reads it, so both see the same thing.
func Validate(data []byte, limits Limits) error {
	if limits.MaxDepth <= 0 {
		limits.MaxDepth = DefaultLimits.MaxDepth
	}
	p := parser{data: data, maxDepth: limits.MaxDepth, maxValues: limits.MaxValues}
	if _, err := p.value(1); err != nil {
		return err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return p.fail("data after the value")
	}
	return nil
}

// IDKey returns a key that two spellings of one JSON-RPC id share, and
// no other id does: a string id's decoded text ("e1" and "e\u0031" are one
// id, as every JSON parser reads them) or an integer id's digits. id is the
// JSON text of an id Parse accepted; anything else has the key "".
func IDKey(id []byte) string {
	if checkID(id) != nil {
		return ""
	}
	if id[0] == '"' {
		p := parser{data: id}
		s, err := p.str(true)
		if err != nil || p.pos != len(id) {
			return ""
		}
		return "s" + string(s)
	}
	digits, negative := bytes.CutPrefix(id, []byte{'-'})
	for _, c := range digits {
		if c < '0' || c > '9' {
			return ""
		}
	}
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return ""
	}
	if negative && string(digits) != "0" {
		return "n-" + string(digits)
	}
	return "n" + string(digits)
}

// checkID accepts the ids MCP allows: a string or an integer.
func checkID(id []byte) error {
	switch {
	case len(id) > 0 && id[0] == '"':
		return nil
	case len(id) > 0 && (id[0] == '-' || id[0] >= '0' && id[0] <= '9'):
		if bytes.ContainsAny(id, ".eE") {
			return &SyntaxError{Msg: `"id" must be a string or an integer`}
		}
		return nil
	}
	return &SyntaxError{Msg: `"id" must be a string or an integer`}
}

// readParams records the routing members of params. Params were already
// validated by Parse, so this pass only locates members.
func (m *Message) readParams() error {
	if m.Params[0] != '{' {
		return &SyntaxError{Msg: `"params" must be an object`}
	}
	p := parser{data: m.Params, maxDepth: 1 << 30}
	return p.object(1, func(key []byte, start int) error {
		end, err := p.value(2)
		if err != nil {
			return err
		}
		raw := p.data[start:end]
		var ok bool
		switch string(key) {
		case "name":
			if m.Name, ok = p.stringValue(raw); !ok {
				return p.failAt(start, `"params.name" must be a string`)
			}
		case "uri":
			if m.URI, ok = p.stringValue(raw); !ok {
				return p.failAt(start, `"params.uri" must be a string`)
			}
		case "protocolVersion":
			if m.ProtocolVersion, ok = p.stringValue(raw); !ok {
				return p.failAt(start, `"params.protocolVersion" must be a string`)
			}
		case "arguments":
			if raw[0] != '{' {
				return p.failAt(start, `"params.arguments" must be an object`)
			}
			m.Arguments = raw
		case "_meta":
			if raw[0] == '{' {
				m.Meta = raw
				m.ProgressToken = memberOf(raw, "progressToken")
				// Decoders read it into a field (the SDKs' ProgressToken):
				// a variant would be a token Parse did not see.
				var err error
				Members(raw, func(key, _ []byte) {
					if err == nil {
						err = p.checkSpelling(key, start, metaMembers)
					}
				})
				if err != nil {
					return err
				}
			}
		case "inputResponses":
			m.InputResponses = raw
			// Each response is a result (of the input request it answers),
			// read by the policy and the upstream alike.
			var err error
			Members(raw, func(_, response []byte) {
				Members(response, func(key, _ []byte) {
					if err == nil {
						err = p.checkSpelling(key, start, resultMembers)
					}
				})
			})
			if err != nil {
				return err
			}
		case "requestState":
			m.RequestState = raw
		case "task":
			if raw[0] != '{' {
				return p.failAt(start, `"params.task" must be an object`)
			}
			m.Task = raw
		case "taskId":
			if m.TaskID, ok = p.stringValue(raw); !ok {
				return p.failAt(start, `"params.taskId" must be a string`)
			}
		default:
			return p.checkSpelling(key, start, paramsMembers)
		}
		return nil
	})
}

// The members of a message and of its params: those Parse reads, and the
// other params members of MCP's requests and notifications (of every
// revision toolgate speaks), which the request policy reads (input.params).
// A key that differs from one of them only in case is refused even without
// the member itself: a parser that matches keys regardless of case
// (encoding/json decoding into a struct) would read it as that member, and
// Parse and the policy would not.
var (
	messageMembers = membersOf(`jsonrpc id method params result error`)
	paramsMembers  = membersOf(`name arguments uri protocolVersion _meta inputResponses requestState task taskId
		capabilities clientInfo requestId reason progressToken progress total message cursor ref argument context
		level logger data messages modelPreferences systemPrompt includeContext temperature maxTokens stopSequences
		metadata tools toolChoice requestedSchema mode url elicitationId status statusMessage resourceSubscriptions`)
	errorMembers = membersOf(`code message data`)
	metaMembers  = membersOf(`progressToken`)
)

// spelling is a set of member names whose case variants are refused.
type spelling struct {
	names [][]byte
	lower map[string]string // each name with its ASCII letters in lower case → the name
	max   int               // the longest name's length
}

// membersOf is the spelling of the member names of a space-separated list.
func membersOf(names string) *spelling {
	s := &spelling{lower: map[string]string{}}
	for _, m := range strings.Fields(names) {
		s.names = append(s.names, []byte(m))
		s.lower[strings.ToLower(m)] = m
		s.max = max(s.max, len(m))
	}
	return s
}

// variant returns the name key is a case variant of (spelled otherwise),
// and whether there is one. An ASCII key is looked up in lower case; only
// a key with other bytes is compared with each name (U+017F folds onto s
// and U+212A onto k).
func (s *spelling) variant(key []byte) (string, bool) {
	if len(key) > 3*s.max { // no fold of a name is longer
		return "", false
	}
	var buf [64]byte
	lower := buf[:0]
	for _, c := range key {
		if c >= utf8.RuneSelf {
			for _, n := range s.names {
				if bytes.EqualFold(key, n) && !bytes.Equal(key, n) {
					return string(n), true
				}
			}
			return "", false
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower = append(lower, c)
	}
	n, ok := s.lower[string(lower)]
	return n, ok && n != string(key)
}

// resultMembers are the members of MCP results (of every revision
// toolgate speaks, server's and client's) that toolgate, its policies or
// runners act on. A result's key that differs from one of them only in
// case is refused: toolgate reads the member as spelled ("content" decides
// whether an answer is a tool result, "tools" what a listing filters), and
// a runner whose decoder ignores case would read the variant instead.
var resultMembers = membersOf(`content structuredContent isError tools prompts resources resourceTemplates
	contents messages description nextCursor task tasks completion _meta resultType inputRequests requestState
	cacheScope capabilities serverInfo protocolVersion instructions roots model role stopReason action
	taskId status statusMessage ttl ttlMs pollInterval`)

// checkSpelling refuses key when it is one of members in another case (as
// a decoder that ignores case reads it), spelled otherwise.
func (p *parser) checkSpelling(key []byte, off int, members *spelling) error {
	if m, ok := members.variant(key); ok {
		return &SyntaxError{Offset: off, Msg: fmt.Sprintf("key %q must be spelled %q", key, m), Quoted: strconv.Quote(string(key))}
	}
	return nil
}

// MemberOf returns the JSON text of key in the valid JSON object obj, or
// nil when obj has no such member.
//
// This and the other helpers on members of a valid object (MemberFold,
// ReplaceMember, RemoveMember…) read keys decoded and skip values quote to
// quote (see Members), without validating again: a result of a megabyte
// was otherwise parsed through once more by each of them.
func MemberOf(obj []byte, key string) []byte { return memberOf(obj, key) }

// memberOf returns the JSON text of key in the valid JSON object obj.
func memberOf(obj []byte, key string) []byte {
	if start, end, ok := MemberSpan(obj, key); ok {
		return obj[start:end]
	}
	return nil
}

// MemberFold is MemberOf for the member whose key is key in any case, as
// a decoder that ignores case (Go's encoding/json) reads it: its key as
// written (decoded) and its JSON text, "" and nil when obj has none. A
// parsed message has at most one such member in an object (the parser
// refuses case variants of a key).
func MemberFold(obj []byte, key string) (string, []byte) {
	var name string
	var found []byte
	members(obj, func(k []byte, start, end int) bool {
		if !bytes.EqualFold(k, []byte(key)) {
			return true
		}
		name, found = string(k), obj[start:end]
		return false
	})
	return name, found
}

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
