// Package registry is toolgate_registry, the second step of the pipeline:
// it resolves the service a request is for, checks the caller may use it,
// reads the runner's JSON-RPC message (once, strictly) and enforces the
// service's tool allowlist and its tools' pins (package toolpin).
package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/impliedsession"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler resolves /v1/mcp/{service} and checks the message against the
// registry.
type Handler struct {
	// Service is the service id, usually a placeholder. Default: the last
	// segment of the request path, so /v1/mcp/tracker is service "tracker".
	Service string `json:"service,omitempty"`

	app       *gateway.App
	pins      *toolpin.Pins
	limits    mcpmsg.Limits
	stateless *mcp2026.Runtime
	route     *gateway.Route
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_registry",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision finds the toolgate app.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	h.app = app
	if h.pins, err = toolpin.For(h.app); err != nil {
		return err
	}
	if h.Service != "" && !strings.Contains(h.Service, "{") && h.app.Registry().Lookup(h.Service) == nil {
		// Found at once, not as a 404 on every request.
		return fmt.Errorf("toolgate_registry: service %q is not defined in the toolgate global option's registry", h.Service)
	}
	h.limits = mcpmsg.Limits{MaxDepth: h.app.MaxJSONDepth, MaxValues: h.app.MaxRequestValues}
	if h.stateless, err = mcp2026.For(h.app); err != nil {
		return err
	}
	if err := h.app.ProvisionStep(gateway.StepRegistry); err != nil {
		return err
	}
	h.route = h.app.ProvisioningRoute()
	return nil
}

// ServeHTTP resolves the service and reads the message.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_registry must come after toolgate_session in the route"))
	}
	id := h.serviceID(r)
	svc := h.app.Registry().Lookup(id)
	if svc == nil || !svc.AllowsUser(call.Caller.User) {
		gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeInvalidRequest, "unknown service "+quote(id), nil)
		return nil
	}
	if !call.Session.Selected(svc.ID) {
		gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeInvalidRequest,
			"service "+quote(id)+" is not selected in this toolgate session; create a session that lists it", nil)
		return nil
	}
	if call.MCPSession != nil && call.MCPSession.Service != svc.ID {
		gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeSessionNotFound,
			"MCP session not found for this service: initialize a new one", nil)
		return nil
	}
	if call.MCPSession != nil && !h.current(w, r, call, svc) {
		return nil
	}
	call.Service = svc
	call.Session = impliedsession.Narrow(call.Session, svc.ID)

	var held *gateway.RequestBytes
	switch r.Method {
	case http.MethodPost:
		var ok bool
		held, ok = h.readMessage(w, r, call, svc)
		defer held.Release() // the body is the call's until it is answered
		if !ok {
			return nil
		}
		if call.Stateless != nil && call.Stateless.Held != "" {
			defer h.releaseUntaken(call)
		}
	case http.MethodGet, http.MethodDelete:
		if r.Method == http.MethodGet && !gateway.Bodyless(w, r) {
			return nil
		}
		if call.MCPSession == nil && mcp2026.ModernHeader(r) {
			statelessGetOrDelete(w)
			return nil
		}
		if call.MCPSession == nil {
			gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
				"missing Mcp-Session-Id header: initialize first", nil)
			return nil
		}
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		gateway.WriteRPCError(w, http.StatusMethodNotAllowed, nil, gateway.CodeInvalidRequest,
			"method "+r.Method+" is not allowed on an MCP endpoint", nil)
		return nil
	}
	if !h.checkProtocolVersion(w, r, call) {
		return nil
	}
	if call.Message.Kind == mcpmsg.Response {
		return h.relayAnswer(w, r, call, next)
	}
	if call.Method == "tools/call" {
		if !svc.AllowsTool(call.Message.Name) {
			// As if the tool did not exist: runners never learn what is hidden.
			gateway.AuditRefused(call, gateway.StepRegistry, "the tool is not on the service's allowlist")
			gateway.WriteRPCError(w, http.StatusOK, call.Message.ID, gateway.CodeInvalidParams,
				"Unknown tool: "+call.Message.Name, nil)
			return nil
		}
		if call.Stateless != nil {
			// Opening the implied MCP session contacts the upstream: that
			// waits until a toolgate_policy has the request.
			call.Prepare = func(w http.ResponseWriter, r *http.Request) bool { return h.readyCall(w, r, call) }
		} else if !h.readyCall(w, r, call) {
			return nil
		}
	}
	if call.Method == "tools/list" {
		call.OnResult(allowlistTools)
		call.OnResult(h.pins.FilterList)
	}
	return next.ServeHTTP(w, r)
}

