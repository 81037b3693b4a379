package mcpproxy

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"

	"github.com/toolgate/toolgate/internal/sseref"
	"github.com/toolgate/toolgate/modules/gateway"
)

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
