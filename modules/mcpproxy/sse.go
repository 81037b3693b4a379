package mcpproxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/bigbuf"
)

// Server-sent events are read and written exactly as the WHATWG HTML
// standard's "event stream interpretation" describes them (section 9.2.6),
// because runners read what toolgate writes with parsers that follow it (the
// TypeScript SDK, Python's httpx-sse, browsers): a line ends at LF, CRLF or a
// bare CR; one leading byte order mark is skipped; a field without a colon
// has an empty value; an empty id resets the last event id; an id holding
// NUL is ignored; retry takes ASCII digits only; an event is dispatched at a
// blank line and only if it had a data field; a stream that ends mid-event
// drops that event. A reader that split lines differently from the runner's
// would let an upstream show the policy one message and the runner another.

// event is one dispatched server-sent event.
type event struct {
	Type string // the "event" field; "" means "message"
	Data []byte // the "data" fields joined by LF
}

// errEventTooLarge reports an SSE event over the size limit.
var errEventTooLarge = errors.New("upstream SSE event exceeds max_response_size")

// maxRetryMillis bounds a retry field's value; larger ones count as this.
const maxRetryMillis = 1 << 40

// sseReader reads an event stream with a bound on the size of one event.
// Besides the events it keeps the stream's state: the last event id and the
// reconnection time the upstream asked for.
type sseReader struct {
	src io.Reader
	buf []byte
	r   int   // buf[r:w] is read but not yet consumed
	w   int   //
	err error // the error that ended reading src
	max int

	pooled *[sseBufferSize]byte // buf, when it came from sseBuffers

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

const sseBufferSize = 32 << 10

// sseBuffers holds the read buffers of sseReaders. Every call answered
// over SSE reads one stream, and a buffer of its own per call was most of
// the memory a small call allocated (and so of the garbage collector's
// work). Events never alias the buffer (next copies their data), so it can
// serve the next stream once its reader is released.
var sseBuffers = sync.Pool{New: func() any { return new([sseBufferSize]byte) }}

// newSSEReader returns a reader of r with a pooled buffer; release gives
// the buffer back.
func newSSEReader(r io.Reader, max int64) *sseReader {
	b := sseBuffers.Get().(*[sseBufferSize]byte)
	s := newSSEReaderBuf(r, max, b[:])
	s.pooled = b
	return s
}

func newSSEReaderSize(r io.Reader, max int64, bufSize int) *sseReader {
	return newSSEReaderBuf(r, max, make([]byte, bufSize))
}

func newSSEReaderBuf(r io.Reader, max int64, buf []byte) *sseReader {
	if max > 1<<40 {
		max = 1 << 40
	}
	return &sseReader{src: r, buf: buf, max: int(max), retry: -1}
}

// release returns the reader's buffer to the pool. The reader must not be
// used afterwards; releasing twice does nothing.
func (s *sseReader) release() {
	if s.pooled != nil {
		sseBuffers.Put(s.pooled)
	}
	s.pooled, s.buf = nil, nil
}

// resumed returns a reader for a reconnection of the stream s read: like
// browsers, it starts from the last event id s reached, so an event without
// an id field does not lose it, and keeps the reconnection time. It takes
// over s's buffer: s must not be used afterwards.
func (s *sseReader) resumed(r io.Reader) *sseReader {
	n := newSSEReaderBuf(r, int64(s.max), s.buf)
	n.pooled = s.pooled
	n.lastID, n.idBuffer, n.retry = s.lastID, s.lastID, s.retry
	s.pooled, s.buf = nil, nil
	return n
}

// next returns the next dispatched event. It returns io.EOF at the clean end
// of the stream, io.ErrUnexpectedEOF when the stream ends in the middle of
// an event (which is dropped), and errEventTooLarge for an event over the
// limit.
func (s *sseReader) next() (event, error) {
	if !s.started {
		s.started = true
		if err := s.skipBOM(); err != nil {
			return event{}, err
		}
	}
	for {
		line, owned, err := s.readLine()
		if err != nil {
			return event{}, err
		}
		if len(line) == 0 {
			if ev, ok := s.dispatch(); ok {
				return ev, nil
			}
			continue
		}
		if line[0] == ':' {
			continue // a comment
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
func (s *sseReader) dispatch() (event, bool) {
	s.lastID = s.idBuffer
	s.size = 0
	ev, ok := event{Type: s.eventType, Data: s.data}, s.hasData
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

// retryDelay is the reconnection time the upstream set, or 0.
func (s *sseReader) retryDelay() time.Duration {
	if s.retry < 0 {
		return 0
	}
	return time.Duration(s.retry) * time.Millisecond
}

// skipBOM drops one leading U+FEFF.
func (s *sseReader) skipBOM() error {
	for s.w-s.r < 3 && s.err == nil {
		s.fill()
	}
	if bytes.HasPrefix(s.buf[s.r:s.w], []byte("\xef\xbb\xbf")) {
		s.r += 3
	}
	return nil
}

// fill reads more of the source into the buffer.
func (s *sseReader) fill() {
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
func (s *sseReader) readLine() (line []byte, owned bool, err error) {
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
				return nil, false, errEventTooLarge
			}
			if long != nil {
				return bigbuf.Join(append(long, line)...), true, nil
			}
			return line, false, nil
		}
		// No line end yet.
		if s.size+longLen+len(pending) > s.max {
			return nil, false, errEventTooLarge
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
func (s *sseReader) newBuffer() {
	if s.pooled != nil {
		s.pooled = sseBuffers.Get().(*[sseBufferSize]byte)
		s.buf = s.pooled[:]
	} else {
		s.buf = make([]byte, len(s.buf))
	}
	s.r, s.w = 0, 0
}

// recycle returns buffers newBuffer replaced to the pool.
func (s *sseReader) recycle(bufs [][]byte) {
	for _, b := range bufs {
		if len(b) == sseBufferSize && s.pooled != nil {
			sseBuffers.Put((*[sseBufferSize]byte)(b))
		}
	}
}

// sseWriter writes events to a runner. Every event field is one line that
// no conforming parser can split: data is written one line per LF it
// holds (parsers join them with LF again), and it never holds a CR, which
// a parser would take for a line end.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu      sync.Mutex
	started bool
	wrote   time.Time // the last write, for keep-alives
	err     error     // the first write error: the runner went away
	// primeID is the id of a priming event not written yet (see prime),
	// and primeTimer writes it when no message comes first.
	primeID    string
	primeTimer *time.Timer
}

// primeDelay is how long a priming event waits for the stream's first
// message: one that follows sooner leaves with it, in one write.
const primeDelay = 5 * time.Millisecond

// errWriterClosed is what a write to a closed sseWriter returns.
var errWriterClosed = errors.New("the SSE stream to the runner is finished")

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// start sends the response headers (a stream that may stay silent for a
// while: its headers are flushed at once).
func (s *sseWriter) start(header func(http.Header)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.startLocked(header)
		_ = s.rc.Flush()
	}
}

// hasStarted reports whether the response headers were written: the
// runner reads a stream.
func (s *sseWriter) hasStarted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// close makes every later write fail with errWriterClosed: the handler
// that owns the response is returning, and nothing (a keep-alive timer)
// may write to it afterwards.
func (s *sseWriter) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = errWriterClosed
	}
	if s.primeTimer != nil {
		s.primeTimer.Stop()
	}
}

// startLocked writes the response headers, unless done already. They go
// out with the first flush: every write of an event ends with one, so
// headers and the first event leave in one write to the connection.
func (s *sseWriter) startLocked(header func(http.Header)) {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	if header != nil {
		header(h)
	}
	s.w.WriteHeader(http.StatusOK)
	s.wrote = now()
}

// send writes one message event with the given id ("" for none) and
// flushes it. data is a JSON-RPC message, where a CR can only be
// whitespace (JSON strings cannot hold one unescaped); any CR becomes a
// space, which reads as the same JSON. The data is written line by line,
// without copying it into one buffer first.
func (s *sseWriter) send(id string, data ...[]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.startLocked(nil)
	s.err = s.writeEvent(id, data)
	return s.err
}

// sendLast writes the stream's last event, as send does. When it is also
// the first (nothing was written yet), the response gets its length: the
// runner knows its answer is whole without waiting for the end of a chunked
// body, and headers and event leave in one write, with nothing to follow
// when the handler returns. Nothing may be written after it.
func (s *sseWriter) sendLast(id string, data ...[]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if !s.started {
		n := eventLen(id, data)
		if s.primeID != "" {
			n += len(primeEvent(s.primeID))
		}
		s.startLocked(func(h http.Header) { h.Set("Content-Length", strconv.Itoa(n)) })
	}
	s.err = s.writeEvent(id, data)
	return s.err
}

// eventLen is the length of what writeEvent writes for id and parts: each
// LF of the data is followed by another "data: ", a CR becomes a space.
// It must follow writeEvent's layout byte for byte (a length too short cuts
// the answer): FuzzSSEWriter holds the two together.
func eventLen(id string, parts [][]byte) int {
	n := len("event: message\n") + len("data: ") + len("\n\n")
	if id != "" {
		n += len("id: ") + len(id) + len("\n")
	}
	for _, p := range parts {
		n += len(p) + bytes.Count(p, []byte{'\n'})*len("data: ")
	}
	return n
}

// prime sends an event with an id and empty data (SEP-1699), which tells
// a runner the stream can be resumed before any message arrives. It goes
// out with the first message when that follows within primeDelay (an
// answer at once: one write instead of two), else on its own.
func (s *sseWriter) prime(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.primeID != "" {
		return nil
	}
	s.primeID = id
	s.primeTimer = time.AfterFunc(primeDelay, s.flushPrime)
	return nil
}

// flushPrime writes the priming event that no message came to carry.
func (s *sseWriter) flushPrime() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.primeID == "" {
		return
	}
	s.startLocked(nil)
	s.err = s.writePrime()
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}

// writePrime writes the priming event still to be written, if any.
func (s *sseWriter) writePrime() error {
	if s.primeID == "" {
		return nil
	}
	s.primeTimer.Stop()
	ev := primeEvent(s.primeID)
	s.primeID = ""
	return s.writeString(ev)
}

func primeEvent(id string) string { return "id: " + id + "\ndata: \n\n" }

// keepAlive writes a comment when nothing was written for interval, so
// that idle connections are not cut by intermediaries and a runner notices
// a dead one.
func (s *sseWriter) keepAlive(interval time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || (s.started && now().Sub(s.wrote) < interval) {
		return s.err
	}
	s.startLocked(nil)
	s.err = s.writePrime()
	if s.err == nil {
		s.err = s.writeString(": keep-alive\n\n")
	}
	if s.err == nil {
		s.err = s.rc.Flush()
	}
	return s.err
}

// writeEvent writes the message whose text is the concatenation of parts
// as one event: a line of data per line of the text, wherever the parts
// meet.
func (s *sseWriter) writeEvent(id string, parts [][]byte) error {
	if err := s.writePrime(); err != nil {
		return err
	}
	if err := s.writeString("event: message\n"); err != nil {
		return err
	}
	if id != "" {
		if err := s.writeString("id: " + id + "\n"); err != nil {
			return err
		}
	}
	if err := s.writeString("data: "); err != nil {
		return err
	}
	for _, data := range parts {
		for {
			line, rest, more := bytes.Cut(data, []byte{'\n'})
			for len(line) > 0 {
				cr := bytes.IndexByte(line, '\r')
				if cr < 0 {
					cr = len(line)
				}
				if _, err := s.w.Write(line[:cr]); err != nil {
					return err
				}
				if cr < len(line) {
					if err := s.writeString(" "); err != nil {
						return err
					}
					cr++
				}
				line = line[cr:]
			}
			if !more {
				break
			}
			if err := s.writeString("\ndata: "); err != nil {
				return err
			}
			data = rest
		}
	}
	if err := s.writeString("\n\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sseWriter) writeString(str string) error {
	_, err := io.WriteString(s.w, str)
	s.wrote = now()
	return err
}

// now is the clock; tests replace it.
var now = time.Now
