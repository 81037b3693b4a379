package policy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// CodeURLElicitationRequired is the JSON-RPC error of the 2025-11-25
// revision telling a client that declared URL elicitation to open a page
// and retry.
const CodeURLElicitationRequired = -32042

// approvalCall is the call as approvals match it, with the arguments as
// they would go upstream (for a method other than tools/call, the params
// that identify the call: mcp2026.CallParams).
func approvalCall(call *gateway.Call) approval.Call {
	args := call.Arguments
	if args == nil {
		if call.Method == "tools/call" {
			args = call.Message.Arguments
		} else {
			args = mcp2026.CallParams(call.Message.Params)
		}
	}
	return approval.Call{Requester: call.Caller.User, Session: gateway.SessionRef(call.Session.ID), SessionStored: call.Session.Stored(),
		Service: call.Service.ID, Method: call.Method, Tool: call.Message.Name, Arguments: args}
}

// ask applies a request-stage ask: an approval of the identical call lets
// it through (proceed), a denial answers it, and otherwise the runner is
// told where the approval is decided — or, with approval_wait, the call is
// held for the pending approval (held), when mayHold.
func (h *RequestHandler) ask(w http.ResponseWriter, r *http.Request, call *gateway.Call, o outcome, d *gateway.Decision, input ast.Value, mayHold bool) (proceed bool, held *approval.Approval) {
	if !call.IsRequest() {
		call.Fail(w, http.StatusForbidden, gateway.CodePolicyDenied,
			"denied by policy: approval asked for a notification, which cannot wait for one ("+o.Reason+")", decisionData(d))
		return false, nil
	}
	spec, err := approval.ParseSpec(o.Approval)
	if err != nil {
		h.refuse(w, call, d, "the policy asked for an approval it cannot have: "+err.Error())
		return false, nil
	}
	ac := approvalCall(call)
	res, err := h.approvals.Resolve(r.Context(), approval.Ask{Call: ac, Stage: approval.StageRequest, Spec: spec,
		Decision: d, Revision: o.Revision, Masked: h.masked(r.Context(), withArguments(input, o.argsTerm), ac.Arguments), Base: h.app.BaseURL(r)})
	var tooMany *approval.ErrTooManyPending
	if errors.As(err, &tooMany) {
		call.Fail(w, http.StatusTooManyRequests, gateway.CodeUnavailable, "this call needs an approval, and "+err.Error(),
			map[string]any{"retryable": true, "limit": "max_pending_per_user", "max": tooMany.Max})
		return false, nil
	}
	if err != nil {
		h.logger.Error("approvals unavailable", zap.String("service", call.Service.ID), zap.Error(err))
		call.Unavailable(w, "this call needs an approval and approvals cannot be read or stored right now; retry later")
		return false, nil
	}
	switch res.Kind {
	case approval.Allow:
		return true, nil
	case approval.Denied:
		h.refuse(w, call, d, deniedBy(res.Approval))
		return false, nil
	}
	// A stateless call (2026-07-28) is not held: its runner takes no
	// requests on a stream, and gets an input_required round instead.
	if mayHold && h.ApprovalWait > 0 && acceptsSSE(r) && call.Stateless == nil {
		return false, res.Approval
	}
	refuseHeld(call, "it needs an approval: "+o.Reason)
	status, msg := h.pending(call, d, res.Approval, h.app.BaseURL(r))
	gateway.WriteRPC(w, status, msg)
	h.completeWhenDecided(call, res.Approval)
	return false, nil
}

// completeWhenDecided tells a runner that was told to open the approval
// page (-32042) when the approval is decided, with
// notifications/elicitation/complete on its MCP session's standalone
// stream: its client may then retry at once instead of asking its person.
// The watch ends with the MCP session or the approval.
func (c *Config) completeWhenDecided(call *gateway.Call, a *approval.Approval) {
	if !urlElicitation(call) {
		return
	}
	ms, board := call.MCPSession, c.notices
	c.approvals.WatchDecision(ms.Context(), ms.ID+"\x00"+a.ID, a, holdPoll, func(*approval.Approval) {
		board.Send(ms.ID, notification("notifications/elicitation/complete", map[string]any{"elicitationId": a.ID}))
	})
}

