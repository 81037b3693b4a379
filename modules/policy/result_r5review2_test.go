package policy

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/modules/gateway"
)

// r5review2UTF16 is s (ASCII) in UTF-16LE, with a byte-order mark when bom.
func r5review2UTF16(s string, bom bool) []byte {
	var b []byte
	if bom {
		b = append(b, 0xFF, 0xFE)
	}
	for i := 0; i < len(s); i++ {
		b = append(b, s[i], 0)
	}
	return b
}

const r5review2Secret = "key AKIAIOSFODNN7EXAMPLE"

// r5review2Check runs the shipped result policy on a tools/call result and
// reports whether the blob (base64) reaches the runner as the upstream
// sent it.
func r5review2Check(t *testing.T, h *ResultHandler, result, blob string) (string, bool) {
	t.Helper()
	res, err := h.check(context.Background(), benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`), []byte(result), "")
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Bytes())
	return out, strings.Contains(out, blob)
}

// FINDING: a blob in UTF-16 with a byte-order mark and no mimeType is taken
// for binary data (its bytes are not UTF-8), so the secret it holds is
// never seen: its markers are ASCII, interleaved with NULs in UTF-16. A
// runner that reads a blob without a mimeType as text (the policy itself
// assumes one may: text_mime("")) and sniffs the BOM (as WHATWG decoding,
// Python's utf-16 codec, chardet do) shows the key.
func TestR5Review2UTF16BlobWithBOMAndNoMimeTypeIsNotInspected(t *testing.T) {
	h := shippedResultHandler(t)
	for _, mime := range []string{``, `"mimeType":null,`, `"mimeType":"",`, `"mimeType":" ",`} {
		blob := base64.StdEncoding.EncodeToString(r5review2UTF16(r5review2Secret, true))
		out, kept := r5review2Check(t, h, `{"content":[{"type":"resource","resource":{"uri":"file:///a.txt",`+mime+`"blob":"`+blob+`"}}]}`, blob)
		if kept {
			t.Errorf("%q: a UTF-16 blob (BOM FF FE) holding %q reached the runner unchanged: %.300s", mime, r5review2Secret, out)
		}
	}
}

// FINDING: a mimeType spelled in another case ("MimeType", "mimetype") is
// not read: the blob is taken for one without a mimeType, i.e. UTF-8 text,
// and UTF-16LE of ASCII is valid UTF-8 (NULs), so nothing is found in it.
// A runner that reads members ignoring case (Go's encoding/json, which the
// Go SDK's clients use) reads the charset and decodes the key. toolgate
// refuses blob/data/type spelled in another case (variantRefusal), not
// mimeType. (Both spellings in one object are refused by
// mcpmsg.Parse end to end: held, see integration/result_r5review2_test.go.)
func TestR5Review2MimeTypeSpelledInAnotherCaseIsNotRead(t *testing.T) {
	h := shippedResultHandler(t)
	blob := base64.StdEncoding.EncodeToString(r5review2UTF16(r5review2Secret, false))
	for _, mime := range []string{
		`"MimeType":"text/plain; charset=utf-16le",`,
		`"mimetype":"text/plain; charset=utf-16le",`,
	} {
		out, kept := r5review2Check(t, h, `{"content":[{"type":"resource","resource":{"uri":"file:///a.txt",`+mime+`"blob":"`+blob+`"}}]}`, blob)
		if kept {
			t.Errorf("%s: a UTF-16 blob holding %q reached the runner unchanged: %.300s", mime, r5review2Secret, out)
		}
	}
}

// FINDING: sampling/createMessage (2025-11-25) messages may hold tool_result
// blocks whose content is an array of content blocks, embedded resources
// among them. The policy's block_paths stop at messages[i].content[j], so a
// blob inside a tool_result block is inspected as text (its base64), never
// decoded: the key it holds, and a blob in UTF-16, reach the runner's model.
func TestR5Review2SamplingToolResultBlobIsNotDecoded(t *testing.T) {
	h, _ := channelHandler(t)
	ctx := context.Background()
	call := benchCall(t, benchTool, `{"ticket_id":"TEST-123"}`)
	for _, tc := range []struct{ mime, blob string }{
		{`"mimeType":"text/plain",`, base64.StdEncoding.EncodeToString([]byte(r5review2Secret))},
		{``, base64.StdEncoding.EncodeToString([]byte(r5review2Secret + "\u200b"))},
		{`"mimeType":"text/plain; charset=utf-16le",`, base64.StdEncoding.EncodeToString(r5review2UTF16(r5review2Secret, false))},
	} {
		block := `{"type":"tool_result","toolUseId":"t1","content":[{"type":"resource","resource":{"uri":"file:///a.txt",` + tc.mime + `"blob":"` + tc.blob + `"}}]}`
		for _, content := range []string{block, "[" + block + "]"} {
			payload := `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"read","input":{}}]},{"role":"user","content":` + content + `}],"maxTokens":5}`
			out, drop, err := h.message(ctx, call, &asked{method: "tools/call", view: call},
				gateway.UpstreamMessage{Channel: gateway.ChannelServerRequest, Method: "sampling/createMessage", Payload: []byte(payload)})
			if err != nil {
				t.Fatal(err)
			}
			if !drop && (out == nil || strings.Contains(string(out), tc.blob)) {
				t.Errorf("%s %.20s: the blob of a tool_result block reached the runner unchanged (out %.200s)", tc.mime, content, out)
			}
		}
	}
}

// HELD (passes): spellings of a foreign charset on a type of text are
// withheld, in a tool result and in resources/read.
func TestR5Review2ForeignCharsetSpellingsHeld(t *testing.T) {
	h := shippedResultHandler(t)
	blob := base64.StdEncoding.EncodeToString(r5review2UTF16(r5review2Secret, false))
	for _, mime := range []string{
		`text/plain;charset=utf-16`, `TEXT/PLAIN; CHARSET=\"UTF-16\"`, `application/json; charset=utf-16`,
		`application/vnd.x+json;charset=utf-16`, ` text/plain ; charset = utf-16 `, `text/plain; charset=utf-8; charset=utf-16`,
		`text/html; charset=utf-16le`, `text/plain; charset='utf-8'`, `application/problem+json; charset=UTF-16BE`,
		`text/plain; format=flowed; charset=utf-16`, "text/plain;\\tcharset=utf-16",
	} {
		out, kept := r5review2Check(t, h, `{"content":[{"type":"resource","resource":{"uri":"file:///a.txt","mimeType":"`+mime+`","blob":"`+blob+`"}}]}`, blob)
		if kept {
			t.Errorf("%s: a UTF-16 blob holding %q reached the runner unchanged: %.300s", mime, r5review2Secret, out)
		}
	}
}

// FINDING (same gap): the sampling requests of an input_required result.
func TestR5Review2InputRequiredSamplingToolResultBlobIsNotDecoded(t *testing.T) {
	h := shippedResultHandler(t)
	blob := base64.StdEncoding.EncodeToString([]byte(r5review2Secret))
	block := `{"type":"tool_result","toolUseId":"t1","content":[{"type":"resource","resource":{"uri":"file:///a.txt","mimeType":"text/plain","blob":"` + blob + `"}}]}`
	out, kept := r5review2Check(t, h, `{"content":[{"type":"text","text":"x"}],"resultType":"input_required","inputRequests":{"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":[`+block+`]}],"maxTokens":5}}}}`, blob)
	if kept {
		t.Errorf("the blob of a tool_result block in an input request reached the runner unchanged: %.300s", out)
	}
}
