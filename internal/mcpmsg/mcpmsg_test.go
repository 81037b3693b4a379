package mcpmsg_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name string
		body string
		want mcpmsg.Message // Raw is filled in from body
	}{
		{
			name: "tools/call request with every routing field",
			body: `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_ticket","arguments":{"ticket_id":"T-1"},"_meta":{"progressToken":"p1"}}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`7`), Method: "tools/call",
				Params:        []byte(`{"name":"read_ticket","arguments":{"ticket_id":"T-1"},"_meta":{"progressToken":"p1"}}`),
				Name:          "read_ticket",
				Arguments:     []byte(`{"ticket_id":"T-1"}`),
				ProgressToken: []byte(`"p1"`),
			},
		},
		{
			name: "whitespace everywhere is kept inside spans but not around them",
			body: " \r\n\t{ \"jsonrpc\" : \"2.0\" ,\n \"id\" : \"abc\" , \"method\" : \"tools/call\" , \"params\" : { \"name\" : \"x\" , \"arguments\" : { } , \"_meta\" : { \"progressToken\" : 42 } } } \n",
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`"abc"`), Method: "tools/call",
				Params:        []byte(`{ "name" : "x" , "arguments" : { } , "_meta" : { "progressToken" : 42 } }`),
				Name:          "x",
				Arguments:     []byte(`{ }`),
				ProgressToken: []byte(`42`),
			},
		},
		{
			name: "task-augmented tools/call",
			body: `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"build","arguments":{},"task":{"ttl":60000}}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`8`), Method: "tools/call",
				Params:    []byte(`{"name":"build","arguments":{},"task":{"ttl":60000}}`),
				Name:      "build",
				Arguments: []byte(`{}`),
				Task:      []byte(`{"ttl":60000}`),
			},
		},
		{
			name: "tasks/result names its task",
			body: `{"jsonrpc":"2.0","id":9,"method":"tasks/result","params":{"taskId":"t\u0031"}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`9`), Method: "tasks/result",
				Params: []byte(`{"taskId":"t\u0031"}`),
				TaskID: "t1",
			},
		},
		{
			name: "notification without params",
			body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			want: mcpmsg.Message{Kind: mcpmsg.Notification, Method: "notifications/initialized"},
		},
		{
			name: "notification with params",
			body: `{"method":"notifications/cancelled","params":{"requestId":3,"reason":"user"},"jsonrpc":"2.0"}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Notification, Method: "notifications/cancelled",
				Params: []byte(`{"requestId":3,"reason":"user"}`),
			},
		},
		{
			name: "response with a result",
			body: `{"jsonrpc":"2.0","id":"s-1","result":{"content":[],"isError":false}}`,
			want: mcpmsg.Message{Kind: mcpmsg.Response, ID: []byte(`"s-1"`), Result: []byte(`{"content":[],"isError":false}`)},
		},
		{
			name: "response with an error",
			body: `{"jsonrpc":"2.0","id":-3,"error":{"code":-32601,"message":"no such method"}}`,
			want: mcpmsg.Message{Kind: mcpmsg.Response, ID: []byte(`-3`), Error: []byte(`{"code":-32601,"message":"no such method"}`)},
		},
		{
			name: "response with a null result",
			body: `{"jsonrpc":"2.0","id":1,"result":null}`,
			want: mcpmsg.Message{Kind: mcpmsg.Response, ID: []byte(`1`), Result: []byte(`null`)},
		},
		{
			name: "initialize with protocolVersion",
			body: `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`0`), Method: "initialize",
				Params:          []byte(`{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}`),
				ProtocolVersion: "2025-11-25",
			},
		},
		{
			name: "resources/read with uri and an integer progress token",
			body: `{"jsonrpc":"2.0","id":12345678901234567890,"method":"resources/read","params":{"uri":"file:///a b","_meta":{"progressToken":-1}}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`12345678901234567890`), Method: "resources/read",
				Params:        []byte(`{"uri":"file:///a b","_meta":{"progressToken":-1}}`),
				URI:           "file:///a b",
				ProgressToken: []byte(`-1`),
			},
		},
		{
			name: "escaped keys and values are decoded",
			body: `{"jsonrpc":"2.0","id":"a\"b","m\u0065thod":"tools\/call","params":{"n\u0061me":"caf\u00e9 \ud83d\ude00","\u0061rguments":{}}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`"a\"b"`), Method: "tools/call",
				Params:    []byte(`{"n\u0061me":"caf\u00e9 \ud83d\ude00","\u0061rguments":{}}`),
				Name:      "café 😀",
				Arguments: []byte(`{}`),
			},
		},
		{
			name: "_meta that is not an object has no progress token",
			body: `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":null}}`,
			want: mcpmsg.Message{Kind: mcpmsg.Request, ID: []byte(`1`), Method: "ping", Params: []byte(`{"_meta":null}`)},
		},
		{
			name: "negative zero id and every JSON value type in arguments",
			body: `{"jsonrpc":"2.0","id":-0,"method":"tools/call","params":{"name":"t","arguments":{"s":"x","n":-1.5e+3,"t":true,"f":false,"z":null,"a":[1,[2,{}]],"o":{"k":"\u2028\t\\"}}}}`,
			want: mcpmsg.Message{
				Kind: mcpmsg.Request, ID: []byte(`-0`), Method: "tools/call",
				Params:    []byte(`{"name":"t","arguments":{"s":"x","n":-1.5e+3,"t":true,"f":false,"z":null,"a":[1,[2,{}]],"o":{"k":"\u2028\t\\"}}}`),
				Name:      "t",
				Arguments: []byte(`{"s":"x","n":-1.5e+3,"t":true,"f":false,"z":null,"a":[1,[2,{}]],"o":{"k":"\u2028\t\\"}}`),
			},
		},
		{
			name: "keys that fold alike in neither Unicode nor ASCII are distinct",
			body: `{"jsonrpc":"2.0","method":"x","params":{"a":1,"b":2,"ab":3,"é":4,"e":5,"ı":6,"i":7}}`,
			want: mcpmsg.Message{Kind: mcpmsg.Notification, Method: "x", Params: []byte(`{"a":1,"b":2,"ab":3,"é":4,"e":5,"ı":6,"i":7}`)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			got, err := mcpmsg.Parse(body, mcpmsg.Limits{})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := tt.want
			want.Raw = body
			checkMessage(t, got, want)
		})
	}
}