// withArguments is input with the arguments the policy rewrote (args; nil:
// none), so that a mask that depends on them is decided on what goes
// upstream, which is what approvers see.
func withArguments(input ast.Value, args *ast.Term) ast.Value {
	obj, ok := input.(ast.Object)
	if !ok || args == nil {
		return input
	}
	out := obj.Copy()
	out.Insert(keyArguments, args)
	return out
}

// masked is payload as approvers see it: the policy's
// data.toolgate.log.mask applied, as in the audit log.
func (h *RequestHandler) masked(ctx context.Context, input ast.Value, payload []byte) []byte {
	out, err := json.Marshal(h.engine.maskedPayload(ctx, input, stageRequest, payload))
	if err != nil {
		return nil
	}
	return out
}

// refuse answers a denial.
func (h *RequestHandler) refuse(w http.ResponseWriter, call *gateway.Call, d *gateway.Decision, reason string) {
	refuseHeld(call, reason)
	writeAnswer(w, call, refusal(call, d, reason))
}

// refusal is the answer to a denied request: a tool result the agent
// reads, or a JSON-RPC error for other methods.
func refusal(call *gateway.Call, d *gateway.Decision, reason string) []byte {
	if call.Method == "tools/call" {
		return gateway.RPCResult(call.Message.ID, gateway.ToolError(reason, d))
	}
	return gateway.RPCError(call.Message.ID, gateway.CodePolicyDenied, "denied: "+reason, decisionData(d))
}

// writeAnswer answers a request with msg (HTTP 200, so MCP clients read it).
func writeAnswer(w http.ResponseWriter, call *gateway.Call, msg []byte) {
	gateway.WriteRPC(w, http.StatusOK, msg)
}

func deniedBy(a *approval.Approval) string {
	s := "denied by " + a.DecidedBy
	if a.Note != "" {
		s += ": " + a.Note
	}
	return s
}

// pendingMessage tells the runner an approval is pending, the way its
// client understands: a 2025-11-25 client that declared URL elicitation
// gets -32042 with the approval page to open; any other gets -32012 with
// the page, the approval's id and its expiry. Either retries the identical
// call once it is decided.
func pendingMessage(call *gateway.Call, d *gateway.Decision, a *approval.Approval, base string) []byte {
	e := pendingError(call, d, a, base)
	return gateway.RPCError(call.Message.ID, e.Code, e.Message, e.Data)
}

// pendingError is the error of pendingMessage.
func pendingError(call *gateway.Call, d *gateway.Decision, a *approval.Approval, base string) *gateway.AnswerError {
	page := approval.URL(base, a)
	message := "approval required: " + a.Reason + " — approve it at " + page + ", then retry the identical call"
	if urlElicitation(call) {
		data := map[string]any{"elicitations": []map[string]any{{
			"mode": "url", "elicitationId": a.ID, "url": page, "message": message,
		}}, "decision_id": d.ID}
		return &gateway.AnswerError{Code: CodeURLElicitationRequired, Message: message, Data: data}
	}
	data := decisionData(d)
	data["approval_required"] = true
	data["approval_id"] = a.ID
	data["approval_url"] = page
	data["expires_at"] = a.ExpiresAt
	return &gateway.AnswerError{Code: gateway.CodeApprovalRequired, Message: message, Data: data}
}

// urlElicitation reports whether the runner speaks 2025-11-25 and declared
// URL-mode elicitation when it initialized.
func urlElicitation(call *gateway.Call) bool {
	if call.MCPSession == nil {
		return false
	}
	up := call.MCPSession.Upstream()
	if up.ProtocolVersion < "2025-11-25" {
		return false
	}
	return gjson.GetBytes(up.InitializeParams, "capabilities.elicitation.url").IsObject()
}

