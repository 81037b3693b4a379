package policy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(RequestHandler{})
}

// RequestHandler is toolgate_policy: it decides every runner message
// (requests, notifications, answers to server→client requests) before it
// goes upstream.
type RequestHandler struct {
	Config
}

// CaddyModule returns the Caddy module information.
func (RequestHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.toolgate_policy",
		New: func() caddy.Module { return new(RequestHandler) },
	}
}

// Provision compiles the policy (file I/O only).
func (h *RequestHandler) Provision(ctx caddy.Context) error {
	if err := h.provision(ctx, stageRequest, "data.toolgate.request.decision"); err != nil {
		return err
	}
	h.app.ProvisioningRoute().AddOpeningGate(h.decideOpening)
	return nil
}

// Validate checks the configuration.
func (h *RequestHandler) Validate() error { return h.validate() }

// Cleanup releases the shared policy.
func (h *RequestHandler) Cleanup() error { return h.cleanup() }

// ServeHTTP applies the request decision.
func (h *RequestHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	call := gateway.CallFrom(r)
	if call == nil || call.Service == nil {
		return caddyhttp.Error(http.StatusInternalServerError,
			errors.New("toolgate_policy must come after toolgate_session and toolgate_registry in the route"))
	}
	call.RequestJudged = true
	if call.Message.Kind == 0 {
		if r.Method == http.MethodGet {
			call.OnStream(h.decideStream) // toward an upstream of 2026-07-28, a stream is a listen
		}
		return next.ServeHTTP(w, r) // GET (open a stream) and DELETE carry no message
	}
	if prepare := call.Prepare; prepare != nil {
		call.Prepare = nil // once, also on a route with several policies
		if !prepare(w, r) {
			return nil
		}
	}
	return h.judge(w, r, call, next, nil)
}

