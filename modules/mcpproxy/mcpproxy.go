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
// the runner stream it answers. Every upstream message is read once,
// strictly, and passes one function, deliver, before the runner sees it. A
// request that may have reached the upstream is never sent twice; when
// toolgate gives up on one, it tells the upstream with
// notifications/cancelled.
package mcpproxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/notice"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler relays runner requests to the service's upstream MCP server.
type Handler struct {
	app        *gateway.App
	maxMessage int64
	limits     mcpmsg.Limits
	stateless  *mcp2026.Runtime
	notices    *notice.Board // toolgate's own notifications to runners' standalone streams
	logger     *zap.Logger
	// unlisted is, by service id, the allowlisted tools its upstream's
	// last whole listing lacked, as last warned of (see fetchCatalog).
	unlisted *sync.Map
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_proxy",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision finds the toolgate app and checks the handler's place in the
// route.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	h.app = app
	h.unlisted = new(sync.Map)
	if err := h.app.ProvisionStep(gateway.StepProxy); err != nil {
		return err
	}
	h.maxMessage = h.app.MaxResponseBytes
	h.limits = mcpmsg.Limits{MaxDepth: h.app.MaxJSONDepth, MaxValues: h.app.MaxResponseValues}
	h.app.OnMCPSessionEnd(h.expired)
	h.app.SetAnswerSearch(h.afterHooks) // what other steps hand out without this relay
	h.notices = notice.For(h.app)       // in Provision: it follows other replicas from the app's start
	if h.stateless, err = mcp2026.For(h.app); err != nil {
		return err
	}
	h.stateless.SetOpener(func(ctx context.Context, call *gateway.Call) error {
		_, err := h.openImplied(ctx, call)
		return err
	})
	return nil
}

// ServeHTTP relays one runner request. It is terminal: it never calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil || call.Service == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_proxy must come last in a route with toolgate_session and toolgate_registry"))
	}
	if !call.RequestJudged || !call.ResultJudged {
		// Fail closed: this request (a message, a stream, a session's
		// end) passed no toolgate_policy or no toolgate_result_policy
		// (their matchers let it by; a route without them is refused at
		// provisioning).
		call.RefuseUnjudged(w, h.logger)
		return nil
	}
	if !call.TasksOwned && call.TaskMethod() {
		// Whose task it is, and what it yields, are checked by
		// toolgate_result_policy: without it, a task of another MCP
		// session would be anyone's to read.
		call.Fail(w, http.StatusOK, gateway.CodeInvalidParams, "this gateway relays no tasks: tasks need toolgate_result_policy in the route (it checks that a task belongs to the MCP session); call the tool without a task", nil)
		return nil
	}
	if r.Method != http.MethodDelete && call.Stateless != nil && call.Stateless.Held != "" {
		// A retry that continues a held call takes that call's stream
		// place (continueHeld): it needs no other, even at the limit.
		p := &streamPlace{}
		defer p.give()
		r = r.WithContext(context.WithValue(r.Context(), streamPlaceKey{}, p))
	} else if r.Method != http.MethodDelete { // ending a session is always possible
		done, err := h.app.OpenStream(call.Caller.User)
		if err != nil {
			h.refuseStream(w, call, err)
			return nil
		}
		if call.Stateless != nil {
			// A stateless call may be held between rounds: it then takes
			// the request's place over (see heldCall.slot).
			p := &streamPlace{done: done}
			done = p.give
			r = r.WithContext(context.WithValue(r.Context(), streamPlaceKey{}, p))
		}
		defer done()
	}
	if call.Stateless != nil && call.MCPSession.Closed() {
		// The implied session ended since this request was bound to it
		// (another request's opening was refused and retired it, the
		// caller connected again): a stateless runner has no session to
		// initialize anew, so the request takes the one implied now.
		if ms, err := h.stateless.Session(r.Context(), call, call.Service); err == nil {
			call.MCPSession = ms
		}
	}
	if ms := call.MCPSession; ms != nil {
		if call.Stateless != nil {
			// An implied session this request leaves unopened (its
			// opening refused or failed) and unused is given back.
			defer h.app.MCPSessions().RetireUnopened(ms)
		}
		defer ms.Begin()()
		if call.IsRequest() && call.Message.ProgressToken != nil {
			defer ms.Requesting(call.Message.ProgressToken)()
		}
	}
	translated := call.MCPSession != nil && call.Stateless == nil && call.MCPSession.Upstream().ProtocolVersion == mcp2026.Version
	switch {
	case call.Stateless != nil:
		h.serveStateless(w, r, call)
	case translated && r.Method == http.MethodGet:
		h.streamTranslated(w, r, call)
	case translated && r.Method != http.MethodDelete && call.Message.Kind == mcpmsg.Request:
		h.requestTranslated(w, r, call)
	case translated && r.Method != http.MethodDelete:
		h.forwardTranslated(w, r, call)
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

// refuseStream answers a request over a stream limit: 503, retryable.
func (h *Handler) refuseStream(w http.ResponseWriter, call *gateway.Call, err error) {
	data := map[string]any{"retryable": true}
	var limit *gateway.StreamLimitError
	if errors.As(err, &limit) {
		data["limit"], data["max"] = limit.Option, limit.Limit
	}
	if c := h.logger.Check(zap.WarnLevel, "stream refused"); c != nil {
		c.Write(zap.String("service", call.Service.ID), zap.Error(err))
	}
	if call.Message.Kind != 0 {
		gateway.AuditRefused(call, gateway.StepProxy, err.Error())
	}
	w.Header().Set("Retry-After", "1")
	var id []byte
	if call.IsRequest() {
		id = call.Message.ID
	}
	gateway.WriteRPCError(w, http.StatusServiceUnavailable, id, gateway.CodeUnavailable, err.Error(), data)
}

// exchangeContext bounds one exchange: the runner's request, the service
// timeout, and the MCP session's life.
func exchangeContext(r *http.Request, call *gateway.Call) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(call.Service.Timeout))
	if ms := call.MCPSession; ms != nil {
		stop := context.AfterFunc(ms.Context(), cancel)
		return ctx, func() { stop(); cancel() }
	}
	return ctx, cancel
}

