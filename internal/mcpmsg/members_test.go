package mcpmsg

import (
	"bytes"
	"testing"
)

func TestRemoveMember(t *testing.T) {
	for _, c := range [][3]string{
		{`{"a":1,"b":2,"c":3}`, "b", `{"a":1,"c":3}`},
		{`{"a":1,"b":2}`, "a", `{"b":2}`},
		{`{"a":1,"b":2}`, "b", `{"a":1}`},
		{`{"a":1}`, "a", `{}`},
		{`{ "a" : {"x":"\"b\":1"} , "b":2}`, "a", `{ "b":2}`},
		{`{"a\"b":1,"c":2}`, "c", `{"a\"b":1}`},
		{`{"a":1}`, "z", `{"a":1}`},
	} {
		got := RemoveMember([]byte(c[0]), c[1])
		if string(got) != c[2] {
			t.Errorf("%s without %s = %s, want %s", c[0], c[1], got, c[2])
		}
		if err := Validate(got, Limits{}); err != nil {
			t.Errorf("%s: %v", got, err)
		}
	}
}

func TestRemoveMemberFold(t *testing.T) {
	for _, c := range [][3]string{
		{`{"a":1,"InputResponses":2}`, "inputResponses", `{"a":1}`},
		{`{"input\u0052esponses":2,"a":1}`, "inputResponses", `{"a":1}`},
		{`{"a":1}`, "A", `{}`},
		{`{"a":1}`, "b", `{"a":1}`},
	} {
		if got := RemoveMemberFold([]byte(c[0]), c[1]); string(got) != c[2] {
			t.Errorf("%s without %s in any case = %s, want %s", c[0], c[1], got, c[2])
		}
	}
}

func TestMemberFold(t *testing.T) {
	for _, c := range [][4]string{
		{`{"a":1,"Uri":"x"}`, "uri", "Uri", `"x"`},
		{` {"uri" : {"b":2} }`, "uri", "uri", `{"b":2}`},
		{`{"\u0055ri":3}`, "uri", "Uri", `3`},
		{`{"\u212Aey":4}`, "key", "\u212Aey", `4`}, // the Kelvin sign folds onto k
		{`{"a":1}`, "uri", "", ""},
		{`"uri"`, "uri", "", ""},
		{`["uri"]`, "uri", "", ""},
		{``, "uri", "", ""},
	} {
		want := c[2]
		if s, ok := String([]byte(`"` + want + `"`)); ok {
			want = s
		}
		name, v := MemberFold([]byte(c[0]), c[1])
		if name != want || string(v) != c[3] {
			t.Errorf("MemberFold(%s, %s) = %q, %s; want %q, %s", c[0], c[1], name, v, want, c[3])
		}
	}
}

// The members a retried multi round-trip request carries are read, and
// their case variants refused like those of every member Parse reads.
func TestRoundMembers(t *testing.T) {
	msg, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputResponses":{"k":{"action":"accept"}},"requestState":"s","_meta":{"x":1}}}`), Limits{})
	if err != nil || string(msg.InputResponses) != `{"k":{"action":"accept"}}` || string(msg.RequestState) != `"s"` || string(msg.Meta) != `{"x":1}` {
		t.Fatalf("%+v %v", msg, err)
	}
	for _, bad := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","RequestState":"s"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputresponses":{}}}`,
	} {
		if _, err := Parse([]byte(bad), Limits{}); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// A result's members are read as spelled (toolgate decides by "content"
// whether an answer is a tool result, filters a listing's "tools"): their
// case variants are refused, as a runner whose decoder ignores case would
// read them instead. Deeper keys, and keys of no result member, are the
// upstream's own.
func TestResultMembersSpelled(t *testing.T) {
	for _, bad := range []string{
		`{"Tools":[{"name":"x"}]}`,
		`{"task":{"taskId":"t"},"Content":[{"type":"text","text":"x"}]}`,
		`{"content\u0053":1,"Content":[]}`,
		`{"\u0043ontent":[]}`,
		`{"ſtructuredContent":{}}`, // U+017F folds onto s
		`{"_META":{}}`,
		`{"inputrequests":{}}`,
	} {
		if _, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":`+bad+`}`), Limits{}); err == nil {
			t.Errorf("accepted the result %s", bad)
		}
	}
	for _, good := range []string{
		`{"content":[{"Type":"text","Text":"x"}],"structuredContent":{"Content":1,"TOOLS":2}}`,
		`{"tools":[],"Toolz":1,"x-Content":2}`,
		`"Content"`,
		`{}`,
	} {
		if _, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":`+good+`}`), Limits{}); err != nil {
			t.Errorf("refused the result %s: %v", good, err)
		}
	}
	// A request's params and an error are not results.
	for _, good := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"Content":1}}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","data":{"Tools":1}}}`,
	} {
		if _, err := Parse([]byte(good), Limits{}); err != nil {
			t.Errorf("refused %s: %v", good, err)
		}
	}
}

// An error's members, each input response's (a result of the input
// request it answers) and the params members of MCP's requests and
// notifications (which the request policy reads) are refused spelled in
// another case too; their exact spellings, and deeper keys, pass.
func TestMembersSpelledBeyondResults(t *testing.T) {
	for _, bad := range []string{
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","Data":{"approval_url":"https://x"}}}`,
		`{"jsonrpc":"2.0","id":1,"error":{"Code":1,"message":"m"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputResponses":{"confirm":{"Action":"accept"}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputResponses":{"s":{"role":"user","CONTENT":{}}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"Ref":{"type":"ref/prompt","name":"p"},"argument":{"name":"a","value":""}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"LEVEL":"debug"}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"RequestId":1}}`,
		`{"jsonrpc":"2.0","id":1,"method":"resources/list","params":{"curſor":"x"}}`,
	} {
		if _, err := Parse([]byte(bad), Limits{}); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	for _, good := range []string{
		`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m","data":{"Data":1,"Code":2}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","inputResponses":{"confirm":{"action":"accept","content":{"Action":1}}}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"Type":"x"},"argument":{"name":"a","value":""},"context":{"arguments":{}}}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"r","X-Vendor":1}}`,
	} {
		if _, err := Parse([]byte(good), Limits{}); err != nil {
			t.Errorf("refused %s: %v", good, err)
		}
	}
}

// RemoveMembersWithPrefix writes, in one pass, what removing the members
// one by one writes (removeMember until none is left), blanks and commas
// included.
func TestRemoveMembersWithPrefixAsOneByOne(t *testing.T) {
	match := func(k []byte) bool { return len(k) >= 2 && bytes.EqualFold(k[:2], []byte("p/")) }
	for _, obj := range []string{
		`{"a":1,"p/x":2,"p/y":3}`, `{ "p/x" : 1 , "p/y":2, "b":3 }`, `{"p/x":1}`, `{"p/x":1,"p/y":2}`, `{}`, `{ }`,
		`{"b":1 , "p/x":2 ,"c":3, "P/z":4}`, `{"p/x":{"p/y":1},"b":[1,{"p/z":2}] ,"\u0070/w":"x"}`, "{\n\t\"p/a\": 1,\n\t\"b\": 2,\n\t\"p/c\": 3\n}",
	} {
		want := []byte(obj)
		for {
			out := removeMember(want, match)
			if len(out) == len(want) {
				break
			}
			want = out
		}
		if got := RemoveMembersWithPrefix([]byte(obj), "p/"); string(got) != string(want) {
			t.Errorf("RemoveMembersWithPrefix(%s) = %s, one by one %s", obj, got, want)
		}
	}
}
