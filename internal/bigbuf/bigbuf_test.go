package bigbuf

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuilderGathers(t *testing.T) {
	for _, size := range []int{1, 100, Threshold - 1, Threshold, Threshold + 1, 1 << 20} {
		src := []byte(strings.Repeat("lorem ipsum dolor sit amet\n", size/27+1)[:size])
		for _, first := range []string{"byte", "rune", "string", "bytes", "empty"} {
			var b Builder
			b.Grow(len(src) + 3)
			rest := src
			switch first {
			case "byte":
				b.WriteByte(rest[0])
				rest = rest[1:]
			case "rune":
				b.WriteRune('é')
			case "string":
				b.WriteString(string(rest[:1]))
				rest = rest[1:]
			case "bytes":
				b.Write(rest[:1])
				rest = rest[1:]
			case "empty":
				b.Write(nil)
				b.WriteString("")
			}
			b.Write(rest[:len(rest)/2])
			b.WriteString(string(rest[len(rest)/2:]))
			want := string(src)
			if first == "rune" {
				want = "é" + want
			}
			if b.String() != want || string(b.Bytes()) != want || b.Len() != len(want) {
				t.Fatalf("size %d, first written as %s: gathered %d bytes, want the %d written", size, first, b.Len(), len(want))
			}
		}
	}
	parts := [][]byte{[]byte("a"), nil, bytes.Repeat([]byte("b"), 1<<20), {}, []byte("c")}
	if got := Join(parts...); !bytes.Equal(got, bytes.Join(parts, nil)) || len(got) != cap(got) {
		t.Fatalf("Join: %d bytes, capacity %d; want the %d joined, no room to grow", len(got), cap(got), len(bytes.Join(parts, nil)))
	}
	if Join() != nil || Join(nil, []byte{}) != nil {
		t.Fatal("Join of nothing is not nil")
	}
}

// TestLargeBuffersAreResidentAtOnce checks that the first write makes every
// page of a large buffer resident, not just the one it touches.
func TestLargeBuffersAreResidentAtOnce(t *testing.T) {
	const size = 4 << 20
	debug.FreeOSMemory() // free heap pages go back to the kernel
	var b Builder
	b.Grow(size)
	b.WriteByte('x')
	buf := b.Bytes()[:1:1]
	resident, total := residentPages(t, buf[:1], size)
	if total < 512 {
		t.Fatalf("a %d-byte buffer spans %d pages", size, total)
	}
	if resident != total {
		t.Fatalf("%d of the buffer's %d whole pages are resident after its first byte was written, want all", resident, total)
	}
}

func BenchmarkGather(b *testing.B) {
	line := bytes.Repeat([]byte("lorem ipsum dolor sit amet, consectetur adipiscing elit\n"), 1<<20/56)
	parts := make([][]byte, 0, 32)
	for p := line; len(p) > 0; {
		n := min(len(p), 32<<10)
		parts, p = append(parts, p[:n]), p[n:]
	}
	reused := make([]byte, 0, len(line))
	for _, c := range []struct {
		name   string
		gather func() []byte
	}{
		{"populated", func() []byte { return Join(parts...) }},
		{"faulted", func() []byte { return bytes.Join(parts, nil) }},
		{"reused", func() []byte {
			reused = reused[:0]
			for _, p := range parts {
				reused = append(reused, p...)
			}
			return reused
		}},
	} {
		// scavenged: the heap's free pages returned to the kernel before
		// each gathering, as the runtime's scavenger does between two
		// calls of a gateway; churned: one after the other, the garbage
		// collector and the scavenger running as they do.
		for _, scavenged := range []bool{true, false} {
			name := c.name + "/churned"
			if scavenged {
				name = c.name + "/scavenged"
			}
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(len(line)))
				for b.Loop() {
					if scavenged {
						b.StopTimer()
						debug.FreeOSMemory()
						b.StartTimer()
					}
					if len(c.gather()) != len(line) {
						b.Fatal("short")
					}
				}
			})
		}
	}
}
