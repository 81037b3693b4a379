// Package mcpproxy is toolgate_proxy, the terminal step of the pipeline: it
// owns the upstream MCP session behind each runner session and relays the
// exchange — JSON and SSE responses, notifications, and server→client
// requests — passing results through the earlier steps' result hooks.
//
// It speaks Streamable HTTP to upstreams itself rather than through the MCP
// Go SDK's client Connection: that Connection merges every response stream
// of a session into one channel and re-encodes messages, so a relay could
// not tell which runner request a notification or a server→client request
// belongs to, nor keep results byte for byte. Here each runner HTTP request
// maps to one upstream HTTP request, and each upstream stream is relayed to
// the runner stream it answers.
package mcpproxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler relays runner requests to the service's upstream MCP server.
type Handler struct {
	app        *gateway.App
	client     *http.Client
	maxMessage int64
	limits     mcpmsg.Limits
	logger     *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_proxy",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision finds the toolgate app.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := ctx.App("toolgate")
	if err != nil {
		return err
	}
	h.app = app.(*gateway.App)
	h.client = h.app.HTTPClient()
	h.maxMessage = h.app.MaxResponseBytes
	h.limits = mcpmsg.Limits{MaxDepth: h.app.MaxJSONDepth}
	return nil
}

// ServeHTTP relays one runner request. It is terminal: it never calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil || call.Service == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_proxy must come last in a route with toolgate_session and toolgate_registry"))
	}
	switch {
	case r.Method == http.MethodGet:
		h.stream(w, r, call)
	case r.Method == http.MethodDelete:
		h.end(w, r, call)
	case call.Message.Kind == mcpmsg.Request && call.Method == "initialize":
		h.initialize(w, r, call)
	case call.Message.Kind == mcpmsg.Request:
		h.request(w, r, call)
	default:
		h.forward(w, r, call)
	}
	return nil
}

// request relays a runner request and its response stream.
func (h *Handler) request(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(call.Service.Timeout))
	defer cancel()
	body := requestBody(call)
	up, resp, err := h.post(ctx, call, body)
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	rs, err := h.newResponse(ctx, call, up, resp)
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	defer rs.close()
	h.relay(w, r, call, rs, nil)
	if ctx.Err() == context.DeadlineExceeded {
		h.cancelUpstream(call, up)
	}
}

// post sends body upstream in the call's MCP session, re-initializing the
// upstream session once if the upstream forgot it. The message was not
// processed when the upstream answered 404, so sending it again is safe.
func (h *Handler) post(ctx context.Context, call *gateway.Call, body []byte) (gateway.Upstream, *http.Response, error) {
	up := call.MCPSession.Upstream()
	resp, err := h.exchange(ctx, call, up, http.MethodPost, body, "")
	if isKind(err, kindSessionGone) {
		if up, err = h.reinitialize(ctx, call, up); err != nil {
			return up, nil, err
		}
		resp, err = h.exchange(ctx, call, up, http.MethodPost, body, "")
	}
	return up, resp, err
}

// relay copies the upstream's messages to the runner until the response to
// the runner's request, which passes the result hooks first. The runner gets
// the same kind of answer the upstream gave: a JSON body, or an SSE stream
// on which notifications and server→client requests arrive as they come.
func (h *Handler) relay(w http.ResponseWriter, r *http.Request, call *gateway.Call, rs *response, header func(http.Header)) {
	var out *sseWriter
	if rs.sse != nil && acceptsSSE(r) {
		out = newSSEWriter(w)
	}
	for {
		msg, err := rs.next()
		if err != nil {
			why := "the upstream ended its stream without answering"
			var ue *upstreamError
			if errors.As(err, &ue) {
				why = ue.msg
			}
			h.logger.Warn("upstream exchange failed", zap.String("service", call.Service.ID),
				zap.String("method", call.Method), zap.String("error", why))
			h.writeFinal(w, out, header, gateway.RPCError(call.Message.ID, gateway.CodeUnavailable,
				why+"; the request may or may not have run upstream", gateway.Retryable))
			return
		}
		if isResponseTo(msg, call.Message.ID) {
			h.writeFinal(w, out, header, h.finish(rs.ctx, call, msg))
			return
		}
		if !h.forRunner(call, msg, "request stream") || out == nil {
			continue
		}
		out.start(header)
		if err := out.send(msg.Raw); err != nil {
			return // the runner went away
		}
	}
}

// forRunner checks a message the upstream sent on a stream and records
// server→client requests. Responses to other requests are dropped: on a
// request stream only the answer to that request may pass, and only after
// the result hooks.
func (h *Handler) forRunner(call *gateway.Call, msg mcpmsg.Message, where string) bool {
	switch msg.Kind {
	case mcpmsg.Request:
		call.MCPSession.ServerRequestSent(msg.ID, msg.Method)
		return true
	case mcpmsg.Notification:
		return true
	}
	h.logger.Warn("dropped an unexpected upstream response", zap.String("service", call.Service.ID), zap.String("stream", where))
	return false
}

// finish runs the result hooks on a successful response. The result was
// read strictly with the rest of the message, so the hooks inspect exactly
// what the runner will read.
func (h *Handler) finish(ctx context.Context, call *gateway.Call, msg mcpmsg.Message) []byte {
	if !call.HasResultHooks() || msg.Result == nil {
		return msg.Raw // no hooks, or an error response: nothing to inspect
	}
	out, changed, err := call.RunResultHooks(ctx, msg.Result)
	if err != nil {
		h.logger.Error("result hook failed; withholding the result", zap.String("service", call.Service.ID), zap.Error(err))
		return gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "toolgate could not check the result; it was withheld", nil)
	}
	if !changed {
		return msg.Raw
	}
	return gateway.RPCResult(call.Message.ID, out)
}

