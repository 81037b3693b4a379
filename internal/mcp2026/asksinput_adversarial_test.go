package mcp2026

// Adversarial review of AsksInput, InputRequestsProblem, isInputRequests
// and the helpers that read input requests (bd9c0cd: one pass over the
// result's members, resultType compared as raw key bytes).

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// foldRunner is what a runner decoding with encoding/json (which matches
// member names without regard to case, Unicode simple folding, and decodes
// escaped names) reads of a result: whether it asks for input
// (resultType input_required, or inputRequests not null).
func foldRunner(t *testing.T, result []byte) (asks bool, ok bool) {
	t.Helper()
	var r struct {
		ResultType    json.RawMessage `json:"resultType"`
		InputRequests json.RawMessage `json:"inputRequests"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return false, false
	}
	var rt string
	_ = json.Unmarshal(r.ResultType, &rt)
	return (r.InputRequests != nil && string(r.InputRequests) != "null") || rt == ResultInputRequired, true
}

// parsedResult is the result of an upstream's answer as Parse accepts it
// (nil when Parse refuses the answer).
func parsedResult(t *testing.T, result string) []byte {
	t.Helper()
	msg, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":`+result+`}`), mcpmsg.Limits{})
	if err != nil {
		return nil
	}
	return msg.Result
}

// Attack (fixed): an upstream spells resultType in another case ("ResultType",
// "resulttype", or "reſultType" with U+017F) with the value
// "input_required". A runner decoding with encoding/json reads that member
// as resultType, so it reads an input_required result, but AsksInput
// compares the key as raw bytes (string(key) == "resultType"), unlike
// isInputRequests beside it, which folds: AsksInput says the result does
// not ask for input, and finish relays it to a runner of an earlier
// revision. (Old code had the same gap through gjson's exact ResultType;
// InputRequestsProblem/Complete read resultType exactly too.)
// Fixed: AsksInput reads the resultType key in any case; and Parse refuses
// a result's member spelled in another case before anything reads it.
func TestAsksInputAttackResultTypeCaseVariant(t *testing.T) {
	for _, key := range []string{"ResultType", "resulttype", "RESULTTYPE", "reſultType"} {
		raw := `{"content":[{"type":"text","text":"ok"}],"` + key + `":"input_required"}`
		if parsedResult(t, raw) != nil {
			t.Errorf("%s: Parse accepts a result's resultType spelled in another case", key)
		}
		result := []byte(raw) // what AsksInput reads, should an answer get past Parse
		runner, ok := foldRunner(t, result)
		if !ok || !runner {
			t.Fatalf("%s: control: an encoding/json runner does not read input_required", key)
		}
		if !AsksInput(result) {
			t.Errorf("%s: AsksInput(%s) = false, but a runner decoding with encoding/json reads resultType %q", key, result, ResultInputRequired)
		}
	}
}