// judge decides call and applies the decision: it goes on through the
// pipeline, is refused, or waits for an approval — held open on its stream
// (approval_wait), or told where the approval is decided. approved is the
// approval a held call was given under another revision of the policy (nil
// for a call as it arrives): it satisfies an ask of the policy in force
// only if its decider may decide that ask, and the call is held no more.
func (h *RequestHandler) judge(w http.ResponseWriter, r *http.Request, call *gateway.Call, next caddyhttp.Handler, approved *approval.Approval) error {
	var tool *ast.Term
	if call.Method == "tools/call" {
		tool = toolTerm(call.ToolDefinition(), call.Message.Name, call.Service)
	}
	_, span := startDecisionSpan(r.Context(), "toolgate.policy.request", call)
	o := outcome{}.deny(failError, "the gateway could not build the policy input")
	input, err := recordRequestInput(call, tool)
	if err == nil && call.Method == "tools/call" {
		// Argument names the policy would read one way and a
		// case-insensitive upstream another are refused before the policy
		// runs.
		if err := checkArgumentKeys(input.Get(keyArguments), tool); err != nil {
			h.logger.Info("tools/call refused: ambiguous argument names", zap.String("service", call.Service.ID),
				zap.String("tool", call.Message.Name), zap.Error(err))
			// A deny of toolgate's own, audited as the policy's are: the
			// attempt is the trail's to show.
			o := outcome{Revision: h.engine.Revision()}.deny(failAmbiguous, "toolgate refused the call: "+err.Error())
			d := h.newDecision(r.Context(), call, &o, stageRequest, auditSubject(call), nil, input)
			call.Decision = d
			gateway.WriteRPC(w, http.StatusOK, gateway.RPCResult(call.Message.ID, gateway.ToolError(o.Reason, d)))
			gateway.EndSpan(span, "ambiguous argument names")
			return nil
		}
	}
	if err == nil {
		o = h.engine.decide(r.Context(), input, time.Duration(h.Timeout), "arguments")
		switch {
		case (o.argsTerm != nil || o.Arguments != nil) && call.Method != "tools/call" && o.Action != gateway.ActionDeny:
			// Kept, the rewrite would be ignored: the call would go upstream
			// as the runner sent it, not as the policy decided.
			o = o.deny(failMalformed, "the policy rewrote the arguments of "+call.Method+"; toolgate rewrites only those of tools/call")
		case o.argsTerm != nil && call.Method == "tools/call":
			if err := checkArgumentKeys(o.argsTerm, tool); err != nil {
				o = o.deny(failMalformed, "the policy's rewritten arguments are refused: "+err.Error())
			}
		}
		o = h.decideSubscriptions(r.Context(), call, o)
	} else {
		h.logger.Warn("cannot build the policy input", zap.String("service", call.Service.ID), zap.Error(err))
	}
	var rewriteErr error
	if o.Arguments != nil && call.Method == "tools/call" && o.Action != gateway.ActionDeny {
		// What goes upstream, what an approval is about, and what the
		// audit entry records beside the runner's.
		o.upstream, rewriteErr = json.Marshal(o.Arguments)
	}
	d := h.newDecision(r.Context(), call, &o, stageRequest, auditSubject(call), nil, input)
	call.Decision = d
	endDecisionSpan(span, d, o)
	if rewriteErr != nil {
		call.Fail(w, http.StatusForbidden, gateway.CodePolicyDenied, "denied: the policy's rewritten arguments cannot be encoded", decisionData(d))
		return nil
	}
	if o.upstream != nil {
		call.Arguments = o.upstream
		call.RequestInput = nil // built from other arguments: of no use to the result stage
	}
	switch o.Action {
	case gateway.ActionAllow:
		if why := h.decideAnswerShape(r.Context(), call); why != "" {
			return h.refuseAnswer(w, r, call, d, why, next)
		}
		return h.allow(w, r, call, next)
	case gateway.ActionAsk:
		if call.Message.Kind == mcpmsg.Response {
			// An answer cannot wait for an approval: it is withheld.
			return h.refuseAnswer(w, r, call, d, "an approval was asked for the client's answer, which cannot wait for one: "+o.Reason, next)
		}
		if h.approvals == nil {
			data := decisionData(d)
			data["approval_required"] = true
			call.Fail(w, http.StatusForbidden, gateway.CodeApprovalRequired,
				"approval required: "+o.Reason+" (this gateway cannot take approvals: it has no cipher to keep them; an administrator must configure one)", data)
			return nil
		}
		if approved != nil {
			// The approval of the call as the runner sent it, judged by
			// the revision that asked: this revision may send other
			// arguments upstream, which nobody approved.
			if spec, err := approval.ParseSpec(o.Approval); err == nil && approved.Covers(spec) && approved.About(approvalCall(call)) {
				return h.allow(w, r, call, next)
			}
		}
		proceed, held := h.ask(w, r, call, o, d, input, approved == nil)
		switch {
		case held != nil:
			return h.hold(w, r, call, d, held, o.Revision, next)
		case proceed:
			return h.allow(w, r, call, next)
		}
	default:
		refuseHeld(call, o.Reason)
		if call.Method == "tools/call" {
			// A tool result, so the agent reads the reason and can adapt.
			gateway.WriteRPC(w, http.StatusOK, gateway.RPCResult(call.Message.ID, gateway.ToolError(o.Reason, d)))
			return nil
		}
		if call.Message.Kind == mcpmsg.Response {
			return h.refuseAnswer(w, r, call, d, o.Reason, next)
		}
		call.Fail(w, http.StatusForbidden, gateway.CodePolicyDenied, "denied by policy: "+o.Reason, decisionData(d))
	}
	return nil
}

// refuseAnswer stands in for a runner's answer to a server→client request
// that the policy denied: whoever asked (the upstream, or toolgate for an
// upstream of the stateless revision) gets an error answer at once,
// carrying nothing of the runner's, instead of waiting for its timeout.
// The runner's POST is then accepted (202), as its answer was delivered in
// that form: clients treat a refused answer as the end of the request it
// belongs to, while the error lets the request finish and say why (the
// decision is audited as a deny). When the stand-in cannot be delivered,
// the runner gets 403.
func (h *RequestHandler) refuseAnswer(w http.ResponseWriter, r *http.Request, call *gateway.Call, d *gateway.Decision, reason string, next caddyhttp.Handler) error {
	stand, err := mcpmsg.Parse(gateway.RPCError(call.Message.ID, gateway.CodePolicyDenied, "the client's answer was withheld by toolgate's policy", nil), mcpmsg.Limits{})
	if err == nil {
		call.Message = stand
		rec := &discardResponse{header: http.Header{}}
		if err := next.ServeHTTP(rec, r); err == nil && rec.status == http.StatusAccepted {
			w.WriteHeader(http.StatusAccepted)
			return nil
		}
		h.logger.Warn("cannot tell the upstream that the client's answer was withheld", zap.String("service", call.Service.ID), zap.Int("status", rec.status))
	}
	gateway.WriteRPCError(w, http.StatusForbidden, nil, gateway.CodePolicyDenied, "denied by policy: "+reason, decisionData(d))
	return nil
}