// readyCall readies a tools/call for its decision: a stateless call's
// implied MCP session is opened, so that the policy sees the tool's
// definition; a call racing the tool listing (the first one, after
// notifications/initialized, or a refresh after list_changed) waits for
// the definition it brings; and the call is checked against its
// Mcp-Param-* headers and the tool's pin. It answers the runner and returns
// false when the call is refused.
func (h *Handler) readyCall(w http.ResponseWriter, r *http.Request, call *gateway.Call) bool {
	if call.Stateless != nil && !h.openStateless(w, r, call) {
		return false
	}
	call.MCPSession.WaitCatalog(r.Context(), min(catalogWait, time.Duration(call.Service.Timeout)))
	if call.Stateless != nil && !h.checkParamHeaders(w, r, call) {
		return false
	}
	return h.pins.AllowCall(w, r, call)
}

// readMessage reads and parses the POST body into call.Message, and
// returns the room held for it (see ReadMessage). It answers the runner and
// returns false when the message is unacceptable.
func (h *Handler) readMessage(w http.ResponseWriter, r *http.Request, call *gateway.Call, svc *gateway.Service) (*gateway.RequestBytes, bool) {
	msg, held, ok := ReadMessage(w, r, h.app, call.Caller.User, h.limits)
	call.Room = held
	return held, ok && h.takeMessage(w, r, call, svc, msg)
}

// takeMessage makes msg the call's message. It answers the runner and
// returns false when the message is unacceptable.
func (h *Handler) takeMessage(w http.ResponseWriter, r *http.Request, call *gateway.Call, svc *gateway.Service, msg mcpmsg.Message) bool {
	call.Message = msg
	call.Method = msg.Method
	if call.MCPSession == nil && mcp2026.IsStateless(r, msg) {
		return h.readStateless(w, r, call, svc)
	}
	isInit := msg.Kind == mcpmsg.Request && msg.Method == "initialize"
	variant := ""
	if isInit {
		variant = mcp2026.CapabilityVariant(mcpmsg.MemberOf(msg.Params, "capabilities"))
	}
	switch {
	case variant != "":
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidParams, variant, nil)
		return false
	case isInit && call.MCPSession != nil:
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidRequest,
			"initialize must not carry an Mcp-Session-Id", nil)
		return false
	case !isInit && call.MCPSession == nil:
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidRequest,
			"missing Mcp-Session-Id header: initialize first", nil)
		return false
	case msg.Kind == mcpmsg.Response:
		if taken, err := h.app.ClientAnswer(r.Context(), call, msg); taken {
			// The answer to toolgate's own request: it never goes upstream.
			if err != nil {
				gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest, err.Error(), nil)
			} else {
				w.WriteHeader(http.StatusAccepted)
			}
			return false
		}
	}
	return true
}