// Holds: AsksInput against a runner decoding with encoding/json, over
// every combination of: resultType spelled exactly or escaped
// ("result\u0054ype"), with string, escaped-string, null, number, array and
// case-variant values; inputRequests spelled exactly, escaped, in another
// ASCII case, with U+017F, with a trailing space, NUL or zero-width space,
// with null (also after whitespace), {}, a request, [], "", 0, false. Only
// the resultType key's case variants (TestAsksInputAttackResultTypeCaseVariant)
// disagree, and they are left out here.
func TestAsksInputHoldsAgreesWithEncodingJSON(t *testing.T) {
	keysIR := []string{"", `inputRequests`, `\u0069nputRequests`, `InputRequests`, `inputrequests`, `inputRequeſts`, `INPUTREQUESTS`,
		`input\u0052equests`, `inputRequests `, ` inputRequests`, `inputRequests\u0000`, `inputRequests\u200b`, `input_requests`}
	valsIR := []string{`null`, ` null `, `{}`, `{"a":{"method":"roots/list","params":{}}}`, `[]`, `""`, `0`, `false`, `"null"`}
	keysRT := []string{"", `resultType`, `result\u0054ype`, `resultType `, `result_type`}
	valsRT := []string{`"input_required"`, `"input\u005frequired"`, `"\u0069nput_required"`, `"complete"`, `null`, `1`, `["input_required"]`,
		`{"x":"input_required"}`, `"INPUT_REQUIRED"`, `"input_required "`, `" input_required"`, `"input_required\u0000"`}
	n := 0
	for _, kr := range keysRT {
		for _, vr := range valsRT {
			for _, ki := range keysIR {
				for _, vi := range valsIR {
					for _, order := range []bool{false, true} {
						members := []string{`"content":[]`}
						if kr != "" {
							members = append(members, `"`+kr+`":`+vr)
						}
						if ki != "" {
							members = append(members, `"`+ki+`" : `+vi)
						}
						if order {
							for i, j := 0, len(members)-1; i < j; i, j = i+1, j-1 {
								members[i], members[j] = members[j], members[i]
							}
						}
						result := parsedResult(t, "{ "+strings.Join(members, " ,\n\t")+" }")
						if result == nil {
							continue
						}
						runner, ok := foldRunner(t, result)
						if !ok {
							continue
						}
						n++
						if got := AsksInput(result); got != runner {
							t.Errorf("%s: AsksInput %v, encoding/json runner asks %v", result, got, runner)
						}
					}
				}
			}
		}
	}
	if n < 1000 {
		t.Fatalf("only %d cases ran", n)
	}
}

// Holds: Members (which AsksInput and InputRequestsProblem walk without
// validating again) is not thrown off by what comes before the members
// that matter: strings holding escaped quotes, runs of backslashes,
// braces and the text "inputRequests" itself; numbers with exponents;
// deep nesting; a megabyte of text. A nested inputRequests is not one.
func TestAsksInputHoldsTrickyStringsAndSize(t *testing.T) {
	big := strings.Repeat(`a\"b\\\\c{[\u0022inputRequests\u0022:{}]}`, 30000)
	for _, c := range []struct {
		result string
		asks   bool
	}{
		{`{"content":[{"type":"text","text":"\\"},{"x":"\\\"inputRequests\":{}"}],"inputRequests":{}}`, true},
		{`{"content":[{"type":"text","text":"\\\\\\"}],"inputRequests":null}`, false},
		{`{"a\"inputRequests":{"inputRequests":{}},"n":-1.5e+10,"resultType":"input_required"}`, true},
		{`{"x":"\"resultType\":\"input_required\"","y":{"resultType":"input_required"}}`, false},
		{`{"structuredContent":{"inputRequests":{"a":{"method":"roots/list"}}},"content":[]}`, false},
		{`{"x":[[[[[[[[[[{"inputRequests":{}}]]]]]]]]]],"resultType":"complete"}`, false},
		{`{"content":[{"type":"text","text":"` + big + `"}],"resultType":"input_required"}`, true},
		{`{"content":[{"type":"text","text":"` + big + `"}],"inputRequests":{"a":{}}}`, true},
		{`{"content":[{"type":"text","text":"` + big + `"}],"resultType":"complete"}`, false},
	} {
		result := parsedResult(t, c.result)
		if result == nil {
			t.Fatalf("control: Parse refuses %.80s", c.result)
		}
		if got := AsksInput(result); got != c.asks {
			t.Errorf("%.120s: AsksInput %v, want %v", c.result, got, c.asks)
		}
		if runner, ok := foldRunner(t, result); !ok || runner != c.asks {
			t.Errorf("%.120s: control: encoding/json reads asks=%v (ok %v)", c.result, runner, ok)
		}
	}
}

