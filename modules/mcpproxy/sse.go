package mcpproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// event is one server-sent event.
type event struct {
	ID    string        // "id:" field; "" when absent
	Name  string        // "event:" field
	Data  []byte        // "data:" lines joined by '\n'
	Retry time.Duration // "retry:" field; 0 when absent
}

// errEventTooLarge reports an SSE event over the size limit.
var errEventTooLarge = errors.New("upstream SSE event exceeds max_response_size")

// sseReader reads server-sent events (the WHATWG event stream format) with
// a bound on the size of one event.
type sseReader struct {
	r   *bufio.Reader
	max int
}

func newSSEReader(r io.Reader, max int64) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 32<<10), max: int(max)}
}

// next returns the next event that carries data or an id. It returns io.EOF
// at the clean end of the stream.
func (s *sseReader) next() (event, error) {
	var ev event
	var data []byte
	hasData, size := false, 0
	for {
		line, owned, err := s.readLine(&size)
		if err != nil {
			if err == io.EOF && (hasData || ev.ID != "") {
				// A stream ending without a blank line still ends the event
				// only if complete; a truncated event is discarded.
				return event{}, io.ErrUnexpectedEOF
			}
			return event{}, err
		}
		if len(line) == 0 { // dispatch
			if hasData || ev.ID != "" || ev.Retry != 0 {
				ev.Data = data
				return ev, nil
			}
			size = 0
			continue
		}
		if line[0] == ':' { // comment
			continue
		}
		field, value, _ := bytes.Cut(line, []byte{':'})
		value = bytes.TrimPrefix(value, []byte{' '})
		switch string(field) {
		case "data":
			if !hasData && owned {
				data = value // the line is a copy already: keep it
			} else {
				if hasData {
					data = append(data, '\n')
				}
				data = append(data, value...)
			}
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				ev.ID = string(value)
			}
		case "event":
			ev.Name = string(value)
		case "retry":
			if ms, err := strconv.Atoi(string(value)); err == nil && ms >= 0 {
				ev.Retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
}

// readLine returns one line without its terminator (\n or \r\n). size
// counts the event's bytes so far. owned reports whether the line is a copy
// (a line longer than the read buffer) rather than a view into the buffer,
// valid only until the next read.
func (s *sseReader) readLine(size *int) (line []byte, owned bool, err error) {
	line, err = s.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// A line longer than the buffer: gather it, bounded by the limit.
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull {
			if *size+len(long) > s.max {
				return nil, false, errEventTooLarge
			}
			line, err = s.r.ReadSlice('\n')
			long = append(long, line...)
		}
		line, owned = long, true
	}
	*size += len(line)
	if *size > s.max {
		return nil, false, errEventTooLarge
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			return nil, false, io.ErrUnexpectedEOF
		}
		return nil, false, err
	}
	return bytes.TrimSuffix(line[:len(line)-1], []byte{'\r'}), owned, nil
}

// sseWriter writes events to a runner.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// start sends the response headers.
func (s *sseWriter) start(header func(http.Header)) {
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
	_ = s.rc.Flush()
}

// send writes one message event and flushes it. The data is written as
// it is, line by line, without copying it into one buffer first.
func (s *sseWriter) send(data []byte) error {
	if _, err := io.WriteString(s.w, "event: message\n"); err != nil {
		return err
	}
	for {
		line, rest, more := bytes.Cut(data, []byte{'\n'})
		if _, err := io.WriteString(s.w, "data: "); err != nil {
			return err
		}
		if _, err := s.w.Write(bytes.TrimSuffix(line, []byte{'\r'})); err != nil {
			return err
		}
		if _, err := io.WriteString(s.w, "\n"); err != nil {
			return err
		}
		if !more {
			break
		}
		data = rest
	}
	if _, err := io.WriteString(s.w, "\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}
