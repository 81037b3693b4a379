package mcpproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// jsonResponse is the JSON answer of an upstream whose body holds body and
// whose Content-Length says length (-1: none, the body is chunked).
func jsonResponse(body io.Reader, length, max int64) *response {
	return &response{h: &Handler{maxMessage: max}, ctx: context.Background(),
		resp: &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(body), ContentLength: length}}
}

// oneByteReader hands out its bytes one Read at a time, as a slow
// connection does.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }

// failReader fails the test when it is read.
type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Error("the body was read")
	return 0, io.EOF
}

// A JSON body is read whole, of the length it announces or, without one,
// to its end; one over max_response_size, or not of its announced length,
// is an error, never a body cut short.
func TestJSONBodyLengths(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + strings.Repeat("lorem ipsum\\n", 10000) + `"}]}}`
	n := int64(len(msg))
	for _, tc := range []struct {
		name   string
		body   io.Reader
		length int64
		max    int64
		want   string // the error's message, "" for the body
	}{
		{"exact", strings.NewReader(msg), n, n, ""},
		{"exact, read a byte at a time", oneByteReader{strings.NewReader(msg)}, n, n, ""},
		{"absent", strings.NewReader(msg), -1, n, ""},
		{"absent, read a byte at a time", oneByteReader{strings.NewReader(msg)}, -1, n, ""},
		{"absent, empty", strings.NewReader(""), -1, n, ""},
		{"absent, over the limit", strings.NewReader(msg), -1, n - 1, "the upstream response exceeds max_response_size"},
		{"announced over the limit", failReader{t}, n, n - 1, "the upstream response exceeds max_response_size"},
		{"announced a gigabyte", failReader{t}, 1 << 30, n, "the upstream response exceeds max_response_size"},
		{"shorter than announced", strings.NewReader(msg[:n-10]), n, n, "reading the upstream response failed"},
		{"empty, announced", strings.NewReader(""), n, n, "reading the upstream response failed"},
		{"longer than announced", strings.NewReader(msg + " "), n, 2 * n, "the upstream response is longer than its Content-Length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := jsonResponse(tc.body, tc.length, tc.max).nextData()
			var ue *upstreamError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("err = %v", err)
			case tc.want == "" && tc.length == -1 && tc.name == "absent, empty":
				if len(data) != 0 {
					t.Fatalf("got %d bytes", len(data))
				}
			case tc.want == "" && string(data) != msg:
				t.Fatalf("got %d bytes, not the body", len(data))
			case tc.want != "" && (!errors.As(err, &ue) || ue.msg != tc.want || !ue.sent || data != nil):
				t.Fatalf("err = %v, data %d bytes; want %q", err, len(data), tc.want)
			}
		})
	}
}

// allocated is the bytes f allocates, on average over runs.
func allocated(runs int, f func()) float64 {
	f()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// A JSON body of a megabyte is read into one slice of its size, with or
// without a Content-Length: reading it by appending to a growing slice
// allocated twice its size, copying it over and over.
func TestJSONBodyReadOnce(t *testing.T) {
	body := bytes.Repeat([]byte(`"lorem ipsum dolor sit amet, consectetur adipiscing elit\n",`), 1<<20/60)
	for _, length := range []int64{int64(len(body)), -1} {
		got := allocated(20, func() {
			data, err := jsonResponse(bytes.NewReader(body), length, 2<<20).nextData()
			if err != nil || len(data) != len(body) {
				t.Fatalf("%d bytes, %v", len(data), err)
			}
		})
		// One slice of the body's size; the margin is for the pooled
		// buffers the race detector makes sync.Pool drop.
		if got > 1.5*float64(len(body)) {
			t.Errorf("Content-Length %d: %.0f bytes allocated to read a body of %d (%.2f×)", length, got, len(body), got/float64(len(body)))
		}
	}
}

// stallReader hands out n bytes, then fails: an upstream that announced a
// large body and sent a little of it.
type stallReader struct{ n int }

func (s *stallReader) Read(p []byte) (int, error) {
	if s.n == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	k := min(len(p), s.n)
	s.n -= k
	return k, nil
}

// An announced length is not memory reserved: an upstream that announces
// max_response_size and sends a few bytes makes toolgate hold about what
// it sent, not what it announced (else slow answers announcing the limit
// would reserve it once per call in progress without sending it).
func TestJSONBodyAnnouncedLengthIsNotReserved(t *testing.T) {
	const announced = 16 << 20
	got := allocated(10, func() {
		if _, err := jsonResponse(&stallReader{n: 100}, announced, announced).nextData(); err == nil {
			t.Fatal("a body cut short was accepted")
		}
	})
	if got > 256<<10 {
		t.Errorf("%.0f bytes allocated for a body that announced %d and sent 100", got, announced)
	}
}

// A small body of a known length, read straight into its slice, is held
// to its length as a large one is.
func TestJSONBodySmallLengths(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`
	n := int64(len(msg))
	if data, err := jsonResponse(oneByteReader{strings.NewReader(msg)}, n, n).nextData(); err != nil || string(data) != msg {
		t.Fatalf("exact: %q, %v", data, err)
	}
	for _, tc := range []struct {
		name string
		body string
		want string
	}{
		{"shorter than announced", msg[:n-1], "reading the upstream response failed"},
		{"longer than announced", msg + " ", "the upstream response is longer than its Content-Length"},
	} {
		data, err := jsonResponse(strings.NewReader(tc.body), n, 2*n).nextData()
		var ue *upstreamError
		if !errors.As(err, &ue) || ue.msg != tc.want || data != nil {
			t.Errorf("%s: err = %v, data %q; want %q", tc.name, err, data, tc.want)
		}
	}
}