func checkMessage(t *testing.T, got, want mcpmsg.Message) {
	t.Helper()
	if got.Kind != want.Kind {
		t.Errorf("Kind = %v, want %v", got.Kind, want.Kind)
	}
	if got.Method != want.Method {
		t.Errorf("Method = %q, want %q", got.Method, want.Method)
	}
	if got.Name != want.Name {
		t.Errorf("Name = %q, want %q", got.Name, want.Name)
	}
	if got.URI != want.URI {
		t.Errorf("URI = %q, want %q", got.URI, want.URI)
	}
	if got.TaskID != want.TaskID {
		t.Errorf("TaskID = %q, want %q", got.TaskID, want.TaskID)
	}
	if got.ProtocolVersion != want.ProtocolVersion {
		t.Errorf("ProtocolVersion = %q, want %q", got.ProtocolVersion, want.ProtocolVersion)
	}
	for _, f := range []struct {
		name      string
		got, want []byte
	}{
		{"Raw", got.Raw, want.Raw},
		{"ID", got.ID, want.ID},
		{"Params", got.Params, want.Params},
		{"Arguments", got.Arguments, want.Arguments},
		{"ProgressToken", got.ProgressToken, want.ProgressToken},
		{"Task", got.Task, want.Task},
		{"Result", got.Result, want.Result},
		{"Error", got.Error, want.Error},
	} {
		if !bytes.Equal(f.got, f.want) || (f.got == nil) != (f.want == nil) {
			t.Errorf("%s = %q (nil %v), want %q (nil %v)", f.name, f.got, f.got == nil, f.want, f.want == nil)
		}
		// Spans alias the body: they are slices of it, never copies.
		if len(f.got) > 0 && !aliases(got.Raw, f.got) {
			t.Errorf("%s does not alias Raw", f.name)
		}
	}
}

// aliases reports whether sub is a slice of the same memory as whole.
func aliases(whole, sub []byte) bool {
	if len(sub) == 0 || len(whole) == 0 {
		return false
	}
	for i := range whole {
		if &whole[i] == &sub[0] {
			return i+len(sub) <= len(whole)
		}
	}
	return false
}