// relayAnswer passes the runner's answer to a server→client request on.
// The policy sees the method of the request it answers, matched on the
// id's value however the runner spells it, and the answer goes upstream
// under the id the upstream gave the request (the runner knows it by
// toolgate's: mcpsession.Session.ServerRequestID). An answer to nothing
// pending is refused: it would reach the upstream with no method for the
// policy to judge. The request is taken from those pending first (so that
// an answer sent to several replicas goes upstream once). When the runner
// is told to send the answer again (503: toolgate_proxy says so only when
// the answer cannot have reached the upstream), the request waits for it
// again; should that fail, the runner is told the answer is lost instead.
func (h *Handler) relayAnswer(w http.ResponseWriter, r *http.Request, call *gateway.Call, next caddyhttp.Handler) error {
	ms, id := call.MCPSession, call.Message.ID
	pending, ok, err := ms.ServerRequestAnswered(r.Context(), id)
	switch {
	case err != nil:
		h.logger.Warn("cannot read the pending server request", zap.Error(err))
		gateway.WriteRPCError(w, http.StatusServiceUnavailable, nil, gateway.CodeUnavailable,
			"toolgate's storage is unavailable; send the response again later", gateway.Retryable)
		return nil
	case !ok:
		gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
			"this response answers no pending server request of this MCP session", nil)
		return nil
	case pending.Generation != 0 && pending.Generation < ms.Upstream().Generation &&
		(call.Service.Transport() == "" || pending.Upstream == "" || pending.Upstream != ms.Upstream().Ref()):
		// The upstream session that asked was replaced: its ids start again,
		// and the answer would reach another request under the same id. (A
		// bridged program's session re-initialized under the same id is the
		// same one: its replaced process winds down, taking its calls'
		// answers, and the bridge names each process's requests apart. An
		// HTTP upstream giving a new session the old id is not.)
		gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest,
			"this response answers a request of an upstream session that has been replaced since; it is not relayed", nil)
		return nil
	}
	call.Message.Raw, call.Message.ID = mcpmsg.ReplaceMember(call.Message.Raw, "id", pending.ID), pending.ID
	call.Method, call.AnswerGeneration, call.AnswerUpstream = pending.Method, pending.Generation, pending.Upstream
	var retry bytes.Buffer
	rec := caddyhttp.NewResponseRecorder(w, &retry, func(status int, _ http.Header) bool { return status == http.StatusServiceUnavailable })
	if err := next.ServeHTTP(rec, r); err != nil || !rec.Buffered() {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), putBackTimeout)
	defer cancel()
	if !ms.Closed() && ms.ServerRequestWaitsAgain(ctx, id, pending) {
		return rec.WriteResponse()
	}
	h.logger.Warn("a server request whose answer failed cannot wait for it again", zap.String("service", call.Service.ID), zap.String("method", pending.Method))
	w.Header().Del("Retry-After")
	gateway.WriteRPCError(w, http.StatusBadGateway, nil, gateway.CodeInternalError,
		"the answer could not be relayed, and toolgate could not keep the request for it to be sent again: the upstream's request stays unanswered", nil)
	return nil
}

// putBackTimeout bounds recording again a request whose answer failed.
const putBackTimeout = 5 * time.Second

// mediaType is the media type of a Content-Type value, lower case; "" when
// the value cannot be parsed.
func mediaType(ct string) string {
	mt, _, _ := mime.ParseMediaType(ct)
	return mt
}

// ReadMessage reads and parses a runner's POST body, once and strictly: a
// JSON body of at most max_request_size bytes holding one JSON-RPC
// message. Room for the body is held first under the request byte limits
// (gateway.App.HoldRequestBytes: its Content-Length, or max_request_size
// while a body without one is read): the caller releases it once the
// request is answered (Release on nil does nothing). It answers the runner
// and returns false when the body is unacceptable or there is no room.
func ReadMessage(w http.ResponseWriter, r *http.Request, app *gateway.App, user string, limits mcpmsg.Limits) (mcpmsg.Message, *gateway.RequestBytes, bool) {
	if ct := r.Header.Get("Content-Type"); ct != "application/json" && mediaType(ct) != "application/json" {
		gateway.WriteRPCError(w, http.StatusUnsupportedMediaType, nil, gateway.CodeInvalidRequest,
			"Content-Type must be application/json", nil)
		return mcpmsg.Message{}, nil, false
	}
	max := app.MaxRequestBytes
	if gateway.IsInnerRequest(r.Context()) {
		msg, ok := readMessage(w, r, max, limits)
		return msg, nil, ok
	}
	room := r.ContentLength
	if room < 0 || room > max {
		room = max // a longer body is refused once max bytes are read
	}
	held, err := app.HoldRequestBytes(user, room)
	if err != nil {
		var limit *gateway.RequestBytesLimitError
		data := map[string]any{"retryable": true}
		if errors.As(err, &limit) {
			data["limit"], data["max"] = limit.Option, limit.Limit
		}
		// Answered with the body unread: toolgate_session has readied
		// the request for it (gateway.AnswerBeforeBody).
		w.Header().Set("Retry-After", "1")
		gateway.WriteRPCError(w, http.StatusServiceUnavailable, nil, gateway.CodeUnavailable, err.Error(), data)
		return mcpmsg.Message{}, nil, false
	}
	msg, ok := readMessage(w, r, max, limits)
	held.Shrink(int64(cap(msg.Raw))) // the memory the body holds
	return msg, held, ok
}

