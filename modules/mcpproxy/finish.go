package mcpproxy

import (
	"bytes"
	"context"
	"net/http"
	"strings"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// What reaches the runner of an upstream's message passes the call's
// hooks here: a result the result hooks (the result policy), anything
// else the message hooks, toolgate's own marks dropped first; then it is
// written, in the pieces the hooks returned.

// inspect passes a notification or server→client request through the
// call's message hooks: it returns the message to relay (rebuilt when a
// hook replaced its params), or false when it must not reach the runner.
func (h *Handler) inspect(ctx context.Context, call *gateway.Call, msg mcpmsg.Message, channel string) ([]byte, bool) {
	if params, stripped := withoutOwnMarks(msg.Params); stripped {
		msg.Params, msg.Raw = params, rebuild(msg, params) // see withoutOwnMarks: marks in a request's or notification's too
	}
	if !call.HasMessageHooks() {
		return msg.Raw, true
	}
	params, changed, drop, err := call.RunMessageHooks(ctx, gateway.UpstreamMessage{Channel: channel, Method: msg.Method, Payload: msg.Params})
	switch {
	case err != nil:
		h.logger.Error("message hook failed; the message was not relayed", zap.String("service", call.Service.ID),
			zap.String("method", mcpmsg.LoggedMethod(msg.Method)), zap.Error(err))
		return nil, false
	case drop:
		return nil, false
	case !changed:
		return msg.Raw, true
	}
	return h.afterHooks(call, rebuild(msg, params))
}

// rebuild writes a notification or request again with other params.
func rebuild(msg mcpmsg.Message, params []byte) []byte {
	b := make([]byte, 0, 64+len(msg.ID)+len(msg.Method)+len(params))
	b = append(b, `{"jsonrpc":"2.0",`...)
	if msg.ID != nil {
		b = append(b, `"id":`...)
		b = append(b, msg.ID...)
		b = append(b, ',')
	}
	b = append(b, `"method":`...)
	b = mcpmsg.AppendQuote(b, msg.Method)
	b = append(b, `,"params":`...)
	b = append(b, params...)
	return append(b, '}')
}

// message is a JSON-RPC message for the runner, in up to four pieces
// written one after the other: a replaced result goes out inside its
// response's envelope, in the pieces the result hooks returned (the
// decision's _meta, then the upstream's own bytes), without being copied
// into one slice with it (for a result of a megabyte, a copy of a
// megabyte). None for no message.
type message [4][]byte

// resultMessage is the response to the runner's request id whose result
// is r.
func resultMessage(id []byte, r gateway.Result) message {
	m := message{gateway.RPCResultPrefix(id)}
	n := 1
	for _, p := range r {
		if p == nil {
			continue
		}
		if n == len(m)-1 {
			// More pieces than the message holds: join them (no hook
			// returns so many).
			m[1], n = r.Bytes(), 2
			break
		}
		m[n] = p
		n++
	}
	if n == 1 {
		m[1], n = []byte{}, 2
	}
	m[n] = rpcResultEnd
	return m
}

// parts returns the message's pieces.
func (m *message) parts() [][]byte {
	n := 0
	for n < len(m) && m[n] != nil {
		n++
	}
	return m[:n]
}

// none reports whether there is no message.
func (m *message) none() bool { return m[0] == nil }

// joined returns the message in one slice, copied only when it is in
// pieces.
func (m *message) joined() []byte {
	if m[1] == nil {
		return m[0]
	}
	return bytes.Join(m.parts(), nil)
}

// ownMetaPrefix starts the _meta keys toolgate writes into results (the
// decision, an approval, a federated service that was unavailable).
const ownMetaPrefix = "toolgate/"

// withoutOwnMarks returns an upstream's result without the members of its
// _meta whose keys start with ownMetaPrefix in any case (a runner matching
// keys without regard to case would take "Toolgate/approval" for
// toolgate's), and whether there were any: only toolgate writes such
// marks, whatever the method, so that none an upstream forges (an approval
// page of its choosing, a decision) reaches a runner as toolgate's.
//
// It finds _meta by skipping values quote to quote (mcpmsg.MemberSpan):
// every result passes here, and one of a megabyte of text whose _meta, if
// any, follows its content was read through at a third of a millisecond.
func withoutOwnMarks(result []byte) ([]byte, bool) {
	start, end, found := mcpmsg.MemberSpan(result, "_meta")
	if !found {
		return result, false
	}
	meta := result[start:end]
	own := false
	mcpmsg.Members(meta, func(key, _ []byte) {
		own = own || len(key) >= len(ownMetaPrefix) && strings.EqualFold(string(key[:len(ownMetaPrefix)]), ownMetaPrefix)
	})
	if !own {
		return result, false
	}
	out := make([]byte, 0, len(result))
	out = append(out, result[:start]...)
	out = append(out, mcpmsg.RemoveMembersWithPrefix(meta, ownMetaPrefix)...)
	return append(out, result[end:]...), true
}

// finish runs the result hooks on a successful response, and the message
// hooks on an error response. The message was read strictly, so the hooks
// inspect exactly what the runner will read. The upstream's own marks in
// toolgate's _meta namespace are dropped first (see withoutOwnMarks).
func (h *Handler) finish(ctx context.Context, call *gateway.Call, msg mcpmsg.Message) message {
	if msg.Result == nil {
		return message{h.finishError(ctx, call, msg)}
	}
	if mcp2026.AsksInput(msg.Result) {
		// Input requests are asked of a runner of an earlier revision as
		// server→client requests (askTranslated), never in a result: some
		// clients fulfil them wherever they find them.
		h.logger.Warn("refused an upstream's answer carrying input requests", zap.String("service", call.Service.ID))
		return message{gateway.RPCError(call.Message.ID, gateway.CodeUnavailable, "the upstream's answer was withheld: it carries input requests, which this client is not asked in a result", nil)}
	}
	result, stripped := withoutOwnMarks(msg.Result)
	if stripped {
		msg.Result = result
		msg.Raw = gateway.RPCResult(call.Message.ID, result)
	}
	if !call.HasResultHooks() {
		return message{msg.Raw}
	}
	out, err := call.RunResultHooks(ctx, msg.Result)
	if err != nil {
		return message{h.hookFailed(call, err)}
	}
	if out == nil {
		return message{msg.Raw}
	}
	m := resultMessage(call.Message.ID, out)
	if h.mayHoldCredential(call, out, msg.Result) {
		return message{h.answerAfterHooks(call, bytes.Join(m[:], nil))}
	}
	return m
}

// hookFailed answers the runner's request when a result hook did not pass
// the result: with the hook's own answer, or toolgate's error.
func (h *Handler) hookFailed(call *gateway.Call, err error) []byte {
	if answer, ok := gateway.HookAnswer(call.Message.ID, err); ok {
		// The hook's own words (a policy's reason quoting what it read)
		// are searched like anything else it writes.
		return h.answerAfterHooks(call, answer)
	}
	h.logger.Error("result hook failed; withholding the result", zap.String("service", call.Service.ID), zap.Error(err))
	return gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "toolgate could not check the result; it was withheld", nil)
}

