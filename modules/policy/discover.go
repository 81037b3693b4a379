package policy

import (
	"context"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A runner of 2026-07-28 learns from the result of server/discover what a
// runner of an earlier revision learns from the result of initialize: the
// upstream's capabilities, identity and instructions (toolgate answers it
// from the initialize it made upstream, when the upstream initializes). So
// that a rule written for initialize's result — one that keeps an
// upstream's instructions from the model — holds whichever revision the
// runner speaks, a server/discover result the policy allowed is decided
// again as the initialize result it stands for, with its own audit entry:
// denied or asked about, the discovery is withheld; rewritten, its
// capabilities, identity and instructions become the rewrite's.

// initializeAs are the members of an initialize result and where each is
// in a server/discover result: a member of its own, or of its _meta.
var initializeAs = []discoverMember{
	{"capabilities", "capabilities", false},
	{"serverInfo", mcp2026.MetaServerInfo, true},
	{"instructions", "instructions", false},
}

type discoverMember struct {
	initialize string // the member of initialize's result
	discover   string // the member of server/discover's result (or of its _meta)
	meta       bool
}

// of is the member's JSON in a server/discover result, nil when absent.
func (m discoverMember) of(discover []byte) []byte {
	if m.meta {
		discover = mcpmsg.MemberOf(discover, "_meta")
		if discover == nil || discover[0] != '{' {
			return nil
		}
	}
	return mcpmsg.MemberOf(discover, m.discover)
}

// set sets the member of a server/discover result to v, or removes it
// when v is nil.
func (m discoverMember) set(discover, v []byte) []byte {
	edit := func(obj []byte) []byte {
		if v == nil {
			return mcpmsg.RemoveMember(obj, m.discover)
		}
		return mcpmsg.ReplaceMember(obj, m.discover, v)
	}
	if !m.meta {
		return edit(discover)
	}
	meta := mcpmsg.MemberOf(discover, "_meta")
	if meta == nil || meta[0] != '{' {
		if v == nil {
			return discover
		}
		meta = []byte("{}")
	}
	return mcpmsg.ReplaceMember(discover, "_meta", edit(meta))
}

// discoverAsInitialize decides discover, a server/discover result the
// policy allowed, as the initialize result it stands for, and returns the
// discovery to send (nil when it is discover unchanged).
func (h *ResultHandler) discoverAsInitialize(ctx context.Context, call *gateway.Call, discover []byte) (gateway.Result, error) {
	init := []byte(`{"protocolVersion":"` + mcp2026.Version + `"`)
	for _, m := range initializeAs {
		if v := m.of(discover); v != nil {
			init = append(init, `,"`+m.initialize+`":`...)
			init = append(init, v...)
		}
	}
	init = append(init, '}')
	stand := *call
	stand.Method = "initialize"
	stand.Message = mcpmsg.Message{Kind: mcpmsg.Request, ID: call.Message.ID, Method: "initialize", Params: initializeParams(call)}
	v := h.evaluate(ctx, &stand, subject{channel: channelResult, method: "initialize", view: &stand}, init)
	if v.o.Action != gateway.ActionAllow {
		return nil, withheldError(v.d, "as the result of initialize it stands for: "+v.o.Reason)
	}
	if v.o.Result == nil {
		return nil, nil
	}
	rewritten, ok := v.o.Result.Value.(ast.Object)
	if !ok {
		return nil, withheldError(v.d, "the policy replaced the result of initialize with something other than an object")
	}
	out := discover
	for _, m := range initializeAs {
		var b []byte
		if t := rewritten.Get(ast.InternedTerm(m.initialize)); t != nil {
			var err error
			if b, err = appendJSON(nil, t, v.spans); err != nil {
				return nil, withheldError(v.d, "the policy's result of initialize cannot be written as JSON")
			}
		}
		out = m.set(out, b)
	}
	return gateway.Whole(out), nil
}

// initializeParams are the params of the initialize a stateless runner's
// request stands for: the capabilities and identity it declared.
func initializeParams(call *gateway.Call) []byte {
	p := []byte(`{"protocolVersion":"` + mcp2026.Version + `","capabilities":`)
	caps := []byte("{}")
	var info []byte
	if st := call.Stateless; st != nil {
		if st.Capabilities != nil {
			caps = st.Capabilities
		}
		info = st.ClientInfo
	}
	p = append(p, caps...)
	if info != nil {
		p = append(p, `,"clientInfo":`...)
		p = append(p, info...)
	}
	return append(p, '}')
}
