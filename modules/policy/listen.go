package policy

import (
	"bytes"
	"context"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A subscriptions/listen (protocol 2026-07-28) subscribes to resources by
// naming them in its filter, where a runner of an earlier revision sends
// one resources/subscribe per resource. Decided only as a listen, a rule
// written for resources/subscribe would not hold for a runner that speaks
// the new revision: so each resource it names is also decided as the
// resources/subscribe an earlier revision would send, params {"uri": …},
// each with its audit entry, before the listen goes on.

// subscribeMethod is the method each resource of a listen is decided as.
const subscribeMethod = "resources/subscribe"

// decideSubscriptions completes o, the decision on a subscriptions/listen,
// with the decisions on the resources it names: any deny denies the listen
// (with that decision's reason), else any ask makes it ask. A listen the
// policy denied itself is not looked into.
//
// One approval answers every ask of the listen, so they must ask for the
// same one: asks with different approval objects (other deciders, scopes)
// deny the listen, as an approval of one of them would grant what another
// keeps for other approvers.
func (h *RequestHandler) decideSubscriptions(ctx context.Context, call *gateway.Call, o outcome) outcome {
	if call.Method != "subscriptions/listen" || o.Action == gateway.ActionDeny {
		return o
	}
	if !call.IsRequest() {
		// Sent as a notification it could not be acknowledged, and an
		// upstream that reads the method alone would subscribe.
		return o.deny(failMalformed, "subscriptions/listen is a request: send it with an id")
	}
	uris, refusal := mcp2026.ListenSubscriptions(call.Message.Params)
	if refusal != nil { // (a stateless runner's listen was refused before the policy: mcp2026.Check)
		return o.deny(failMalformed, refusal.Message)
	}
	var common [][2]*ast.Term
	var asks []string
	asked := o.Action == gateway.ActionAsk
	for _, uri := range uris {
		if common == nil {
			common = commonItems(call)
		}
		sub := *call
		sub.Method = subscribeMethod
		sub.Message.Method, sub.Message.URI, sub.Message.Name = subscribeMethod, uri, ""
		sub.Message.Params = mcpmsg.AppendQuote([]byte(`{"uri":`), uri)
		sub.Message.Params = append(sub.Message.Params, '}')
		so, input := h.decideStandIn(ctx, common, &sub, subscribeMethod)
		if so.Action == gateway.ActionAsk {
			if _, err := approval.ParseSpec(so.Approval); err != nil {
				so = so.deny(failMalformed, "the policy asked for an approval it cannot have: "+err.Error())
			} else if asked && !bytes.Equal(so.Approval, o.Approval) {
				so = so.deny(failMalformed, "the policy asks for another approval of this resource than of the rest of the subscriptions/listen; subscribe to it in a listen of its own")
			}
		}
		h.newDecision(ctx, &sub, &so, stageRequest, sub.Message.Params, nil, input)
		switch so.Action {
		case gateway.ActionDeny:
			return o.deny(so.Failure, "subscribing to "+strconv.Quote(uri)+" is denied: "+so.Reason)
		case gateway.ActionAsk:
			if !asked {
				asked, o.Approval = true, so.Approval
			}
			asks = append(asks, "subscribing to "+strconv.Quote(uri)+": "+so.Reason)
		}
	}
	if len(asks) > 0 {
		if o.Action == gateway.ActionAsk {
			asks = append([]string{o.Reason}, asks...)
		}
		o.Action, o.Reason = gateway.ActionAsk, strings.Join(asks, "; ")
	}
	return o
}

// decideStream decides the request toolgate sends upstream to serve a
// runner's standalone stream (toward an upstream of 2026-07-28, a
// subscriptions/listen for the list changes the upstream offers) as the
// runner's own request of that method and params, with its audit entry: a
// rule about subscriptions/listen holds whichever revision the runner
// speaks. An ask refuses it too: a stream cannot wait for an approval.
func (h *RequestHandler) decideStream(ctx context.Context, call *gateway.Call, method string, params []byte) string {
	m := *call
	m.Method = method
	m.Message = mcpmsg.Message{Kind: mcpmsg.Request, Method: method, Params: params, ID: []byte("0")}
	o, input := h.decideStandIn(ctx, commonItems(&m), &m, method)
	h.newDecision(ctx, &m, &o, stageRequest, params, nil, input)
	return o.refusal("approval required, which a stream cannot wait for: ")
}
