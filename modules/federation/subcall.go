package federation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/toolgate/toolgate/internal/eventstream"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
	"github.com/toolgate/toolgate/modules/registry"
)

// A sub-call is one message of the federated session sent to one service:
// a request through the rest of the route (toolgate_registry and every
// step after it), as if a runner had sent it to /v1/mcp/{service} in that
// service's MCP session. Nothing of the pipeline is skipped or done twice:
// the allowlist, the tool pins, the policies (which see the real service),
// the service's credential and the proxy all act on it as on any call.

// subCall sends body (nil for GET and DELETE) with method to svc in its MCP
// session ms (nil for the initialize that creates it), accepting accept,
// through next. It returns once the route answered with headers; the
// answer's body is read from the returned response, which must be closed.
func (h *Handler) subCall(ctx context.Context, r *http.Request, next caddyhttp.Handler, call *gateway.Call,
	svc *gateway.Service, ms *gateway.MCPSession, method string, body []byte, accept string) *answer {
	// The federated message's room covers the body of its call of a
	// service (the registry reads it again).
	sub := r.Clone(gateway.WithOuterRequest(ctx, r))
	sub.Method = method
	// The caller was authenticated and the session resolved already (the
	// call says who and which); nothing of the runner's headers is needed
	// further on.
	sub.Header = http.Header{"Accept": {accept}}
	sub.Body, sub.ContentLength, sub.GetBody = http.NoBody, 0, nil
	if body != nil {
		sub.Header.Set("Content-Type", "application/json")
		sub.Body, sub.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	sub.URL.Path = h.Path + "/" + svc.ID
	sub.URL.RawPath = ""
	sub = registry.WithService(sub, svc.ID)
	sub = gateway.WithCall(sub, &gateway.Call{Started: time.Now(), Caller: call.Caller, Session: call.Session,
		RemoteIP: call.RemoteIP, MCPSession: ms})

	pr, pw := io.Pipe()
	cw := &capture{header: http.Header{}, ready: make(chan struct{}), body: pw}
	go func() {
		err := next.ServeHTTP(cw, sub)
		if err != nil {
			status := http.StatusInternalServerError
			var he caddyhttp.HandlerError
			if errors.As(err, &he) && he.StatusCode != 0 {
				status = he.StatusCode
			}
			cw.fail(status, err)
		}
		cw.WriteHeader(http.StatusOK) // no-op when written
		_ = pw.Close()
	}()
	select {
	case <-cw.ready:
	case <-ctx.Done():
		_ = pr.CloseWithError(ctx.Err())
		return &answer{status: http.StatusServiceUnavailable, header: http.Header{}, body: pr,
			err: ctx.Err(), limit: h.app.MaxResponseBytes, limits: h.answers}
	}
	return &answer{status: cw.status, header: cw.header, body: pr, sse: isSSE(cw.header), err: cw.err,
		limit: h.app.MaxResponseBytes, limits: h.answers}
}

// capture is the ResponseWriter of a sub-call: headers are kept, the body
// flows through a pipe to the reader, and flushing is a no-op (the pipe
// hands each write over at once).
type capture struct {
	header http.Header
	once   sync.Once
	ready  chan struct{}
	status int
	err    error
	body   *io.PipeWriter
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(status int) {
	c.once.Do(func() {
		c.status = status
		c.header = c.header.Clone() // what the reader sees stays as written
		close(c.ready)
	})
}

func (c *capture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.body.Write(b)
}

func (c *capture) Flush() {}

// fail records a handler error (the route answered nothing itself).
func (c *capture) fail(status int, err error) {
	c.once.Do(func() {
		c.status, c.err = status, err
		close(c.ready)
	})
}

// answer is what the route answered a sub-call: its status and headers,
// and its messages, one JSON body or SSE events as they come.
type answer struct {
	status int
	header http.Header
	sse    bool
	err    error // the route failed without answering
	body   *io.PipeReader
	events *eventstream.Reader
	limit  int64
	limits mcpmsg.Limits
	done   bool
	// keepAlive, when set, is called for each SSE comment line (the
	// proxy's keep-alive on a long silent stream).
	keepAlive func()
}

func (a *answer) close() { _ = a.body.CloseWithError(errClosed) }

var errClosed = errors.New("federation: answer closed")

// next returns the answer's next message; io.EOF when there is none.
func (a *answer) next() (mcpmsg.Message, error) {
	data, err := a.nextData()
	if err != nil {
		return mcpmsg.Message{}, err
	}
	return mcpmsg.Parse(data, a.limits)
}

// nextData returns the text of the next message: a JSON body's, or the
// next SSE event's that holds data (toolgate_proxy's priming events hold
// none; its comments are keep-alives).
func (a *answer) nextData() ([]byte, error) {
	if !a.sse {
		if a.done {
			return nil, io.EOF
		}
		a.done = true
		data, err := io.ReadAll(io.LimitReader(a.body, a.limit+1))
		switch {
		case err != nil:
			return nil, err
		case int64(len(data)) > a.limit:
			return nil, errTooLarge
		case len(bytes.TrimSpace(data)) == 0:
			return nil, io.EOF
		}
		return data, nil
	}
	if a.events == nil {
		// The size of an event's field names and id on top of its data.
		const fieldsSize = 4 << 10
		a.events = eventstream.NewReaderSize(a.body, a.limit+fieldsSize, 4<<10)
		a.events.OnComment = func() {
			if a.keepAlive != nil {
				a.keepAlive()
			}
		}
	}
	for {
		ev, err := a.events.Next()
		switch {
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, io.EOF // the stream ended mid-event, which is dropped
		case errors.Is(err, eventstream.ErrEventTooLarge):
			return nil, errTooLarge
		case err != nil:
			return nil, err
		case int64(len(ev.Data)) > a.limit:
			return nil, errTooLarge
		case len(ev.Data) > 0: // not a priming event
			return ev.Data, nil
		}
	}
}

var errTooLarge = errors.New("a message exceeds max_response_size")

// drain reads what is left of the answer and closes it.
func (a *answer) drain() {
	_, _ = io.Copy(io.Discard, io.LimitReader(a.body, a.limit))
	a.close()
}

// single reads a JSON answer's one message: the response to the sub-call.
// A route that failed, or answered something else, is an error.
func (a *answer) single() (mcpmsg.Message, error) {
	defer a.drain()
	if a.err != nil {
		return mcpmsg.Message{}, fmt.Errorf("HTTP %d: %v", a.status, a.err)
	}
	for {
		msg, err := a.next()
		if err != nil {
			return msg, fmt.Errorf("HTTP %d: %v", a.status, err)
		}
		if msg.Kind == mcpmsg.Response {
			return msg, nil
		}
	}
}

func isSSE(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "text/event-stream"
}
