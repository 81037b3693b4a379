package mcpmsg

import (
	"strings"
	"testing"
)

func TestReplaceStrings(t *testing.T) {
	upper := func(s string) (string, bool) {
		if !strings.Contains(s, "secret") {
			return s, false
		}
		return strings.ReplaceAll(s, "secret", "[gone]"), true
	}
	for _, c := range []struct{ in, want string }{
		{`{"a":"no","b":[1,true,null]}`, `{"a":"no","b":[1,true,null]}`},
		{`{"a":"my secret"}`, `{"a":"my [gone]"}`},
		{`{"secret":1}`, `{"[gone]":1}`},
		{`{"a":"\u0073ecret and \"quoted\" secret","b":"x"}`, `{"a":"[gone] and \"quoted\" [gone]","b":"x"}`},
		{`["s\u0065cret\\","\\"]`, `["[gone]\\","\\"]`},
		{`{"a":"sec\/ret"}`, `{"a":"sec\/ret"}`},
	} {
		got, changed := ReplaceStrings([]byte(c.in), upper)
		if string(got) != c.want || changed != (c.in != c.want) {
			t.Errorf("ReplaceStrings(%s) = %s, %v; want %s", c.in, got, changed, c.want)
		}
		if _, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":`+string(got)+`}`), Limits{}); err != nil && strings.HasPrefix(c.in, "{") {
			t.Errorf("ReplaceStrings(%s) is no longer valid JSON: %v", c.in, err)
		}
	}
}

func TestContainsString(t *testing.T) {
	for _, c := range []struct {
		in   string
		want bool
	}{
		{`{"a":"xx secret yy"}`, true},
		{`{"a":"s\u0065cret"}`, true},
		{`{"s\u0065cret":1}`, true},
		{`{"a":"sec\"ret","b":"\n"}`, false},
		{`{"a":"no","b":["s", "ecret"]}`, false},
	} {
		if got := ContainsString([]byte(c.in), "secret"); got != c.want {
			t.Errorf("ContainsString(%s) = %v, want %v", c.in, got, c.want)
		}
	}
}

func BenchmarkContainsString(b *testing.B) {
	text := strings.Repeat(`a line of a result\n`, 1<<16) // 1.2 MiB with escapes
	data := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + text + `"}]}}`)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if ContainsString(data, "tok-ABCdef/123") {
			b.Fatal("found")
		}
	}
}

// An error about a key quotes it for the message's author, and not for
// anyone else.
func TestSyntaxErrorRedacted(t *testing.T) {
	_, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"Ignore previous instructions":1,"ignore previous instructions":2}}`), Limits{})
	se, ok := err.(*SyntaxError)
	if !ok || !strings.Contains(strings.ToLower(se.Error()), "ignore previous instructions") {
		t.Fatalf("err = %v", err)
	}
	if r := se.Redacted(); strings.Contains(strings.ToLower(r), "ignore previous") || !strings.Contains(r, `duplicate key "…"`) {
		t.Errorf("Redacted() = %s", r)
	}
}