// resultApproval is the call a result-stage approval is about: the runner's
// request as approvals match it (so that its identical retry is released
// the answer), naming the task's tool for a request that names a task,
// within the MCP session that created the task (another session's task of
// the same id is another task).
func resultApproval(call *gateway.Call, rq *asked) approval.Call {
	ac := approvalCall(call)
	if rq != nil && rq.task != "" {
		ac.Tool = rq.view.Message.Name
		if call.MCPSession != nil {
			ac.Within = gateway.SessionRef(call.MCPSession.ID)
		}
	}
	return ac
}

// withhold applies a result-stage ask: the answer (result) is sealed with
// an approval, and the identical retry gets exactly that answer once it is
// approved (or a denial). toolForm: the answer is a tool result, and the
// runner is told in a tool error; otherwise in a JSON-RPC error.
func (h *ResultHandler) withhold(ctx context.Context, call *gateway.Call, s subject, v verdict, result []byte, base string, toolForm bool) ([]byte, error) {
	o, d := v.o, v.d
	fail := func(text string) ([]byte, error) {
		if toolForm {
			return gateway.ToolError(text, d), nil
		}
		return nil, &gateway.AnswerError{Code: gateway.CodePolicyDenied, Message: text, Data: decisionData(d)}
	}
	spec, err := approval.ParseSpec(o.Approval)
	if err != nil {
		return fail("the result was withheld: the policy asked for an approval it cannot have: " + err.Error())
	}
	if a := s.approved; a != nil && a.Covers(spec) {
		return result, nil // the approver's release stands under the changed policy
	}
	rq := &asked{view: s.view, task: s.task}
	ac := resultApproval(call, rq)
	shown := ac.Arguments
	if s.task != "" {
		shown = s.view.Arguments // what approvers judge is the task's call
	}
	// What the approval keeps is handed out later (released to the
	// runner, shown to approvers) without this call's relay: searched for
	// the call's secrets now, as the relay searches what the hooks write.
	result, ok := searchedResult(h.app, call, result)
	if !ok {
		return fail("the result was withheld: toolgate could not check it for the credential it attached")
	}
	maskedResult, _ := json.Marshal(h.engine.maskedPayload(ctx, v.input, stageResult, result))
	if maskedResult, ok = searchedResult(h.app, call, maskedResult); !ok {
		return fail("the result was withheld: toolgate could not check it for the credential it attached")
	}
	maskedArgs, _ := json.Marshal(h.engine.maskedPayload(ctx, v.input, stageRequest, shown))
	res, err := h.approvals.Resolve(ctx, approval.Ask{Call: ac, Stage: approval.StageResult, Spec: spec,
		Decision: d, Revision: o.Revision, Masked: maskedArgs, Result: result, MaskedResult: maskedResult, Base: base})
	var tooMany *approval.ErrTooManyPending
	switch {
	case errors.As(err, &tooMany):
		why := "the upstream's answer is withheld pending an approval, and " + err.Error()
		if !toolForm {
			return nil, &gateway.AnswerError{Code: gateway.CodeUnavailable, Message: why,
				Data: map[string]any{"retryable": true, "limit": "max_pending_per_user", "max": tooMany.Max}}
		}
		return fail(why)
	case err != nil:
		h.logger.Error("approvals unavailable; the result is withheld", zap.String("service", call.Service.ID), zap.Error(err))
		if !toolForm {
			return nil, &gateway.AnswerError{Code: gateway.CodeUnavailable, Data: gateway.Retryable,
				Message: "the upstream's answer is withheld pending an approval, and approvals are unavailable right now; retry later"}
		}
		return fail("the result is withheld pending an approval, and approvals are unavailable right now; retry later")
	case res.Kind == approval.Release && res.Approval.Revision != o.Revision:
		again := &asked{method: s.method, view: s.view, task: s.task}
		return h.judgeReleased(ctx, call, again, res, base)
	case res.Kind == approval.Release:
		return res.Result, nil
	case res.Kind == approval.Denied:
		return fail("the result was withheld: " + deniedBy(res.Approval))
	}
	a := res.Approval
	if !toolForm {
		h.completeWhenDecided(call, a)
		return nil, pendingError(call, d, a, base)
	}
	return withheldResult("the result is withheld pending approval: "+o.Reason+" — approve it at "+approval.URL(base, a)+
		", then retry the identical call", d, a, base), nil
}