// responseTo reads the upstream's response to the runner's request (resp
// and err, from sending it to up): the upstream's own answer when it
// rejected the request, else its response. false: the runner was answered
// with toolgate's error instead, and the upstream told to cancel a request
// that may have run.
func (h *Handler) responseTo(ctx context.Context, w http.ResponseWriter, r *http.Request, call *gateway.Call, up gateway.Upstream, resp *http.Response, err error) (*response, bool) {
	if rs, _, rejected := h.rejectedResponse(ctx, call, up, err, call.Message.ID); rejected {
		return rs, true
	}
	var rs *response
	if err == nil {
		rs, err = h.newResponse(ctx, call, up, resp)
	}
	if err != nil {
		h.answerError(w, r, call, err)
		if mayHaveRun(err) {
			h.cancelUpstream(call, up, err.Error())
		}
		return nil, false
	}
	return rs, true
}

// request relays a runner request and its response stream.
func (h *Handler) request(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := exchangeContext(r, call)
	defer cancel()
	body := requestBody(call)
	if call.Message.InputResponses != nil || call.Message.RequestState != nil || call.Message.Meta != nil {
		// Members of 2026-07-28 only: a runner of an earlier revision's own
		// answers would reach an upstream that speaks both revisions as
		// answers to input requests it never asked through toolgate, past
		// the rules on answers (see mcp2026.WithoutRetry), and its
		// per-request log level past the rules on logging/setLevel (see
		// mcp2026.StripMeta).
		if params := mcpmsg.MemberOf(body, "params"); params != nil && params[0] == '{' {
			if own := mcp2026.StripMeta(mcp2026.WithoutRetry(params)); len(own) != len(params) {
				body = mcpmsg.ReplaceMember(body, "params", own)
			}
		}
	}
	// The runner's cancellation of the request goes to the upstream
	// session it went to (forward), for as long as the call may run there:
	// until the answer, or while its dropped stream is kept (the stream's
	// then: see runnerStream.sent).
	ms := call.MCPSession
	sent := ms.SentIn(call.Message.ID, ms.Upstream())
	var st *runnerStream
	defer func() {
		if st == nil {
			ms.RequestDone(sent)
		}
	}()
	up, resp, err := h.post(ctx, call, body, sent)
	rs, ok := h.responseTo(ctx, w, r, call, up, resp, err)
	if !ok {
		return
	}
	defer rs.close()
	var out *sseWriter
	if rs.sse != nil && acceptsSSE(r) {
		out = newSSEWriter(w)
	}
	if !gateway.IsInnerRequest(r.Context()) {
		// (A federated message's call of a service: the runner has the
		// federated message's stream, and nothing resumes this one.)
		deadline, _ := ctx.Deadline()
		st = newRunnerStream(call, up, deadline, out, cancel, func(why string) { h.cancelUpstream(call, up, why) })
		st.ownsSent(sent)
	}
	h.relay(r.Context(), w, call, rs, out, st)
}