func (h *Handler) writeFinal(w http.ResponseWriter, out *sseWriter, header func(http.Header), msg []byte) {
	if out != nil {
		out.start(header)
		_ = out.send(msg)
		return
	}
	if header != nil {
		header(w.Header())
	}
	gateway.WriteRPC(w, http.StatusOK, msg)
}

// forward relays a notification, or the runner's answer to a server→client
// request. The upstream acknowledges with 202.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(call.Service.Timeout))
	defer cancel()
	up, resp, err := h.post(ctx, call, call.Message.Raw)
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if call.Method == "notifications/initialized" && !call.MCPSession.HasCatalog() {
		// Learn the upstream's tool definitions before the runner's first
		// call, so the request policy sees annotations.
		if err := h.fetchCatalog(ctx, call, up); err != nil {
			h.logger.Warn("cannot list the upstream's tools; policy will see tools without annotations",
				zap.String("service", call.Service.ID), zap.Error(err))
		}
	}
	w.WriteHeader(http.StatusAccepted)
}

// stream relays the upstream's standalone SSE stream (server-initiated
// notifications and requests) to the runner's GET.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	if !acceptsSSE(r) {
		gateway.WriteRPCError(w, http.StatusNotAcceptable, nil, gateway.CodeInvalidRequest,
			"GET opens an SSE stream: Accept must include text/event-stream", nil)
		return
	}
	ctx := r.Context()
	up := call.MCPSession.Upstream()
	resp, err := h.exchange(ctx, call, up, http.MethodGet, nil, "")
	if isKind(err, kindSessionGone) {
		if up, err = h.reinitialize(ctx, call, up); err == nil {
			resp, err = h.exchange(ctx, call, up, http.MethodGet, nil, "")
		}
	}
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
	rs := &response{h: h, ctx: ctx, call: call, up: up, resp: resp, sse: newSSEReader(resp.Body, h.maxMessage)}
	defer rs.close()
	out := newSSEWriter(w)
	out.start(nil)
	for {
		msg, err := rs.next()
		if err != nil {
			return
		}
		if !h.forRunner(call, msg, "standalone stream") {
			continue
		}
		if out.send(msg.Raw) != nil {
			return
		}
	}
}

// end terminates the runner's MCP session and, best effort, the upstream's.
func (h *Handler) end(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ms := call.MCPSession
	h.app.MCPSessions().Delete(ms.ID)
	if up := ms.Upstream(); up.SessionID != "" {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if resp, err := h.exchange(ctx, call, up, http.MethodDelete, nil, ""); err == nil {
			resp.Body.Close()
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// cancelUpstream tells the upstream to stop working on a request the
// gateway gave up on (timeout). Best effort.
func (h *Handler) cancelUpstream(call *gateway.Call, up gateway.Upstream) {
	body := make([]byte, 0, 128)
	body = append(body, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`...)
	body = append(body, call.Message.ID...)
	body = append(body, `,"reason":"toolgate: the service timeout elapsed"}}`...)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if resp, err := h.exchange(ctx, call, up, http.MethodPost, body, ""); err == nil {
			resp.Body.Close()
		}
	}()
}

// answerError tells the runner why the upstream exchange failed.
func (h *Handler) answerError(w http.ResponseWriter, r *http.Request, call *gateway.Call, err error) {
	var ue *upstreamError
	if !errors.As(err, &ue) {
		ue = unavailable("%v", err)
	}
	switch ue.kind {
	case kindUnauthorized:
		if k := call.Service.Auth.Kind; k == gateway.AuthBearer || k == gateway.AuthOAuth {
			call.Fail(w, http.StatusForbidden, gateway.CodeNeedsSignIn,
				"the upstream refused your stored credential for "+call.Service.ID+": connect again", h.app.NeedsSignIn(r, call.Service))
			return
		}
		h.logger.Error("upstream refused the service credential", zap.String("service", call.Service.ID), zap.Int("status", ue.status))
		call.Unavailable(w, "the upstream refused toolgate's credential for "+call.Service.ID+"; an administrator must fix the service's auth")
	case kindRejected:
		if ue.body != nil && gjson.ValidBytes(ue.body) {
			gateway.WriteRPC(w, ue.status, ue.body)
			return
		}
		call.Fail(w, ue.status, gateway.CodeInvalidRequest, ue.msg, nil)
	default:
		h.logger.Warn("upstream unavailable", zap.String("service", call.Service.ID), zap.String("error", ue.msg))
		call.Unavailable(w, ue.msg)
	}
}

// requestBody is the runner's message, with the arguments a policy
// rewrote.
func requestBody(call *gateway.Call) []byte {
	if call.Arguments == nil {
		return call.Message.Raw
	}
	params := mcpmsg.ReplaceMember(call.Message.Params, "arguments", call.Arguments)
	return mcpmsg.ReplaceMember(call.Message.Raw, "params", params)
}

func acceptsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/event-stream") || strings.Contains(v, "*/*") {
			return true
		}
	}
	return false
}

func isKind(err error, kind errorKind) bool {
	var ue *upstreamError
	return errors.As(err, &ue) && ue.kind == kind
}

// gatewayRequestID is the id of a request toolgate itself sends upstream.
func gatewayRequestID() []byte {
	return mcpmsg.Quote("toolgate-" + gateway.NewID())
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
