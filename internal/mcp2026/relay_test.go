package mcp2026

import "testing"

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
