package policy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// pending tells the runner an approval is pending, the way its client
// understands (see pendingMessage), with the HTTP status of the answer. A
// runner of the stateless revision (2026-07-28) gets an input_required
// result: a URL-mode elicitation of the approval page and a requestState
// toolgate sealed, bound to the caller, the toolgate session, the service,
// the tool, the arguments and the approval's expiry, which its retry
// echoes (toolgate_registry verifies it and uses it up). One that did not
// declare URL elicitation gets MissingRequiredClientCapability (HTTP 400)
// naming it, with the approval's page, instead of an input request it
// cannot handle.
func (h *RequestHandler) pending(call *gateway.Call, d *gateway.Decision, a *approval.Approval, base string) (int, []byte) {
	if call.Stateless == nil {
		return http.StatusOK, pendingMessage(call, d, a, base)
	}
	page := approval.URL(base, a)
	message := "approval required: " + a.Reason + " — approve it at " + page + ", then retry"
	need, declared := mcp2026.RequiredCapability(call.Stateless.Capabilities, "elicitation/create", gjsonURLMode)
	rt, err := mcp2026.For(h.app)
	if !declared || err != nil {
		data := mcp2026.MissingCapability(need)
		data["decision_id"] = d.ID
		data["approval_id"] = a.ID
		data["approval_url"] = page
		data["expires_at"] = a.ExpiresAt
		return http.StatusBadRequest, gateway.RPCError(call.Message.ID, mcp2026.CodeMissingRequiredClientCapability,
			message+" (declare the elicitation.url capability to be asked in band)", data)
	}
	ttl := time.Until(a.ExpiresAt)
	asked := mcp2026.StateOf(call.Caller.User, gateway.SessionRef(call.Session.ID), call.Service.ID, call.Message)
	asked.Approval = a.ID
	if st := call.Stateless; st.Relayed {
		// The retry answers an upstream's input requests too: its
		// requestState, and what its answers answer, go on in this one.
		asked.Relayed, asked.Upstream, asked.Inputs = true, st.UpstreamState, st.Inputs
	}
	state, err := rt.Seal(asked, ttl)
	if err != nil {
		h.logger.Error("cannot seal a requestState", zap.Error(err))
		return http.StatusOK, pendingMessage(call, d, a, base)
	}
	info, _ := json.Marshal(map[string]any{"id": a.ID, "url": page, "expires_at": a.ExpiresAt})
	result := mcp2026.ApprovalInput(page, message, state, gateway.AppendDecisionMeta(nil, d), info)
	return http.StatusOK, gateway.RPCResult(call.Message.ID, result)
}

// pendingFinal is pending's message, as the last event of a held stream.
func (h *RequestHandler) pendingFinal(call *gateway.Call, d *gateway.Decision, a *approval.Approval, base string) []byte {
	_, msg := h.pending(call, d, a, base)
	return msg
}

// gjsonURLMode is the params of a URL-mode elicitation, for
// RequiredCapability.
var gjsonURLMode = gjson.Parse(`{"mode":"url"}`)

var (
	keyInputResponses = ast.StringTerm("input_responses")
	keyRequestState   = ast.StringTerm("request_state")
)

// roundItems adds what a retried round of a multi round-trip request
// (2026-07-28) carries besides its arguments or params: the client's
// input_responses, and the request_state it echoes (opaque: the policy
// sees that it is there and what it says, nothing it could verify).
func roundItems(items [][2]*ast.Term, call *gateway.Call) ([][2]*ast.Term, error) {
	if ir := call.Message.InputResponses; ir != nil {
		t, err := jsonTerm(ir)
		if err != nil {
			return nil, fmt.Errorf("inputResponses: %w", err)
		}
		items = append(items, ast.Item(keyInputResponses, t))
	}
	if rs, ok := mcpmsg.String(call.Message.RequestState); ok {
		items = append(items, ast.Item(keyRequestState, ast.StringTerm(rs)))
	}
	return items, nil
}

// refuseHeld records why the policy refused a retry that would have
// continued a held call: toolgate_registry releases the call, which
// nothing else would continue (its requestState is used up), with this
// reason.
func refuseHeld(call *gateway.Call, reason string) {
	if call.Stateless != nil && call.Stateless.Held != "" {
		call.Stateless.Refused = "toolgate's policy denied the client's retry: " + reason
	}
}