func readMessage(w http.ResponseWriter, r *http.Request, max int64, limits mcpmsg.Limits) (mcpmsg.Message, bool) {
	body, err := readBody(w, r, max)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			if r.ProtoMajor == 1 {
				// The rest of the body is not read: the connection ends
				// after the answer, and the runner must not send its next
				// request on it (it would read EOF). Over HTTP/2 the
				// stream alone ends.
				w.Header().Set("Connection", "close")
			}
			gateway.WriteRPCError(w, http.StatusRequestEntityTooLarge, nil, gateway.CodeInvalidRequest,
				"request body exceeds max_request_size", nil)
			return mcpmsg.Message{}, false
		}
		gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeParseError, "reading request body: "+err.Error(), nil)
		return mcpmsg.Message{}, false
	}
	msg, err := mcpmsg.Parse(body, limits)
	if err == nil && msg.Extra {
		// Members beside JSON-RPC's would reach the upstream unseen by
		// the request policy.
		msg, err = mcpmsg.Parse(msg.WithoutExtra(), limits)
	}
	if err != nil {
		code := gateway.CodeParseError
		if errors.Is(err, mcpmsg.ErrBatch) || msg.Kind != 0 {
			code = gateway.CodeInvalidRequest
		}
		gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, code, err.Error(), nil)
		return msg, false
	}
	return msg, true
}

// readBody reads a request body of at most max bytes. A body whose length
// is known is read into a buffer of that length (net/http ends the body
// there): its room was held for that length, and a buffer grown as it is
// read would copy the body over and hold up to twice its length.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if n := r.ContentLength; n >= 0 && n <= max {
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
}

// checkProtocolVersion sets call.ProtocolVersion from the MCP-Protocol-Version
// header, the session's negotiated version, or the initialize request.
func (h *Handler) checkProtocolVersion(w http.ResponseWriter, r *http.Request, call *gateway.Call) bool {
	if call.Stateless != nil {
		return true // checked with the message
	}
	if call.MCPSession == nil {
		call.ProtocolVersion = call.Message.ProtocolVersion
		return true
	}
	negotiated := call.MCPSession.Upstream().ProtocolVersion
	v := r.Header.Get("Mcp-Protocol-Version")
	switch {
	case v == "":
		call.ProtocolVersion = negotiated
	case !gateway.SupportsProtocolVersion(v):
		gateway.WriteRPCError(w, http.StatusBadRequest, call.ReplyID(), gateway.CodeInvalidRequest,
			"unsupported MCP-Protocol-Version "+quote(v)+"; supported: "+strings.Join(gateway.ProtocolVersions, ", "), nil)
		return false
	default:
		call.ProtocolVersion = v
	}
	return true
}

// catalogWait bounds how long a tools/call waits for a tool listing in
// progress.
const catalogWait = 5 * time.Second

type serviceKey struct{}

// WithService returns r for the service id, whatever its URL and the
// handler's configuration say: a step before toolgate_registry that routes
// a request to one service itself (the federated endpoint) names it so.
func WithService(r *http.Request, id string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), serviceKey{}, id))
}

func (h *Handler) serviceID(r *http.Request) string {
	if id, ok := r.Context().Value(serviceKey{}).(string); ok {
		return id
	}
	if h.Service != "" {
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		return repl.ReplaceAll(h.Service, "")
	}
	p := strings.TrimSuffix(r.URL.Path, "/")
	return p[strings.LastIndexByte(p, '/')+1:]
}