// Holds: duplicate keys, which would let toolgate and a runner read
// different members (gjson and Members the first, encoding/json the
// last), never reach AsksInput: Parse refuses duplicates of inputRequests,
// resultType, method and params, spelled the same, escaped, or in another
// case (U+017F too), also in objects of more than 16 members (FoldKey).
func TestAsksInputHoldsDuplicatesRefusedByParse(t *testing.T) {
	filler := ""
	for i := 0; i < 20; i++ {
		filler += `"f` + string(rune('a'+i)) + `":1,`
	}
	for _, result := range []string{
		`{"inputRequests":null,"inputRequests":{"a":{}}}`,
		`{"inputRequests":null,"\u0069nputRequests":{"a":{}}}`,
		`{"inputRequests":null,"InputRequests":{"a":{}}}`,
		`{"inputRequests":null,"inputRequeſts":{"a":{}}}`,
		`{` + filler + `"inputRequests":null,"inputRequeſts":{"a":{}}}`,
		`{` + filler + `"resultType":"complete","RESULTTYPE":"input_required"}`,
		`{"resultType":"complete","result\u0054ype":"input_required"}`,
		`{"resultType":"input_required","inputRequests":{"a":{"method":"roots/list","Method":"sampling/createMessage"}}}`,
		`{"resultType":"input_required","inputRequests":{"a":{"params":{},"paramſ":{}}}}`,
		`{"resultType":"input_required","inputRequests":{"a":{},"\u0061":{}}}`,
	} {
		if parsedResult(t, result) != nil {
			t.Errorf("Parse accepts %s", result)
		}
	}
}

// Holds: InputRequestsProblem refuses input requests in a result whose
// resultType is not the string input_required as gjson (and the runner)
// reads it: null, a number, an array, an object, absent, in another case,
// or "INPUT_REQUIRED"; and accepts an escaped "input\u005frequired" with an
// escaped "\u0069nputRequests" and escaped method and params keys.
func TestInputRequestsProblemHoldsResultTypeValues(t *testing.T) {
	req := `{"a":{"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1}}}`
	for _, rt := range []string{``, `"resultType":null,`, `"resultType":1,`, `"resultType":["input_required"],`,
		`"resultType":{"v":"input_required"},`, `"ResultType":"input_required",`, `"resultType":"INPUT_REQUIRED",`, `"resultType":"complete",`} {
		result := parsedResult(t, `{`+rt+`"inputRequests":`+req+`}`)
		if result == nil && strings.HasPrefix(rt, `"ResultType"`) {
			result = []byte(`{` + rt + `"inputRequests":` + req + `}`) // refused by Parse: as if it got past
		}
		if result == nil {
			t.Fatalf("control: Parse refuses %s", rt)
		}
		if InputRequestsProblem(result) == "" {
			t.Errorf("%s: input requests accepted", result)
		}
	}
	result := parsedResult(t, `{"resultType":"input\u005frequired","\u0069nputRequests":{"a":{"m\u0065thod":"sampling\/createMessage","p\u0061rams":{}}}}`)
	if p := InputRequestsProblem(result); p != "" {
		t.Errorf("escaped spellings refused: %s", p)
	}
	if got := gjson.GetBytes(result, "inputRequests.a.method").Str; got != "sampling/createMessage" {
		t.Errorf("control: gjson reads method %q", got)
	}
}

// Attack (fixed): an upstream's sampling input request carries "tools": null (a
// serializer that writes absent members as null). The go-sdk runner
// (v1.8.0) decodes Tools as nil: a plain sampling request, which a client
// declaring {"sampling":{}} serves. RequiredCapability asks
// memberFold(params, "tools").Exists(), which is true for a JSON null, and
// demands sampling.tools: Undeclared refuses the input_required result
// (MissingRequiredClientCapability) that the runner could have fulfilled —
// a false positive, the same mistake ac7803f fixed for a null
// inputRequests. Fixed: a null tools is none.
func TestRequiredCapabilityAttackNullToolsFalsePositive(t *testing.T) {
	result := parsedResult(t, `{"resultType":"input_required","inputRequests":{"s1":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"hi"}}],"maxTokens":10,"tools":null}}}}`)
	var p struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal([]byte(gjson.GetBytes(result, "inputRequests.s1.params").Raw), &p); err != nil || p.Tools != nil {
		t.Fatalf("control: the runner reads tools %v (%v)", p.Tools, err)
	}
	if missing := Undeclared([]byte(`{"sampling":{}}`), result); missing != nil {
		t.Errorf("a sampling request without tools (tools: null) needs %v of a client that declared sampling", missing)
	}
}
