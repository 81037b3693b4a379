package policy

import (
	"context"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A runner of 2026-07-28 initializes nothing: it declares its capabilities
// and identity in each request's _meta. In front of an upstream of an
// earlier revision, toolgate initializes an upstream session for it with
// what it declared (the implied MCP session). So that a rule written for
// initialize holds whichever revision the runner speaks, that initialize is
// decided as a runner's own would be — method "initialize", its params as
// they will be sent — before it is sent, with its own audit entry. Unless
// the decision allows it, nothing is sent and the runner's request is
// refused with the decision's reason (an ask too: opening a session cannot
// wait for an approval).

// initializeMethod is what the opening of an implied session is decided
// as.
const initializeMethod = "initialize"

// decideOpening is this handler's gate of its route (gateway.Route.
// DecideOpening, under every toolgate_policy of the route): it decides the
// initialize with params that opens call's implied MCP session, and
// returns a *gateway.OpeningRefused unless the decision allows it.
func (h *RequestHandler) decideOpening(ctx context.Context, call *gateway.Call, params []byte) error {
	m := *call
	m.Method = initializeMethod
	m.Message = mcpmsg.Message{Kind: mcpmsg.Request, Method: initializeMethod, Params: params, ID: []byte("0")}
	m.Tool, m.Arguments, m.RequestInput, m.Decision = nil, nil, nil, nil
	o, input := h.decideStandIn(ctx, commonItems(&m), &m, initializeMethod)
	d := h.newDecision(ctx, &m, &o, stageRequest, params, nil, input)
	if why := o.refusal("approval required, which opening a session cannot wait for: "); why != "" {
		return &gateway.OpeningRefused{Decision: d, Reason: why}
	}
	return nil
}
