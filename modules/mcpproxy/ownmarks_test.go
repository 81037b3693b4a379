package mcpproxy

import "testing"

func TestWithoutOwnMarks(t *testing.T) {
	for in, want := range map[string]string{
		`{"contents":[],"_meta":{"toolgate/approval":{"url":"x"},"a":1,"Toolgate/Decision":{}}}`: `{"contents":[],"_meta":{"a":1}}`,
		`{"_meta":{"TOOLGATE/x":1},"messages":[]}`:                                               `{"_meta":{},"messages":[]}`,
		`{"_meta":{"\u0074oolgate\/approval":1,"b":2}}`:                                          `{"_meta":{"b":2}}`,
	} {
		got, ok := withoutOwnMarks([]byte(in))
		if !ok || string(got) != want {
			t.Errorf("withoutOwnMarks(%s) = %s %v, want %s", in, got, ok, want)
		}
	}
	for _, in := range []string{`{"_meta":{"io.toolgate/x":1,"toolgatex":2}}`, `{"_meta":null}`, `{"content":[{"_meta":{"toolgate/decision":1}}]}`, `[]`} {
		if got, ok := withoutOwnMarks([]byte(in)); ok || string(got) != in {
			t.Errorf("withoutOwnMarks(%s) = %s %v, want it unchanged", in, got, ok)
		}
	}
}
