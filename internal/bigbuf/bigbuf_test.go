package bigbuf

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFillAndJoin(t *testing.T) {
	for _, size := range []int{1, 100, Threshold - 1, Threshold, Threshold + 1, 1 << 20} {
		src := strings.Repeat("lorem ipsum dolor sit amet\n", size/27+1)[:size]
		// What fill writes, and only that: all of dst, its first half, none.
		for _, keep := range []int{size, size / 2, 0} {
			got := Fill(size, func(dst []byte) int {
				if len(dst) != size {
					t.Fatalf("size %d: dst has %d bytes", size, len(dst))
				}
				return copy(dst, src[:keep])
			})
			if got != src[:keep] {
				t.Fatalf("size %d, %d written: got %d bytes, not those written", size, keep, len(got))
			}
		}
		parts := [][]byte{[]byte(src[:size/3]), nil, []byte(src[size/3:]), {}}
		if got := Join(parts...); string(got) != src || len(got) != cap(got) {
			t.Fatalf("Join: %d bytes, capacity %d; want the %d joined, no room to grow", len(got), cap(got), len(src))
		}
	}
	if Join() != nil || Join(nil, []byte{}) != nil || Fill(0, func([]byte) int { return 0 }) != "" {
		t.Fatal("nothing gathered is not empty")
	}
	defer func() {
		if recover() == nil {
			t.Error("a fill that claims more than its room does not panic")
		}
	}()
	Fill(10, func([]byte) int { return 11 })
}

// TestLargeBuffersAreResidentAtOnce checks that a large allocation's pages
// are all resident before fill writes anything, not faulted in one by one.
func TestLargeBuffersAreResidentAtOnce(t *testing.T) {
	const size = 4 << 20
	debug.FreeOSMemory() // free heap pages go back to the kernel
	var resident, total int
	Fill(size, func(dst []byte) int {
		resident, total = residentPages(t, dst[:1], size)
		return 0
	})
	if total < 512 {
		t.Fatalf("a %d-byte buffer spans %d pages", size, total)
	}
	if resident != total {
		t.Fatalf("%d of the buffer's %d whole pages are resident before fill wrote, want all", resident, total)
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
