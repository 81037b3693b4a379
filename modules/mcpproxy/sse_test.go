package mcpproxy

import (
	"bytes"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"

	"github.com/toolgate/toolgate/internal/sseref"
	"github.com/toolgate/toolgate/modules/gateway"
)

// readStream reads a stream with sseReader the way the relay does and
// returns it in the reference's terms.
func readStream(t testing.TB, r io.Reader, max int64, bufSize int) (sseref.Stream, error) {
	t.Helper()
	s := newSSEReaderSize(r, max, bufSize)
	var out sseref.Stream
	for {
		ev, err := s.next()
		if err != nil {
			out.LastEventID = s.lastID
			if s.retry >= 0 {
				out.Retry = big.NewInt(s.retry).String()
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return out, nil
			}
			return out, err
		}
		typ := ev.Type
		if typ == "" {
			typ = "message"
		}
		out.Events = append(out.Events, sseref.Event{Type: typ, Data: string(ev.Data), LastEventID: s.lastID})
	}
}

// sameRetry compares a reference retry value with the reader's, which
// saturates at maxRetryMillis.
func sameRetry(ref, got string) bool {
	if ref == "" || got == "" {
		return ref == got
	}
	n, _ := new(big.Int).SetString(ref, 10)
	if n.Cmp(big.NewInt(maxRetryMillis)) > 0 {
		n = big.NewInt(maxRetryMillis)
	}
	return n.String() == got
}

func checkAgainstReference(t *testing.T, stream string) {
	t.Helper()
	want := sseref.Parse(stream)
	for _, rd := range []struct {
		name string
		r    io.Reader
		buf  int
	}{
		{"whole", strings.NewReader(stream), sseBufferSize},
		{"one byte at a time", iotest.OneByteReader(strings.NewReader(stream)), sseBufferSize},
		{"tiny buffer", iotest.HalfReader(strings.NewReader(stream)), 4},
	} {
		got, err := readStream(t, rd.r, 1<<20, rd.buf)
		if err != nil {
			t.Fatalf("%s: %q: %v", rd.name, stream, err)
		}
		if len(got.Events) != len(want.Events) || got.LastEventID != want.LastEventID || !sameRetry(want.Retry, got.Retry) {
			t.Fatalf("%s: %q:\n got %+v\nwant %+v", rd.name, stream, got, want)
		}
		for i := range want.Events {
			if got.Events[i] != want.Events[i] {
				t.Fatalf("%s: %q: event %d = %+v, want %+v", rd.name, stream, i, got.Events[i], want.Events[i])
			}
		}
	}
}

