package mcpmsg

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	for _, ok := range []string{`{"content":[{"type":"text","text":"a"}]}`, `[1,2,{"a":null}]`, `"x"`, ` 3 `} {
		if err := Validate([]byte(ok), Limits{}); err != nil {
			t.Errorf("Validate(%s) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		`{"content":[{"type":"text","text":"clean","text":"secret"}]}`,
		`{"tools":[],"Tools":[{"name":"hidden"}]}`,
		`{"a":1} {"b":2}`,
		"\"\xff\"",
		`{"a":`,
	} {
		err := Validate([]byte(bad), Limits{})
		var se *SyntaxError
		if !errors.As(err, &se) || !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%q) = %v, want a SyntaxError", bad, err)
		}
	}
}

// BenchmarkValidateLargeResult validates a 1 MiB tools/call result, the
// size DESIGN.md budgets 2 ms for through the whole gateway.
func BenchmarkValidateLargeResult(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing — élit\n", 1<<20/60)
	result, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}, "isError": false})
	b.SetBytes(int64(len(result)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Validate(result, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