// discardResponse takes what the rest of the pipeline answers for a
// message toolgate sent in the runner's place.
type discardResponse struct {
	header http.Header
	status int
}

func (d *discardResponse) Header() http.Header { return d.header }

func (d *discardResponse) Write(b []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	return len(b), nil
}

func (d *discardResponse) WriteHeader(status int) {
	if d.status == 0 {
		d.status = status
	}
}

// allow sends the call on: a listing without the tools the policy would
// deny, a call whose result carries its decision.
func (h *RequestHandler) allow(w http.ResponseWriter, r *http.Request, call *gateway.Call, next caddyhttp.Handler) error {
	h.decideInputResponses(r.Context(), call)
	h.decideLogLevel(r.Context(), call)
	switch call.Method {
	case "tools/list":
		call.OnResult(h.hideTools)
	case "tools/call":
		if call.IsRequest() {
			call.OnResult(func(ctx context.Context, call *gateway.Call, result []byte) (gateway.Result, error) {
				return whole(markDecision(ctx, call, result))
			})
		}
	}
	if call.IsRequest() && call.Stateless == nil && call.MCPSession != nil && call.MCPSession.Upstream().ProtocolVersion == mcp2026.Version {
		call.OnRound(h.decideRound) // the rounds toolgate sends upstream for this request
	}
	return next.ServeHTTP(w, r)
}

// markDecision writes the request decision into a tools/call result's
// _meta["toolgate/decision"], unless toolgate_result_policy decides the
// result (and writes its own).
//
// It is the rare path (a pipeline without toolgate_result_policy), so the
// marked result is written into one slice, a copy of the upstream's.
func markDecision(_ context.Context, call *gateway.Call, result []byte) ([]byte, error) {
	if call.ResultDecided || call.Decision == nil {
		return nil, nil
	}
	spans := make(map[*ast.Term]string)
	p := jsonParser{src: unsafe.String(unsafe.SliceData(result), len(result)), spans: spans} // result is not changed while the terms live
	res, err := p.parse()
	if err != nil {
		return nil, nil // the proxy relays only results it could parse; nothing to mark
	}
	return markResult(result, res, call.Decision, spans)
}

// auditSubject is what a request-stage audit entry digests
// (arguments_sha256) and, with log_payloads, logs: a tools/call's
// arguments, a runner's answer's result (or error), another message's
// params — so that the entries of two reads of different resources, or of
// an accept and a decline, differ.
func auditSubject(call *gateway.Call) []byte {
	switch {
	case call.Method == "tools/call" && call.IsRequest():
		return call.Message.Arguments
	case call.Message.Kind == mcpmsg.Response && call.Message.Result != nil:
		return call.Message.Result
	case call.Message.Kind == mcpmsg.Response:
		return call.Message.Error
	}
	return call.Message.Params
}

// hideTools removes from a tools/list result the tools the policy would
// deny this caller calling: each is evaluated as a tools/call with
// listing: true and no arguments. ask keeps a tool visible.
func (h *RequestHandler) hideTools(ctx context.Context, call *gateway.Call, result []byte) (gateway.Result, error) {
	timeout := time.Duration(h.Timeout)
	common := commonItems(call) // shared by every tool's input
	return gateway.Whole(gateway.FilterTools(result, func(tool gjson.Result) bool {
		o := outcome{}.deny(failError, "the gateway could not build the policy input")
		def, err := jsonTerm([]byte(tool.Raw))
		var input ast.Object
		if err == nil {
			obj, _ := def.Value.(ast.Object)
			input, err = inputFor(common, call, toolView(obj, tool.Get("name").String(), call.Service, toolpin.Digest([]byte(tool.Raw))), true)
		}
		if err == nil {
			o = h.engine.decide(ctx, input, timeout, "arguments")
		}
		if o.Action != gateway.ActionDeny {
			return true
		}
		h.newDecision(ctx, call, &o, stageListing, []byte(tool.Get("name").Raw), nil, input)
		return false
	})), nil
}

func decisionData(d *gateway.Decision) map[string]any {
	return map[string]any{"decision_id": d.ID}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*RequestHandler)(nil)
	_ caddy.Validator             = (*RequestHandler)(nil)
	_ caddy.CleanerUpper          = (*RequestHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*RequestHandler)(nil)
)
