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

// BenchmarkParseLargeResult parses a message with a 1 MiB tools/call
// result of text in short lines, in ASCII and not (an escape, \n, every
// 58 or 61 bytes).
func BenchmarkParseLargeResult(b *testing.B) {
	for _, c := range []struct{ name, line string }{
		{"ascii", "lorem ipsum dolor sit amet, consectetur adipiscing elit\n"},
		{"accents", "lorem ipsum dolor sit amet, consectetur adipiscing — élit\n"},
	} {
		text := strings.Repeat(c.line, 1<<20/len(c.line))
		result, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}, "isError": false})
		raw := []byte(`{"jsonrpc":"2.0","id":1,"result":` + string(result) + `}`)
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(raw, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// plainPrefixRest must stop where the byte table says, whatever follows
// in the word (its mask may mark bytes after the first one that is not
// plain, never one before).
func TestPlainPrefixAgreesWithTheTable(t *testing.T) {
	check := func(b [8]byte) {
		want := 0
		for want < len(b) && plainASCII[b[want]] {
			want++
		}
		// Alone, and followed by a plain word (the word loop, then the
		// bytes after it).
		for _, in := range [][]byte{b[:], append(b[:], "abcdefgh"...)} {
			rest := plainPrefixRest(in)
			got := len(in) - len(rest)
			if want == len(b) {
				want = len(in)
			}
			if got != want {
				t.Fatalf("plainPrefixRest(%q) stops at %d, want %d", in, got, want)
			}
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
	// Two bytes at the edges of the tests, in every pair of positions:
	// a borrow from the first must not hide or fake the second.
	edges := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"', '#', '[', '\\', ']', 0x7f, 0x80, 0xa0, 0xff}
	for i := range 8 {
		for j := i + 1; j < 8; j++ {
			for _, c := range edges {
				for _, d := range edges {
					b := [8]byte{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
					b[i], b[j] = c, d
					check(b)
				}
			}
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