// allowlistTools removes tools off the service's allowlist from a tools/list
// result. Definitions of the tools kept pass through byte for byte, and
// become the MCP session's known definitions.
func allowlistTools(_ context.Context, call *gateway.Call, result []byte) (gateway.Result, error) {
	listed := map[string][]byte{}
	kept := gateway.FilterTools(result, func(tool gjson.Result) bool {
		name := tool.Get("name").String()
		if !call.Service.AllowsTool(name) {
			return false
		}
		listed[name] = []byte(tool.Raw)
		return true
	})
	if call.MCPSession != nil && len(listed) > 0 {
		call.MCPSession.ToolsListed(listed)
	}
	return gateway.Whole(kept), nil
}

func quote(s string) string { return string(mcpmsg.Quote(s)) }

// current checks that the call's MCP session was initialized with the
// upstream svc names now, and through the credential the caller reaches
// it with as it stands. A session that was not is over, and ended (the
// runner is told to initialize again, and a DELETE of it is answered as
// done): its tool catalog, streams and whatever else the upstream said
// would otherwise decide calls, or reach the runner, that run on another
// upstream (a reload changed the service's url or transport), through
// another connection of the caller (they stored another personal token,
// or consented again, maybe as another account at the provider), or with
// the service's own credential in place of the caller's (a reload). Its
// upstream session is not ended with a DELETE where a server would see it:
// that would hand its id to the new upstream, or carry the new
// credential with the old one's session; the upstream forgets it at its
// own idle timeout. A transport module's (a program, a legacy SSE
// connection) ends without one (see gateway.App.EndUpstream). A caller
// with no connection (they disconnected), or one that cannot be read, is
// left to the credentials step, which says so (sign in, or try again);
// connecting again then ends the session.
func (h *Handler) current(w http.ResponseWriter, r *http.Request, call *gateway.Call, svc *gateway.Service) bool {
	ms := call.MCPSession
	why := h.outdated(r.Context(), call, svc, ms.Upstream())
	if why == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), endOutdatedTimeout)
	defer cancel()
	up, ended, err := h.app.MCPSessions().End(ctx, ms)
	if err != nil {
		// The runner is told to initialize again all the same, and the
		// next request of the session comes here again.
		h.logger.Warn("cannot end an outdated MCP session", zap.String("service", ms.Service), zap.String("reason", why), zap.Error(err))
	} else {
		h.logger.Info("ended an outdated MCP session", zap.String("service", ms.Service), zap.String("reason", why))
		if ended {
			h.app.EndUpstream(gateway.EndedMCPSession{ID: ms.ID, User: ms.User, Service: ms.Service, Upstream: up})
		}
	}
	if r.Method == http.MethodDelete && err == nil {
		w.WriteHeader(http.StatusNoContent) // what the runner asked for
		return false
	}
	gateway.WriteRPCError(w, http.StatusNotFound, nil, gateway.CodeSessionNotFound, why+": initialize a new one", nil)
	return false
}

// outdated says why up, the upstream session of the call's MCP session,
// is over (see current), or "" when it is not.
func (h *Handler) outdated(ctx context.Context, call *gateway.Call, svc *gateway.Service, up gateway.Upstream) string {
	if !up.From(svc.Endpoint()) {
		return "the service's upstream changed since this MCP session was initialized"
	}
	if !svc.PerUserCredentials() {
		if up.Grant != "" {
			return "the service's credential changed since this MCP session was initialized"
		}
		return ""
	}
	grant, err := h.app.GrantFor(ctx, svc, call.Caller.User, false)
	if err == nil && grant != "" && grant != up.Grant {
		// This replica's copy of the connection may be older than the
		// session (the caller connected again through another replica,
		// and initialized there): read it before ending anything.
		grant, err = h.app.GrantFor(ctx, svc, call.Caller.User, true)
	}
	if err != nil || grant == "" || grant == up.Grant {
		return ""
	}
	return "you connected to the service again since this MCP session was initialized"
}

// endOutdatedTimeout bounds ending an outdated MCP session in storage.
const endOutdatedTimeout = 10 * time.Second

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
