package mcpproxy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Requests of the stateless revision (2026-07-28). The runner has no MCP
// session of its own: toolgate_registry bound the request to the session
// toolgate implies for the caller, the toolgate session, the service and
// the declared capabilities. Opening that session, once, learns the
// upstream's revision with server/discover: an upstream of the stateless
// revision gets each request as it came (its _meta, toolgate's checked
// headers), and its answers come back as they went, HTTP status included;
// an upstream of an earlier revision gets an MCP session of its own,
// initialized with the capabilities the runner declared, and the request
// without the stateless revision's _meta members, and its results are
// completed (resultType, caching hints) for the runner.

// serveStateless relays one stateless request.
func (h *Handler) serveStateless(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	if call.Stateless.Held != "" {
		h.continueHeld(w, r, call)
		return
	}
	listen := call.Method == "subscriptions/listen"
	var ctx context.Context
	var cancel context.CancelFunc
	if listen {
		// A subscription lasts until either side closes it, or the
		// session is retired (the caller connected again: nothing of the
		// old connection's upstream session reaches them any more).
		ctx, cancel = context.WithCancel(r.Context())
		defer context.AfterFunc(call.MCPSession.Retiring(), cancel)()
		defer h.app.WhileAuthorized(r, call, cancel)() // a reload may take away what let it open
	} else {
		ctx, cancel = exchangeContext(r, call)
	}
	defer cancel()
	octx, ocancel := context.WithTimeout(ctx, time.Duration(call.Service.Timeout))
	up, err := h.openImplied(octx, call)
	ocancel()
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	if call.Message.Kind != mcpmsg.Request {
		h.statelessNotification(w, r, call, up)
		return
	}
	modern := up.ProtocolVersion == mcp2026.Version
	switch {
	case call.Method == "server/discover":
		d, _ := h.stateless.Discovery(call)
		h.answerOwn(ctx, w, call, gateway.RPCResult(call.Message.ID, mcp2026.DiscoverResult(d)))
		return
	case !modern && mcp2026.IsRemoved(call.Method):
		gateway.WriteRPCError(w, http.StatusNotFound, call.Message.ID, gateway.CodeMethodNotFound,
			"Method not found: "+call.Method+" is not part of protocol "+mcp2026.Version, nil)
		return
	case !modern && listen:
		h.listenLegacy(ctx, w, r, call)
		return
	}
	body := statelessBody(call, modern)
	var hc *heldCall
	if modern {
		ctx = withUpstreamHeaders(ctx, h.standardHeaders(call, body))
	} else if isRoundMethod(call.Method) {
		// The upstream may ask the runner something during the call: the
		// call may be held between rounds, beyond this request.
		hc = &heldCall{h: h, call: call}
		ctx, hc.cancel, hc.detach = roundsContext(r, call)
		defer func() {
			if hc.rs == nil {
				hc.cancel()
			}
		}()
	}
	resp, err := h.exchange(ctx, call, up, http.MethodPost, body, "")
	if err != nil && !modern && isKind(err, kindSessionGone) {
		if up, err = h.reinitialize(ctx, call, up); err == nil {
			resp, err = h.exchange(ctx, call, up, http.MethodPost, body, "")
		}
	}
	rs, ok := h.responseTo(ctx, w, r, call, up, resp, err)
	if !ok {
		return
	}
	if hc != nil {
		hc.up, hc.rs = up, rs
		h.rounds(w, r, call, hc)
		return
	}
	defer rs.close()
	var out *sseWriter
	if rs.sse != nil && acceptsSSE(r) {
		out = newSSEWriter(w)
	}
	// The revision has no resumable streams: no event ids for the runner.
	h.relay(r.Context(), w, call, rs, out, nil)
}

