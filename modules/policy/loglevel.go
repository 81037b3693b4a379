package policy

import (
	"context"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A client of protocol 2026-07-28 asks for a log level per request, in
// params._meta "io.modelcontextprotocol/logLevel", where a client of an
// earlier revision sends logging/setLevel (which the revision removed).
// Decided only as the request it rides on, a rule written for
// logging/setLevel would not hold for a runner that speaks the new
// revision: so the level is also decided as the logging/setLevel it stands
// for, params {"level": …}, with its own audit entry, and goes upstream
// only when that decision allows it.

// setLevelMethod is the method a stateless request's logLevel is decided
// as.
const setLevelMethod = "logging/setLevel"

// decideLogLevel decides the logLevel of a stateless message's _meta (its
// key in any case, as an upstream's decoder may read it) as the
// logging/setLevel it stands for. Unless that decision allows it, the
// member is removed from the message, which goes on without it (an ask
// too: a level cannot wait for an approval). An upstream known to
// initialize is never sent the revision's _meta members
// (mcp2026.StripMeta): nothing is decided for it.
func (h *RequestHandler) decideLogLevel(ctx context.Context, call *gateway.Call) {
	if call.Stateless == nil || call.Message.Meta == nil {
		return
	}
	key, level := mcpmsg.MemberFold(call.Message.Meta, mcp2026.MetaLogLevel)
	if level == nil {
		return
	}
	if ms := call.MCPSession; ms != nil {
		if up := ms.Upstream(); up.Generation > 0 && up.ProtocolVersion != mcp2026.Version {
			return
		}
	}
	params := make([]byte, 0, len(level)+10)
	params = append(append(append(params, `{"level":`...), level...), '}')
	m := *call
	m.Method = setLevelMethod
	m.Message = mcpmsg.Message{Kind: mcpmsg.Request, Method: setLevelMethod, Params: params, ID: []byte("0")}
	o, input := h.decideStandIn(ctx, commonItems(&m), &m, setLevelMethod)
	h.newDecision(ctx, &m, &o, stageRequest, params, nil, input)
	if o.Action == gateway.ActionAllow {
		return
	}
	meta := mcpmsg.RemoveMemberFold(call.Message.Meta, key)
	p := mcpmsg.ReplaceMember(call.Message.Params, "_meta", meta)
	call.Message.Raw = mcpmsg.ReplaceMember(call.Message.Raw, "params", p)
	call.Message.Params, call.Message.Meta = p, meta
	call.RequestInput = nil // built from the params as the runner sent them
}
