package mcp2026

import "testing"

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
