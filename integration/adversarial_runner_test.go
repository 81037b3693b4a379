package integration

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Hostile runners: messages that could read one way to the gateway and
// another way upstream, bodies too large or too deep, the wrong content
// type or HTTP method. Each is refused with a clear error before anything
// reaches the upstream or storage. The parser's own tests
// (internal/mcpmsg) hold every rule byte by byte; these prove the gateway
// applies them to what runners send. Also covered elsewhere:
// TestBatchesAndDuplicateKeysAreRejected, TestArgumentKeysThatFoldAreRefused
// (keys an encoding/json upstream would fold), TestApprovalIdentityOfArguments.
func TestAdversarialRunnerMessages(t *testing.T) {
	up, g, m := aliceSession(t, gatewayConfig{})
	deep := strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100)
	call := func(params string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`
	}
	cases := []struct {
		name   string
		method string // HTTP method, default POST
		header map[string]string
		body   string
		status int
		says   string // in the answer
	}{
		// Duplicate and case-variant keys, at every level.
		{name: "duplicate id", body: `{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}`, status: 400, says: "duplicate key"},
		{name: "duplicate method", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"not_allowlisted"}}`, status: 400, says: "duplicate key"},
		{name: "case-variant method", body: `{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{"name":"not_allowlisted"}}`, status: 400, says: "even in another case"},
		{name: "case-variant params", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"PARAMS":{"name":"not_allowlisted"}}`, status: 400, says: "even in another case"},
		{name: "duplicate jsonrpc", body: `{"jsonrpc":"2.0","jsonrpc":"1.0","id":1,"method":"ping"}`, status: 400, says: "duplicate key"},
		{name: "escaped duplicate name", body: call(`{"name":"echo","na\u006de":"not_allowlisted","arguments":{}}`), status: 400, says: "duplicate key"},
		{name: "duplicate argument", body: call(`{"name":"echo","arguments":{"text":"a","text":"b"}}`), status: 400, says: "duplicate key"},
		{name: "case-variant argument", body: call(`{"name":"echo","arguments":{"text":"a","TEXT":"b"}}`), status: 400, says: "even in another case"},
		{name: "duplicate key deep in the arguments", body: call(`{"name":"echo","arguments":{"a":[{"b":{"c":1,"c":2}}]}}`), status: 400, says: "duplicate key"},
		{name: "duplicate _meta key", body: call(`{"name":"echo","arguments":{},"_meta":{"progressToken":1,"progressToken":2}}`), status: 400, says: "duplicate key"},
		{name: "duplicate key in a ping's params", body: `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":{"y":true,"y":false}}}`, status: 400, says: "duplicate key"},
		// Batches.
		{name: "batch", body: `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, status: 400, says: "batches are not supported"},
		{name: "empty batch", body: `[]`, status: 400, says: "batches are not supported"},
		{name: "batch after whitespace", body: " \n\t[" + call(`{"name":"echo","arguments":{}}`) + "]", status: 400, says: "batches are not supported"},
		// Escaped and invalid UTF-8 methods and names.
		{name: "invalid UTF-8 in the method", body: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\xff\",\"params\":{\"name\":\"echo\"}}", status: 400, says: "UTF-8"},
		{name: "invalid UTF-8 in the tool name", body: call("{\"name\":\"ech\xc3o\",\"arguments\":{}}"), status: 400, says: "UTF-8"},
		{name: "overlong UTF-8 slash", body: call("{\"name\":\"echo\xc0\xaf\",\"arguments\":{}}"), status: 400, says: "UTF-8"},
		{name: "lone surrogate in the name", body: call(`{"name":"echo\ud800","arguments":{}}`), status: 400, says: "surrogate"},
		{name: "invalid UTF-8 in a key", body: call("{\"name\":\"echo\",\"arguments\":{\"te\xffxt\":1}}"), status: 400, says: "UTF-8"},
		// Size and depth.
		{name: "nesting deeper than max_json_depth", body: call(`{"name":"echo","arguments":` + deep + `}`), status: 400, says: "nest"},
		{name: "trailing data", body: `{"jsonrpc":"2.0","id":1,"method":"ping"} {"jsonrpc":"2.0","id":2,"method":"ping"}`, status: 400, says: "after"},
		// Content types and HTTP methods.
		{name: "text/plain", header: map[string]string{"Content-Type": "text/plain"}, body: call(`{"name":"echo","arguments":{}}`), status: 415, says: "Content-Type must be application/json"},
		{name: "form", header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: "a=b", status: 415, says: "Content-Type must be application/json"},
		{name: "no content type", header: map[string]string{"Content-Type": ""}, body: call(`{"name":"echo","arguments":{}}`), status: 415, says: "Content-Type must be application/json"},
		{name: "json lookalike", header: map[string]string{"Content-Type": "application/jsonx"}, body: call(`{"name":"echo","arguments":{}}`), status: 415, says: "Content-Type must be application/json"},
		{name: "PUT", method: http.MethodPut, body: call(`{"name":"echo","arguments":{}}`), status: 405, says: "not allowed"},
		{name: "PATCH", method: http.MethodPatch, body: call(`{"name":"echo","arguments":{}}`), status: 405, says: "not allowed"},
		{name: "GET that wants JSON", method: http.MethodGet, header: map[string]string{"Accept": "application/json"}, status: 406, says: "Accept must include text/event-stream"},
		// Protocol headers.
		{name: "unsupported protocol version", header: map[string]string{"Mcp-Protocol-Version": "1999-01-01"}, body: call(`{"name":"echo","arguments":{}}`), status: 400, says: "unsupported MCP-Protocol-Version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, up, g)
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			status, _, answer := m.rawRequest(method, tc.header, body)
			if status != tc.status || !strings.Contains(answer, tc.says) {
				t.Errorf("%d %s; want %d saying %q", status, answer, tc.status, tc.says)
			}
			before.check(t)
		})
	}

	// A name that only decodes to a tool off the allowlist is off the
	// allowlist; one that decodes to a denied tool is denied: escapes
	// change no decision.
	t.Run("escaped names", func(t *testing.T) {
		before := snapshot(t, up, g)
		_, _, answer := m.rawRequest(http.MethodPost, nil, strings.NewReader(call(`{"name":"not_allow\u006cisted","arguments":{}}`)))
		if !strings.Contains(answer, "-32602") || !strings.Contains(answer, "Unknown tool: not_allowlisted") {
			t.Errorf("an escaped name off the allowlist: %s", answer)
		}
		_, _, answer = m.rawRequest(http.MethodPost, nil, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"name":"forbidden\u005ftool","arguments":{}}}`))
		if !strings.Contains(answer, "forbidden_tool is forbidden in tests") || !strings.Contains(answer, `"isError":true`) {
			t.Errorf("an escaped method and name of a denied tool: %s", answer)
		}
		before.check(t)
	})

	// Over max_request_size, with a Content-Length and without one
	// (chunked): refused with 413 before the whole body is read.
	t.Run("oversized bodies", func(t *testing.T) {
		before := snapshot(t, up, g)
		big := call(`{"name":"echo","arguments":{"text":"` + strings.Repeat("x", 5<<20) + `"}}`)
		status, _, answer := m.rawRequest(http.MethodPost, nil, bytes.NewReader([]byte(big)))
		if status != http.StatusRequestEntityTooLarge || !strings.Contains(answer, "max_request_size") {
			t.Errorf("with a length: %d %s", status, answer)
		}
		status, _, answer = m.rawRequest(http.MethodPost, nil, struct{ io.Reader }{strings.NewReader(big)})
		if status != http.StatusRequestEntityTooLarge || !strings.Contains(answer, "max_request_size") {
			t.Errorf("chunked: %d %s", status, answer)
		}
		before.check(t)
	})

	// After all of that, the session works.
	if _, _, msgs := m.post(call(`{"name":"echo","arguments":{"text":"still here"}}`)); len(msgs) != 1 ||
		!strings.Contains(string(msgs[0]), `still here`) {
		t.Fatalf("a good call after the bad ones: %s", msgs)
	}
}