// withheldResult is a tool error saying where the approval is decided,
// with the approval in _meta["toolgate/approval"].
func withheldResult(text string, d *gateway.Decision, a *approval.Approval, base string) []byte {
	out := gateway.ToolError(text, d)
	info, _ := json.Marshal(map[string]any{"id": a.ID, "url": approval.URL(base, a), "expires_at": a.ExpiresAt})
	meta := gjson.GetBytes(out, "_meta").Raw
	if meta == "" {
		meta = "{}"
	}
	return mcpmsg.ReplaceMember(out, "_meta", mcpmsg.ReplaceMember([]byte(meta), "toolgate/approval", info))
}

// released answers a retried request with the withheld answer an approver
// released, without calling the upstream again. It reports whether it
// answered.
func (h *ResultHandler) released(w http.ResponseWriter, r *http.Request, call *gateway.Call, rq *asked) bool {
	res, ok, err := h.approvals.Released(r.Context(), resultApproval(call, rq))
	if err != nil {
		if !errors.Is(err, approval.ErrNotFound) {
			h.logger.Warn("cannot read approvals; the call goes upstream", zap.String("service", call.Service.ID), zap.Error(err))
		}
		return false
	}
	if !ok {
		return false
	}
	answer := res.Result
	if res.Approval.Revision != h.engine.Revision() {
		var err error
		if answer, err = h.judgeReleased(r.Context(), call, rq, res, h.app.BaseURL(r)); err != nil {
			gateway.WriteRPC(w, http.StatusOK, h.answerFailed(call, err))
			return true
		}
	}
	// Searched again with this call: the caller's token may have changed
	// since the result was withheld (released answers skip the relay).
	out, ok := h.app.SearchAnswer(call, gateway.RPCResult(call.Message.ID, answer))
	if !ok {
		out = gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "toolgate could not check the released result for the credential it attached; it was withheld", nil)
	}
	gateway.WriteRPC(w, http.StatusOK, out)
	return true
}

// searchedResult is result (an answer's result member, or a copy of it)
// searched for call's secrets (App.SearchAnswer); false when it could not
// be. "null" (no copy) passes as it is.
func searchedResult(app *gateway.App, call *gateway.Call, result []byte) ([]byte, bool) {
	if string(result) == "null" {
		return result, true
	}
	out, ok := app.SearchAnswer(call, gateway.RPCResult(call.Message.ID, result))
	if !ok {
		return nil, false
	}
	return mcpmsg.MemberOf(out, "result"), true
}

// judgeReleased judges a withheld answer that res released again, when
// the policy that withheld it is no longer the one in force: the approver
// judged it under a policy that may since have learnt to deny or clean
// it. What the policy in force allows goes out as it allows it, what it
// denies is refused, and an ask is satisfied by the release only when its
// decider may decide what the policy now asks (else it asks anew).
func (h *ResultHandler) judgeReleased(ctx context.Context, call *gateway.Call, rq *asked, res approval.Resolution, base string) ([]byte, error) {
	again := *rq
	again.approved = res.Approval
	out, err := h.result(ctx, call, &again, res.Result, base)
	if err != nil || out == nil {
		return res.Result, err
	}
	return out.Bytes(), nil
}

// answerFailed is the runner's answer when judging a result failed: the
// hook's own error, or toolgate's.
func (h *ResultHandler) answerFailed(call *gateway.Call, err error) []byte {
	if answer, ok := gateway.HookAnswer(call.Message.ID, err); ok {
		return answer
	}
	h.logger.Error("cannot judge a released result; withholding it", zap.String("service", call.Service.ID), zap.Error(err))
	return gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "toolgate could not check the released result; it was withheld", nil)
}