func TestKindString(t *testing.T) {
	for k, want := range map[mcpmsg.Kind]string{
		mcpmsg.Request: "request", mcpmsg.Notification: "notification", mcpmsg.Response: "response", 0: "invalid", 99: "invalid",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

// manyKeys returns n distinct members "k0":0 … as object text without braces.
func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	return b.String()
}

// call wraps arguments text in a tools/call request.
func call(arguments string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":` + arguments + `}}`
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name string
		body string
		why  string // substring of the error
	}{
		// Not one message.
		{"empty", ``, "must be a JSON object"},
		{"only spaces", "  \n", "must be a JSON object"},
		{"null", `null`, "must be a JSON object"},
		{"string", `"x"`, "must be a JSON object"},
		{"number", `1`, "must be a JSON object"},
		{"byte order mark", "\uFEFF{\"jsonrpc\":\"2.0\",\"method\":\"x\"}", "must be a JSON object"},
		{"unterminated object", `{"jsonrpc":"2.0"`, "unexpected end of input"},
		{"unterminated string", `{"jsonrpc":"2.0`, "unterminated string"},
		{"trailing data", `{"jsonrpc":"2.0","method":"x"} x`, "data after the message"},
		{"two messages", `{"jsonrpc":"2.0","method":"x"}{"jsonrpc":"2.0","method":"y"}`, "data after the message"},
		{"trailing comma after message", `{"jsonrpc":"2.0","method":"x"},`, "data after the message"},
		{"trailing NUL", "{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\x00", "data after the message"},

		// Duplicate keys at any depth.
		{"duplicate id", `{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}`, "duplicate key"},
		{"duplicate method", `{"jsonrpc":"2.0","method":"ping","method":"tools/call"}`, "duplicate key"},
		{"duplicate params.name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}`, "duplicate key"},
		{"duplicate deep in arguments", call(`{"a":{"b":{"c":1,"c":2}}}`), "duplicate key"},
		{"duplicate in an object inside an array", call(`{"a":[1,{"x":1,"x":1}]}`), "duplicate key"},
		{"duplicate in result", `{"jsonrpc":"2.0","id":1,"result":{"isError":false,"isError":true}}`, "duplicate key"},
		{"duplicate in error", `{"jsonrpc":"2.0","id":1,"error":{"code":1,"code":2,"message":""}}`, "duplicate key"},
		{"duplicate in _meta", `{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"progressToken":1,"progressToken":2}}}`, "duplicate key"},

		// Keys differing only in case, at any depth.
		{"Method and method", `{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call"}`, "duplicate key"},
		{"NAME and name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}`, "duplicate key"},
		{"case pair deep in arguments", call(`{"x":[{"Path":"/a","path":"/etc"}]}`), "duplicate key"},
		{"K and Kelvin sign", call(`{"K":1,"` + "\u212a" + `":2}`), "duplicate key"},
		{"k and escaped Kelvin sign", call(`{"k":1,"\u212a":2}`), "duplicate key"},
		{"s and long s", call(`{"s":1,"` + "\u017f" + `":2}`), "duplicate key"},
		{"Greek sigma forms", call(`{"` + "\u03c3" + `":1,"` + "\u03c2" + `":2}`), "duplicate key"},

		// Keys equal after unescaping.
		{"escaped name and name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","n\u0061me":"b"}}`, "duplicate key"},
		{"escaped id and id", `{"jsonrpc":"2.0","id":1,"\u0069d":2,"method":"x"}`, "duplicate key"},
		{"escaped solidus", call(`{"a/b":1,"a\/b":2}`), "duplicate key"},
		{"escaped case variant", call(`{"A":1,"\u0061":2}`), "duplicate key"},

		// Objects with more than 16 keys, late duplicates.
		{"late exact duplicate in a big object", call(`{` + manyKeys(20) + `,"k3":true}`), "duplicate key"},
		{"17th key duplicates the first", call(`{` + manyKeys(16) + `,"k0":true}`), "duplicate key"},
		{"late case variant in a big object", call(`{` + manyKeys(20) + `,"K17":true}`), "duplicate key"},
		{"late Kelvin variant in a big object", call(`{"k":0,` + manyKeys(20) + `,"\u212a":true}`), "duplicate key"},
		{"late escaped duplicate in a big object", call(`{` + manyKeys(30) + `,"\u006b29":true}`), "duplicate key"},

		// Invalid UTF-8 and surrogates.
		{"invalid byte in value", call("{\"a\":\"\xff\"}"), "invalid UTF-8"},
		{"invalid byte in key", call("{\"\xfe\":1}"), "invalid UTF-8"},
		{"truncated sequence", call("{\"a\":\"\xe2\x82\"}"), "invalid UTF-8"},
		{"overlong encoding", call("{\"a\":\"\xc0\xaf\"}"), "invalid UTF-8"},
		{"surrogate encoded in UTF-8", call("{\"a\":\"\xed\xa0\x80\"}"), "invalid UTF-8"},
		{"invalid UTF-8 in method", "{\"jsonrpc\":\"2.0\",\"method\":\"\xff\"}", "invalid UTF-8"},
		{"lone high surrogate", call(`{"a":"\ud800"}`), "lone surrogate"},
		{"lone low surrogate", call(`{"a":"\udc00"}`), "lone surrogate"},
		{"high surrogate then letter", call(`{"a":"\ud800x"}`), "lone surrogate"},
		{"high surrogate then non-surrogate escape", call(`{"a":"\ud800\u0041"}`), "lone surrogate"},
		{"two high surrogates", call(`{"a":"\ud800\ud800"}`), "lone surrogate"},
		{"reversed pair", call(`{"a":"\udc00\ud800"}`), "lone surrogate"},
		{"lone surrogate in key", call(`{"\ud800":1}`), "lone surrogate"},
		{"lone surrogate in name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\udfff"}}`, "lone surrogate"},

		// Control characters and bad escapes.
		{"raw control character", call("{\"a\":\"\x01\"}"), "control character"},
		{"raw newline in string", call("{\"a\":\"x\ny\"}"), "control character"},
		{"raw tab in string", call("{\"a\":\"x\ty\"}"), "control character"},
		{"raw unit separator in key", call("{\"\x1f\":1}"), "control character"},
		{"unknown escape", call(`{"a":"\x41"}`), "invalid escape"},
		{"short \\u escape", call(`{"a":"\u12"}`), `invalid \u escape`},
		{"non-hex \\u escape", call(`{"a":"\u12g4"}`), `invalid \u escape`},
		{"signed \\u escape", call(`{"a":"\u+123"}`), `invalid \u escape`},
		{"escape at end of input", `{"a":"\`, "unterminated escape"},

		// Bad numbers and literals.
		{"leading zero", call(`{"a":01}`), "leading zero"},
		{"negative leading zero", call(`{"a":-01}`), "leading zero"},
		{"trailing dot", call(`{"a":1.}`), "invalid number"},
		{"lone minus", call(`{"a":-}`), "invalid number"},
		{"empty exponent", call(`{"a":1e}`), "invalid number"},
		{"signed empty exponent", call(`{"a":1e+}`), "invalid number"},
		{"leading dot", call(`{"a":.5}`), "unexpected character"},
		{"leading plus", call(`{"a":+1}`), "unexpected character"},
		{"hex number", call(`{"a":0x10}`), "expected ',' or '}'"},
		{"NaN", call(`{"a":NaN}`), "unexpected character"},
		{"Infinity", call(`{"a":Infinity}`), "unexpected character"},
		{"short literal", call(`{"a":tru}`), "invalid literal"},
		{"capitalized literal", call(`{"a":True}`), "unexpected character"},
		{"number in array then garbage", call(`{"a":[1 2]}`), "expected ',' or ']'"},

		// Malformed structure.
		{"trailing comma in object", call(`{"a":1,}`), "expected a string key"},
		{"trailing comma in array", call(`{"a":[1,]}`), "unexpected character"},
		{"missing colon", call(`{"a" 1}`), "expected ':'"},
		{"single-quoted key", call(`{'a':1}`), "expected a string key"},
		{"unquoted key", call(`{a:1}`), "expected a string key"},
		{"unterminated array", `{"jsonrpc":"2.0","method":"x","params":{"a":[1`, "unexpected end of input in array"},

		// JSON-RPC shape.
		{"no jsonrpc", `{"id":1,"method":"x"}`, `"jsonrpc" must be "2.0"`},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":1,"method":"x"}`, `"jsonrpc" must be "2.0"`},
		{"jsonrpc as a number", `{"jsonrpc":2.0,"id":1,"method":"x"}`, `"jsonrpc" must be "2.0"`},
		{"jsonrpc with a space", `{"jsonrpc":"2.0 ","id":1,"method":"x"}`, `"jsonrpc" must be "2.0"`},
		{"float id", `{"jsonrpc":"2.0","id":1.5,"method":"x"}`, `"id" must be a string or an integer`},
		{"exponent id", `{"jsonrpc":"2.0","id":1e3,"method":"x"}`, `"id" must be a string or an integer`},
		{"upper exponent id", `{"jsonrpc":"2.0","id":1E3,"method":"x"}`, `"id" must be a string or an integer`},
		{"bool id", `{"jsonrpc":"2.0","id":true,"method":"x"}`, `"id" must be a string or an integer`},
		{"null id", `{"jsonrpc":"2.0","id":null,"method":"x"}`, `"id" must be a string or an integer`},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"x"}`, `"id" must be a string or an integer`},
		{"array id", `{"jsonrpc":"2.0","id":[1],"method":"x"}`, `"id" must be a string or an integer`},
		{"null id on a response", `{"jsonrpc":"2.0","id":null,"result":{}}`, `"id" must be a string or an integer`},
		{"numeric method", `{"jsonrpc":"2.0","id":1,"method":5}`, `"method" must be a string`},
		{"null method", `{"jsonrpc":"2.0","id":1,"method":null}`, `"method" must be a string`},
		{"object method", `{"jsonrpc":"2.0","id":1,"method":{}}`, `"method" must be a string`},
		{"method and result", `{"jsonrpc":"2.0","id":1,"method":"x","result":{}}`, `both "method" and "result"`},
		{"method and error", `{"jsonrpc":"2.0","id":1,"method":"x","error":{"code":1,"message":""}}`, `both "method" and "result"`},
		{"notification with result", `{"jsonrpc":"2.0","method":"x","result":{}}`, `both "method" and "result"`},
		{"result and error", `{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":""}}`, `exactly one of "result" and "error"`},
		{"result and null error", `{"jsonrpc":"2.0","id":1,"result":{},"error":null}`, `exactly one of "result" and "error"`},
		{"id alone", `{"jsonrpc":"2.0","id":1}`, `exactly one of "result" and "error"`},
		{"result without id", `{"jsonrpc":"2.0","result":{}}`, `exactly one of "result" and "error"`},
		{"nothing but jsonrpc", `{"jsonrpc":"2.0"}`, `a message needs "method"`},
		{"params array", `{"jsonrpc":"2.0","id":1,"method":"x","params":[1,2]}`, `"params" must be an object`},
		{"params string", `{"jsonrpc":"2.0","id":1,"method":"x","params":"a"}`, `"params" must be an object`},
		{"params null", `{"jsonrpc":"2.0","id":1,"method":"x","params":null}`, `"params" must be an object`},
		{"arguments array", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":[1]}}`, `"params.arguments" must be an object`},
		{"arguments string", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":"{}"}}`, `"params.arguments" must be an object`},
		{"arguments null", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":null}}`, `"params.arguments" must be an object`},
		{"numeric name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":1}}`, `"params.name" must be a string`},
		{"null name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":null}}`, `"params.name" must be a string`},
		{"task not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":true}}`, `"params.task" must be an object`},
		{"numeric taskId", `{"jsonrpc":"2.0","id":1,"method":"tasks/result","params":{"taskId":1}}`, `"params.taskId" must be a string`},
		{"case variant of taskId", `{"jsonrpc":"2.0","id":1,"method":"tasks/result","params":{"taskid":"t1"}}`, `must be spelled "taskId"`},
		{"numeric uri", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":1}}`, `"params.uri" must be a string`},
		{"object protocolVersion", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":{}}}`, `"params.protocolVersion" must be a string`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := mcpmsg.Parse([]byte(tt.body), mcpmsg.Limits{})
			if err == nil {
				t.Fatalf("Parse(%q) accepted it", tt.body)
			}
			if !errors.Is(err, mcpmsg.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if errors.Is(err, mcpmsg.ErrBatch) {
				t.Errorf("error %v wraps ErrBatch", err)
			}
			var se *mcpmsg.SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %T is not a *SyntaxError", err)
			}
			if se.Offset < 0 || se.Offset > len(tt.body) {
				t.Errorf("Offset %d outside the body (len %d)", se.Offset, len(tt.body))
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Errorf("error %q does not say %q", err, tt.why)
			}
		})
	}
}

func TestParseRejectsBatches(t *testing.T) {
	for _, body := range []string{
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		" \n[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"},{\"jsonrpc\":\"2.0\",\"method\":\"x\"}]",
		`[]`,
		`[`, // not even valid: still reported as a batch
	} {
		_, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{})
		if !errors.Is(err, mcpmsg.ErrBatch) {
			t.Errorf("Parse(%q) = %v, want ErrBatch", body, err)
		}
		if errors.Is(err, mcpmsg.ErrInvalid) {
			t.Errorf("Parse(%q): ErrBatch should not wrap ErrInvalid", body)
		}
	}
}

