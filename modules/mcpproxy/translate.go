package mcpproxy

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/notice"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Runners of the earlier revisions (they initialize) in front of an
// upstream that speaks only the stateless revision (2026-07-28). Such an
// upstream answers initialize, if at all, with a version it then refuses,
// so toolgate learns the upstream's era first, as the revision asks of
// clients that speak both: a server/discover probe at the first initialize
// for the service, kept for the configuration's life. An upstream that
// lists 2026-07-28 and none of the versions toolgate initializes with is
// spoken to statelessly: toolgate answers the runner's initialize from the
// discovery, sends every request with the revision's _meta (the
// capabilities and identity the runner declared) and headers, turns an
// input_required result into server→client requests on the runner's
// stream and retries with the answers and the upstream's requestState, and
// serves the runner's GET stream with subscriptions/listen.

// maxTranslatedRounds bounds the input_required rounds of one request.
const maxTranslatedRounds = 10

// probeDiscover asks the upstream which revisions it speaks, with
// server/discover. modern reports an upstream of the stateless revision
// (its discovery is recorded for the service); any answer that is not a
// discovery listing the revision means an upstream of an earlier one. err
// is set when the upstream could not be reached, refused the caller or
// failed (see revisionSignal): nothing was learned of its revision.
func (h *Handler) probeDiscover(ctx context.Context, call *gateway.Call) (res gjson.Result, modern bool, err error) {
	id := gatewayRequestID()
	body := ownStatelessRequest(id, "server/discover", nil)
	dctx := withUpstreamHeaders(ctx, http.Header{mcp2026.HeaderMethod: {"server/discover"}})
	_, msg, err := h.roundTrip(dctx, call, gateway.Upstream{ProtocolVersion: mcp2026.Version}, id, body)
	var ue *upstreamError
	if err != nil && (!errors.As(err, &ue) || !revisionSignal(ue.status)) {
		return res, false, err
	}
	if err != nil || msg.Result == nil {
		return res, false, nil
	}
	res = gjson.ParseBytes(msg.Result)
	for _, v := range res.Get("supportedVersions").Array() {
		if v.String() == mcp2026.Version {
			h.stateless.SetDiscovery(call, mcp2026.Discovery{Stateless: true,
				Capabilities: rawOrNil(res.Get("capabilities")), ServerInfo: rawOrNil(res.Get("_meta").Get(gjson.Escape(mcp2026.MetaServerInfo))),
				Instructions: rawOrNil(res.Get("instructions")), TTLMs: rawOrNil(res.Get("ttlMs")), CacheScope: rawOrNil(res.Get("cacheScope"))})
			return res, true, nil
		}
	}
	return res, false, nil
}

