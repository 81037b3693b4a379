package mcp2026

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// r11OldResultType and r11OldComplete are ResultType and Complete before
// 3b13504 (gjson).
func r11OldResultType(result []byte) string {
	if t := gjson.GetBytes(result, "resultType"); t.Type == gjson.String {
		return t.Str
	}
	return ResultComplete
}

func r11OldComplete(method string, result []byte, private bool) []byte {
	if len(result) == 0 || result[0] != '{' {
		return result
	}
	t, isString := mcpmsg.String(mcpmsg.MemberOf(result, "resultType"))
	switch {
	case isString && t == ResultInputRequired:
		return result
	case !isString || t != ResultComplete:
		result = mcpmsg.ReplaceMember(result, "resultType", []byte(`"complete"`))
	}
	if mcpmsg.MemberOf(result, "requestState") != nil {
		result = mcpmsg.RemoveMember(result, "requestState")
	}
	if !slices.Contains(CacheableMethods, method) {
		return result
	}
	if !gjson.GetBytes(result, "ttlMs").Exists() {
		result = mcpmsg.ReplaceMember(result, "ttlMs", []byte("0"))
	}
	if scope := gjson.GetBytes(result, "cacheScope"); private && scope.Str != "private" || !scope.Exists() {
		result = mcpmsg.ReplaceMember(result, "cacheScope", []byte(`"private"`))
	}
	return result
}

// r11Read is what a runner decoding with encoding/json reads of a result.
type r11Read struct {
	ResultType   json.RawMessage `json:"resultType"`
	RequestState json.RawMessage `json:"requestState"`
	TTLMs        json.RawMessage `json:"ttlMs"`
	CacheScope   json.RawMessage `json:"cacheScope"`
}

// r11Type is the resultType a runner reads: a string's, else complete
// (as the SDKs read any other).
func r11Type(read r11Read) string {
	var s string
	if json.Unmarshal(read.ResultType, &s) == nil && read.ResultType != nil && read.ResultType[0] == '"' {
		return s
	}
	return ResultComplete
}