// nested returns a notification whose total nesting depth (the message
// object counting as 1) is depth, alternating objects and arrays.
func nested(depth int) string {
	var open, closing strings.Builder
	for i := 2; i <= depth; i++ {
		if i == 2 {
			open.WriteString(`{"a":`) // params must be an object
			closing.WriteString(`}`)
			continue
		}
		if i%2 == 0 {
			open.WriteString(`{"a":`)
			closing.WriteString(`}`)
		} else {
			open.WriteString(`[`)
			closing.WriteString(`]`)
		}
	}
	inner := open.String() + `1` + reverse(closing.String())
	if depth == 1 {
		return `{"jsonrpc":"2.0","method":"x"}`
	}
	return `{"jsonrpc":"2.0","method":"x","params":` + inner + `}`
}

func reverse(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

func TestParseDepthLimit(t *testing.T) {
	for _, limit := range []int{0, 1, 2, 3, 10, 64, 100} {
		effective := limit
		if effective == 0 {
			effective = mcpmsg.DefaultLimits.MaxDepth
		}
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			at := nested(effective)
			if !json.Valid([]byte(at)) {
				t.Fatalf("test body is not JSON: %s", at)
			}
			if _, err := mcpmsg.Parse([]byte(at), mcpmsg.Limits{MaxDepth: limit}); err != nil {
				t.Errorf("depth %d at limit %d rejected: %v", effective, limit, err)
			}
			over := nested(effective + 1)
			_, err := mcpmsg.Parse([]byte(over), mcpmsg.Limits{MaxDepth: limit})
			if !errors.Is(err, mcpmsg.ErrInvalid) || !strings.Contains(err.Error(), "nesting too deep") {
				t.Errorf("depth %d at limit %d: err = %v, want nesting too deep", effective+1, limit, err)
			}
		})
	}
	if mcpmsg.DefaultLimits.MaxDepth != 64 {
		t.Errorf("DefaultLimits.MaxDepth = %d, want 64 (the documented default)", mcpmsg.DefaultLimits.MaxDepth)
	}
}

