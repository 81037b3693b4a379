// Package eventstream reads server-sent events (text/event-stream) exactly
// as the WHATWG HTML standard's "event stream interpretation" describes them
// (section 9.2.6), because runners read what toolgate writes with parsers
// that follow it (the TypeScript SDK, Python's httpx-sse, browsers), and
// because what toolgate reads from an upstream must be what the policy saw:
// a line ends at LF, CRLF or a bare CR; one leading byte order mark is
// skipped; a field without a colon has an empty value; an empty id resets
// the last event id; an id holding NUL is ignored; retry takes ASCII digits
// only; an event is dispatched at a blank line and only if it had a data
// field; a stream that ends mid-event drops that event. A reader that split
// lines differently from the runner's would let an upstream show the policy
// one message and the runner another.
//
// toolgate_proxy reads Streamable HTTP upstreams' streams with it, the
// 2024-11-05 transport (toolgate.upstreams.sse) its servers' streams, and
// the federated endpoint what its sub-calls through the route answered. Its
// read buffers come from a pool shared with toolgate_proxy's reading of
// JSON bodies (GetBuffer, PutBuffer).
package eventstream

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/bigbuf"
)

// Event is one dispatched server-sent event.
type Event struct {
	Type string // the "event" field; "" means "message"
	Data []byte // the "data" fields joined by LF
}

// ErrEventTooLarge reports an SSE event over the size limit.
var ErrEventTooLarge = errors.New("upstream SSE event exceeds max_response_size")

// maxRetryMillis bounds a retry field's value; larger ones count as this.
const maxRetryMillis = 1 << 40

// Reader reads an event stream with a bound on the size of one event.
// Besides the events it keeps the stream's state: the last event id and the
// reconnection time the upstream asked for.
type Reader struct {
	// OnComment, when set, is called for each comment line (a keep-alive
	// of a stream that is otherwise silent).
	OnComment func()

	src io.Reader
	buf []byte
	r   int   // buf[r:w] is read but not yet consumed
	w   int   //
	err error // the error that ended reading src
	max int

	pooled *[BufferSize]byte // buf, when it came from the pool

	started bool // the byte order mark was checked
	skipLF  bool // the last line ended with CR: an LF right after belongs to it
	size    int  // bytes of the event being read

	data      []byte // the data buffer, without the final LF
	hasData   bool   // a data field was seen
	eventType string
	idBuffer  string

	lastID string // the last event id string, set when an event ends
	retry  int64  // the reconnection time in milliseconds; -1 when never set
}

// BufferSize is the size of the pool's buffers.
const BufferSize = 32 << 10

// buffers holds the read buffers of Readers. Every call answered
// over SSE reads one stream, and a buffer of its own per call was most of
// the memory a small call allocated (and so of the garbage collector's
// work). Events never alias the buffer (Next copies their data), so it can
// serve the next stream once its reader is released.
var buffers = sync.Pool{New: func() any { return new([BufferSize]byte) }}

// GetBuffer takes a buffer from the pool Readers' buffers come from.
func GetBuffer() *[BufferSize]byte { return buffers.Get().(*[BufferSize]byte) }

// PutBuffer gives a buffer back to the pool; nothing may use it afterwards.
func PutBuffer(b *[BufferSize]byte) { buffers.Put(b) }

// NewReader returns a reader of r with a pooled buffer; Release gives
// the buffer back. An event over max bytes is ErrEventTooLarge.
func NewReader(r io.Reader, max int64) *Reader {
	b := buffers.Get().(*[BufferSize]byte)
	s := newReaderBuf(r, max, b[:])
	s.pooled = b
	return s
}

// NewReaderSize returns a reader of r with a buffer of its own of bufSize
// bytes.
func NewReaderSize(r io.Reader, max int64, bufSize int) *Reader {
	return newReaderBuf(r, max, make([]byte, bufSize))
}

func newReaderBuf(r io.Reader, max int64, buf []byte) *Reader {
	if max > 1<<40 {
		max = 1 << 40
	}
	return &Reader{src: r, buf: buf, max: int(max), retry: -1}
}

// Release returns the reader's buffer to the pool. The reader must not be
// used afterwards; releasing twice does nothing.
func (s *Reader) Release() {
	if s.pooled != nil {
		buffers.Put(s.pooled)
	}
	s.pooled, s.buf = nil, nil
}

// Resumed returns a reader for a reconnection of the stream s read: like
// browsers, it starts from the last event id s reached, so an event without
// an id field does not lose it, and keeps the reconnection time. It takes
// over s's buffer: s must not be used afterwards.
func (s *Reader) Resumed(r io.Reader) *Reader {
	n := newReaderBuf(r, int64(s.max), s.buf)
	n.pooled = s.pooled
	n.lastID, n.idBuffer, n.retry = s.lastID, s.lastID, s.retry
	s.pooled, s.buf = nil, nil
	return n
}

