package sse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/eventstream"
	"github.com/toolgate/toolgate/internal/mcpbridge"
)

// stream is one runner session's connection to a 2024-11-05 server: the
// GET event stream, read with toolgate's own reader (package eventstream),
// and the endpoint its first event named, where messages are POSTed. Every
// message event's data reaches the bridge as the server wrote it, so an
// answer toolgate cannot relay (cut off, not JSON) still names its call,
// which fails at once instead of waiting out the service's timeout.
type stream struct {
	client   *http.Client
	endpoint string // where messages are POSTed (the guard keeps them on the service's host)
	body     io.ReadCloser
	events   *eventstream.Reader
	service  string
	logger   func() *zap.Logger
	logged   atomic.Int32 // entries the server's stream put in the log
}

// maxLogged bounds what one stream puts in the log (malformed messages,
// events that are not messages, requests toolgate refused): a server that
// sends nothing else cannot fill it.
const maxLogged = 100

// postBodyWait bounds reading the body of a POST's answer.
const postBodyWait = 100 * time.Millisecond

// openStream opens the event stream at sseURL and reads its first event,
// which names the message endpoint. max bounds one event.
func openStream(ctx context.Context, client *http.Client, sseURL *url.URL, max int64) (*stream, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sseURL.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		resp.Body.Close()
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	s := &stream{client: client, body: resp.Body, events: eventstream.NewReader(resp.Body, max)}
	first, err := s.events.Next()
	switch {
	case errors.Is(err, eventstream.ErrEventTooLarge):
		err = &mcpbridge.Unavailable{Reason: "the server's first event exceeds max_response_size"}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		err = &mcpbridge.Unavailable{Reason: "the server's SSE stream ended before its endpoint event"}
	case err != nil:
	case first.Type != "endpoint":
		err = &mcpbridge.Unavailable{Reason: "the server's SSE stream did not begin with an endpoint event: is it a server of the 2024-11-05 HTTP+SSE transport?"}
	default:
		var u *url.URL
		// Blanks around it (which no URL holds) are dropped, as the SDK's
		// client did: a server that pads its endpoint still works.
		if u, err = sseURL.Parse(strings.TrimSpace(string(first.Data))); err != nil {
			err = &mcpbridge.Unavailable{Reason: "the server's endpoint event does not hold a URL"}
		} else {
			s.endpoint = u.String()
		}
	}
	if err != nil {
		s.close()
		s.events.Release()
		return nil, err
	}
	return s, nil
}

// close ends the GET; reading then ends too.
func (s *stream) close() { s.body.Close() }

// send POSTs one message to the server's endpoint.
func (s *stream) send(ctx context.Context, msg []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.endpoint, bytes.NewReader(msg))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// The answer's body says nothing (the answer comes on the stream); what
	// of it comes at once is read so that the connection serves the next
	// POST, but a body the server keeps open does not hold the message up
	// (the SDK's client closed it unread).
	stop := time.AfterFunc(postBodyWait, func() { resp.Body.Close() })
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	stop.Stop()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// read hands each message event to link until the stream ends, then closes
// link with endErr (or, after an event over max_response_size, with an
// error saying so). Events of other types (a heartbeat some servers send,
// another endpoint event, which is never followed) are skipped.
func (s *stream) read(link *mcpbridge.Link, endErr error) {
	defer s.events.Release()
	defer s.close()
	skipped := false
	for {
		ev, err := s.events.Next()
		switch {
		case errors.Is(err, eventstream.ErrEventTooLarge):
			link.Close(&mcpbridge.Unavailable{Reason: "the server sent an event over max_response_size on its SSE stream, which toolgate then closed"})
			return
		case err != nil:
			link.Close(endErr)
			return
		case ev.Type == "" || ev.Type == "message":
			link.Receive(ev.Data)
		default:
			// Not the server's message, as a reader following the standard
			// (the TypeScript SDK's, a browser's) has it; but one that names
			// a call in progress (an answer under "message " or a type of
			// the server's own) fails that call at once, rather than leave
			// it waiting out its timeout.
			link.FailAnswer(ev.Data, "the upstream sent an answer as an SSE event of another type than message")
			if !skipped && s.mayLog() {
				skipped = true
				// Its text is not logged: it is the server's.
				s.logger().Warn("skipped an event of the server's stream that is not a message (logged once per stream)",
					zap.String("service", s.service))
			}
		}
	}
}

// mayLog reports whether the stream may put one more entry in the log,
// and says so once when it may not.
func (s *stream) mayLog() bool {
	// The count stops past the bound: counting every message a server
	// sends would wrap around.
	for {
		n := s.logged.Load()
		if n > maxLogged {
			return false
		}
		if !s.logged.CompareAndSwap(n, n+1) {
			continue
		}
		if n < maxLogged {
			return true
		}
		s.logger().Warn("the server's SSE stream sent more than is logged; what more of it toolgate drops is not logged",
			zap.String("service", s.service))
		return false
	}
}