// statelessBody is the request as it goes upstream: with the arguments a
// policy rewrote and without toolgate's own requestState and input
// response; for an upstream of the stateless revision, with its own
// requestState back in place of the one toolgate relayed and without the
// answers the policy withheld (mcp2026.Relay); for an upstream of an
// earlier revision, without the stateless revision's _meta members and
// without inputResponses and requestState altogether. Such an upstream asks with server→client requests, whose
// answers reach it only through the exchange toolgate holds (continueHeld,
// each decided as the answer it is): a runner's own answers in a request
// that continues no held exchange would be answers no policy decided.
func statelessBody(call *gateway.Call, modern bool) []byte {
	body := requestBody(call)
	if call.Stateless.OwnState {
		body = mcp2026.WithoutOwnState(body, mcpmsg.MemberOf(body, "params"))
	}
	if st := call.Stateless; modern && (st.Relayed || len(st.Withheld) > 0) {
		params := mcpmsg.MemberOf(body, "params")
		if st.Relayed {
			params = mcp2026.RestoreUpstream(params, st.UpstreamState)
		}
		body = mcpmsg.ReplaceMember(body, "params", mcp2026.WithoutAnswers(params, st.Withheld))
	}
	if !modern {
		if params := mcpmsg.MemberOf(body, "params"); params != nil && params[0] == '{' {
			body = mcpmsg.ReplaceMember(body, "params", mcp2026.StripMeta(mcp2026.WithoutRetry(params)))
		}
	}
	return body
}

// standardHeaders are the request metadata headers of the revision for an
// upstream request: Mcp-Method, Mcp-Name, and the Mcp-Param-* headers of
// the tool's definition for the arguments that go upstream.
func (h *Handler) standardHeaders(call *gateway.Call, body []byte) http.Header {
	hdr := http.Header{mcp2026.HeaderMethod: {call.Message.Method}}
	if name, ok := mcp2026.Name(call.Message); ok {
		hdr.Set(mcp2026.HeaderName, mcp2026.EncodeHeaderValue(name))
	}
	if call.Method == "tools/call" {
		if def := call.ToolDefinition(); def != nil {
			args := call.Arguments
			if args == nil {
				args = call.Message.Arguments
			}
			for k, v := range mcp2026.ParamHeaders(def.Raw, args) {
				hdr[k] = v
			}
		}
	}
	return hdr
}

// statelessNotification passes a notification of a stateless runner to an
// upstream of the same revision; one of an earlier revision has no request
// it could relate to.
func (h *Handler) statelessNotification(w http.ResponseWriter, r *http.Request, call *gateway.Call, up gateway.Upstream) {
	if up.ProtocolVersion == mcp2026.Version {
		ctx, cancel := exchangeContext(r, call)
		defer cancel()
		resp, err := h.exchange(withUpstreamHeaders(ctx, http.Header{mcp2026.HeaderMethod: {call.Message.Method}}),
			call, up, http.MethodPost, call.Message.Raw, "")
		if err != nil {
			h.answerError(w, r, call, err)
			return
		}
		drain(resp)
	}
	w.WriteHeader(http.StatusAccepted)
}

// answerOwn answers a stateless request with a response toolgate made from
// what the upstream said, through deliver like any upstream answer.
func (h *Handler) answerOwn(ctx context.Context, w http.ResponseWriter, call *gateway.Call, raw []byte) {
	answer, err := h.ownAnswer(ctx, call, raw)
	if err != nil {
		call.Unavailable(w, h.ownAnswerFailed(call, err))
		return
	}
	gateway.WriteRPC(w, http.StatusOK, answer.parts()...)
}

// ownAnswer is what answerOwn writes.
// ownAnswerFailed logs why ownAnswer failed and says it to the runner in
// toolgate's words: the error may carry the storage's or the cipher's (the
// credential search could not read the caller's connection) or the
// upstream's own text.
func (h *Handler) ownAnswerFailed(call *gateway.Call, err error) string {
	why := err.Error()
	if se, ok := errors.AsType[*mcpmsg.SyntaxError](err); ok {
		why = se.Redacted() // not the key it quotes: the upstream's, unseen by any policy
	}
	h.logger.Warn("toolgate could not build the answer", zap.String("service", call.Service.ID), zap.String("error", why))
	if errors.Is(err, errSecretsUnread) {
		return errSecretsUnread.Error() + "; try again once storage and the cipher answer"
	}
	return "toolgate could not build the answer from what the upstream sent"
}

func (h *Handler) ownAnswer(ctx context.Context, call *gateway.Call, raw []byte) (message, error) {
	msg, err := mcpmsg.Parse(raw, h.limits)
	if err == nil {
		// What toolgate learned from the upstream is redacted like what
		// the upstream sends (deliver expects it).
		msg, err = h.redactCredential(call, msg)
	}
	if err != nil {
		return message{}, err
	}
	return h.deliver(ctx, call, gateway.Upstream{}, msg, false), nil // an answer: no upstream session asks or cancels in it
}