// post sends body upstream in the call's MCP session, re-initializing the
// upstream session once if the upstream forgot it. The message was not
// processed when the upstream answered 404, so sending it again is safe.
// sent is SentIn's record of a runner's request (the zero value for
// anything else).
func (h *Handler) post(ctx context.Context, call *gateway.Call, body []byte, sent gateway.SentRequest) (gateway.Upstream, *http.Response, error) {
	up := call.MCPSession.Upstream()
	answer := call.Message.Kind == mcpmsg.Response && call.AnswerGeneration != 0
	if answer && up.Generation < call.AnswerGeneration {
		// Asked by an upstream session another replica made, which this
		// copy has not heard of yet.
		if err := call.MCPSession.Refresh(ctx); err != nil && !errors.Is(err, gateway.ErrMCPSessionClosed) {
			return up, nil, unavailable("%s", gateway.StorageUnavailableText)
		}
		if up = call.MCPSession.Upstream(); up.Generation < call.AnswerGeneration {
			return up, nil, unavailable("toolgate has not yet heard of the upstream session that asked this")
		}
	}
	if answer && up.Generation > call.AnswerGeneration && !askedIn(call, up) {
		return up, nil, errAnswerReplaced
	}
	resp, err := h.send(ctx, call, up, body, sent)
	if isKind(err, kindSessionGone) {
		if up, err = h.reinitialize(ctx, call, up); err != nil {
			return up, nil, err
		}
		if call.Message.Kind == mcpmsg.Response && up.Generation != call.AnswerGeneration && !askedIn(call, up) {
			return up, nil, errAnswerReplaced
		}
		resp, err = h.send(ctx, call, up, body, sent)
	}
	return up, resp, err
}

// send posts body to up. A runner's request is recorded as sent there
// first, for its cancellation (mcpsession's SendingIn), unless the runner
// cancelled it while toolgate re-created the upstream session that had
// forgotten it (cancelInProgress): it is not sent then, and never ran.
func (h *Handler) send(ctx context.Context, call *gateway.Call, up gateway.Upstream, body []byte, sent gateway.SentRequest) (*http.Response, error) {
	if !call.MCPSession.SendingIn(sent, up) {
		return nil, errCancelledUnsent
	}
	return h.exchange(ctx, call, up, http.MethodPost, body, "")
}

// askedIn reports whether the runner's answer call answers a request of
// the upstream session up, of an earlier generation: a bridged program's
// (a stdio program, a legacy SSE server) re-initialized under the same
// session id, whose replaced process winds down and takes its calls'
// answers; the bridge names each process's requests apart. An HTTP
// upstream that gives a new session the old id starts its ids again.
func askedIn(call *gateway.Call, up gateway.Upstream) bool {
	return call.Service.Transport() != "" && call.AnswerUpstream != "" && call.AnswerUpstream == up.Ref()
}

// errAnswerReplaced refuses a runner's answer to a request of an upstream
// session that was replaced since: the new one never asked it, and its ids
// start again (its request of the same id is another).
var errAnswerReplaced error = &upstreamError{kind: kindRejected, status: http.StatusBadRequest,
	msg: "the upstream session that asked this was replaced: the answer is not relayed"}

