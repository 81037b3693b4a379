package mcpproxy

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/toolgate/toolgate/internal/eventstream"
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
	const b = eventstream.BufferSize
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
