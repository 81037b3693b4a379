package mcpproxy

import (
	"errors"
	"io"

	"github.com/toolgate/toolgate/internal/bigbuf"
	"github.com/toolgate/toolgate/internal/eventstream"
)

// Errors of readBody.
var (
	errBodyTooLarge = errors.New("the body exceeds max_response_size")
	errBodyLength   = errors.New("the body is longer than its Content-Length")
)

// readBody reads a JSON body of at most max bytes into one slice of its
// exact length, which is what the message is parsed from and relayed as:
// no copy between reading and parsing, and no garbage of a growing slice
// (reading a megabyte by appending allocates about twice that, and copies
// it several times over).
//
// size is the body's Content-Length, -1 when it has none. A body that
// announces more than max is refused before anything is read or allocated;
// one that announces less than it holds, or ends before its announced
// length (io.ErrUnexpectedEOF), is an error, never a body cut short. A
// small body of a known length is read straight into a slice of that
// length. Any other is read into pooled buffers and copied once into a
// slice of its length (read-only, see package bigbuf), refused as soon as
// it passes max: an announced length is not memory reserved before the
// bytes arrive, or an upstream announcing max_response_size and sending
// nothing would hold that much per call in progress.
func readBody(r io.Reader, size, max int64) ([]byte, error) {
	if size > max {
		return nil, errBodyTooLarge
	}
	if size > exactBodyMax {
		b, err := readBody(r, -1, size)
		switch {
		case errors.Is(err, errBodyTooLarge):
			return nil, errBodyLength
		case err == nil && int64(len(b)) < size:
			return nil, io.ErrUnexpectedEOF
		}
		return b, err
	}
	if size >= 0 {
		b := make([]byte, size)
		if _, err := io.ReadFull(r, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		return b, atEnd(r)
	}
	var (
		chunks []*[eventstream.BufferSize]byte // full buffers, in order
		cur    = eventstream.GetBuffer()
		n      int   // bytes in cur
		total  int64 // bytes in chunks
	)
	defer func() {
		for _, c := range chunks {
			eventstream.PutBuffer(c)
		}
		eventstream.PutBuffer(cur)
	}()
	for {
		if n == len(cur) {
			chunks = append(chunks, cur)
			cur, n, total = eventstream.GetBuffer(), 0, total+eventstream.BufferSize
		}
		m, err := r.Read(cur[n:])
		n += m
		if total+int64(n) > max {
			return nil, errBodyTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	parts := make([][]byte, 0, len(chunks)+1)
	for _, c := range chunks {
		parts = append(parts, c[:])
	}
	if b := bigbuf.Join(append(parts, cur[:n])...); b != nil {
		return b, nil
	}
	return []byte{}, nil
}

// exactBodyMax is the largest announced length read straight into a slice
// of that length.
const exactBodyMax = eventstream.BufferSize

// atEnd checks that r has nothing more to read.
func atEnd(r io.Reader) error {
	var one [1]byte
	for range 100 { // a reader may return 0, nil; not forever
		n, err := r.Read(one[:])
		switch {
		case n > 0:
			return errBodyLength
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
	return io.ErrNoProgress
}