// errCancelledUnsent ends a runner's request it cancelled while toolgate
// re-created the upstream session that had forgotten it unprocessed: it is
// not sent to the new one, and so never ran.
var errCancelledUnsent error = &upstreamError{kind: kindRejected, status: http.StatusConflict,
	msg: "the request was cancelled by its sender before toolgate could send it again to the upstream's new session: it did not run"}

// relay copies the upstream's messages to the runner until the response to
// the runner's request, which passes the result hooks first. The runner gets
// the same kind of answer the upstream gave: a JSON body, or an SSE stream
// (out) on which notifications and server→client requests arrive as they
// come. runner is the runner's own request context: when it ends, the
// runner went away.
func (h *Handler) relay(runner context.Context, w http.ResponseWriter, call *gateway.Call, rs *response, out *sseWriter, st *runnerStream) {
	defer func() {
		rs.close() // before a resume waiting for this relay's end opens the upstream stream again
		st.release("")
	}()
	if out != nil {
		defer h.keepAlive(out, call.Service)()
		rs.onPrime = st.prime
	}
	for {
		msg, err := rs.next()
		if err != nil {
			switch {
			case !call.IsRequest():
				return // the standalone stream ended
			case st.stoppedForResume():
				// The runner resumed the stream on another request (while
				// this one was still open): the call goes on there.
				return
			case call.MCPSession.Closed():
				h.writeFinal(w, out, "", message{gateway.RPCError(call.Message.ID, gateway.CodeSessionNotFound,
					"the MCP session was ended while the request was in progress", nil)})
				return
			case runner.Err() != nil && st.resumable():
				return // the runner may resume the stream with Last-Event-ID
			}
			why := "the upstream ended its stream without answering"
			var ue *upstreamError
			switch {
			case runner.Err() != nil:
				why = "the client went away and cannot resume the stream"
			case errors.As(err, &ue):
				why = ue.msg
			}
			h.logger.Warn("upstream exchange failed", zap.String("service", call.Service.ID),
				zap.String("method", call.Method), zap.String("error", why))
			code, text, data := streamFailure(err, why)
			if h.writeFinal(w, out, "", message{gateway.RPCError(call.Message.ID, code, text, data)}) {
				st.finished() // the runner has its answer: nothing to resume
			}
			h.cancelUpstream(call, rs.up, why)
			return
		}
		if isResponseTo(msg, call.Message.ID) {
			data := h.deliver(rs.ctx, call, rs.up, msg, out != nil)
			if call.Stateless != nil {
				// A stateless runner reads the HTTP status of an error too.
				h.finalStateless(w, out, data, rs.status)
				rs.awaitEnd()
				return
			}
			if h.writeFinal(w, out, st.id(rs.lastEventID()), data) {
				st.finished()
			}
			// The runner has its answer (an SSE event is flushed as it is
			// written; a JSON body is flushed here). The end of the
			// upstream's stream follows at once, and reading it lets the
			// connection serve the next call.
			if out == nil {
				_ = http.NewResponseController(w).Flush()
			}
			rs.awaitEnd()
			return
		}
		if out == nil && msg.Kind == mcpmsg.Notification {
			// A JSON answer carries no notifications: nothing to relay,
			// so nothing to inspect.
			h.noted(call, msg)
			continue
		}
		data := h.deliver(rs.ctx, call, rs.up, msg, out != nil)
		if data.none() || out == nil {
			continue
		}
		if out.send(st.id(rs.lastEventID()), data.parts()...) != nil {
			if !st.resumable() {
				h.cancelUpstream(call, rs.up, "the runner went away")
			}
			return
		}
	}
}

// progressFor reports whether progress about token belongs on the stream
// of call (a runner's request, or its standalone stream): it is the
// request's own progressToken (also on a stream the runner resumed after
// the request ended), or that of a request of the runner's in progress.
func progressFor(call *gateway.Call, token []byte) bool {
	if key := mcpmsg.IDKey(token); key != "" && key == mcpmsg.IDKey(call.Message.ProgressToken) {
		return true
	}
	return call.MCPSession.Progressing(token)
}