// finishStateless is finish for a stateless request: the result hooks,
// then the result made one of the revision for the runner — resultType
// and caching hints (cacheScope "private": the answer was decided for
// this caller) — and an
// input_required result whose input requests the runner did not declare
// replaced by MissingRequiredClientCapability.
func (h *Handler) finishStateless(ctx context.Context, call *gateway.Call, msg mcpmsg.Message) []byte {
	if why := mcp2026.InputRequestsProblem(msg.Result); why != "" {
		h.logger.Warn("refused an upstream's answer whose input requests toolgate cannot inspect", zap.String("service", call.Service.ID), zap.String("reason", why))
		return gateway.RPCError(call.Message.ID, gateway.CodeUnavailable, "the upstream's answer was withheld: "+why, nil)
	}
	if mcp2026.ResultType(msg.Result) == mcp2026.ResultInputRequired && mcp2026.ReservedInput(msg.Result) {
		h.logger.Warn("refused an upstream's input request under a key toolgate reserves", zap.String("service", call.Service.ID))
		return gateway.RPCError(call.Message.ID, gateway.CodeUnavailable,
			"the upstream asked for input under a key toolgate reserves for its own requests (io.toolgate/); the call is refused", nil)
	}
	// The upstream's own marks in toolgate's _meta namespace are dropped,
	// whatever the method (see withoutOwnMarks).
	if result, stripped := withoutOwnMarks(msg.Result); stripped {
		msg.Result, msg.Raw = result, gateway.RPCResult(call.Message.ID, result)
	}
	// check: the hooks wrote what may have put the call's credential
	// together (see finish).
	result, changed, check := msg.Result, false, false
	if mcp2026.ResultType(result) == mcp2026.ResultInputRequired && call.HasMessageHooks() {
		inspected, withheld, err := h.inspectInputRequests(ctx, call, result)
		switch {
		case err != nil:
			return h.hookFailed(call, err)
		case withheld != "":
			return gateway.RPCError(call.Message.ID, gateway.CodePolicyDenied, "toolgate's policy withheld "+mcp2026.InputMethodName(withheld)+" from the client", nil)
		case inspected != nil:
			result, changed, check = inspected, true, true
		}
	}
	if call.HasResultHooks() {
		// The result hooks see the input requests as the message hooks
		// left them.
		out, err := call.RunResultHooks(ctx, result)
		if err != nil {
			return h.hookFailed(call, err)
		}
		if out != nil {
			// out holds what the message hooks wrote, if anything.
			check = h.mayHoldCredential(call, out, msg.Result)
			// The revision's members are added to the result: one slice.
			result, changed = out.Bytes(), true
		}
	}
	if mcp2026.ResultType(result) == mcp2026.ResultInputRequired {
		if missing := mcp2026.Undeclared(call.Stateless.Capabilities, result); missing != nil {
			h.logger.Warn("withheld input requests the client did not declare", zap.String("service", call.Service.ID))
			return gateway.RPCError(call.Message.ID, mcp2026.CodeMissingRequiredClientCapability,
				"the server needs client capabilities this request did not declare", mcp2026.MissingCapability(missing))
		}
		// The runner gets toolgate's requestState in the upstream's place,
		// so that its answers are decided as answers (mcp2026.Relay).
		relayed, err := h.stateless.Relay(mcp2026.StateOf(call.Caller.User, gateway.SessionRef(call.Session.ID), call.Service.ID, call.Message), result)
		if err != nil {
			h.logger.Error("cannot seal a requestState", zap.Error(err))
			return gateway.RPCError(call.Message.ID, gateway.CodeUnavailable, "toolgate could not seal the requestState of the upstream's input requests", gateway.Retryable)
		}
		result, changed = relayed, true
	}
	// Whatever cacheScope the upstream claims, the answer is the caller's:
	// the policies decided it for them (a tools/list is filtered, a read
	// another caller may be denied), and an upstream of an earlier revision
	// answered in an MCP session toolgate initialized with their
	// credential. A cache shared between callers must not serve it to
	// another.
	completed := mcp2026.Complete(call.Method, result, true)
	if !changed && string(completed) == string(result) {
		return msg.Raw
	}
	answer := gateway.RPCResult(call.Message.ID, completed)
	if check {
		return h.answerAfterHooks(call, answer)
	}
	return answer
}