// Attack: an upstream's 2026-07-28 result (Parse-accepted) whose
// resultType, requestState, ttlMs or cacheScope hide behind escaped keys,
// strings holding those keys and escaped quotes or backslashes, nested
// objects holding the same keys, deep nesting, numbers, literals and
// blanks, hoping ResultType or Complete read it otherwise than the runner
// does: an input_required result toolgate takes for complete (its input
// requests past the rules), a requestState reaching the runner unsealed
// from a "complete" result, or a shared cacheScope on a private result.
//
// Expected: ResultType reads what the runner reads; Complete leaves no
// requestState, writes "complete" unless exactly input_required, and
// cacheScope "private" when private; the new code answers as the old
// (gjson) did, or reads escaped keys the old missed.
// Held: as expected on every case. Where old and new differ, it is the
// old gjson lookup that missed an escaped key the runner reads (logged).
// Severity: none.
func TestR11ResultTypeAndCompleteReadAsTheRunner(t *testing.T) {
	deep := strings.Repeat(`{"resultType":"complete","x":`, 30) + `1` + strings.Repeat(`}`, 30)
	cases := []string{
		`{"resultType":"input_required","inputRequests":{}}`,
		`{"result\u0054ype":"input_required","inputRequests":{}}`,
		`{"\u0072esultType" : "input_required"}`,
		`{"content":[{"type":"text","text":"\",\"resultType\":\"complete\"}"}],"resultType":"input_required"}`,
		`{"a":"\\","resultType":"input_required","requestState":"s"}`,
		`{"a":"\\\"resultType\\\":","resultType":"complete","request\u0053tate":"upstream's"}`,
		`{"x":` + deep + `,"resultType":"input_required"}`,
		`{"x":` + deep + `,"requestState":"upstream's","ttlMs":5,"cacheScope":"shared"}`,
		`{"resultType":null,"requestState":{"a":"}"},"ttl\u004ds":1e2,"cache\u0053cope":"public"}`,
		`{"resultType":1,"requestState":[1,"]"],"cacheScope":"private"}`,
		`{"resultType":"Input_Required","requestState":"x"}`,
		`{ "tools" : [ ] , "resultType" : "complete" , "requestState" : "x" }`,
		`{"tools":[{"name":"t","inputSchema":{"type":"object","properties":{"resultType":{"type":"string"},"requestState":{}}}}],"nextCursor":"\u0000"}`,
		`{}`, `{ }`,
	}
	for _, result := range cases {
		msg, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":`+result+`}`), mcpmsg.Limits{})
		if err != nil {
			t.Fatalf("premise: %s: %v", result, err)
		}
		r := msg.Result
		var read r11Read
		if err := json.Unmarshal(r, &read); err != nil {
			t.Fatal(err)
		}
		runner := r11Type(read)
		if got := ResultType(r); got != runner {
			t.Errorf("ResultType(%s) = %q, the runner reads %q", r, got, runner)
		}
		if o, n := r11OldResultType(r), ResultType(r); o != n {
			t.Logf("ResultType(%s): old %q, new %q (runner %q)", r, o, n, runner)
		}
		for _, method := range []string{"tools/list", "tools/call"} {
			for _, private := range []bool{false, true} {
				out := Complete(method, r, private)
				if err := mcpmsg.Validate(out, mcpmsg.Limits{}); err != nil {
					t.Errorf("Complete(%s) = %s: %v", r, out, err)
					continue
				}
				var got r11Read
				if err := json.Unmarshal(out, &got); err != nil {
					t.Fatal(err)
				}
				if r11Type(got) == ResultInputRequired {
					continue // left as it is
				}
				if string(got.ResultType) != `"complete"` {
					t.Errorf("Complete(%s) = %s: resultType not complete", r, out)
				}
				if got.RequestState != nil {
					t.Errorf("Complete(%s) = %s: a requestState reaches the runner", r, out)
				}
				if method == "tools/list" && (got.TTLMs == nil || got.CacheScope == nil || private && string(got.CacheScope) != `"private"`) {
					t.Errorf("Complete(%s, private %v) = %s: caching hints", r, private, out)
				}
				if o := r11OldComplete(method, r, private); string(o) != string(out) {
					t.Logf("Complete(%s, %s, %v): old %s, new %s", method, r, private, o, out)
				}
			}
		}
	}
}

// Attack: a runner of an earlier revision sends a request whose
// params._meta holds 20 000 members of the 2026 namespace
// ("io.modelcontextprotocol/m0":0, …: 800 KB, 40 000 values, inside
// max_request_bytes (4 MiB) and max_request_values (100 000)); WithMeta
// strips them (mcpmsg.RemoveMembersWithPrefix) before toolgate sets its
// own.
//
// Expected: work linear in the request.
// Reproduced, fixed (RemoveMembersWithPrefix is one pass now): one member
// was removed per pass, the object copied each time — quadratic, seconds
// of CPU per request (see TestR11WithoutOwnMarksIsQuadraticInForgedMarks
// in mcpproxy for the upstream's side). Severity: medium (CPU exhaustion
// by one caller). The test counts the copies (allocations), not time: a
// copy per member removed is the quadratic work.
func TestR11WithMetaIsQuadraticInNamespaceMembers(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"name":"t","_meta":{`)
	for i := range 20000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"io.modelcontextprotocol/m` + strings.Repeat("x", i%3) + `` + string(rune('a'+i%26)) + `` + itoaR11(i) + `":0`)
	}
	b.WriteString(`}}`)
	msg, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":`+b.String()+`}`), mcpmsg.Limits{MaxValues: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	allocs := testing.AllocsPerRun(1, func() { out = WithMeta(msg.Params, nil) })
	if strings.Contains(string(out), "io.modelcontextprotocol/") {
		t.Fatal("premise: the namespace's members were not all removed")
	}
	if allocs > 100 {
		t.Fatalf("WithMeta of %d bytes of params holding 20 000 namespace members made %.0f allocations: a copy per member removed", len(msg.Params), allocs)
	}
}

func itoaR11(i int) string {
	return strconv.Itoa(i)
}
