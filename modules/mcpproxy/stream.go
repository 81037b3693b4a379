package mcpproxy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/toolgate/toolgate/internal/eventstream"
	"github.com/toolgate/toolgate/modules/gateway"
)

// stream relays the upstream's standalone SSE stream (server-initiated
// notifications and requests) to the runner's GET, or resumes a stream
// the runner lost when the GET carries Last-Event-ID.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	if !acceptsSSE(r) {
		gateway.WriteRPCError(w, http.StatusNotAcceptable, nil, gateway.CodeInvalidRequest,
			"GET opens an SSE stream: Accept must include text/event-stream", nil)
		return
	}
	if id := r.Header.Get("Last-Event-Id"); id != "" {
		h.resumeForRunner(w, r, call, id)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(call.MCPSession.Context(), cancel)()
	defer h.app.WhileAuthorized(r, call, cancel)() // a reload may take away what let it open
	up, resp, err := h.openStream(ctx, call)
	if err != nil {
		var ue *upstreamError
		if errors.As(err, &ue) && ue.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", "POST, DELETE")
			gateway.WriteRPCError(w, http.StatusMethodNotAllowed, nil, gateway.CodeInvalidRequest,
				"this service offers no standalone SSE stream", nil)
			return
		}
		h.answerError(w, r, call, err)
		return
	}
	if !isSSE(resp.Header) {
		resp.Body.Close()
		h.answerError(w, r, call, unavailable("the upstream answered GET without an SSE stream"))
		return
	}
	rs := &response{h: h, ctx: ctx, call: call, up: up, resp: resp, sse: eventstream.NewReader(resp.Body, h.maxMessage)}
	defer rs.close()
	out := newSSEWriter(w)
	out.start(nil)
	defer out.close() // a notice sent as the stream ends writes nothing
	// toolgate's own notifications to the runner (an approval decided)
	// go on this stream too.
	defer h.notices.Attach(call.MCPSession.ID, func(msg []byte) error { return out.send("", msg) })()
	var st *runnerStream
	if !gateway.IsInnerRequest(r.Context()) { // nothing resumes a federated message's call of a service
		st = newRunnerStream(call, up, time.Time{}, out, cancel, nil)
	}
	h.relay(r.Context(), w, call, rs, out, st)
}

// openStream opens the upstream's standalone stream, re-initializing the
// upstream session if it forgot it. Re-initializing, and waiting for the
// stream's response headers, are bounded by the service timeout; the
// stream itself only by ctx.
func (h *Handler) openStream(ctx context.Context, call *gateway.Call) (gateway.Upstream, *http.Response, error) {
	timeout := time.Duration(call.Service.Timeout)
	open := func(up gateway.Upstream) (*http.Response, error) {
		hctx, cancel := context.WithCancel(ctx)
		t := time.AfterFunc(timeout, cancel)
		resp, err := h.getStream(hctx, call, up, "")
		if !t.Stop() {
			if err == nil {
				resp.Body.Close()
			}
			return nil, unavailable("the upstream did not open its stream in time")
		}
		if err != nil {
			cancel()
			return nil, err
		}
		resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel} // the body lives as long as the stream
		return resp, nil
	}
	up := call.MCPSession.Upstream()
	resp, err := open(up)
	if isKind(err, kindSessionGone) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		up, err = h.reinitialize(rctx, call, up)
		cancel()
		if err == nil {
			resp, err = open(up)
		}
	}
	return up, resp, err
}

// keepAlive writes a comment on out whenever it was silent for the
// service's sse_keepalive, until the returned function is called; after
// that, out writes nothing more. A timer does it, so no goroutine waits
// beside each stream.
func (h *Handler) keepAlive(out *sseWriter, svc *gateway.Service) (stop func()) {
	d := time.Duration(svc.SSEKeepAlive)
	if d <= 0 {
		return out.close
	}
	k := &keepAliveTimer{out: out, interval: d}
	k.mu.Lock()
	k.t = time.AfterFunc(d/2, k.fire)
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		k.t.Stop()
		k.mu.Unlock()
		out.close() // a fire already running writes nothing more
	}
}

// keepAliveTimer checks every half interval whether its stream needs a
// keep-alive comment.
type keepAliveTimer struct {
	out      *sseWriter
	interval time.Duration

	mu sync.Mutex
	t  *time.Timer
}

func (k *keepAliveTimer) fire() {
	if k.out.keepAlive(k.interval) != nil {
		return // the runner went away, or the stream is finished
	}
	k.mu.Lock()
	k.t.Reset(k.interval / 2)
	k.mu.Unlock()
}
