package mcp2026

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// BenchmarkComplete makes a tools/call result of 1 MiB of text in short
// lines, from an upstream of an earlier revision (no resultType), one of
// the stateless revision for its runner: every result to such a runner
// passes here.
func BenchmarkComplete(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit\n", 1<<20/57)
	result := []byte(`{"content":[{"type":"text","text":` + string(mcpmsg.Quote(text)) + `}],"isError":false}`)
	b.SetBytes(int64(len(result)))
	b.ReportAllocs()
	for b.Loop() {
		if out := Complete("tools/call", result, false); len(out) != len(result)+len(`,"resultType":"complete"`) {
			b.Fatalf("%d bytes out of %d", len(out), len(result))
		}
	}
}