// inspectInputRequests passes each input request of an input_required
// result (what server→client requests are in earlier revisions) through
// the call's message hooks on the server_request channel, as the requests
// of an upstream that initializes are: it returns the result with the
// params the hooks replaced (nil when none did), or the method of one
// that must not reach the runner.
func (h *Handler) inspectInputRequests(ctx context.Context, call *gateway.Call, result []byte) (inspected []byte, withheld string, err error) {
	requests := mcpmsg.MemberOf(result, "inputRequests")
	if requests == nil || requests[0] != '{' {
		return nil, "", nil
	}
	replaced := requests
	gjson.ParseBytes(requests).ForEach(func(k, v gjson.Result) bool {
		method := v.Get("method").String()
		params := mcpmsg.MemberOf([]byte(v.Raw), "params")
		out, changed, drop, herr := call.RunMessageHooks(ctx, gateway.UpstreamMessage{Channel: gateway.ChannelServerRequest, Method: method, Payload: params})
		switch {
		case herr != nil:
			err = herr
			return false
		case drop:
			withheld = method
			return false
		case changed:
			entry := mcpmsg.ReplaceMember([]byte(v.Raw), "params", out)
			replaced = mcpmsg.ReplaceMember(replaced, k.String(), entry)
		}
		return true
	})
	if err != nil || withheld != "" || len(replaced) == len(requests) && string(replaced) == string(requests) {
		return nil, withheld, err
	}
	return mcpmsg.ReplaceMember(result, "inputRequests", replaced), "", nil
}

// openImplied opens the call's implied MCP session, once (concurrent
// requests share the opening): it learns the upstream's revision with
// server/discover, initializes an upstream session when the upstream
// speaks an earlier revision, and lists the upstream's tools.
func (h *Handler) openImplied(ctx context.Context, call *gateway.Call) (gateway.Upstream, error) {
	ms := call.MCPSession
	if up := ms.Upstream(); up.Generation > 0 {
		return up, nil
	}
	if call.Credential == nil && call.Service.Auth != nil && call.Service.Auth.Kind != gateway.AuthNone {
		// Before toolgate_credentials ran (toolgate_policy opens the session
		// for the policy): the caller's credential, as that step finds it.
		cred, err := h.app.CredentialFor(ctx, call.Service, call.Caller.User)
		if err != nil {
			return gateway.Upstream{}, err
		}
		c := *call
		c.Credential = cred
		call = &c
	}
	ran := false
	ictx, cancel := completing(ctx)
	defer cancel()
	init := func(gateway.Upstream) (gateway.Upstream, error) {
		up, err := h.discoverUpstream(ictx, call)
		if err == nil {
			ran = true
		}
		return stamped(call, up), err
	}
	up, err := ms.Reinitialize(ctx, 0, init, func(up gateway.Upstream) { h.endUpstream(ictx, call, up) })
	if refused := (*gateway.OpeningRefused)(nil); errors.As(err, &refused) {
		// Nothing was opened: unless another request uses the session
		// (and may open it), it does not hold the caller's place among
		// their MCP sessions any more.
		h.app.MCPSessions().RetireUnopened(ms)
	}
	if err != nil || !ran {
		return up, err
	}
	if err := h.fetchCatalog(ctx, call, up); err != nil {
		h.logger.Warn("cannot list the upstream's tools; policy will see tools without annotations",
			zap.String("service", call.Service.ID), zap.Error(err))
	}
	return up, nil
}

// discoverUpstream asks the upstream which revisions it speaks. One that
// lists the stateless revision gets stateless requests; any other answer
// (an earlier revision's server, which does not know the method, or one
// that lists only earlier revisions) means initializing an upstream session
// with the runner's capabilities.
func (h *Handler) discoverUpstream(ctx context.Context, call *gateway.Call) (gateway.Upstream, error) {
	_, modern, err := h.probeDiscover(ctx, call)
	switch {
	case err != nil:
		return gateway.Upstream{}, err
	case modern:
		return gateway.Upstream{ProtocolVersion: mcp2026.Version}, nil
	}
	return h.initializeFor(ctx, call)
}