func TestParseDeepInputDoesNotOverflow(t *testing.T) {
	// A megabyte of '[' must fail fast on the depth limit, not blow the stack.
	body := `{"jsonrpc":"2.0","method":"x","params":{"a":` + strings.Repeat("[", 1<<20)
	_, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{})
	if err == nil || !strings.Contains(err.Error(), "nesting too deep") {
		t.Fatalf("err = %v, want nesting too deep", err)
	}
}

func TestReplaceMember(t *testing.T) {
	tests := []struct {
		name  string
		obj   string
		key   string
		value string
		want  string
	}{
		{"replace existing", `{"name":"t","arguments":{"a":1}}`, "arguments", `{"b":2}`, `{"name":"t","arguments":{"b":2}}`},
		{"replace first member keeps spacing", `{ "arguments" : {"a":1} , "name":"t" }`, "arguments", `{}`, `{ "arguments" : {} , "name":"t" }`},
		{"replace escaped key", `{"n\u0061me":"a"}`, "name", `"b"`, `{"n\u0061me":"b"}`},
		{"replace with a different type", `{"a":[1,2,3]}`, "a", `null`, `{"a":null}`},
		{"nested key of the same name is untouched", `{"x":{"k":1},"k":2}`, "k", `3`, `{"x":{"k":1},"k":3}`},
		{"only nested key of the same name: add at top", `{"x":{"k":1}}`, "k", `3`, `{"x":{"k":1},"k":3}`},
		{"add to empty", `{}`, "arguments", `{"a":1}`, `{"arguments":{"a":1}}`},
		{"add to empty with spaces", "{ \n }", "k", `1`, "{ \n \"k\":1}"},
		{"add to non-empty", `{"name":"t"}`, "arguments", `{}`, `{"name":"t","arguments":{}}`},
		{"add to non-empty with trailing space", "{\"name\":\"t\" }\n", "arguments", `{}`, "{\"name\":\"t\" ,\"arguments\":{}}\n"},
		{"add a key that needs quoting", `{"a":1}`, "we\"ird\n<key>", `true`, `{"a":1,"we\"ird\n\u003ckey\u003e":true}`},
		{"leading whitespace", "  {\"a\":1}", "a", `2`, "  {\"a\":2}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := []byte(tt.obj)
			orig := bytes.Clone(obj)
			got := mcpmsg.ReplaceMember(obj, tt.key, []byte(tt.value))
			if string(got) != tt.want {
				t.Errorf("ReplaceMember = %s, want %s", got, tt.want)
			}
			if !bytes.Equal(obj, orig) {
				t.Errorf("ReplaceMember modified its input: %s", obj)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(got, &m); err != nil {
				t.Fatalf("result is not a JSON object: %v", err)
			}
			var gotValue, wantValue any
			if err := json.Unmarshal(m[tt.key], &gotValue); err != nil {
				t.Fatalf("member %q missing or invalid: %v", tt.key, err)
			}
			_ = json.Unmarshal([]byte(tt.value), &wantValue)
			if fmt.Sprint(gotValue) != fmt.Sprint(wantValue) {
				t.Errorf("member %q = %v, want %v", tt.key, gotValue, wantValue)
			}
			// The result is still a strictly valid object for our parser too.
			body := `{"jsonrpc":"2.0","method":"x","params":` + string(got) + `}`
			if _, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{}); err != nil {
				t.Errorf("Parse rejects the result: %v", err)
			}
		})
	}
}