// Each rule of the standard, one stream each, read as the reference reads it.
func TestSSEReaderFollowsTheStandard(t *testing.T) {
	for name, c := range map[string]struct {
		stream string
		want   sseref.Stream
	}{
		"LF": {"data: a\n\n", sseref.Stream{Events: []sseref.Event{ev("message", "a", "")}}},
		"CRLF": {"data: a\r\ndata: b\r\n\r\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "a\nb", "")}}},
		"bare CR ends lines": {"id: 1\rdata: {\"a\":1}\r\rdata: two\r\r",
			sseref.Stream{Events: []sseref.Event{ev("message", `{"a":1}`, "1"), ev("message", "two", "1")}, LastEventID: "1"}},
		"a leading BOM is skipped once": {"\uFEFFdata: first\n\n\uFEFFdata: second\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "first", "")}}}, // the second line's field is "\uFEFFdata"
		"an empty id resets the last event id": {"id: 7\ndata: a\n\nid\ndata: b\n\nid:\ndata: c\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "a", "7"), ev("message", "b", ""), ev("message", "c", "")}}},
		"an id holding NUL is ignored": {"id: 5\ndata: a\n\nid: 6\x00\ndata: b\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "a", "5"), ev("message", "b", "5")}, LastEventID: "5"}},
		"an id-only event sets the last event id": {"id: 9\n\n",
			sseref.Stream{LastEventID: "9"}},
		"retry takes digits only": {"retry: 250\n\nretry: -5\n\nretry: +7\n\nretry: 3x\n\nretry:\n\n",
			sseref.Stream{Retry: "250"}},
		"a field without a colon has an empty value": {"data\ndata\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "\n", "")}}},
		"only one leading space is dropped": {"data:  two spaces\n\ndata:none\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", " two spaces", ""), ev("message", "none", "")}}},
		"an empty data field is an event": {"event: close\nretry: 20\ndata: \n\n",
			sseref.Stream{Events: []sseref.Event{ev("close", "", "")}, Retry: "20"}},
		"events without data are not dispatched": {"event: x\n\ndata: y\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "y", "")}}},
		"comments and unknown fields are ignored": {": hi\nfoo: bar\ndata: z\n\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "z", "")}}},
		"a stream ending mid-event drops it": {"data: kept\n\ndata: dropped\n",
			sseref.Stream{Events: []sseref.Event{ev("message", "kept", "")}}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := sseref.Parse(c.stream); !sameStream(got, c.want) {
				t.Fatalf("the reference reads %+v, want %+v", got, c.want)
			}
			checkAgainstReference(t, c.stream)
		})
	}
}

func ev(typ, data, lastEventID string) sseref.Event {
	return sseref.Event{Type: typ, Data: data, LastEventID: lastEventID}
}

func sameStream(a, b sseref.Stream) bool {
	if len(a.Events) != len(b.Events) || a.LastEventID != b.LastEventID || a.Retry != b.Retry {
		return false
	}
	for i := range a.Events {
		if a.Events[i] != b.Events[i] {
			return false
		}
	}
	return true
}

func TestSSEReaderLimitsAndTruncation(t *testing.T) {
	read := func(stream string, max int64) ([]event, error) {
		r := newSSEReader(strings.NewReader(stream), max)
		var out []event
		for {
			ev, err := r.next()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				return out, err
			}
			out = append(out, ev)
		}
	}
	if _, err := read("data: "+strings.Repeat("x", 100)+"\n\n", 50); !errors.Is(err, errEventTooLarge) {
		t.Errorf("an event over the limit: err = %v", err)
	}
	// An event split across many data lines is still bounded.
	if _, err := read(strings.Repeat("data: xxxxxxxxxx\n", 20)+"\n", 100); !errors.Is(err, errEventTooLarge) {
		t.Errorf("many lines over the limit: err = %v", err)
	}
	// So is a line without an end, and endless comments.
	if _, err := read("data: "+strings.Repeat("x", 200), 100); !errors.Is(err, errEventTooLarge) {
		t.Errorf("an endless line: err = %v", err)
	}
	if _, err := read(strings.Repeat(": keep\r", 50), 100); !errors.Is(err, errEventTooLarge) {
		t.Errorf("endless comments: err = %v", err)
	}
	// A stream cut in the middle of an event is not an event.
	if events, err := read("data: {\"a\":1}\n\ndata: {\"trunc", 1<<20); !errors.Is(err, io.ErrUnexpectedEOF) || len(events) != 1 {
		t.Errorf("truncated stream: %d events, err = %v", len(events), err)
	}
	// A retry value, however long, is bounded.
	r := newSSEReader(strings.NewReader("retry: "+strings.Repeat("9", 40)+"\n\n"), 1<<20)
	if _, err := r.next(); err != io.EOF || r.retryDelay() != time.Duration(maxRetryMillis)*time.Millisecond {
		t.Errorf("a huge retry: err = %v, delay %v", err, r.retryDelay())
	}
}

// A line longer than the read buffer counts once against the limit.
func TestSSEReaderLongLine(t *testing.T) {
	data := strings.Repeat("x", 1<<20)
	got, err := readStream(t, strings.NewReader("data: "+data+"\n\n"), 2<<20, sseBufferSize)
	if err != nil || len(got.Events) != 1 || len(got.Events[0].Data) != len(data) {
		t.Fatalf("a 1 MiB line under a 2 MiB limit: %d events, err = %v", len(got.Events), err)
	}
	if _, err := readStream(t, strings.NewReader("data: "+data+"\n\n"), 1<<20, sseBufferSize); !errors.Is(err, errEventTooLarge) {
		t.Errorf("a 1 MiB line over a 1 MiB limit: err = %v", err)
	}
	// Across buffer refills, a CR at the end of one read and the LF at the
	// start of the next are one line end.
	checkAgainstReference(t, "data: "+strings.Repeat("y", 40)+"\r\n\r\ndata: z\r\n\r\n")
}

// A resumed stream starts from the last event id reached, as browsers do.
func TestSSEReaderResumedKeepsTheLastEventID(t *testing.T) {
	first := newSSEReader(strings.NewReader("id: 3\nretry: 40\ndata: a\n\n"), 1<<20)
	if _, err := first.next(); err != nil {
		t.Fatal(err)
	}
	next := first.resumed(strings.NewReader("event: close\ndata: \n\n"))
	if _, err := next.next(); err != nil || next.lastID != "3" || next.retryDelay() != 40*time.Millisecond {
		t.Fatalf("resumed: err = %v, last id %q, retry %v", err, next.lastID, next.retryDelay())
	}
}

func FuzzSSEReader(f *testing.F) {
	for _, seed := range []string{
		"data: x\n\n", "id: 1\nretry: 10\ndata:\n\n", "data: a\r\ndata: b\r\n\r\n", ":c\n\n",
		"data: " + strings.Repeat("y", 300) + "\n\n", "id: \x00\n\n", "retry: -5\n\n", "data",
		"\uFEFFdata: bom\r\r", "id\rdata\r\r", "event: prime\nid: s_0\ndata: \n\n", "data: a\r",
		"retry: 00012\n\n", "id: 1\n\nid\n\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, stream string) {
		// Any bytes: never a panic, never an event over the limit, never
		// more events than lines.
		r := newSSEReaderSize(strings.NewReader(stream), 256, 16)
		for i := 0; ; i++ {
			ev, err := r.next()
			if err != nil {
				break
			}
			if len(ev.Data) > 256 {
				t.Fatalf("event of %d bytes over a 256-byte limit", len(ev.Data))
			}
			if i > len(stream) {
				t.Fatalf("more events than bytes in %q", stream)
			}
		}
		// Decoded text: exactly the reference's reading.
		if utf8.ValidString(stream) {
			checkAgainstReference(t, stream)
		}
	})
}

func TestSSEWriterSplitsLinesAndNeverWritesCR(t *testing.T) {
	rec := httptest.NewRecorder()
	w := newSSEWriter(rec)
	w.start(nil)
	if err := w.send("tok.1", []byte("{\n\"a\": 1\r\n,\"b\":\r2}")); err != nil {
		t.Fatal(err)
	}
	if got := rec.Body.String(); got != "event: message\nid: tok.1\ndata: {\ndata: \"a\": 1 \ndata: ,\"b\": 2}\n\n" {
		t.Errorf("written = %q", got)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
}

// The writer against the reference parser: whatever a message holds, a
// conforming parser reads one message event with exactly the message's
// bytes, CRs read as the spaces they stand for in JSON.
func FuzzSSEWriter(f *testing.F) {
	for _, seed := range []string{`{"a":1}`, "{\r\"a\":\r1}", "{\n}\r\n", "\r", "\n\n", "", "\uFEFF{}", ": x", "data: y"} {
		f.Add(seed, "tok.1")
	}
	f.Fuzz(func(t *testing.T, data, id string) {
		if !utf8.ValidString(data) || !utf8.ValidString(id) || strings.ContainsAny(id, "\r\n\x00") {
			t.Skip()
		}
		rec := httptest.NewRecorder()
		w := newSSEWriter(rec)
		if err := w.send(id, []byte(data)); err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(rec.Body.Bytes(), '\r') >= 0 {
			t.Fatalf("the writer wrote a CR for %q", data)
		}
		got := sseref.Parse(rec.Body.String())
		want := strings.ReplaceAll(data, "\r", " ")
		if len(got.Events) != 1 || got.Events[0].Type != "message" || got.Events[0].Data != want || got.LastEventID != id {
			t.Fatalf("%q (id %q) was read as %+v", data, id, got)
		}
		// As the stream's only event, the same bytes with their length.
		last := httptest.NewRecorder()
		if err := newSSEWriter(last).sendLast(id, []byte(data)); err != nil {
			t.Fatal(err)
		}
		if last.Body.String() != rec.Body.String() || last.Header().Get("Content-Length") != strconv.Itoa(last.Body.Len()) {
			t.Fatalf("%q (id %q) as the only event: %q with Content-Length %q, want %q with its length", data, id, last.Body.String(), last.Header().Get("Content-Length"), rec.Body.String())
		}
	})
}

// Reading a stream takes its buffer from a pool and gives it back: a small
// event costs a few hundred bytes of allocation, not a buffer of its own
// (sseBufferSize), and an event read before its reader was released keeps
// its data when the buffer serves another stream.
func TestSSEReaderBuffersArePooled(t *testing.T) {
	read := func(stream string) event {
		r := newSSEReader(strings.NewReader(stream), 1<<20)
		ev, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		r.release()
		r.release() // a second release does nothing
		return ev
	}
	first := read("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
	for range 3 {
		read("data: " + strings.Repeat("z", 100) + "\n\n")
	}
	if string(first.Data) != `{"jsonrpc":"2.0","id":1,"result":{}}` {
		t.Fatalf("the first event's data changed to %q after its buffer was reused", first.Data)
	}
	const runs = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		read("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
	}
	runtime.ReadMemStats(&after)
	// A collection may empty the pool, and under the race detector the
	// pool drops a quarter of what it is given; a buffer per read would be
	// sseBufferSize each.
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > sseBufferSize/2 {
		t.Errorf("reading a small event allocates %d bytes, want well under a buffer (%d)", per, sseBufferSize)
	}
}

// A resumed reader takes over the buffer of the reader it continues.
func TestSSEReaderResumedTakesOverTheBuffer(t *testing.T) {
	first := newSSEReader(strings.NewReader("id: 3\ndata: a\n\n"), 1<<20)
	if _, err := first.next(); err != nil {
		t.Fatal(err)
	}
	pooled := first.pooled
	next := first.resumed(strings.NewReader("data: b\n\n"))
	if next.pooled != pooled || first.pooled != nil || first.buf != nil {
		t.Fatal("the resumed reader did not take over the buffer")
	}
	if ev, err := next.next(); err != nil || string(ev.Data) != "b" {
		t.Fatalf("resumed read: %q, %v", ev.Data, err)
	}
	next.release()
}

// flushCounter is a ResponseWriter that counts flushes: each is a write to
// the runner's connection.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() {
	f.flushes++
	f.ResponseRecorder.Flush()
}

// The headers of a stream go out with its first event, in one flush; a
// stream opened ahead of its events (a GET) flushes them at once.
func TestSSEWriterSendsHeadersWithTheFirstEvent(t *testing.T) {
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	out := newSSEWriter(w)
	if err := out.send("", []byte(`{"jsonrpc":"2.0","id":1,"result":{}}`)); err != nil {
		t.Fatal(err)
	}
	if w.flushes != 1 || w.Header().Get("Content-Type") != "text/event-stream" || w.Code != http.StatusOK {
		t.Errorf("headers and first event: %d flushes, Content-Type %q, status %d; want 1 flush", w.flushes, w.Header().Get("Content-Type"), w.Code)
	}
	w = &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	newSSEWriter(w).start(nil)
	if w.flushes != 1 || !w.Flushed {
		t.Errorf("start: %d flushes, want the headers flushed at once", w.flushes)
	}
}

// The last event of a stream that is also its first gives the response its
// length, with the headers, in one flush; after other events (or a stream
// opened ahead of them) the response stays a stream of unknown length.
func TestSSEWriterLastEventHasItsLength(t *testing.T) {
	msg := []byte("{\"jsonrpc\":\"2.0\",\"id\":1,\r\n\"result\":{}}\n")
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	if err := newSSEWriter(w).sendLast("tok.1", msg[:9], msg[9:]); err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(w.Body.Len()); w.Header().Get("Content-Length") != want || w.flushes != 1 {
		t.Errorf("only event: Content-Length %q for %d bytes, %d flushes; want %s and 1", w.Header().Get("Content-Length"), w.Body.Len(), w.flushes, want)
	}
	// A priming event just before goes with it.
	w = &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	out := newSSEWriter(w)
	if err := out.prime("tok.1"); err != nil {
		t.Fatal(err)
	}
	if err := out.sendLast("tok.2", msg); err != nil {
		t.Fatal(err)
	}
	out.close()
	got := sseref.Parse(w.Body.String())
	if want := strconv.Itoa(w.Body.Len()); w.Header().Get("Content-Length") != want || w.flushes != 1 ||
		len(got.Events) != 2 || got.Events[0].Data != "" || got.Events[1].Data == "" || got.LastEventID != "tok.2" {
		t.Errorf("prime and only event: Content-Length %q for %d bytes, %d flushes, events %+v; want %s, 1 flush, the prime and the message",
			w.Header().Get("Content-Length"), w.Body.Len(), w.flushes, got, want)
	}
	for name, open := range map[string]func(*sseWriter) error{
		"after an event": func(out *sseWriter) error { return out.send("", []byte(`{}`)) },
		"after a prime written on its own": func(out *sseWriter) error {
			if err := out.prime("tok.0"); err != nil {
				return err
			}
			out.flushPrime() // as its timer does
			return nil
		},
		"after start": func(out *sseWriter) error { out.start(nil); return nil },
	} {
		rec := httptest.NewRecorder()
		out := newSSEWriter(rec)
		if err := open(out); err != nil {
			t.Fatal(err)
		}
		if err := out.sendLast("tok.1", msg); err != nil {
			t.Fatal(err)
		}
		if cl := rec.Header().Get("Content-Length"); cl != "" {
			t.Errorf("%s: Content-Length %q on a stream already started", name, cl)
		}
	}
}

// A priming event that no message follows goes out on its own after
// primeDelay; none goes out after the stream's handler stopped its writer.
func TestSSEWriterPrimeWaitsForAMessage(t *testing.T) {
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	out := newSSEWriter(w)
	if err := out.prime("tok.1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out.mu.Lock()
		body, flushes := w.Body.String(), w.flushes
		out.mu.Unlock()
		if body != "" {
			if body != "id: tok.1\ndata: \n\n" || flushes != 1 || w.Header().Get("Content-Length") != "" {
				t.Fatalf("a prime on its own: %q, %d flushes, Content-Length %q", body, flushes, w.Header().Get("Content-Length"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the prime was not written within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	if err := out.send("tok.2", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if got := sseref.Parse(w.Body.String()); len(got.Events) != 2 || got.LastEventID != "tok.2" {
		t.Errorf("prime, then a message: %+v", got)
	}

	rec := httptest.NewRecorder()
	out = newSSEWriter(rec)
	if err := out.prime("tok.1"); err != nil {
		t.Fatal(err)
	}
	out.close()
	time.Sleep(4 * primeDelay)
	out.mu.Lock()
	defer out.mu.Unlock()
	if rec.Body.Len() != 0 {
		t.Errorf("written after close: %q", rec.Body.String())
	}
}

// A keep-alive comment goes out on a silent stream, and none after the
// stream's handler stopped the keep-alives (it is returning).
func TestKeepAliveStopsWriting(t *testing.T) {
	rec := httptest.NewRecorder()
	out := newSSEWriter(rec)
	svc := &gateway.Service{SSEKeepAlive: caddy.Duration(20 * time.Millisecond)}
	stop := (&Handler{}).keepAlive(out, svc)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out.mu.Lock()
		body := rec.Body.String()
		out.mu.Unlock()
		if strings.Contains(body, ": keep-alive\n\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no keep-alive on a silent stream within 10s: %q", body)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	out.mu.Lock()
	n := rec.Body.Len()
	out.mu.Unlock()
	time.Sleep(100 * time.Millisecond) // five intervals
	out.mu.Lock()
	if rec.Body.Len() != n {
		t.Errorf("written after the keep-alives stopped: %q", rec.Body.String()[n:])
	}
	out.mu.Unlock()
	if err := out.send("", []byte(`{}`)); !errors.Is(err, errWriterClosed) {
		t.Errorf("send after close: %v", err)
	}
}

// A data line longer than the read buffer is copied once into a slice of
// its length: reading a 1 MiB event allocates about 1 MiB, not the several
// MiB that gathering it by appending costs.
func TestSSEReaderLongLineIsCopiedOnce(t *testing.T) {
	data := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	stream := "event: message\ndata: " + data + "\n\n"
	read := func() {
		r := newSSEReader(strings.NewReader(stream), 2<<20)
		ev, err := r.next()
		r.release()
		if err != nil || len(ev.Data) != len(data) || string(ev.Data[:16]) != data[:16] || string(ev.Data[len(data)-16:]) != data[len(data)-16:] {
			t.Fatalf("read %d bytes, %v; want the %d of the data", len(ev.Data), err, len(data))
		}
	}
	read()
	const runs = 8
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		read()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > uint64(len(data))*3/2 {
		t.Errorf("reading a %d-byte event allocates %d bytes, want at most 1.5 times its size", len(data), per)
	}
}

// A message written in pieces is the same event as written whole, however
// the pieces split its lines, CRs and CRLFs.
func TestSSEWriterPiecesAreOneMessage(t *testing.T) {
	msgs := []string{
		`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}]}}`,
		"{\n\"a\": 1\r\n,\"b\":\r2}\n", "\r\n\r\n", "{}", "\n", "x\ry\nz",
	}
	for _, msg := range msgs {
		whole := httptest.NewRecorder()
		if err := newSSEWriter(whole).send("tok.1", []byte(msg)); err != nil {
			t.Fatal(err)
		}
		for i := 0; i <= len(msg); i++ {
			for j := i; j <= len(msg); j++ {
				pieces := httptest.NewRecorder()
				if err := newSSEWriter(pieces).send("tok.1", []byte(msg[:i]), []byte(msg[i:j]), []byte(msg[j:])); err != nil {
					t.Fatal(err)
				}
				if pieces.Body.String() != whole.Body.String() {
					t.Fatalf("%q in pieces at %d and %d was written as %q, whole as %q", msg, i, j, pieces.Body.String(), whole.Body.String())
				}
			}
		}
	}
}