// deliver is the one place every upstream message passes on its way to the
// runner: the answer to the runner's request, and the notifications and
// server→client requests on a stream (canRequest reports whether the
// runner's stream can carry a request). from is the upstream session whose
// exchange carried msg: the one that asks a server→client request, or
// cancels one, though another call may have replaced it since. It returns
// the message to send, or none for a message the runner must not get. Any
// inspection of what upstreams send belongs here. msg has been through
// redactCredential.
func (h *Handler) deliver(ctx context.Context, call *gateway.Call, from gateway.Upstream, msg mcpmsg.Message, canRequest bool) message {
	switch {
	case call.IsRequest() && isResponseTo(msg, call.Message.ID):
		if call.Stateless != nil && msg.Result != nil {
			return message{h.finishStateless(ctx, call, msg)}
		}
		return h.finish(ctx, call, msg)
	case msg.Kind == mcpmsg.Request:
		if call.Stateless != nil {
			h.refuseServerRequest(call, from, msg, "the client speaks protocol "+mcp2026.Version+", which has no server requests on a stream")
			return message{}
		}
		if !canRequest {
			h.refuseServerRequest(call, from, msg, "the client's request does not accept an SSE stream, so toolgate cannot relay "+msg.Method+" to it")
			return message{}
		}
		if !declared(from, msg) {
			h.refuseServerRequest(call, from, msg, "the client did not declare the capability "+msg.Method+" needs")
			return message{}
		}
		// The runner knows the request by an id of toolgate's own: the
		// upstream's is text no policy reads (and may be shaped like the
		// id of an in-band approval). The runner's answer goes upstream
		// under the upstream's id (registry.relayAnswer).
		relayed := withID(msg, call.MCPSession.ServerRequestID(from.Generation, msg.ID))
		out, ok := h.inspect(ctx, call, relayed, gateway.ChannelServerRequest)
		if !ok {
			h.refuseServerRequest(call, from, msg, "toolgate's policy withheld "+msg.Method+" from the client")
			return message{}
		}
		if !call.MCPSession.ServerRequestSent(ctx, from, relayed.ID, msg.ID, msg.Method) {
			h.refuseServerRequest(call, from, msg, "too many server requests are waiting for the client's answer, or toolgate's storage is unavailable")
			return message{}
		}
		return message{out}
	case msg.Kind == mcpmsg.Notification && msg.Method == "notifications/progress" && call.MCPSession != nil &&
		!progressFor(call, []byte(gjson.GetBytes(msg.Params, "progressToken").Raw)):
		// Progress only about this request or another of the runner's in
		// progress (on the standalone stream, only the latter): any other
		// token is nothing it asked about.
		h.logger.Debug("dropped an upstream's progress on a token of no request in progress", zap.String("service", call.Service.ID))
		return message{}
	case msg.Kind == mcpmsg.Notification && msg.Method == "notifications/tasks/status" && !call.TasksOwned:
		return message{} // a task of any MCP session's: see TasksOwned
	case msg.Kind == mcpmsg.Notification:
		h.noted(call, msg)
		if msg.Method == "notifications/cancelled" && call.MCPSession != nil {
			var ok bool
			if msg, ok = cancelledAsRelayed(call, from, msg); !ok {
				return message{}
			}
		}
		out, ok := h.inspect(ctx, call, msg, gateway.ChannelNotification)
		if !ok {
			return message{}
		}
		return message{out}
	}
	// On a stream only the answer to the runner's request may pass, and
	// only after the result hooks.
	h.logger.Warn("dropped an unexpected upstream response", zap.String("service", call.Service.ID))
	return message{}
}

