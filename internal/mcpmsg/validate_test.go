package mcpmsg

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
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

// plainWord must agree with the byte table on every word.
func TestPlainWordAgreesWithTheTable(t *testing.T) {
	check := func(b [8]byte) {
		want := true
		for _, c := range b {
			want = want && plainASCII[c]
		}
		if got := plainWord(binary.LittleEndian.Uint64(b[:])); got != want {
			t.Fatalf("plainWord(%q) = %v, want %v", b[:], got, want)
		}
	}
	// Every byte value in every position, among plain neighbours.
	for pos := range 8 {
		for c := range 256 {
			b := [8]byte{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
			b[pos] = byte(c)
			check(b)
		}
	}
	// And random words.
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], r.Uint64())
		check(b)
	}
}