// finishError passes the upstream's error response through the message
// hooks. A hook that refuses it leaves the runner toolgate's own error.
func (h *Handler) finishError(ctx context.Context, call *gateway.Call, msg mcpmsg.Message) []byte {
	payload, recoded := msg.Error, false
	if call.Service.Transport() == "" { // a transport module recodes its server's errors itself
		payload, recoded = gateway.OwnCodeRecoded(msg.Error)
	}
	if !call.HasMessageHooks() && !recoded {
		return msg.Raw
	}
	obj, changed, drop, err := payload, recoded, false, error(nil)
	if call.HasMessageHooks() {
		obj, changed, drop, err = call.RunMessageHooks(ctx, gateway.UpstreamMessage{Channel: gateway.ChannelError, Payload: payload})
		changed = changed || recoded
	}
	switch {
	case err != nil:
		h.logger.Error("message hook failed; withholding the upstream's error", zap.String("service", call.Service.ID), zap.Error(err))
		return gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "the upstream answered with an error, which toolgate could not check; it was withheld", nil)
	case drop:
		return gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "the upstream answered with an error, which toolgate withheld", nil)
	case !changed:
		return msg.Raw
	}
	b := make([]byte, 0, 40+len(call.Message.ID)+len(obj))
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, call.Message.ID...)
	b = append(b, `,"error":`...)
	b = append(b, obj...)
	return h.answerAfterHooks(call, append(b, '}'))
}

// rpcResultEnd closes a result response opened by gateway.RPCResultPrefix.
var rpcResultEnd = []byte{'}'}

// writeFinal writes the answer to the runner's request, as an SSE event
// when the runner gets a stream (with the event id given, "" for none),
// else as a JSON body. It reports whether the write succeeded.
func (h *Handler) writeFinal(w http.ResponseWriter, out *sseWriter, id string, msg message) bool {
	if out != nil {
		return out.sendLast(id, msg.parts()...) == nil
	}
	gateway.WriteRPC(w, http.StatusOK, msg.parts()...)
	return true
}
