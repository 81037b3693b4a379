package registry

import (
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// readStateless checks a request of the stateless revision (2026-07-28)
// before any policy sees it — its _meta, its protocol version, its
// Mcp-Method and Mcp-Name headers against the body, and a requestState
// toolgate sealed — and binds it to the MCP session toolgate implies for
// the caller, the toolgate session, the service and the declared
// capabilities. It answers the runner and returns false when the request
// is refused.
func (h *Handler) readStateless(w http.ResponseWriter, r *http.Request, call *gateway.Call, svc *gateway.Service) bool {
	msg := call.Message
	st, refusal := mcp2026.Check(r, msg)
	if refusal != nil {
		refusal.Write(w, msg.ID)
		return false
	}
	if h.route.HasOpeningGates() {
		st.Gate = h.route.DecideOpening
	}
	call.Stateless = st
	call.ProtocolVersion = mcp2026.Version
	ms, err := h.stateless.Session(r.Context(), call, svc)
	if err != nil {
		var limit *gateway.MCPSessionLimitError
		if errors.As(err, &limit) {
			call.Fail(w, http.StatusTooManyRequests, gateway.CodeInvalidRequest, err.Error(),
				map[string]any{"limit": limit.Option, "max": limit.Limit})
			return false
		}
		h.logger.Warn("cannot find the MCP session of a 2026-07-28 request", zap.String("service", svc.ID), zap.Error(err))
		call.Unavailable(w, gateway.RunnerText(err)) // not the storage's own words: its paths and hosts
		return false
	}
	call.MCPSession = ms
	if text, ok := mcpmsg.String(msg.RequestState); ok && mcp2026.IsOwnState(text) {
		want := mcp2026.StateOf(call.Caller.User, gateway.SessionRef(call.Session.ID), svc.ID, msg)
		redeemed, err := h.stateless.Redeem(r.Context(), text, want)
		if errors.Is(err, gateway.ErrStorageUnavailable) {
			h.logger.Warn("cannot check a requestState", zap.String("service", svc.ID), zap.Error(err))
			call.Unavailable(w, gateway.RunnerText(err)) // retryable; the storage's own words stay in the log
			return false
		}
		if err != nil {
			h.logger.Info("refused a requestState", zap.String("service", svc.ID), zap.Error(err))
			gateway.WriteRPCError(w, http.StatusBadRequest, msg.ID, gateway.CodeInvalidParams,
				"requestState refused: "+err.Error()+"; send the call again without it", nil)
			return false
		}
		st.OwnState, st.Held, st.Inputs = true, redeemed.Held, redeemed.Inputs
		st.Relayed, st.UpstreamState = redeemed.Relayed, redeemed.Upstream
	}
	return true
}

// releaseUntaken releases the held call a retry's requestState named
// (redeemed, so used up) when nothing took it on: a later step refused the
// retry (the request policy, with its reason in Stateless.Refused, or
// toolgate_proxy, as no policy judged it). Kept, the call would hold its
// upstream request and the caller's place until its deadline, with nothing
// left to continue it.
func (h *Handler) releaseUntaken(call *gateway.Call) {
	x := h.stateless.Take(call.Stateless.Held, mcp2026.Owner(call))
	if x == nil {
		return
	}
	reason := call.Stateless.Refused
	if reason == "" {
		reason = "toolgate did not let the client's retry through"
	}
	x.Release(reason)
}

// openStateless prepares the implied MCP session of a stateless tools/call
// so that the policy sees the tool's definition: toolgate_proxy learns the
// upstream's revision and lists its tools. The initialize it may send is
// decided by the request policy first (gateway.Stateless.Gate): when that
// refuses it, the runner is answered and openStateless returns false.
// Another failure is left to the later steps, which report it (a missing
// credential, an unreachable upstream).
func (h *Handler) openStateless(w http.ResponseWriter, r *http.Request, call *gateway.Call) bool {
	if call.MCPSession.HasCatalog() {
		return true
	}
	err := h.stateless.Open(r.Context(), call)
	var refused *gateway.OpeningRefused
	if errors.As(err, &refused) {
		refused.Answer(w, call)
		return false
	}
	if err != nil {
		h.logger.Debug("cannot open the implied MCP session before the policy", zap.String("service", call.Service.ID), zap.Error(err))
	}
	return true
}

// checkParamHeaders checks a stateless tools/call's Mcp-Param-* headers
// against its arguments, with the upstream's definition of the tool.
// Without a definition nothing can be checked, and toolgate_proxy then
// sends none upstream.
func (h *Handler) checkParamHeaders(w http.ResponseWriter, r *http.Request, call *gateway.Call) bool {
	def := call.ToolDefinition()
	if def == nil {
		return true
	}
	if refusal := mcp2026.CheckParamHeaders(r.Header, def.Raw, call.Message.Arguments); refusal != nil {
		refusal.Write(w, call.Message.ID)
		return false
	}
	return true
}

// statelessGetOrDelete answers GET and DELETE of the stateless revision,
// which has neither.
func statelessGetOrDelete(w http.ResponseWriter) {
	w.Header().Set("Allow", "POST")
	gateway.WriteRPCError(w, http.StatusMethodNotAllowed, nil, gateway.CodeInvalidRequest,
		"protocol "+mcp2026.Version+" has no GET stream and no sessions to end: use subscriptions/listen", nil)
}