// declared reports whether the runner declared, in the initialize the
// upstream session from was made with, the capability the server→client
// request msg needs. A server may ask only what the client declared
// (sampling, and its tools and context as mcp2026.RequiredCapabilityIn
// reads them for the session's revision; elicitation, form or url;
// roots); a runner that did not may not expect the request at all. Other
// requests (ping, a service's own) need none.
func declared(from gateway.Upstream, msg mcpmsg.Message) bool {
	switch msg.Method {
	case "sampling/createMessage", "elicitation/create", "roots/list":
		caps := mcpmsg.MemberOf(from.InitializeParams, "capabilities")
		_, ok := mcp2026.RequiredCapabilityIn(from.ProtocolVersion, caps, msg.Method, gjson.ParseBytes(msg.Params))
		return ok
	}
	return true
}

// withID is msg under the id id.
func withID(msg mcpmsg.Message, id []byte) mcpmsg.Message {
	msg.Raw, msg.ID = mcpmsg.ReplaceMember(msg.Raw, "id", id), id
	return msg
}

// cancelledAsRelayed is an upstream's cancellation of its server→client
// request as the runner gets it: naming the request by the id the runner
// knows it by (see mcpsession.Session.ServerRequestID). An upstream
// session cancels only requests of its own: from, which carried the
// cancellation. ok is false for one naming no request
// by a JSON-RPC id, which names nothing the runner knows.
func cancelledAsRelayed(call *gateway.Call, from gateway.Upstream, msg mcpmsg.Message) (_ mcpmsg.Message, ok bool) {
	name, id := mcpmsg.MemberFold(msg.Params, "requestId")
	switch {
	case id == nil:
		return msg, true
	case mcpmsg.IDKey(id) == "":
		return msg, false
	}
	params := mcpmsg.ReplaceMember(msg.Params, name, call.MCPSession.ServerRequestID(from.Generation, id))
	msg.Params, msg.Raw = params, rebuild(msg, params)
	return msg, true
}

// noted does what toolgate itself does on an upstream's notification: a
// changed tool list is listed again.
func (h *Handler) noted(call *gateway.Call, msg mcpmsg.Message) {
	if msg.Method == "notifications/tools/list_changed" {
		h.refreshCatalog(call)
	}
}

// forward relays a notification, or the runner's answer to a server→client
// request. The upstream acknowledges with 202.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := exchangeContext(r, call)
	defer cancel()
	ms := call.MCPSession
	initialized := call.Method == "notifications/initialized"
	if initialized {
		ms.ListingTools()
	}
	if h.cancelInProgress(ctx, call) {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	up, resp, err := h.post(ctx, call, call.Message.Raw, gateway.SentRequest{})
	if err != nil {
		if initialized {
			ms.CatalogFailed()
		}
		if call.Message.Kind == mcpmsg.Response && isKind(err, kindUnavailable) && mayHaveRun(err) && !ms.Closed() {
			// Told to send it again, the runner could answer the upstream's
			// request twice (a 503 here makes it wait for the answer
			// again: registry.relayAnswer).
			h.logger.Warn("an upstream did not acknowledge a client's answer", zap.String("service", call.Service.ID), zap.Error(err))
			call.Fail(w, http.StatusBadGateway, gateway.CodeInternalError,
				"the upstream did not acknowledge the answer, and may have received it: it must not be sent again", nil)
			return
		}
		h.answerError(w, r, call, err)
		return
	}
	drain(resp)
	if initialized {
		// Learn the upstream's tool definitions before the runner's first
		// call, so the request policy sees annotations.
		if err := h.fetchCatalog(ctx, call, up); err != nil {
			h.logger.Warn("cannot list the upstream's tools; policy will see tools without annotations",
				zap.String("service", call.Service.ID), zap.Error(err))
		}
	}
	w.WriteHeader(http.StatusAccepted)
}

// end terminates the runner's MCP session on every replica and at the
// upstream. It answers once every replica has been told.
func (h *Handler) end(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Duration(call.Service.Timeout))
	defer cancel()
	up, ok, err := h.app.MCPSessions().End(ctx, call.MCPSession)
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	if ok {
		h.endUpstream(ctx, call, up)
	}
	w.WriteHeader(http.StatusNoContent)
}

// mayHaveRun reports whether a failed exchange may have reached the
// upstream.
func mayHaveRun(err error) bool {
	var ue *upstreamError
	return errors.As(err, &ue) && ue.sent
}

