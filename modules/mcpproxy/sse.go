package mcpproxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Server-sent events are written so that every reader following the
// WHATWG HTML standard (section 9.2.6) reads them as toolgate's reader
// (package eventstream) read the upstream's: what the policy saw is what
// the runner gets.

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
