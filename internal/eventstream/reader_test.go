package eventstream

import (
	"errors"
	"fmt"
	"io"
	"math/big"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"

	"github.com/toolgate/toolgate/internal/sseref"
)

// readStream reads a stream with Reader the way toolgate_proxy does and
// returns it in the reference's terms.
func readStream(t testing.TB, r io.Reader, max int64, bufSize int) (sseref.Stream, error) {
	t.Helper()
	s := NewReaderSize(r, max, bufSize)
	var out sseref.Stream
	for {
		ev, err := s.Next()
		if err != nil {
			out.LastEventID = s.LastID()
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
		out.Events = append(out.Events, sseref.Event{Type: typ, Data: string(ev.Data), LastEventID: s.LastID()})
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
		{"whole", strings.NewReader(stream), BufferSize},
		{"one byte at a time", iotest.OneByteReader(strings.NewReader(stream)), BufferSize},
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
func TestReaderFollowsTheStandard(t *testing.T) {
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

func TestReaderLimitsAndTruncation(t *testing.T) {
	read := func(stream string, max int64) ([]Event, error) {
		r := NewReader(strings.NewReader(stream), max)
		var out []Event
		for {
			ev, err := r.Next()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				return out, err
			}
			out = append(out, ev)
		}
	}
	if _, err := read("data: "+strings.Repeat("x", 100)+"\n\n", 50); !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("an event over the limit: err = %v", err)
	}
	// An event split across many data lines is still bounded.
	if _, err := read(strings.Repeat("data: xxxxxxxxxx\n", 20)+"\n", 100); !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("many lines over the limit: err = %v", err)
	}
	// So is a line without an end, and endless comments.
	if _, err := read("data: "+strings.Repeat("x", 200), 100); !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("an endless line: err = %v", err)
	}
	if _, err := read(strings.Repeat(": keep\r", 50), 100); !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("endless comments: err = %v", err)
	}
	// A stream cut in the middle of an event is not an event.
	if events, err := read("data: {\"a\":1}\n\ndata: {\"trunc", 1<<20); !errors.Is(err, io.ErrUnexpectedEOF) || len(events) != 1 {
		t.Errorf("truncated stream: %d events, err = %v", len(events), err)
	}
	// A retry value, however long, is bounded.
	r := NewReader(strings.NewReader("retry: "+strings.Repeat("9", 40)+"\n\n"), 1<<20)
	if _, err := r.Next(); err != io.EOF || r.RetryDelay() != time.Duration(maxRetryMillis)*time.Millisecond {
		t.Errorf("a huge retry: err = %v, delay %v", err, r.RetryDelay())
	}
}

// A line longer than the read buffer counts once against the limit.
func TestReaderLongLine(t *testing.T) {
	data := strings.Repeat("x", 1<<20)
	got, err := readStream(t, strings.NewReader("data: "+data+"\n\n"), 2<<20, BufferSize)
	if err != nil || len(got.Events) != 1 || len(got.Events[0].Data) != len(data) {
		t.Fatalf("a 1 MiB line under a 2 MiB limit: %d events, err = %v", len(got.Events), err)
	}
	if _, err := readStream(t, strings.NewReader("data: "+data+"\n\n"), 1<<20, BufferSize); !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("a 1 MiB line over a 1 MiB limit: err = %v", err)
	}
	// Across buffer refills, a CR at the end of one read and the LF at the
	// start of the next are one line end.
	checkAgainstReference(t, "data: "+strings.Repeat("y", 40)+"\r\n\r\ndata: z\r\n\r\n")
}

// A resumed stream starts from the last event id reached, as browsers do.
func TestReaderResumedKeepsTheLastEventID(t *testing.T) {
	first := NewReader(strings.NewReader("id: 3\nretry: 40\ndata: a\n\n"), 1<<20)
	if _, err := first.Next(); err != nil {
		t.Fatal(err)
	}
	next := first.Resumed(strings.NewReader("event: close\ndata: \n\n"))
	if _, err := next.Next(); err != nil || next.LastID() != "3" || next.RetryDelay() != 40*time.Millisecond {
		t.Fatalf("resumed: err = %v, last id %q, retry %v", err, next.LastID(), next.RetryDelay())
	}
}

