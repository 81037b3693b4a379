package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A runner of an earlier revision answers an upstream's server→client
// request (elicitation/create, sampling/createMessage, roots/list) with a
// JSON-RPC response, which the request policy decides as that answer. A
// runner of 2026-07-28 answers the same requests, when toolgate holds an
// upstream's exchange for it, in the input responses of its retried
// request. So that a rule about answers holds whichever revision the runner
// speaks, each of those is decided as the answer it stands for, besides
// the retried request itself.

// decideInputResponses decides each input response of a stateless
// runner's retry as the answer to the upstream request it answers (method:
// that request's; result: the response), each with its audit entry: for a
// retry that continues a held exchange, or that echoes the requestState
// toolgate sealed in place of an upstream's (mcp2026.Relay), the request
// toolgate relayed under its key. An answer toolgate relayed no request
// for goes to an upstream of 2026-07-28 all the same (a server that keeps
// no state cannot tell it from the answer to its own request): it is
// decided as the answer to each method an input request may have, and
// allowed only when all are. Those the policy does not allow are withheld
// (gateway.Stateless.Withheld): a held exchange's upstream gets toolgate's
// error in their place, an upstream of 2026-07-28 the retry without them;
// nothing of the runner's. An ask withholds too: an answer cannot wait for
// an approval.
func (h *RequestHandler) decideInputResponses(ctx context.Context, call *gateway.Call) {
	st := call.Stateless
	if st == nil || call.Message.InputResponses == nil {
		return
	}
	if ms := call.MCPSession; st.Held == "" && ms != nil {
		if up := ms.Upstream(); up.Generation > 0 && up.ProtocolVersion != mcp2026.Version {
			return // an upstream that initializes never gets them (mcp2026.WithoutRetry)
		}
	}
	var common [][2]*ast.Term
	gjson.ParseBytes(call.Message.InputResponses).ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		method := st.Inputs[key]
		switch {
		case st.OwnState && key == mcp2026.OwnInput:
			return true // toolgate's own (an approval's), never sent upstream
		case st.Held != "" && (method == "" || !v.IsObject()):
			return true // the held exchange takes only answers to what it asked (the proxy refuses the rest)
		}
		methods := mcp2026.AnswerMethods(method, []byte(v.Raw))
		if common == nil {
			common = commonItems(call)
		}
		for _, method := range methods {
			if o := h.decideAnswer(ctx, common, call, method, []byte(v.Raw)); o.Action != gateway.ActionAllow {
				if st.Withheld == nil {
					st.Withheld = make(map[string]bool)
				}
				st.Withheld[key] = true
				break
			}
		}
		return true
	})
}

// decideAnswer decides result as a runner's answer to a request of
// method, on the common input members of call (the runner's message), with
// its audit entry.
func (h *RequestHandler) decideAnswer(ctx context.Context, common [][2]*ast.Term, call *gateway.Call, method string, result []byte) outcome {
	answer := *call
	answer.Method = method
	answer.Message.Kind, answer.Message.Method, answer.Message.Result = mcpmsg.Response, method, result
	answer.Message.Params, answer.Message.Error, answer.Message.Arguments = nil, nil, nil
	answer.Message.Name, answer.Message.URI = "", ""
	o, input := h.decideStandIn(ctx, common, &answer, "an answer to "+method)
	h.newDecision(ctx, &answer, &o, stageRequest, result, nil, input)
	return o
}

// decideAnswerShape decides a runner's answer to a server→client request,
// allowed as the answer to that request (call.Method), also as each other
// method its shape may be read as (mcp2026.AnswerMethods): toolgate hands
// the answer to an upstream of 2026-07-28 in inputResponses, where a
// server may tell its type by its members. It returns why the answer is
// withheld, or "".
func (h *RequestHandler) decideAnswerShape(ctx context.Context, call *gateway.Call) string {
	if call.Message.Kind != mcpmsg.Response || call.Message.Result == nil {
		return ""
	}
	methods := mcp2026.AnswerMethods(call.Method, call.Message.Result)
	if len(methods) < 2 {
		return ""
	}
	common := commonItems(call)
	for _, method := range methods[1:] {
		o := h.decideAnswer(ctx, common, call, method, call.Message.Result)
		if why := o.refusal("an approval was asked for the client's answer, which cannot wait for one: "); why != "" {
			return why
		}
	}
	return ""
}

// decideStandIn decides m, a message toolgate makes up to stand for part
// of the runner's (what) — a resource of a listen as a resources/subscribe,
// an input response as an answer — on the common input members of the
// runner's message. Its decision may not rewrite arguments: only a
// tools/call's are.
func (h *RequestHandler) decideStandIn(ctx context.Context, common [][2]*ast.Term, m *gateway.Call, what string) (outcome, ast.Value) {
	input, err := inputFor(common, m, nil, false)
	if err != nil {
		return outcome{}.deny(failError, "the gateway could not build the policy input"), nil
	}
	o := h.engine.decide(ctx, input, time.Duration(h.Timeout), "arguments")
	if (o.argsTerm != nil || o.Arguments != nil) && o.Action != gateway.ActionDeny {
		o = o.deny(failMalformed, "the policy rewrote the arguments of "+what+"; toolgate rewrites only those of tools/call")
	}
	return o, input
}

// decideRound decides a round toolgate sends for a runner of an earlier
// revision to an upstream of 2026-07-28 (the runner's request sent again
// with the answers it gave and the upstream's requestState) as the retried
// request it is, with input_responses and request_state, as a stateless
// runner's own retry is decided. It returns why the round must not be
// sent: a deny; an ask, which a round cannot wait for; or a rewrite of
// other arguments than those the call was sent with (only a tools/call's
// are rewritten).
func (h *RequestHandler) decideRound(ctx context.Context, call *gateway.Call, inputResponses, requestState []byte) string {
	round := *call
	round.Message.InputResponses, round.Message.RequestState = inputResponses, requestState
	var tool *ast.Term
	if call.Method == "tools/call" {
		tool = toolTerm(call.ToolDefinition(), call.Message.Name, call.Service)
	}
	o := outcome{}.deny(failError, "the gateway could not build the policy input")
	input, err := inputFor(commonItems(&round), &round, tool, false)
	if err == nil {
		o = h.engine.decide(ctx, input, time.Duration(h.Timeout), "arguments")
		switch {
		case (o.argsTerm != nil || o.Arguments != nil) && call.Method != "tools/call" && o.Action != gateway.ActionDeny:
			o = o.deny(failMalformed, "the policy rewrote the arguments of "+call.Method+"; toolgate rewrites only those of tools/call")
		case o.Arguments != nil && o.Action != gateway.ActionDeny:
			if args, err := json.Marshal(o.Arguments); err != nil || !bytes.Equal(args, argumentsOf(call)) {
				o = o.deny(failMalformed, "the policy rewrites this round's arguments otherwise than those the call was sent with; send the call again")
			}
		}
	}
	h.newDecision(ctx, &round, &o, stageRequest, argumentsOf(call), nil, input)
	return o.refusal("approval required for the answers given during this call, which cannot wait for one: ")
}

// refusal is why a message toolgate sends in the runner's place, decided
// as o, must not be sent: "" when it is allowed, the reason when it is
// denied, and for an ask the reason after asked (it cannot wait for an
// approval).
func (o outcome) refusal(asked string) string {
	switch o.Action {
	case gateway.ActionAllow:
		return ""
	case gateway.ActionAsk:
		return asked + o.Reason
	}
	return o.Reason
}
