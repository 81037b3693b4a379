package mcpproxy

// Adversarial review of mcp2026.AsksInput (bd9c0cd) and
// InputRequestsProblem at their callers: finish (a runner of an earlier
// revision, also the final answer of the translated path) and
// finishStateless. Helpers: parCall, parUpstream, parRunnerInputs,
// parSampling (parity_adversarial_test.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// foldRunnerResultType is the resultType a runner decoding the answer with
// encoding/json (member names matched in any case) reads, "" for an error
// answer.
func foldRunnerResultType(t *testing.T, answer []byte) string {
	t.Helper()
	var env struct {
		Result *struct {
			ResultType string `json:"resultType"`
		} `json:"result"`
	}
	if err := json.Unmarshal(answer, &env); err != nil {
		t.Fatalf("the runner gets no JSON: %v: %s", err, answer)
	}
	if env.Result == nil {
		return ""
	}
	return env.Result.ResultType
}

// finishJoined is finish's answer in one slice.
func finishJoined(h *Handler, call *gateway.Call, msg mcpmsg.Message) []byte {
	m := h.finish(context.Background(), call, msg)
	return bytes.Join(m.parts(), nil)
}

// Attack (fixed): the upstream answers a runner of an earlier revision (finish;
// also the translated path, whose answers not input_required by gjson's
// exact resultType go through finish) with resultType spelled in another
// case: {"ResultType":"input_required",…}. AsksInput compares the key as
// raw bytes, so finish relays the answer untouched; a runner decoding with
// encoding/json reads resultType "input_required" — a result asking for
// input, which an earlier revision's runner must never get (with no input
// requests the revision reads it as load shedding and calls again).
// Root cause: mcp2026.AsksInput, case string(key) == "resultType".
// Fixed: AsksInput reads the key in any case; finish withholds the answer.
func TestAsksInputAttackLegacyFinishRelaysResultTypeCaseVariant(t *testing.T) {
	h := testHandler()
	for _, key := range []string{"ResultType", "reſultType"} {
		seen := 0
		call := parCall(false, &seen)
		// Control: spelled exactly, the answer is withheld.
		msg := parUpstream(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}],"resultType":"input_required"}}`)
		if out := finishJoined(h, call, msg); !bytes.Contains(out, []byte(`"error"`)) {
			t.Fatalf("control: an input_required answer reaches the legacy runner: %s", out)
		}
		msg = parUpstream(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}],"`+key+`":"input_required"}}`)
		out := finishJoined(h, call, msg)
		if rt := foldRunnerResultType(t, out); rt == "input_required" {
			t.Errorf("%s: a runner of an earlier revision (encoding/json) gets a result whose resultType is input_required: %s", key, out)
		}
	}
}

// Holds: finish withholds from a runner of an earlier revision every
// answer carrying input requests however the key is spelled (exact,
// escaped, another ASCII case, U+017F), with whitespace around the value,
// whatever the resultType (absent, complete, escaped input_required, a
// number), and an escaped resultType "input\u005frequired" alone; an
// inputRequests of null (with whitespace) and a nested one pass.
func TestAsksInputHoldsLegacyFinish(t *testing.T) {
	h := testHandler()
	for _, c := range []struct {
		result   string
		withheld bool
	}{
		{`{"inputRequests":{"s1":` + parSampling + `}}`, true},
		{`{"\u0069nputRequests" :  {"s1":` + parSampling + `}}`, true},
		{`{"resultType":"complete","INPUTREQUESTS":{"s1":` + parSampling + `}}`, true},
		{`{"resultType":1,"inputRequeſts":{"s1":` + parSampling + `}}`, true},
		{`{"result\u0054ype":"input\u005frequired","inputRequests":{"s1":` + parSampling + `}}`, true},
		{`{"resultType":"input\u005frequired","content":[]}`, true},
		{`{"inputRequests":{}}`, true},
		{`{"inputRequests":[]}`, true},
		{`{"content":[{"type":"text","text":"ok"}],"inputRequests" :  null }`, false},
		{`{"content":[{"type":"text","text":"ok \"inputRequests\":{}"}],"structuredContent":{"inputRequests":{"a":{}},"resultType":"input_required"}}`, false},
	} {
		seen := 0
		call := parCall(false, &seen)
		msg := parUpstream(t, h, call, `{"jsonrpc":"2.0","id":1,"result":`+c.result+`}`)
		out := finishJoined(h, call, msg)
		if got := bytes.Contains(out, []byte(`"error"`)); got != c.withheld {
			t.Errorf("%.100s: withheld %v, want %v: %.200s", c.result, got, c.withheld, out)
		}
		if c.withheld && bytes.Contains(out, []byte("exfiltrate")) {
			t.Errorf("%.100s: the upstream's text reaches the runner: %s", c.result, out)
		}
	}
}

