package mcpmsg

import (
	"strings"
	"testing"
)

// Attack (fixed): Parse reads params._meta.progressToken (Message.ProgressToken,
// mcpmsg.go readParams, memberOf(raw, "progressToken")) and the members it
// reads are, by the stated rule of this package ("The members of a message
// and of its params: those Parse reads … A key that differs from one of
// them only in case is refused even without the member itself"), refused in
// another case. The check runs on params' own keys only (paramsMembers), not
// on _meta's: a request whose _meta says "ProgressToken" is accepted, Parse
// reports no progress token, and a peer decoding with encoding/json (mcp-go's
// Meta.ProgressToken) reads one. Every place toolgate routes progress by
// this token (mcpproxy Requesting/progressFor, the federation's
// fs.progress, the stdio/legacy SSE bridge's rewrite of the token to its
// own link id, internal/mcpbridge/session.go:71-75) sees none, while the
// upstream gets the runner's raw token. Fixed: _meta's progressToken is
// refused spelled in another case.
func TestSpellingAttackMetaProgressTokenInAnotherCase(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"ProgressToken":7}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"PROGRESSTOKEN":7}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{},"_meta":{"progre\u017fsToken":7}}}`,
	} {
		msg, err := Parse([]byte(body), Limits{})
		if err == nil {
			t.Errorf("accepted, with ProgressToken %q as Parse reads it, though a case-insensitive decoder reads 7: %s", msg.ProgressToken, body)
		}
	}
}

// Holds: the members refused in another case are refused in another case, also
// spelled with escapes or with the Unicode characters that fold onto ASCII
// letters (U+017F, U+212A), at every place they named; ordinary members
// beside them, and PascalCase keys one level down (structuredContent, an
// error's data, an answer's form content), pass.
func TestSpellingHoldsMembersRefusedInAnyCase(t *testing.T) {
	refused := []string{
		`{"jsonrpc":"2.0","id":1,"result":{"\u0043ontent":[]}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"ta\u017fk":{}}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"TOOLS":[]}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","D\u0061ta":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","Ta\u017fk":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"REF":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","inputResponses":{"a":{"\u0041ction":"accept"}}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"Reason":"x"}}`,
	}
	for _, body := range refused {
		if _, err := Parse([]byte(body), Limits{}); err == nil {
			t.Errorf("accepted: %s", body)
		}
	}
	accepted := []string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":{"Content":1,"Tools":[],"IsError":true},"_meta":{"Task":1}}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","data":{"Code":1,"Message":"x","Data":2}}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"action":"accept","content":{"Name":"n","Content":"c"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"Name":"a","URI":"b"},"_meta":{"Trace":1}}}`,
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":1,"result":[]}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{}}`,
	}
	for _, body := range accepted {
		if _, err := Parse([]byte(body), Limits{}); err != nil {
			t.Errorf("refused: %v: %s", err, body)
		}
	}
	// Odd input: no panic.
	for _, body := range []string{`{"jsonrpc":"2.0","id":1,"method":"x","params":[]}`, `{"jsonrpc":"2.0","id":1,"method":"x","params":"s"}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":[{"Action":1}]}}`, `{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":1}}}`,
		`{"jsonrpc":"2.0","id":1,"result":` + strings.Repeat("[", 40) + `{"Content":1}` + strings.Repeat("]", 40) + `}`} {
		_, _ = Parse([]byte(body), Limits{})
	}
	for _, obj := range []string{``, `{`, `{"a"`, `[]`, `"x"`, `{"Type":}`, `{"type":1,"TYPE":2}`} {
		_, _ = MemberFold([]byte(obj), "type")
	}
}
