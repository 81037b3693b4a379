package mcp2026

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestListenSubscriptions(t *testing.T) {
	var limit []string
	for i := range MaxListenSubscriptions {
		limit = append(limit, strconv.Quote("test://r"+strconv.Itoa(i)))
	}
	for _, c := range []struct {
		params string
		want   []string
		refuse string // in the refusal's message; "" for none
	}{
		{params: `{}`},
		{params: `{"notifications":{"toolsListChanged":true}}`},
		{params: `{"notifications":{"resourceSubscriptions":[]}}`},
		{params: `{"notifications":{"resourceSubscriptions":["b","a","b","a"]}}`, want: []string{"b", "a"}},
		{params: `{"notifications":{"resourceSubscriptions":[` + strings.Join(limit, ",") + `,"test://r0"]}}`, want: func() []string {
			var uris []string
			for _, q := range limit {
				u, _ := strconv.Unquote(q)
				uris = append(uris, u)
			}
			return uris
		}()},
		{params: `{"notifications":{"resourceSubscriptions":[` + strings.Join(limit, ",") + `,"test://one-more"]}}`, refuse: "more than 64 resources"},
		{params: `{"notifications":{"resourceSubscriptions":["a",7]}}`, refuse: "array of resource URIs"},
		{params: `{"notifications":{"resourceSubscriptions":["a",null]}}`, refuse: "array of resource URIs"},
		{params: `{"notifications":{"resourceSubscriptions":"a"}}`, refuse: "array of resource URIs"},
		{params: `{"notifications":["a"]}`, refuse: "must be an object"},
		{params: `{"notifications":{"ResourceSubscriptions":["a"]}}`, refuse: `must be spelled "resourceSubscriptions"`},
		{params: `{"notifications":{"re\u017fourceSubscriptions":["a"]}}`, refuse: `must be spelled "resourceSubscriptions"`},
		{params: `{"notifications":{"resourceSubscriptions":["a"],"RESOURCESUBSCRIPTIONS":["b"]}}`, refuse: `must be spelled "resourceSubscriptions"`},
		{params: `{"notifications":{"ToolsListChanged":true}}`, refuse: `must be spelled "toolsListChanged"`},
		{params: `{"Notifications":{"resourceSubscriptions":["a"]}}`, refuse: `must be spelled "notifications"`},
		{params: `{"notifications":{"resource\u0053ubscriptions":["a"]}}`, want: []string{"a"}},
	} {
		got, refusal := ListenSubscriptions([]byte(c.params))
		switch {
		case c.refuse != "" && (refusal == nil || !strings.Contains(refusal.Message, c.refuse) || refusal.Code != -32602):
			t.Errorf("%.80s: %v, want a -32602 refusal saying %q", c.params, refusal, c.refuse)
		case c.refuse == "" && refusal != nil:
			t.Errorf("%.80s: refused: %s", c.params, refusal.Message)
		case !slices.Equal(got, c.want):
			t.Errorf("%.80s: %q, want %q", c.params, got, c.want)
		}
	}
}

// A retry adds _meta, inputResponses and requestState to a request's
// params; what identifies the call stays the same.
func TestCallParams(t *testing.T) {
	first := `{"uri":"test://a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}`
	retry := `{"uri":"test://a","inputResponses":{"io.toolgate/approval":{"action":"accept"},"ask":{}},"requestState":"x","_meta":{"progressToken":7}}`
	if a, b := string(CallParams([]byte(first))), string(CallParams([]byte(retry))); a != `{"uri":"test://a"}` || b != a {
		t.Fatalf("CallParams: %s and %s, want both {\"uri\":\"test://a\"}", a, b)
	}
	if got := string(CallParams([]byte(`{"uri":"test://b"}`))); got != `{"uri":"test://b"}` {
		t.Fatalf("CallParams of params without retry members: %s", got)
	}
}
