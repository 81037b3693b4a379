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
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// LoggedMethod is an upstream's request's or notification's method as a
// log names it: the method when MCP defines it for a server to send, else
// none of the upstream's text. An upstream holds secrets toolgate cannot
// redact (a program the values of its environment, a legacy SSE server
// what its requests carried), and may write one as a method name.
func LoggedMethod(method string) string {
	switch method {
	case "ping", "sampling/createMessage", "elicitation/create", "roots/list",
		"tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
		"notifications/message", "notifications/progress", "notifications/cancelled",
		"notifications/resources/updated", "notifications/resources/list_changed",
		"notifications/tools/list_changed", "notifications/prompts/list_changed",
		"notifications/elicitation/complete", "notifications/tasks/status":
		return method
	}
	return "a method MCP does not define"
}

// LoggedRevision reports whether v, a protocol version an upstream named,
// is written as MCP names its revisions (YYYY-MM-DD), and so may be
// logged: any other text of the upstream's could be a secret it holds (a
// program's API key), which toolgate cannot redact.
func LoggedRevision(v string) bool {
	if len(v) != len("2025-11-25") {
		return false
	}
	for i, c := range []byte(v) {
		if (i == 4 || i == 7) != (c == '-') || c != '-' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
