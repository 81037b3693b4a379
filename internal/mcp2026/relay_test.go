package mcp2026

import (
	"strings"
	"testing"
)

// The retry's params as they go upstream: the upstream's requestState in
// place of toolgate's (removed when the upstream sent none), and without
// the answers the policy withheld, however the runner spelled their keys.
func TestRestoreUpstream(t *testing.T) {
	for _, c := range []struct {
		params, upstream string
		withheld         map[string]bool
		want             string
	}{
		{`{"name":"t","inputResponses":{"a":{"action":"accept"}},"requestState":"toolgate.1.x"}`, `"up\/1 \u2713"`, nil,
			`{"name":"t","inputResponses":{"a":{"action":"accept"}},"requestState":"up\/1 \u2713"}`},
		{`{"name":"t","inputResponses":{"a":{"action":"accept"}},"requestState":"toolgate.1.x"}`, "", nil,
			`{"name":"t","inputResponses":{"a":{"action":"accept"}}}`},
		{`{"name":"t","inputResponses":{"a":{"action":"accept"},"b":{}},"requestState":"toolgate.1.x"}`, `"s"`, map[string]bool{"a": true},
			`{"name":"t","inputResponses":{"b":{}},"requestState":"s"}`},
		{`{"name":"t","inputResponses":{"\u0061":{"action":"accept"}},"requestState":"toolgate.1.x"}`, `"s"`, map[string]bool{"a": true},
			`{"name":"t","requestState":"s"}`},
	} {
		if got := string(WithoutAnswers(RestoreUpstream([]byte(c.params), c.upstream), c.withheld)); got != c.want {
			t.Errorf("RestoreUpstream(%s, %s, %v)\n got %s\nwant %s", c.params, c.upstream, c.withheld, got, c.want)
		}
	}
}

// An answer is decided as its request's method and as each method its
// members may be read as (in any case, escaped or not); one whose request
// is not known, as each input method.
func TestAnswerMethods(t *testing.T) {
	for _, c := range []struct {
		method, answer string
		want           []string
	}{
		{"elicitation/create", `{"action":"accept","content":{}}`, []string{"elicitation/create"}},
		{"roots/list", `{"action":"accept"}`, []string{"roots/list", "elicitation/create"}},
		{"roots/list", `{"\u0061ction":"accept"}`, []string{"roots/list", "elicitation/create"}},
		// A dotless ı: toolgate's fold of keys (mcpmsg.SameFold, on the fold
		// the parser refuses duplicate keys by) takes it for i;
		// strings.EqualFold does not.
		{"roots/list", `{"actıon":"accept"}`, []string{"roots/list", "elicitation/create"}},
		{"elicitation/create", `{"action":"decline","ROOTS":[]}`, []string{"elicitation/create", "roots/list"}},
		{"elicitation/create", `{"Role":"user","content":{}}`, []string{"elicitation/create", "sampling/createMessage"}},
		{"roots/list", `{"roots":[]}`, []string{"roots/list"}},
		{"roots/list", `{}`, []string{"roots/list"}},
		{"", `{"roots":[]}`, InputMethods},
	} {
		got := AnswerMethods(c.method, []byte(c.answer))
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("AnswerMethods(%q, %s) = %v, want %v", c.method, c.answer, got, c.want)
		}
	}
}

// Capabilities under a known name spelled in another case are refused;
// the exact names, and names toolgate does not know, pass.
func TestCapabilityVariant(t *testing.T) {
	for caps, refused := range map[string]bool{
		`{"sampling":{},"elicitation":{"form":{},"url":{}},"roots":{"listChanged":true}}`: false,
		`{"vendor.thing":{},"experimental":{"x":{}}}`:                                     false,
		`{"SAMPLING":{}}`:                true,
		`{"ſampling":{}}`:                true,
		`{"elicitation":{"Form":{}}}`:    true,
		`{"roots":{"listchanged":true}}`: true,
		`{"\u0053ampling":{}}`:           true,
	} {
		if got := CapabilityVariant([]byte(caps)); (got != "") != refused {
			t.Errorf("CapabilityVariant(%s) = %q, want refused %v", caps, got, refused)
		}
	}
}
