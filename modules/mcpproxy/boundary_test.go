package mcpproxy

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/toolgate/toolgate/internal/sseref"
)

// chunkReader hands out its bytes n at a time, so that a read ends exactly
// where a test wants a buffer to end.
type chunkReader struct {
	r io.Reader
	n int
}

func (c chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// A body of any length around the read buffer's size and its multiples,
// with or without its length announced, however it arrives, is read whole:
// non-nil, its exact bytes, and no room to append into.
func TestJSONBodyAtBufferBoundaries(t *testing.T) {
	const b = sseBufferSize
	for _, size := range []int{0, 1, b - 1, b, b + 1, 2*b - 1, 2 * b, 2*b + 1, 3 * b, 1 << 20} {
		body := []byte(strings.Repeat("[1,2,3,4,5,6,7]\n", size/16+1)[:size])
		for _, length := range []int64{int64(size), -1} {
			for _, rd := range []struct {
				name string
				r    func() io.Reader
			}{
				{"whole", func() io.Reader { return bytes.NewReader(body) }},
				{"one byte at a time", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(body)) }},
				{"by buffers", func() io.Reader { return chunkReader{bytes.NewReader(body), b} }},
				{"by uneven pieces", func() io.Reader { return chunkReader{bytes.NewReader(body), b/3 + 1} }},
				{"data with EOF", func() io.Reader { return iotest.DataErrReader(bytes.NewReader(body)) }},
			} {
				got, err := readBody(rd.r(), length, int64(size))
				switch {
				case err != nil:
					t.Fatalf("%d bytes, length %d, read %s: %v", size, length, rd.name, err)
				case got == nil || !bytes.Equal(got, body):
					t.Fatalf("%d bytes, length %d, read %s: got %d bytes (nil: %t), not the body", size, length, rd.name, len(got), got == nil)
				case len(got) > 0 && cap(got) != len(got):
					t.Fatalf("%d bytes, length %d, read %s: capacity %d, want %d", size, length, rd.name, cap(got), len(got))
				}
			}
			if size > 0 {
				if _, err := readBody(bytes.NewReader(body), length, int64(size-1)); err == nil {
					t.Fatalf("%d bytes, length %d, under a limit one byte short: no error", size, length)
				}
			}
		}
	}
}

// Lines as long as the read buffer and its multiples, give or take a byte,
// ending in LF, CR or CRLF whose CR and LF fall into different reads, after
// a BOM or not, several to an event: read as the reference reads them, and
// an event of one long line holds no room to append into.
func TestSSEReaderLinesAtBufferBoundaries(t *testing.T) {
	const b = sseBufferSize
	var lens []int
	for _, k := range []int{1, 2, 3} {
		for d := -8; d <= 2; d++ {
			lens = append(lens, k*b+d)
		}
	}
	for _, n := range lens {
		for _, end := range []string{"\n", "\r", "\r\n"} {
			for _, bom := range []string{"", "\uFEFF"} {
				// "data: " and the value make a line of n bytes; after the
				// BOM, the line end straddles the buffer end one byte later.
				value := strings.Repeat("abcdefghijklmnopqrstuvwxyz012345", n/32+1)[:n-len("data: ")]
				stream := bom + "data: " + value + end + "data: " + value[:n/2] + end + end +
					"data: " + value + end + end + "data: z" + end + end
				want := sseref.Parse(stream)
				for _, rd := range []struct {
					name string
					r    io.Reader
				}{
					{"whole", strings.NewReader(stream)},
					{"by buffers", chunkReader{strings.NewReader(stream), b}},
					{"one byte short of buffers", chunkReader{strings.NewReader(stream), b - 1}},
				} {
					s := newSSEReader(rd.r, 1<<22)
					for i, w := range want.Events {
						ev, err := s.next()
						if err != nil {
							t.Fatalf("line of %d, end %q, BOM %t, %s: event %d: %v", n, end, bom != "", rd.name, i, err)
						}
						if string(ev.Data) != w.Data {
							t.Fatalf("line of %d, end %q, BOM %t, %s: event %d: %d bytes, want %d", n, end, bom != "", rd.name, i, len(ev.Data), len(w.Data))
						}
						if i == 1 && n >= b && cap(ev.Data) != len(ev.Data) {
							t.Fatalf("line of %d, end %q, %s: an event of one long line has capacity %d for %d bytes", n, end, rd.name, cap(ev.Data), len(ev.Data))
						}
					}
					if _, err := s.next(); err != io.EOF {
						t.Fatalf("line of %d, end %q, %s: after the events: %v", n, end, rd.name, err)
					}
					s.release()
				}
			}
		}
	}
}

// Two events, each of one long line, read one after the other: the first
// one's bytes are not changed by reading the second (the reader's buffers
// go back to the pool and are reused).
func TestSSEReaderLongEventsStayIntact(t *testing.T) {
	a := strings.Repeat("a", 3*sseBufferSize+5)
	c := strings.Repeat("c", 2*sseBufferSize-3)
	s := newSSEReader(strings.NewReader(fmt.Sprintf("data: %s\n\ndata: %s\r\n\r\ndata: x\n\n", a, c)), 1<<22)
	defer s.release()
	first, err := s.next()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.next(); err != nil {
			t.Fatal(err)
		}
	}
	if string(first.Data) != a {
		t.Fatal("the first event's data changed as the next ones were read")
	}
}