// Next returns the next dispatched event. It returns io.EOF at the clean end
// of the stream, io.ErrUnexpectedEOF when the stream ends in the middle of
// an event (which is dropped), and ErrEventTooLarge for an event over the
// limit.
func (s *Reader) Next() (Event, error) {
	if !s.started {
		s.started = true
		if err := s.skipBOM(); err != nil {
			return Event{}, err
		}
	}
	for {
		line, owned, err := s.readLine()
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 {
			if ev, ok := s.dispatch(); ok {
				return ev, nil
			}
			continue
		}
		if line[0] == ':' {
			if s.OnComment != nil {
				s.OnComment()
			}
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "event":
			s.eventType = string(value)
		case "data":
			switch {
			case s.hasData:
				s.data = append(s.data, '\n')
				s.data = append(s.data, value...)
			case owned:
				s.data = value // a copy already (a line longer than the buffer)
			default:
				s.data = append([]byte(nil), value...)
			}
			s.hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				s.idBuffer = string(value)
			}
		case "retry":
			if ms, ok := digits(value); ok {
				s.retry = ms
			}
		}
	}
}

// dispatch ends the current event at a blank line.
func (s *Reader) dispatch() (Event, bool) {
	s.lastID = s.idBuffer
	s.size = 0
	ev, ok := Event{Type: s.eventType, Data: s.data}, s.hasData
	if ok && ev.Data == nil {
		ev.Data = []byte{}
	}
	s.data, s.hasData, s.eventType = nil, false, ""
	return ev, ok
}

// digits reads a retry value: ASCII digits only, at least one.
func digits(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < maxRetryMillis {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, maxRetryMillis), true
}

// LastID is the stream's last event id string, as of the last event read.
func (s *Reader) LastID() string { return s.lastID }

// Ended reports whether reading the source ended (its end, or an error):
// nothing of the stream is left to read.
func (s *Reader) Ended() bool { return s.err != nil }

// StartAfter makes a reader of a stream resumed after the event id
// lastID start from it, as a browser reconnecting does: an event without
// an id field keeps it. It is called before the first Next.
func (s *Reader) StartAfter(lastID string) { s.lastID, s.idBuffer = lastID, lastID }

// RetryDelay is the reconnection time the upstream set, or 0.
func (s *Reader) RetryDelay() time.Duration {
	if s.retry < 0 {
		return 0
	}
	return time.Duration(s.retry) * time.Millisecond
}

// skipBOM drops one leading U+FEFF.
func (s *Reader) skipBOM() error {
	for s.w-s.r < 3 && s.err == nil {
		s.fill()
	}
	if bytes.HasPrefix(s.buf[s.r:s.w], []byte("\xef\xbb\xbf")) {
		s.r += 3
	}
	return nil
}

// fill reads more of the source into the buffer.
func (s *Reader) fill() {
	if s.r > 0 {
		s.w = copy(s.buf, s.buf[s.r:s.w])
		s.r = 0
	}
	n, err := s.src.Read(s.buf[s.w:])
	s.w += n
	if err != nil {
		s.err = err
	}
}

// readLine returns one line without its end (LF, CRLF or CR). The line
// aliases the read buffer, valid until the next read, unless owned reports
// a copy (a line longer than the buffer). Each line counts against the
// size limit of the event it belongs to.
//
// A line longer than the buffer is read into whole buffers, one after
// another, and copied once into a slice of its exact length at its end
// (read-only, see package bigbuf): gathering it by appending would copy
// and allocate it several times over as the slice grows (a 1 MiB result,
// about five times).
func (s *Reader) readLine() (line []byte, owned bool, err error) {
	var long [][]byte // the full buffers of a long line, in order
	longLen := 0
	defer func() { s.recycle(long) }()
	for {
		if s.skipLF && s.r < s.w {
			if s.buf[s.r] == '\n' {
				s.r++
			}
			s.skipLF = false
		}
		pending := s.buf[s.r:s.w]
		end := bytes.IndexByte(pending, '\n')
		if end < 0 {
			end = len(pending)
		}
		if cr := bytes.IndexByte(pending[:end], '\r'); cr >= 0 {
			end = cr
		}
		if end < len(pending) {
			line = pending[:end]
			s.skipLF = pending[end] == '\r'
			s.r += end + 1
			s.size += longLen + end + 1
			if s.size > s.max {
				return nil, false, ErrEventTooLarge
			}
			if long != nil {
				return bigbuf.Join(append(long, line)...), true, nil
			}
			return line, false, nil
		}
		// No line end yet.
		if s.size+longLen+len(pending) > s.max {
			return nil, false, ErrEventTooLarge
		}
		if s.err != nil {
			if s.err == io.EOF {
				if len(pending) > 0 || long != nil || s.hasData || s.eventType != "" || s.size > 0 {
					return nil, false, io.ErrUnexpectedEOF
				}
				return nil, false, io.EOF
			}
			return nil, false, s.err
		}
		if s.r == 0 && s.w == len(s.buf) {
			// A line longer than the buffer: keep this one whole and read
			// on into another.
			long = append(long, s.buf)
			longLen += len(s.buf)
			s.newBuffer()
		}
		s.fill()
	}
}

// newBuffer gives the reader an empty buffer of the size of its current
// one, which the caller keeps.
func (s *Reader) newBuffer() {
	if s.pooled != nil {
		s.pooled = buffers.Get().(*[BufferSize]byte)
		s.buf = s.pooled[:]
	} else {
		s.buf = make([]byte, len(s.buf))
	}
	s.r, s.w = 0, 0
}

// recycle returns buffers newBuffer replaced to the pool.
func (s *Reader) recycle(bufs [][]byte) {
	for _, b := range bufs {
		if len(b) == BufferSize && s.pooled != nil {
			buffers.Put((*[BufferSize]byte)(b))
		}
	}
}
