package mcpproxy

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

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

// BenchmarkWithoutOwnMarks is the look for toolgate's marks in a result
// of 1 MiB of text in short lines without _meta, as make bench-compare's
// upstream sends: every result passes there before the result policy.
func BenchmarkWithoutOwnMarks(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit\n", 1<<20/57)
	result := []byte(`{"content":[{"type":"text","text":` + string(mcpmsg.Quote(text)) + `}],"isError":false}`)
	b.SetBytes(int64(len(result)))
	b.ReportAllocs()
	for b.Loop() {
		if _, stripped := withoutOwnMarks(result); stripped {
			b.Fatal("marks found in a result without _meta")
		}
	}
}