// revisionSignal reports whether an upstream's HTTP error status answering
// server/discover says that it does not know the method (a server of an
// earlier revision: 400, 404, 405, …), as opposed to refusing this caller
// (401, 403, 407, its credential) or failing for now (408, 429, 5xx). Only
// the former says anything of the upstream: what modernOnly learns from a
// probe holds for every caller of the service, so one caller's refused
// credential must not decide how the others are served.
func revisionSignal(status int) bool {
	switch status {
	case 0, http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired,
		http.StatusRequestTimeout, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// modernOnly reports whether the service's upstream speaks only the
// stateless revision, probing it at each initialize for the service until
// it answers a discovery. Only a discovery is learned for the service (the
// revisions it lists); any other answer — an earlier revision's server,
// which does not know the method, but also an upstream that refuses this
// caller's credential in a way of its own (a 400 or 404 with a challenge,
// a 402, a JSON-RPC error) — holds for this initialize alone, which then
// goes upstream as it is, so that no caller decides how the others are
// served. When the upstream speaks only the stateless revision, each later
// initialize asks its discovery again for the call's
// caller, in place of the initialize that would have reached the
// upstream: what the upstream tells one caller is not another's, and a
// caller it does not answer with a discovery now gets what it answers an
// initialize.
func (h *Handler) modernOnly(ctx context.Context, call *gateway.Call) bool {
	if only, known := h.stateless.Era(call.Service.ID); known {
		if !only {
			return false
		}
		_, modern, err := h.probeDiscover(ctx, call)
		return err == nil && modern
	}
	res, modern, err := h.probeDiscover(ctx, call)
	if err != nil || !modern {
		return false
	}
	only := !slices.ContainsFunc(res.Get("supportedVersions").Array(), func(v gjson.Result) bool {
		return gateway.SupportsProtocolVersion(v.String())
	})
	h.stateless.SetEra(call.Service.ID, only)
	if only {
		h.logger.Info("the upstream speaks only protocol "+mcp2026.Version+"; runners that initialize are translated",
			zap.String("service", call.Service.ID))
	}
	return only
}

// initializeTranslated answers a runner's initialize for an upstream of the
// stateless revision only, from its discovery: the runner's version (or
// toolgate's latest), and the upstream's capabilities without those the
// revision removed (resource subscriptions: the GET stream carries list
// changes only), identity and instructions.
func (h *Handler) initializeTranslated(ctx context.Context, w http.ResponseWriter, r *http.Request, call *gateway.Call, ms *gateway.MCPSession, replay []byte) {
	d, _ := h.stateless.Discovery(call)
	if err := ms.SetUpstream(ctx, stamped(call, gateway.Upstream{ProtocolVersion: mcp2026.Version, InitializeParams: replay})); err != nil {
		// Answered before the session ends, which would read as "ended
		// meanwhile"; ended so that its reservation and its place in
		// max_mcp_sessions go now, not when they run out.
		h.refuseInitialize(w, r, call, err)
		_, _, _ = h.app.MCPSessions().End(ctx, ms) // not stored: forgotten here
		return
	}
	caps := d.Capabilities
	if caps == nil {
		caps = []byte("{}")
	}
	if res := mcpmsg.MemberOf(caps, "resources"); res != nil && res[0] == '{' {
		caps = mcpmsg.ReplaceMember(caps, "resources", mcpmsg.RemoveMember(res, "subscribe"))
	}
	result := []byte(`{"protocolVersion":`)
	result = append(result, mcpmsg.MemberOf(replay, "protocolVersion")...)
	result = append(result, `,"capabilities":`...)
	result = append(result, caps...)
	result = append(result, `,"serverInfo":`...)
	if d.ServerInfo != nil {
		result = append(result, d.ServerInfo...)
	} else {
		result = append(result, `{"name":"`+call.Service.ID+`","version":"unknown"}`...)
	}
	if d.Instructions != nil {
		result = append(result, `,"instructions":`...)
		result = append(result, d.Instructions...)
	}
	result = append(result, '}')
	answer, err := h.ownAnswer(ctx, call, gateway.RPCResult(call.Message.ID, result))
	if err != nil {
		call.Unavailable(w, h.ownAnswerFailed(call, err))
		_, _, _ = h.app.MCPSessions().End(ctx, ms)
		return
	}
	h.answerInitialize(ctx, w, call, ms, gateway.Upstream{}, answer)
}

// translatedBody is a runner's request with the given id and params.
func translatedBody(call *gateway.Call, id, params []byte) []byte {
	return mcpmsg.ReplaceMember(mcpmsg.ReplaceMember(call.Message.Raw, "params", params), "id", id)
}

// requestTranslated relays a runner's request to an upstream of the
// stateless revision, in rounds: an input_required answer's input requests
// go to the runner as server→client requests on its stream (those it
// declared in its initialize, and only when its request accepts a
// stream), and the request is sent again with the runner's answers and the
// upstream's requestState as it was, until the upstream completes it.
func (h *Handler) requestTranslated(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	switch call.Method {
	case "ping", "logging/setLevel":
		// Removed in the revision; the answer is toolgate's.
		h.answerOwn(r.Context(), w, call, gateway.RPCResult(call.Message.ID, []byte("{}")))
		return
	}
	ctx, cancel := exchangeContext(r, call)
	defer cancel()
	up := call.MCPSession.Upstream()
	var out *sseWriter
	if acceptsSSE(r) {
		out = newSSEWriter(w)
		defer h.keepAlive(out, call.Service)()
	}
	id := call.Message.ID
	// inputResponses and requestState are members of the stateless
	// revision, toolgate's to add in the rounds below: a runner of an
	// earlier revision sending its own (in any case: the upstream's decoder
	// may ignore case) would answer input requests the upstream never made
	// through toolgate (nor past its policy).
	params := mcpmsg.MemberOf(requestBody(call), "params")
	if params != nil {
		params = mcpmsg.RemoveMemberFold(mcpmsg.RemoveMemberFold(params, "inputResponses"), "requestState")
	}
	params = mcp2026.WithMeta(params, mcp2026.LegacyMeta(up.InitializeParams))
	for round := 0; ; round++ {
		body := translatedBody(call, id, params)
		resp, err := h.exchange(withUpstreamHeaders(ctx, h.standardHeaders(call, body)), call, up, http.MethodPost, body, "")
		rs, _, rejected := h.rejectedResponse(ctx, call, up, err, id)
		if !rejected {
			if err == nil {
				rs, err = h.newResponse(ctx, call, up, resp)
			}
			if err != nil {
				h.answerError(w, r, call, err)
				return
			}
		}
		msg, ok := h.readAnswer(ctx, w, call, rs, out, id)
		rs.close()
		if !ok {
			return
		}
		if msg.Result == nil || mcp2026.ResultType(msg.Result) != mcp2026.ResultInputRequired {
			if round > 0 || mcpmsg.IDKey(id) != mcpmsg.IDKey(call.Message.ID) {
				var err error
				if msg, err = mcpmsg.Parse(mcpmsg.ReplaceMember(msg.Raw, "id", call.Message.ID), h.limits); err != nil {
					h.finalTranslated(w, out, call, gateway.CodeInternalError, "toolgate could not renumber the upstream's answer", nil)
					return
				}
			}
			data := h.deliver(ctx, call, rs.up, msg, false)
			if out != nil && out.hasStarted() {
				_ = out.send("", data.parts()...)
			} else {
				gateway.WriteRPC(w, http.StatusOK, data.parts()...)
			}
			return
		}
		if round >= maxTranslatedRounds {
			h.finalTranslated(w, out, call, gateway.CodeInternalError, "the upstream asked for input more than "+
				"toolgate relays for one request", nil)
			return
		}
		responses, ok := h.askTranslated(ctx, w, call, msg.Result, out)
		if !ok {
			return
		}
		state := mcpmsg.MemberOf(msg.Result, "requestState")
		if refused := call.RunRoundHooks(ctx, responses, state); refused != "" {
			// The round is decided as the retry it is (a stateless
			// runner's would be): refused, it is not sent.
			answer := gateway.RPCError(call.Message.ID, gateway.CodePolicyDenied, "denied by policy: "+refused, nil)
			if call.Method == "tools/call" {
				answer = gateway.RPCResult(call.Message.ID, gateway.ToolError(refused, nil))
			}
			if out != nil && out.hasStarted() {
				_ = out.send("", answer)
			} else {
				gateway.WriteRPC(w, http.StatusOK, answer)
			}
			return
		}
		params = mcpmsg.ReplaceMember(params, "inputResponses", responses)
		if state != nil {
			params = mcpmsg.ReplaceMember(params, "requestState", state) // byte for byte
		} else {
			params = mcpmsg.RemoveMember(params, "requestState")
		}
		id = gatewayRequestID() // a retry is a new request
	}
}

// readAnswer reads the upstream's stream up to the response to id,
// relaying notifications to the runner's stream. It answers the runner
// and reports false when the stream failed.
func (h *Handler) readAnswer(ctx context.Context, w http.ResponseWriter, call *gateway.Call, rs *response, out *sseWriter, id []byte) (mcpmsg.Message, bool) {
	for {
		msg, err := rs.next()
		if err != nil {
			why := "the upstream ended its stream without answering"
			var ue *upstreamError
			if errors.As(err, &ue) {
				why = ue.msg
			}
			code, text, data := streamFailure(err, why)
			h.finalTranslated(w, out, call, code, text, data)
			return msg, false
		}
		if isResponseTo(msg, id) {
			rs.awaitEnd()
			return msg, true
		}
		if msg.Kind != mcpmsg.Notification {
			continue // the revision has no server requests on a stream
		}
		if out == nil {
			h.noted(call, msg)
			continue
		}
		if data := h.deliver(ctx, call, rs.up, msg, true); !data.none() && out.send("", data.parts()...) != nil {
			return msg, false
		}
	}
}

// askTranslated sends the input requests of an input_required result to
// the runner as server→client requests and waits for its answers, which it
// returns as inputResponses (JSON text). It answers the runner and reports
// false when a request cannot be sent or is not answered.
func (h *Handler) askTranslated(ctx context.Context, w http.ResponseWriter, call *gateway.Call, result []byte, out *sseWriter) ([]byte, bool) {
	if why := mcp2026.InputRequestsProblem(result); why != "" {
		// Read otherwise than the runner would (say, under a key in
		// another case): asking nothing would send the call again, and
		// again, with no responses.
		h.finalTranslated(w, out, call, gateway.CodeUnavailable, "the upstream's answer was withheld: "+why, nil)
		return nil, false
	}
	ms := call.MCPSession
	caps := mcpmsg.MemberOf(ms.Upstream().InitializeParams, "capabilities")
	type pending struct {
		key    string
		id     []byte
		answer <-chan []byte
		done   func()
	}
	var asked []pending
	defer func() {
		for _, p := range asked {
			p.done()
		}
	}()
	fail := ""
	gjson.GetBytes(result, "inputRequests").ForEach(func(key, req gjson.Result) bool {
		method := req.Get("method").String()
		if need, declared := mcp2026.RequiredCapabilityIn(call.ProtocolVersion, caps, method, req.Get("params")); !declared {
			fail = "the upstream needs " + mcp2026.InputMethodName(method) + ", which this client did not declare (capabilities: " + capabilityNames(need) + ")"
			return false
		}
		if out == nil {
			fail = "the upstream needs " + mcp2026.InputMethodName(method) + ", and this request does not accept an SSE stream to carry it"
			return false
		}
		id := gatewayRequestID()
		raw := []byte(`{"jsonrpc":"2.0","id":`)
		raw = append(raw, id...)
		raw = append(raw, `,"method":`...)
		raw = mcpmsg.AppendQuote(raw, method)
		if p := req.Get("params"); p.Exists() {
			raw = append(raw, `,"params":`...)
			raw = append(raw, p.Raw...)
		}
		raw = append(raw, '}')
		msg, err := mcpmsg.Parse(raw, h.limits)
		if err != nil {
			fail = "the upstream's input request is malformed"
			return false
		}
		relayed, ok := h.inspect(ctx, call, msg, gateway.ChannelServerRequest)
		if !ok {
			fail = "toolgate's policy withheld " + mcp2026.InputMethodName(method) + " from the client"
			return false
		}
		if !ms.ServerRequestSent(ctx, ms.Upstream(), id, id, method) { // toolgate's own request: its id is the runner's
			fail = "too many server requests are waiting for the client's answer"
			return false
		}
		answer, done := h.stateless.Expect(ms.ID, id)
		asked = append(asked, pending{key: key.String(), id: id, answer: answer, done: done})
		if out.send("", relayed) != nil {
			fail = "the client went away"
			return false
		}
		return true
	})
	if fail != "" {
		h.finalTranslated(w, out, call, gateway.CodeInvalidRequest, fail, nil)
		return nil, false
	}
	responses := []byte("{}")
	for _, p := range asked {
		var raw []byte
		select {
		case raw = <-p.answer:
		case <-ctx.Done():
			h.finalTranslated(w, out, call, gateway.CodeUnavailable, "the client did not answer the upstream's input request in time", gateway.Retryable)
			return nil, false
		}
		res := mcpmsg.MemberOf(raw, "result")
		if res == nil {
			h.finalTranslated(w, out, call, gateway.CodeInvalidRequest, "the client refused the upstream's input request", nil)
			return nil, false
		}
		responses = mcpmsg.ReplaceMember(responses, p.key, res)
	}
	return responses, true
}

// finalTranslated answers the runner's request with toolgate's error.
func (h *Handler) finalTranslated(w http.ResponseWriter, out *sseWriter, call *gateway.Call, code int, why string, data any) {
	h.logger.Warn("translated request failed", zap.String("service", call.Service.ID), zap.String("reason", why))
	msg := gateway.RPCError(call.Message.ID, code, why, data)
	if out != nil && out.hasStarted() {
		_ = out.send("", msg)
		return
	}
	gateway.WriteRPC(w, http.StatusOK, msg)
}

func capabilityNames(need map[string]any) string {
	names := ""
	for k := range need {
		if names != "" {
			names += ", "
		}
		names += k
	}
	return names
}

// forwardTranslated takes a runner's notification or response in an MCP
// session with an upstream of the stateless revision, which has neither:
// a response answers an input request toolgate sent (askTranslated), and
// notifications/initialized lets toolgate list the upstream's tools.
func (h *Handler) forwardTranslated(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ms := call.MCPSession
	switch {
	case call.Message.Kind == mcpmsg.Response:
		if !h.stateless.Answer(ms.ID, call.Message.ID, call.Message.Raw) {
			gateway.WriteRPCError(w, http.StatusBadRequest, nil, gateway.CodeInvalidRequest, "the response answers no request toolgate is waiting for", nil)
			return
		}
	case call.Method == "notifications/initialized":
		ms.ListingTools() // pending since the session began, unless a wait gave up on it
		ctx, cancel := context.WithTimeout(r.Context(), time.Duration(call.Service.Timeout))
		defer cancel()
		if err := h.fetchCatalog(ctx, call, ms.Upstream()); err != nil {
			h.logger.Warn("cannot list the upstream's tools; policy will see tools without annotations",
				zap.String("service", call.Service.ID), zap.Error(err))
		}
	}
	w.WriteHeader(http.StatusAccepted)
}

// streamTranslated serves a runner's GET stream with subscriptions/listen:
// the list changes the upstream's capabilities offer, for as long as both
// sides keep it open. The acknowledgement is the revision's own and is not
// relayed.
func (h *Handler) streamTranslated(w http.ResponseWriter, r *http.Request, call *gateway.Call) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(call.MCPSession.Context(), cancel)()
	defer h.app.WhileAuthorized(r, call, cancel)() // a reload may take away what let it open
	up := call.MCPSession.Upstream()
	d, known := h.stateless.Discovery(call)
	if !known {
		// The runner initialized on another replica: ask what this one
		// has not learned.
		if _, _, err := h.probeDiscover(ctx, call); err != nil {
			h.answerError(w, r, call, err)
			return
		}
		d, _ = h.stateless.Discovery(call)
	}
	caps := gjson.ParseBytes(d.Capabilities)
	filter := []byte("{}")
	for _, f := range [][2]string{{"tools", "toolsListChanged"}, {"prompts", "promptsListChanged"}, {"resources", "resourcesListChanged"}} {
		if caps.Get(f[0] + ".listChanged").Bool() {
			filter = mcpmsg.ReplaceMember(filter, f[1], []byte("true"))
		}
	}
	listen := []byte(`{"notifications":` + string(filter) + `}`)
	if refused := call.RunStreamHooks(ctx, "subscriptions/listen", listen); refused != "" {
		// The stream still carries toolgate's own notifications; the
		// upstream gets no listen, and the runner no list changes.
		h.logger.Info("the subscriptions/listen serving a client's stream was refused", zap.String("service", call.Service.ID),
			zap.String("reason", refused))
		out := newSSEWriter(w)
		out.start(nil)
		defer h.keepAlive(out, call.Service)()
		defer notice.For(h.app).Attach(call.MCPSession.ID, func(msg []byte) error { return out.send("", msg) })()
		<-ctx.Done()
		return
	}
	id := gatewayRequestID()
	params := mcp2026.WithMeta(listen, mcp2026.LegacyMeta(up.InitializeParams))
	body := []byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"method":"subscriptions/listen","params":` + string(params) + `}`)
	resp, err := h.exchange(withUpstreamHeaders(ctx, http.Header{mcp2026.HeaderMethod: {"subscriptions/listen"}}), call, up, http.MethodPost, body, "")
	if err != nil {
		h.answerError(w, r, call, err)
		return
	}
	rs, err := h.newResponse(ctx, call, up, resp)
	if err != nil || rs.sse == nil {
		if rs != nil {
			rs.close()
		}
		h.answerError(w, r, call, unavailable("the upstream did not open a subscription stream"))
		return
	}
	defer rs.close()
	out := newSSEWriter(w)
	out.start(nil)
	defer h.keepAlive(out, call.Service)()
	// toolgate's own notifications to the runner (an approval decided)
	// go on this stream too.
	defer notice.For(h.app).Attach(call.MCPSession.ID, func(msg []byte) error { return out.send("", msg) })()
	for {
		msg, err := rs.next()
		if err != nil || isResponseTo(msg, id) {
			return // the upstream ended the subscription
		}
		if msg.Kind != mcpmsg.Notification || msg.Method == "notifications/subscriptions/acknowledged" {
			continue
		}
		if data := h.deliver(ctx, call, rs.up, msg, false); !data.none() && out.send("", data.parts()...) != nil {
			return
		}
	}
}