// initializeFor initializes an upstream session of an earlier revision for
// a stateless runner, declaring the capabilities and the identity the
// runner declared.
func (h *Handler) initializeFor(ctx context.Context, call *gateway.Call) (gateway.Upstream, error) {
	params := []byte(`{"protocolVersion":`)
	params = mcpmsg.AppendQuote(params, gateway.LatestProtocolVersion)
	params = append(params, `,"capabilities":`...)
	params = append(params, call.Stateless.Capabilities...)
	params = append(params, `,"clientInfo":`...)
	if info := call.Stateless.ClientInfo; info != nil {
		params = append(params, info...)
	} else {
		params = append(params, `{"name":"toolgate","version":"1"}`...)
	}
	params = append(params, '}')
	if len(params) > maxReplayedInitialize {
		return gateway.Upstream{}, &upstreamError{kind: kindRejected, status: http.StatusBadRequest,
			msg: "the declared capabilities and clientInfo are too large to initialize an upstream session"}
	}
	if gate := call.Stateless.Gate; gate != nil {
		if err := gate(ctx, call, params); err != nil {
			return gateway.Upstream{}, err
		}
	}
	id := gatewayRequestID()
	hdr, msg, err := h.roundTrip(ctx, call, gateway.Upstream{}, id, initializeRequest(id, params))
	if err != nil {
		return gateway.Upstream{}, err
	}
	res := gjson.ParseBytes(msg.Result)
	version := res.Get("protocolVersion").String()
	if !gateway.SupportsProtocolVersion(version) {
		return gateway.Upstream{}, unavailable("the upstream speaks neither protocol %s nor one toolgate initializes", mcp2026.Version)
	}
	up := stamped(call, gateway.Upstream{SessionID: hdr.Get("Mcp-Session-Id"), ProtocolVersion: version, InitializeParams: params})
	ack, err := h.exchange(ctx, call, up, http.MethodPost, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), "")
	if err != nil {
		h.endUpstream(ctx, call, up)
		return gateway.Upstream{}, err
	}
	drain(ack)
	h.stateless.SetDiscovery(call, mcp2026.Discovery{Capabilities: rawOrNil(res.Get("capabilities")),
		ServerInfo: rawOrNil(res.Get("serverInfo")), Instructions: rawOrNil(res.Get("instructions"))})
	return up, nil
}

// ownStatelessRequest is a request toolgate itself sends an upstream of the
// stateless revision, with toolgate's own _meta (no client capabilities).
func ownStatelessRequest(id []byte, method string, params []byte) []byte {
	meta := []byte(`{"` + mcp2026.MetaProtocolVersion + `":"` + mcp2026.Version + `","` +
		mcp2026.MetaClientCapabilities + `":{},"` + mcp2026.MetaClientInfo + `":{"name":"toolgate","version":"1"}}`)
	if params == nil {
		params = []byte("{}")
	}
	params = mcpmsg.ReplaceMember(params, "_meta", meta)
	b := []byte(`{"jsonrpc":"2.0","id":`)
	b = append(b, id...)
	b = append(b, `,"method":`...)
	b = mcpmsg.AppendQuote(b, method)
	b = append(b, `,"params":`...)
	b = append(b, params...)
	return append(b, '}')
}

// ownRequest prepares a request toolgate itself sends (a tools/list of its
// catalog) for an upstream of the stateless revision: toolgate's _meta and
// the Mcp-Method header. Requests to other upstreams pass as they are.
func ownRequest(ctx context.Context, up gateway.Upstream, body []byte) (context.Context, []byte) {
	if up.ProtocolVersion != mcp2026.Version || upstreamHeaders(ctx) != nil {
		return ctx, body
	}
	msg, err := mcpmsg.Parse(body, mcpmsg.Limits{})
	if err != nil || msg.Kind != mcpmsg.Request {
		return ctx, body
	}
	return withUpstreamHeaders(ctx, http.Header{mcp2026.HeaderMethod: {msg.Method}}),
		ownStatelessRequest(msg.ID, msg.Method, msg.Params)
}

func rawOrNil(r gjson.Result) []byte {
	if !r.Exists() {
		return nil
	}
	return []byte(r.Raw)
}

type upstreamHeadersKey struct{}

// withUpstreamHeaders returns ctx telling attempt to add hdr to the
// upstream request.
func withUpstreamHeaders(ctx context.Context, hdr http.Header) context.Context {
	return context.WithValue(ctx, upstreamHeadersKey{}, hdr)
}

func upstreamHeaders(ctx context.Context) http.Header {
	h, _ := ctx.Value(upstreamHeadersKey{}).(http.Header)
	return h
}
