package mcp2026

import (
	"testing"

	"github.com/tidwall/gjson"
)

func TestInputRequestsProblem(t *testing.T) {
	for _, c := range []struct {
		result string
		ok     bool
	}{
		{`{"content":[]}`, true},
		{`{"resultType":"input_required","inputRequests":{"a":{"method":"roots/list"}}}`, true},
		{`{"resultType":"input_required","inputRequests":{"a":{"method":"sampling/createMessage","params":{"maxTokens":1,"messages":[]}}}}`, true},
		{`{"content":[],"inputRequests":{"a":{"method":"roots/list"}}}`, false},
		{`{"resultType":"complete","inputRequests":{}}`, false},
		{`{"resultType":"input_required","InputRequests":{"a":{"method":"roots/list"}}}`, false},
		{`{"resultType":"input_required","inputRequests":[{"method":"roots/list"}]}`, false},
		{`{"resultType":"input_required","inputRequests":{"a":"roots/list"}}`, false},
		{`{"resultType":"input_required","inputRequests":{"a":{"method":"roots/list","Params":{}}}}`, false},
		{`{"resultType":"input_required","inputRequests":{"a":{"Method":"roots/list"}}}`, false},
	} {
		if why := InputRequestsProblem([]byte(c.result)); (why == "") != c.ok {
			t.Errorf("%s: problem %q, want ok %v", c.result, why, c.ok)
		}
	}
}

// TestRequiredCapabilityReadsParamsAsRunnersDo: the members of an input
// request's params that decide the capability it needs are read in any
// case, as clients decoding with encoding/json read them; sampling with
// tools or a toolChoice needs sampling.tools, and with context from the
// client's servers (an includeContext other than "none"), sampling.context.
func TestRequiredCapabilityReadsParamsAsRunnersDo(t *testing.T) {
	for _, c := range []struct {
		caps, method, params string
		ok                   bool
	}{
		{`{"elicitation":{"form":{}}}`, "elicitation/create", `{"mode":"form","message":"m"}`, true},
		{`{"elicitation":{"form":{}}}`, "elicitation/create", `{"mode":"url","url":"https://x"}`, false},
		{`{"elicitation":{"form":{}}}`, "elicitation/create", `{"Mode":"url","url":"https://x"}`, false},
		{`{"elicitation":{"form":{},"url":{}}}`, "elicitation/create", `{"MODE":"url","url":"https://x"}`, true},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1}`, true},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"tools":[]}`, false},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"Tools":[]}`, false},
		{`{"sampling":{"tools":{}}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"tools":[]}`, true},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"toolChoice":{"mode":"auto"}}`, false},
		{`{"sampling":{"tools":{}}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"toolChoice":{"mode":"auto"}}`, true},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"includeContext":"none"}`, true},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"includeContext":"allServers"}`, false},
		{`{"sampling":{}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"IncludeContext":"thisServer"}`, false},
		{`{"sampling":{"context":{}}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"includeContext":"thisServer"}`, true},
		{`{"sampling":{"context":{}}}`, "sampling/createMessage", `{"messages":[],"maxTokens":1,"includeContext":"thisServer","tools":[]}`, false},
	} {
		if _, ok := RequiredCapability([]byte(c.caps), c.method, gjson.Parse(c.params)); ok != c.ok {
			t.Errorf("%s %s with %s: declared %v, want %v", c.method, c.params, c.caps, ok, c.ok)
		}
	}
	// Before 2025-11-25 includeContext was a member like any other.
	if _, ok := RequiredCapabilityIn("2025-06-18", []byte(`{"sampling":{}}`), "sampling/createMessage", gjson.Parse(`{"includeContext":"thisServer"}`)); !ok {
		t.Error("a 2025-06-18 client that declared sampling is refused a request with includeContext")
	}
	if _, ok := RequiredCapabilityIn("2025-06-18", []byte(`{"sampling":{}}`), "sampling/createMessage", gjson.Parse(`{"tools":[]}`)); ok {
		t.Error("a 2025-06-18 client is asked sampling with tools")
	}
}

func TestAsksInput(t *testing.T) {
	for _, c := range []struct {
		result string
		asks   bool
	}{
		{`{"content":[]}`, false},
		{`{"content":[],"inputRequests":null}`, false},
		{`{"content":[],"structuredContent":{"inputRequests":{}}}`, false},
		{`{"resultType":"complete","content":[]}`, false},
		{`{"resultType":"input_required"}`, true},
		{`{"resultType":"input\u005frequired"}`, true},
		{`{"content":[],"inputRequests":{}}`, true},
		{`{"content":[],"InputRequests":{"a":{"method":"roots/list"}}}`, true},
	} {
		if got := AsksInput([]byte(c.result)); got != c.asks {
			t.Errorf("%s: asks %v, want %v", c.result, got, c.asks)
		}
	}
}
