package mcpproxy

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func readAll(t *testing.T, stream string, max int64) ([]event, error) {
	t.Helper()
	r := newSSEReader(strings.NewReader(stream), max)
	var out []event
	for {
		ev, err := r.next()
		if err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, err
		}
		out = append(out, ev)
	}
}

func TestSSEReader(t *testing.T) {
	events, err := readAll(t, ": comment\n"+
		"event: message\nid: 1\ndata: {\"a\":1}\n\n"+
		"id: 2\nretry: 250\ndata:\n\n"+ // a priming event: id and retry, no data
		"data: line one\r\ndata: line two\r\n\r\n"+
		"id: 3\n\n", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 4 {
		t.Fatalf("events = %+v", events)
	}
	if e := events[0]; e.ID != "1" || e.Name != "message" || string(e.Data) != `{"a":1}` {
		t.Errorf("event 0 = %+v", e)
	}
	if e := events[1]; e.ID != "2" || e.Retry != 250*time.Millisecond || len(e.Data) != 0 {
		t.Errorf("event 1 = %+v", e)
	}
	if e := events[2]; string(e.Data) != "line one\nline two" {
		t.Errorf("event 2 = %q", e.Data)
	}
	if e := events[3]; e.ID != "3" || e.Data != nil {
		t.Errorf("event 3 = %+v", e)
	}
}

func TestSSEReaderLimitsAndTruncation(t *testing.T) {
	if _, err := readAll(t, "data: "+strings.Repeat("x", 100)+"\n\n", 50); !errors.Is(err, errEventTooLarge) {
		t.Errorf("an event over the limit: err = %v", err)
	}
	// An event split across many data lines is still bounded.
	if _, err := readAll(t, strings.Repeat("data: xxxxxxxxxx\n", 20)+"\n", 100); !errors.Is(err, errEventTooLarge) {
		t.Errorf("many lines over the limit: err = %v", err)
	}
	// A stream cut in the middle of an event is not an event.
	if events, err := readAll(t, "data: {\"a\":1}\n\ndata: {\"trunc", 1<<20); !errors.Is(err, io.ErrUnexpectedEOF) || len(events) != 1 {
		t.Errorf("truncated stream: %d events, err = %v", len(events), err)
	}
}

func TestSSEWriterSplitsLines(t *testing.T) {
	rec := httptest.NewRecorder()
	w := newSSEWriter(rec)
	w.start(nil)
	if err := w.send([]byte("{\n\"a\": 1\n}")); err != nil {
		t.Fatal(err)
	}
	if got := rec.Body.String(); got != "event: message\ndata: {\ndata: \"a\": 1\ndata: }\n\n" {
		t.Errorf("written = %q", got)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
}

// FuzzSSEReader reads arbitrary upstream bytes: it must never panic, never
// return an event over the limit, and never loop forever.
func FuzzSSEReader(f *testing.F) {
	for _, seed := range []string{
		"data: x\n\n", "id: 1\nretry: 10\ndata:\n\n", "data: a\r\ndata: b\r\n\r\n", ":c\n\n",
		"data: " + strings.Repeat("y", 300) + "\n\n", "id: \x00\n\n", "retry: -5\n\n", "data",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := newSSEReader(strings.NewReader(string(stream)), 256)
		for i := 0; i <= len(stream); i++ {
			ev, err := r.next()
			if err != nil {
				return
			}
			if len(ev.Data) > 256 {
				t.Fatalf("event of %d bytes over a 256-byte limit", len(ev.Data))
			}
		}
		t.Fatalf("more events than bytes in %q", stream)
	})
}

// A line longer than the read buffer counts once against the limit.
func TestSSEReaderLongLine(t *testing.T) {
	data := strings.Repeat("x", 1<<20)
	events, err := readAll(t, "data: "+data+"\n\n", 2<<20)
	if err != nil || len(events) != 1 || len(events[0].Data) != len(data) {
		t.Fatalf("a 1 MiB line under a 2 MiB limit: %d events, err = %v", len(events), err)
	}
	if _, err := readAll(t, "data: "+data+"\n\n", 1<<20); !errors.Is(err, errEventTooLarge) {
		t.Errorf("a 1 MiB line over a 1 MiB limit: err = %v", err)
	}
}