func TestReplaceMemberRewritesArgumentsOfParsedMessage(t *testing.T) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"q":"secret"},"_meta":{"progressToken":3}}}`)
	msg, err := mcpmsg.Parse(body, mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	params := mcpmsg.ReplaceMember(msg.Params, "arguments", []byte(`{"q":"redacted"}`))
	out := mcpmsg.ReplaceMember(body, "params", params)
	again, err := mcpmsg.Parse(out, mcpmsg.Limits{})
	if err != nil {
		t.Fatalf("rewritten message rejected: %v\n%s", err, out)
	}
	if string(again.Arguments) != `{"q":"redacted"}` || again.Name != "t" || string(again.ProgressToken) != "3" || string(again.ID) != "1" {
		t.Errorf("rewritten message reads %+v", again)
	}
	if bytes.Contains(out, []byte("secret")) {
		t.Errorf("old arguments survived: %s", out)
	}
}

func TestAppendQuote(t *testing.T) {
	tests := []struct {
		in   string
		want string // what encoding/json decodes the output to
	}{
		{"", ""},
		{"plain", "plain"},
		{`quote " and backslash \`, `quote " and backslash \`},
		{"\x00\x01\x1f\x7f", "\x00\x01\x1f\x7f"},
		{"\b\f\n\r\t", "\b\f\n\r\t"},
		{"line\u2028para\u2029end", "line\u2028para\u2029end"},
		{"<script>&amp;</script>", "<script>&amp;</script>"},
		{"caf\u00e9 \U0001F600 \u212a", "caf\u00e9 \U0001F600 \u212a"},
		{"bad \xff byte", "bad \uFFFD byte"},
		{"truncated \xe2\x82", "truncated \uFFFD\uFFFD"},
		{"surrogate in UTF-8 \xed\xa0\x80", "surrogate in UTF-8 \uFFFD\uFFFD\uFFFD"},
		{"real U+FFFD \uFFFD", "real U+FFFD \uFFFD"},
	}
	for _, tt := range tests {
		quoted := mcpmsg.Quote(tt.in)
		var got string
		if err := json.Unmarshal(quoted, &got); err != nil {
			t.Errorf("Quote(%q) = %s: not a JSON string: %v", tt.in, quoted, err)
			continue
		}
		if got != tt.want {
			t.Errorf("Quote(%q) = %s, decodes to %q, want %q", tt.in, quoted, got, tt.want)
		}
		if !utf8.Valid(quoted) {
			t.Errorf("Quote(%q) = %q: not valid UTF-8", tt.in, quoted)
		}
		for _, r := range []string{"\u2028", "\u2029", "<", ">", "&"} {
			if bytes.Contains(quoted, []byte(r)) {
				t.Errorf("Quote(%q) = %s: contains %q unescaped", tt.in, quoted, r)
			}
		}
		// Our own parser accepts what we produce.
		body := `{"jsonrpc":"2.0","method":` + string(quoted) + `}`
		msg, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{})
		if err != nil {
			t.Errorf("Parse rejects Quote(%q) = %s: %v", tt.in, quoted, err)
		} else if msg.Method != tt.want {
			t.Errorf("Parse reads Quote(%q) as %q, want %q", tt.in, msg.Method, tt.want)
		}
		// AppendQuote appends.
		if got := mcpmsg.AppendQuote([]byte("x:"), tt.in); string(got) != "x:"+string(quoted) {
			t.Errorf("AppendQuote = %s, want x:%s", got, quoted)
		}
	}
}

// checkAgreement asserts the differential property: a body Parse accepts
// reads the same in encoding/json and in gjson.
func checkAgreement(t testing.TB, body []byte, msg mcpmsg.Message) {
	t.Helper()
	if !json.Valid(body) {
		t.Fatalf("Parse accepted invalid JSON: %q", body)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a number beyond float64 (1e400) is valid JSON
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("encoding/json rejects an accepted body %q: %v", body, err)
	}
	if method, _ := m["method"].(string); method != msg.Method {
		t.Errorf("method: encoding/json %q, Parse %q (body %q)", method, msg.Method, body)
	}
	if msg.ID == nil {
		if _, ok := m["id"]; ok {
			t.Errorf("id: encoding/json sees one, Parse none (body %q)", body)
		}
	} else {
		switch id := m["id"].(type) {
		case string:
			var want string
			if err := json.Unmarshal(msg.ID, &want); err != nil || id != want {
				t.Errorf("id: encoding/json %q, Parse %s (body %q)", id, msg.ID, body)
			}
		case json.Number:
			if id.String() != string(msg.ID) {
				t.Errorf("id: encoding/json %s, Parse %s (body %q)", id, msg.ID, body)
			}
		default:
			t.Errorf("id: encoding/json %T, Parse %s (body %q)", id, msg.ID, body)
		}
	}
	params, _ := m["params"].(map[string]any)
	if (params != nil) != (msg.Params != nil) {
		t.Errorf("params: encoding/json %v, Parse %q (body %q)", params, msg.Params, body)
	}
	if name, _ := params["name"].(string); name != msg.Name {
		t.Errorf("params.name: encoding/json %q, Parse %q (body %q)", name, msg.Name, body)
	}
	if uri, _ := params["uri"].(string); uri != msg.URI {
		t.Errorf("params.uri: encoding/json %q, Parse %q (body %q)", uri, msg.URI, body)
	}
	if msg.Arguments != nil {
		var a, b any
		d1 := json.NewDecoder(bytes.NewReader(msg.Arguments))
		d1.UseNumber()
		if err := d1.Decode(&a); err != nil {
			t.Errorf("arguments span is not JSON: %v", err)
		}
		b = params["arguments"]
		if !jsonEqual(a, b) {
			t.Errorf("params.arguments: encoding/json %v, Parse %s (body %q)", b, msg.Arguments, body)
		}
	} else if _, ok := params["arguments"]; ok {
		t.Errorf("params.arguments: encoding/json sees it, Parse does not (body %q)", body)
	}

	// A case-insensitive struct decoder (encoding/json, as many MCP servers
	// read requests) must see the same routing fields.
	var w struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
			URI       string          `json:"uri"`
		} `json:"params"`
	}
	if err := json.Unmarshal(body, &w); err == nil {
		if w.Method != msg.Method || w.Params.Name != msg.Name || w.Params.URI != msg.URI ||
			!bytes.Equal(w.ID, msg.ID) || !bytes.Equal(w.Params.Arguments, msg.Arguments) {
			t.Errorf("struct decoding reads id=%s method=%q name=%q uri=%q arguments=%s; Parse id=%s method=%q name=%q uri=%q arguments=%s (body %q)",
				w.ID, w.Method, w.Params.Name, w.Params.URI, w.Params.Arguments, msg.ID, msg.Method, msg.Name, msg.URI, msg.Arguments, body)
		}
	}

	if g := gjson.GetBytes(body, "method"); g.String() != msg.Method || g.Exists() != (msg.Method != "" || msg.Kind != mcpmsg.Response) {
		t.Errorf("method: gjson %q (exists %v), Parse %q (body %q)", g.String(), g.Exists(), msg.Method, body)
	}
	if g := gjson.GetBytes(body, "id"); g.Raw != string(msg.ID) {
		t.Errorf("id: gjson %s, Parse %s (body %q)", g.Raw, msg.ID, body)
	}
	if g := gjson.GetBytes(body, "params.name"); g.String() != msg.Name {
		t.Errorf("params.name: gjson %q, Parse %q (body %q)", g.String(), msg.Name, body)
	}
	if g := gjson.GetBytes(body, "params.arguments"); g.Raw != string(msg.Arguments) {
		t.Errorf("params.arguments: gjson %s, Parse %s (body %q)", g.Raw, msg.Arguments, body)
	}
	if g := gjson.GetBytes(body, "params"); g.Raw != string(msg.Params) {
		t.Errorf("params: gjson %s, Parse %s (body %q)", g.Raw, msg.Params, body)
	}
}

func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

// differentialCorpus are bodies Parse accepts, chosen where parsers tend
// to disagree: escapes in keys and values, unusual numbers, big objects.
var differentialCorpus = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_ticket","arguments":{"ticket_id":"T-1"}}}`,
	`{"jsonrpc":"2.0","id":"x","m\u0065thod":"tools\/call","params":{"n\u0061me":"a\u0000b","\u0061rguments":{"\ud83d\ude00":"\u2028"}}}`,
	`{"jsonrpc":"2.0","id":99999999999999999999999,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":-0,"method":"x","params":{"name":"\"quoted\"","arguments":{"big":1e400,"small":-1E-400,"frac":0.000001}}}`,
	`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":0.5}}`,
	`{"jsonrpc":"2.0","id":"r1","result":{"tools":[]}}`,
	`{"jsonrpc":"2.0","id":"r1","error":{"code":-32000,"message":"x","data":null}}`,
	`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"https://example.com/a?b=c&d=\u00e9"}}`,
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{` + manyKeys(40) + `}}}`,
	`{"params":{"arguments":{},"name":"last"},"method":"tools/call","id":"first","jsonrpc":"2.0"}`,
	"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"\u212a\u017f\",\"arguments\":{\"k\":1,\"\u212a\u212a\":2}}}",
}

func TestParseAgreesWithOtherParsers(t *testing.T) {
	for _, body := range differentialCorpus {
		msg, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{})
		if err != nil {
			t.Errorf("Parse(%s): %v", body, err)
			continue
		}
		checkAgreement(t, []byte(body), msg)
	}
}

func FuzzParse(f *testing.F) {
	for _, body := range differentialCorpus {
		f.Add([]byte(body))
	}
	for _, body := range []string{
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","n\u0061me":"b"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"\ud800":1}}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"params\":{\"K\":1,\"\u212a\":2}}",
		`{"jsonrpc":"2.0","id":1.0,"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}}`,
	} {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		msg, err := mcpmsg.Parse(body, mcpmsg.Limits{})
		if !bytes.Equal(body, orig) {
			t.Fatalf("Parse modified its input")
		}
		if err != nil {
			if !errors.Is(err, mcpmsg.ErrInvalid) && !errors.Is(err, mcpmsg.ErrBatch) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		if msg.Kind < mcpmsg.Request || msg.Kind > mcpmsg.Response {
			t.Fatalf("accepted with Kind %d", msg.Kind)
		}
		checkAgreement(t, body, msg)
		// Rewriting arguments keeps the message parseable.
		if msg.Params != nil {
			params := mcpmsg.ReplaceMember(msg.Params, "arguments", []byte(`{"x":1}`))
			out := mcpmsg.ReplaceMember(body, "params", params)
			again, err := mcpmsg.Parse(out, mcpmsg.Limits{MaxDepth: 1 << 20})
			if err != nil {
				t.Fatalf("rewritten message rejected: %v\n%q", err, out)
			}
			if string(again.Arguments) != `{"x":1}` || again.Method != msg.Method || again.Name != msg.Name || !bytes.Equal(again.ID, msg.ID) {
				t.Fatalf("rewritten message reads differently: %+v", again)
			}
		}
	})
}