// streamFailure is the runner's error for a request whose answer did not
// come (why says why): retryable, as it may or may not have run, unless
// the upstream answered past max_response_values (it ran).
func streamFailure(err error, why string) (code int, text string, data any) {
	switch {
	case isKind(err, kindOverLimit):
		return gateway.CodeInternalError, why, nil
	case isKind(err, kindClosed):
		return gateway.CodeSessionNotFound, why + ": initialize a new one", nil
	}
	return gateway.CodeUnavailable, why + "; the request may or may not have run upstream", gateway.Retryable
}

// answerError tells the runner why the upstream exchange failed.
func (h *Handler) answerError(w http.ResponseWriter, r *http.Request, call *gateway.Call, err error) {
	var ue *upstreamError
	var refused *gateway.OpeningRefused
	switch {
	case errors.As(err, &refused):
		refused.Answer(w, call)
		return
	case errors.Is(err, gateway.ErrMCPSessionClosed) || call.MCPSession != nil && call.MCPSession.Closed():
		ue = &upstreamError{kind: kindClosed}
	case errors.Is(err, gateway.ErrStorageUnavailable):
		h.logger.Warn("storage unavailable", zap.String("service", call.Service.ID), zap.Error(err))
		ue = unavailable("%s", gateway.StorageUnavailableText)
	case !errors.As(err, &ue):
		ue = unavailable("%v", err)
	}
	switch ue.kind {
	case kindClosed:
		// 404 whatever the message: it tells an MCP client to initialize anew.
		gateway.WriteRPCError(w, http.StatusNotFound, call.ReplyID(), gateway.CodeSessionNotFound,
			"the MCP session was ended: initialize a new one", nil)
	case kindUnauthorized:
		if k := call.Service.Auth.Kind; k == gateway.AuthBearer || k == gateway.AuthOAuth {
			data := h.app.NeedsSignIn(r, call.Service)
			call.Fail(w, http.StatusForbidden, gateway.CodeNeedsSignIn,
				"the upstream refused your stored credential for "+call.Service.ID+": connect again "+gateway.ConnectHint(data), data)
			return
		}
		if call.Service.Auth.Kind == gateway.AuthNone {
			// Nothing was sent to refuse: trying again changes nothing.
			h.logger.Error("the upstream asks for a credential, and the service has auth none", zap.String("service", call.Service.ID), zap.Int("status", ue.status))
			call.Fail(w, http.StatusBadGateway, gateway.CodeUnavailable,
				"the upstream asks for a credential, and toolgate's service "+call.Service.ID+" sends none (auth none): an administrator must configure the service's auth", nil)
			return
		}
		h.logger.Error("upstream refused the service credential", zap.String("service", call.Service.ID), zap.Int("status", ue.status))
		call.Unavailable(w, "the upstream refused toolgate's credential for "+call.Service.ID+"; an administrator must fix the service's auth")
	case kindRejected:
		// The upstream's body is not relayed: what reaches the runner is
		// read strictly and passes deliver, and this did not.
		h.logger.Info("the upstream rejected a request", zap.String("service", call.Service.ID), zap.String("method", call.Method), zap.Int("status", ue.status))
		call.Fail(w, ue.status, gateway.CodeInvalidRequest, ue.msg, nil)
	case kindOverLimit:
		call.Fail(w, http.StatusBadGateway, gateway.CodeInternalError, ue.msg, nil)
	default:
		fields := []zap.Field{zap.String("service", call.Service.ID), zap.String("error", ue.msg)}
		if ue.cause != nil {
			fields = append(fields, zap.String("cause", ue.cause.Error()))
		}
		h.logger.Warn("upstream unavailable", fields...)
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

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	resp.Body.Close()
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
	if err == nil {
		return false
	}
	var ue *upstreamError
	return errors.As(err, &ue) && ue.kind == kind
}

// statusOf is the HTTP status of an upstream's refusal, 0 for other errors.
func statusOf(err error) int {
	if ue, ok := errors.AsType[*upstreamError](err); ok {
		return ue.status
	}
	return 0
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
