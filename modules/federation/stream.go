package federation

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// stream writes server-sent events to the runner. The messages it gets
// come from toolgate_proxy, read strictly and written without a CR, so
// each is one data line. It carries no event ids: a federated stream that
// drops is not resumed (the runner sends its request again).
type stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	mu      sync.Mutex
	started bool
	err     error
}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, rc: http.NewResponseController(w)}
}

func (s *stream) startLocked() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

// send writes one message event and flushes it.
func (s *stream) send(msg []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.startLocked()
	if s.err != nil {
		return s.err
	}
	b := make([]byte, 0, len(msg)+16)
	b = append(b, "event: message\ndata: "...)
	b = append(b, msg...)
	b = append(b, "\n\n"...)
	if _, s.err = s.w.Write(b); s.err == nil {
		s.err = s.rc.Flush()
	}
	return s.err
}

// keepAlive passes a service's keep-alive on.
func (s *stream) keepAlive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.err != nil {
		return
	}
	if _, s.err = io.WriteString(s.w, ": keep-alive\n\n"); s.err == nil {
		s.err = s.rc.Flush()
	}
}

// stream answers the runner's GET: one stream carrying the standalone
// streams of every service of the session (each opened through the
// pipeline, as a GET to /v1/mcp/{service} would be). Services without one
// are left out; 405 when none has one. It ends when the runner goes away
// or every service's stream ended.
func (x *exchange) stream() {
	ctx, cancel := context.WithCancel(x.r.Context())
	defer cancel()
	type opened struct {
		svc *gateway.Service
		ms  *gateway.MCPSession
		a   *answer
	}
	var streams []opened
	for _, svc := range x.services() {
		c, g := x.childSession(ctx, svc)
		if g != nil {
			x.h.logger.Info("a service is missing from a federated stream", zap.String("service", svc.ID), zap.String("reason", g.Message))
			continue
		}
		a := x.h.subCall(ctx, x.r, x.next, x.call, svc, c.ms, http.MethodGet, nil, "text/event-stream")
		if a.status != http.StatusOK || !a.sse {
			a.drain()
			continue
		}
		streams = append(streams, opened{svc, c.ms, a})
	}
	if len(streams) == 0 {
		gateway.WriteRPCError(x.w, http.StatusMethodNotAllowed, nil, gateway.CodeInvalidRequest,
			"no service of this session offers a stream", nil)
		return
	}
	out := newStream(x.w)
	out.mu.Lock()
	out.startLocked()
	_ = out.rc.Flush()
	out.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range streams {
		s.a.keepAlive = out.keepAlive
		wg.Go(func() {
			defer s.a.close()
			for {
				msg, err := s.a.next()
				if err != nil {
					if !errors.Is(err, io.EOF) && ctx.Err() == nil {
						x.h.logger.Debug("a service's stream ended", zap.String("service", s.svc.ID), zap.Error(err))
					}
					return
				}
				if b := x.outgoing(s.svc, s.ms, msg, nil); b != nil && out.send(b) != nil {
					cancel()
					return
				}
			}
		})
	}
	go func() {
		<-ctx.Done()
		for _, s := range streams {
			s.a.close()
		}
	}()
	wg.Wait()
}