func FuzzReader(f *testing.F) {
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
		r := NewReaderSize(strings.NewReader(stream), 256, 16)
		for i := 0; ; i++ {
			ev, err := r.Next()
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

// Reading a stream takes its buffer from a pool and gives it back: a small
// event costs a few hundred bytes of allocation, not a buffer of its own
// (BufferSize), and an event read before its reader was released keeps
// its data when the buffer serves another stream.
func TestReaderBuffersArePooled(t *testing.T) {
	read := func(stream string) Event {
		r := NewReader(strings.NewReader(stream), 1<<20)
		ev, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
		r.Release() // a second release does nothing
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
	// BufferSize each.
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > BufferSize/2 {
		t.Errorf("reading a small event allocates %d bytes, want well under a buffer (%d)", per, BufferSize)
	}
}

// A resumed reader takes over the buffer of the reader it continues.
func TestReaderResumedTakesOverTheBuffer(t *testing.T) {
	first := NewReader(strings.NewReader("id: 3\ndata: a\n\n"), 1<<20)
	if _, err := first.Next(); err != nil {
		t.Fatal(err)
	}
	pooled := first.pooled
	next := first.Resumed(strings.NewReader("data: b\n\n"))
	if next.pooled != pooled || first.pooled != nil || first.buf != nil {
		t.Fatal("the resumed reader did not take over the buffer")
	}
	if ev, err := next.Next(); err != nil || string(ev.Data) != "b" {
		t.Fatalf("resumed read: %q, %v", ev.Data, err)
	}
	next.Release()
}

// A data line longer than the read buffer is copied once into a slice of
// its length: reading a 1 MiB event allocates about 1 MiB, not the several
// MiB that gathering it by appending costs.
func TestReaderLongLineIsCopiedOnce(t *testing.T) {
	data := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	stream := "event: message\ndata: " + data + "\n\n"
	read := func() {
		r := NewReader(strings.NewReader(stream), 2<<20)
		ev, err := r.Next()
		r.Release()
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

// chunkReader hands out its bytes n at a time, so that a read ends exactly
// where a test wants a buffer to end.
type chunkReader struct {
	r io.Reader
	n int
}

func (c chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// Lines as long as the read buffer and its multiples, give or take a byte,
// ending in LF, CR or CRLF whose CR and LF fall into different reads, after
// a BOM or not, several to an event: read as the reference reads them, and
// an event of one long line holds no room to append into.
func TestReaderLinesAtBufferBoundaries(t *testing.T) {
	const b = BufferSize
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
					s := NewReader(rd.r, 1<<22)
					for i, w := range want.Events {
						ev, err := s.Next()
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
					if _, err := s.Next(); err != io.EOF {
						t.Fatalf("line of %d, end %q, %s: after the events: %v", n, end, rd.name, err)
					}
					s.Release()
				}
			}
		}
	}
}

// Two events, each of one long line, read one after the other: the first
// one's bytes are not changed by reading the second (the reader's buffers
// go back to the pool and are reused).
func TestReaderLongEventsStayIntact(t *testing.T) {
	a := strings.Repeat("a", 3*BufferSize+5)
	c := strings.Repeat("c", 2*BufferSize-3)
	s := NewReader(strings.NewReader(fmt.Sprintf("data: %s\n\ndata: %s\r\n\r\ndata: x\n\n", a, c)), 1<<22)
	defer s.Release()
	first, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
	}
	if string(first.Data) != a {
		t.Fatal("the first event's data changed as the next ones were read")
	}
}

// Each comment line is reported to OnComment (a keep-alive), and is no
// event.
func TestReaderReportsComments(t *testing.T) {
	r := NewReader(strings.NewReader(": keep-alive\n\n:\ndata: a\n: inside\n\n"), 1<<20)
	defer r.Release()
	comments := 0
	r.OnComment = func() { comments++ }
	ev, err := r.Next()
	if err != nil || string(ev.Data) != "a" || comments != 3 {
		t.Fatalf("read %q %v after %d comments, want \"a\" after 3", ev.Data, err, comments)
	}
	if _, err := r.Next(); err != io.EOF || comments != 3 {
		t.Fatalf("then %v after %d comments, want EOF", err, comments)
	}
}