// Holds: on the stateless path a case-variant resultType without input
// requests ({"ResultType":"input_required"}) reaches the runner as a
// complete result: Complete appends "resultType":"complete" after it, and
// encoding/json keeps the last of the two members it reads as resultType.
func TestAsksInputHoldsStatelessResultTypeCaseVariantCompleted(t *testing.T) {
	h := testHandler()
	seen := 0
	call := parCall(true, &seen)
	msg := parUpstream(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}],"ResultType":"input_required"}}`)
	out := h.finishStateless(context.Background(), call, msg)
	if rt := foldRunnerResultType(t, out); rt != "complete" {
		t.Errorf("the stateless runner (encoding/json) reads resultType %q: %s", rt, out)
	}
}

// Holds: on the stateless path input requests whose method value or keys
// are escaped ("sampling\/createMessage", "sampling\u002fcreateMessage",
// "\u0069nputRequests"), or whose resultType is escaped, pass the message
// hooks as the runner reads them (withheld), and input requests beside a
// resultType that is not the string input_required are refused.
func TestAsksInputHoldsStatelessEscapesReachMessagePolicy(t *testing.T) {
	h := testHandler()
	for _, c := range []struct {
		result string
		hooks  int
	}{
		{`{"resultType":"input_required","inputRequests":{"s1":` + strings.Replace(parSampling, `sampling/createMessage`, `sampling\/createMessage`, 1) + `}}`, 1},
		{`{"resultType":"input_required","inputRequests":{"s1":` + strings.Replace(parSampling, `sampling/createMessage`, `sampling\u002fcreateMessage`, 1) + `}}`, 1},
		{`{"result\u0054ype":"input\u005frequired","\u0069nputRequests":{"s\u0031":` + parSampling + `}}`, 1},
		{`{"resultType":null,"inputRequests":{"s1":` + parSampling + `}}`, 0},
		{`{"resultType":["input_required"],"inputRequests":{"s1":` + parSampling + `}}`, 0},
		{`{"resultType":"INPUT_REQUIRED","inputRequests":{"s1":` + parSampling + `}}`, 0},
	} {
		seen := 0
		call := parCall(true, &seen)
		msg := parUpstream(t, h, call, `{"jsonrpc":"2.0","id":1,"result":`+c.result+`}`)
		out := h.finishStateless(context.Background(), call, msg)
		if seen != c.hooks || bytes.Contains(out, []byte("exfiltrate")) || !bytes.Contains(out, []byte(`"error"`)) {
			t.Errorf("%.100s: hooks saw %d (want %d): %s", c.result, seen, c.hooks, out)
		}
		if got := parRunnerInputs(t, out); got != nil {
			t.Errorf("%.100s: the runner fulfils %v", c.result, got)
		}
	}
}

// Attack (fixed): on the translated path, the upstream answers
// input_required with its input requests under a key spelled in another
// case ({"InputRequests":{…}}). askTranslated read them with gjson's exact
// key, found none, and sent the call again with no responses, up to
// maxTranslatedRounds times, running the upstream's tool each time.
// An input request whose params are spelled Params was sent to the
// runner without them. Fixed: askTranslated refuses at once an answer
// whose input requests toolgate cannot inspect as the runner reads them
// (mcp2026.InputRequestsProblem), as the stateless path does.
func TestAsksInputAttackTranslatedVariantKeyRefusedAtOnce(t *testing.T) {
	ms := aliceSession(t)
	h := testHandler()
	seen := 0
	call := parCall(false, &seen)
	call.MCPSession = ms
	for key, requests := range map[string]string{
		"InputRequests": `"InputRequests":{"s1":{"method":"roots/list"}}`,
		"inputrequests": `"inputrequests":{"s1":{"method":"roots/list"}}`,
		"inputRequeſts": `"inputRequeſts":{"s1":{"method":"roots/list"}}`,
		// Its params under Params: sent without them, where the
		// stateless path refuses the answer.
		"Params": `"inputRequests":{"s1":{"method":"sampling/createMessage","Params":{"messages":[],"maxTokens":5}}}`,
	} {
		msg := parUpstream(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required",`+requests+`}}`)
		w := httptest.NewRecorder()
		out := newSSEWriter(w)
		if responses, ok := h.askTranslated(context.Background(), w, call, msg.Result, out); ok {
			t.Fatalf("%s: the call goes upstream again with inputResponses %s", key, responses)
		}
		if !strings.Contains(w.Body.String(), "withheld") || !strings.Contains(w.Body.String(), "another case") {
			t.Errorf("%s: the runner is not told why: %s", key, w.Body.String())
		}
	}
}