// benchBody is a realistic tools/call of about 300 bytes.
var benchBody = []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"read_ticket","arguments":{"ticket_id":"TEST-123","include":["comments","history"],"limit":20,"fields":{"title":true,"body":true,"assignee":false}},"_meta":{"progressToken":"c2c4f8a0-8a7b-4b8e-9f6a-1d2e3f4a5b6c"}}}`)

// BenchmarkParseSmallResult is an upstream's small tool result, whose
// members are checked for their spelling (resultMembers).
func BenchmarkParseSmallResult(b *testing.B) {
	msg := []byte(`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"the ticket T-1 is open"}],"structuredContent":{"id":"T-1","state":"open"},"isError":false}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := mcpmsg.Parse(msg, mcpmsg.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		msg, err := mcpmsg.Parse(benchBody, mcpmsg.Limits{})
		if err != nil || msg.Name != "read_ticket" {
			b.Fatal(err)
		}
	}
}

// A key that is a case variant of a routing member, without the member
// itself, is not a duplicate, but a parser that matches keys regardless of
// case (encoding/json decoding into a struct, as many MCP servers do) reads
// it as that member while Parse would not: policy would see no arguments
// and the upstream would run with them. Parse must refuse such keys.
func TestParseRejectsCaseVariantsOfRoutingMembers(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"Arguments", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_ticket","Arguments":{"ticket_id":"SECRET-1"}}}`},
		{"ARGUMENTS", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_ticket","ARGUMENTS":{"ticket_id":"SECRET-1"}}}`},
		{"Name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"Name":"delete_ticket","arguments":{}}}`},
		{"URI", `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"URI":"file:///etc/passwd"}}`},
		{"protocolVersion with long s", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVer\u017fion\":\"1999-01-01\"}}"},
		{"Params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","Params":{"name":"delete_ticket"}}`},
		{"ID on a notification", `{"jsonrpc":"2.0","method":"tools/call","ID":5,"params":{"name":"t"}}`},
		{"Method on a response", `{"jsonrpc":"2.0","id":1,"result":{},"Method":"tools/call"}`},
		{"Result", `{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"},"Result":{}}`},
		{"JSONRPC", `{"JSONRPC":"1.0","jsonrpc":"2.0","method":"x"}`},
		{"escaped Kelvin-free variant", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","\u0041rguments":{}}}`},
	}
	type wire struct {
		ID     any    `json:"id"`
		Method string `json:"method"`
		Params struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
			URI       string         `json:"uri"`
		} `json:"params"`
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := mcpmsg.Parse([]byte(tt.body), mcpmsg.Limits{})
			if err == nil {
				// Show the disagreement that makes this a bypass.
				var w wire
				_ = json.Unmarshal([]byte(tt.body), &w)
				t.Fatalf("Parse accepted %s: it reads name=%q arguments=%s id=%s, a case-insensitive decoder reads %+v", tt.body, msg.Name, msg.Arguments, msg.ID, w)
			}
			if !errors.Is(err, mcpmsg.ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
	// Keys that merely resemble members stay accepted.
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":"b"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"Name":"x","Arguments":1,"URI":"u"}}}`,
	} {
		if _, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{}); err != nil {
			t.Errorf("Parse(%s): %v", body, err)
		}
	}
}

// Two spellings of one id share a key; different ids never do.
func TestIDKey(t *testing.T) {
	same := [][2]string{
		{`"e1"`, `"e\u0031"`}, {`"a/b"`, `"a\/b"`}, {`"é"`, `"\u00e9"`}, {`"😀"`, `"\ud83d\ude00"`}, {`0`, `-0`}, {`12`, `12`},
	}
	for _, p := range same {
		if a, b := mcpmsg.IDKey([]byte(p[0])), mcpmsg.IDKey([]byte(p[1])); a == "" || a != b {
			t.Errorf("IDKey(%s) = %q, IDKey(%s) = %q; want one key", p[0], a, p[1], b)
		}
	}
	different := [][2]string{{`"1"`, `1`}, {`"e1"`, `"E1"`}, {`1`, `-1`}, {`"e1"`, `"e1 "`}}
	for _, p := range different {
		if mcpmsg.IDKey([]byte(p[0])) == mcpmsg.IDKey([]byte(p[1])) {
			t.Errorf("IDKey(%s) == IDKey(%s)", p[0], p[1])
		}
	}
	for _, bad := range []string{``, `null`, `1.0`, `1e3`, `01`, `"open`, `"a"x`, `{}`, `-`} {
		if k := mcpmsg.IDKey([]byte(bad)); k != "" {
			t.Errorf("IDKey(%s) = %q, want none", bad, k)
		}
	}
}

// MaxValues bounds the JSON values of a message, its members' and
// elements' included; a long string is one.
func TestMaxValues(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":[` +
		strings.TrimSuffix(strings.Repeat("{},", 1000), ",") + `],"b":"` + strings.Repeat("y", 1<<16) + `"}}}`
	if _, err := mcpmsg.Parse([]byte(msg), mcpmsg.Limits{MaxValues: 1010}); err != nil {
		t.Errorf("about 1,005 values within a bound of 1,010: %v", err)
	}
	if _, err := mcpmsg.Parse([]byte(msg), mcpmsg.Limits{MaxValues: 999}); err == nil || !strings.Contains(err.Error(), "more than 999 JSON values") {
		t.Errorf("over 1,000 values past a bound of 999: %v", err)
	}
	if err := mcpmsg.Validate([]byte(`[1,2,3]`), mcpmsg.Limits{MaxValues: 3}); err == nil {
		t.Error("Validate: 4 values past a bound of 3")
	}
}

// A member beside JSON-RPC's is marked, and WithoutExtra leaves it out,
// each other value as it was sent.
func TestExtraMembers(t *testing.T) {
	for in, want := range map[string]string{
		`{"jsonrpc":"2.0","id":7,"result":{"a" : 1},"note":"secret"}`:                           `{"jsonrpc":"2.0","id":7,"result":{"a" : 1}}`,
		`{"x":[1],"jsonrpc":"2.0","id":"s","error":{"code":1,"message":"m"}}`:                   `{"jsonrpc":"2.0","id":"s","error":{"code":1,"message":"m"}}`,
		`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"},"y":null}`: `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","z":{}}`:                                       `{"jsonrpc":"2.0","id":1,"method":"ping"}`,
	} {
		msg, err := mcpmsg.Parse([]byte(in), mcpmsg.Limits{})
		if err != nil || !msg.Extra {
			t.Fatalf("%s: Extra %v, %v", in, msg.Extra, err)
		}
		if got := string(msg.WithoutExtra()); got != want {
			t.Errorf("%s: WithoutExtra = %s, want %s", in, got, want)
		}
	}
	msg, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`), mcpmsg.Limits{})
	if err != nil || msg.Extra {
		t.Errorf("a message with JSON-RPC's members only: Extra %v, %v", msg.Extra, err)
	}
}
