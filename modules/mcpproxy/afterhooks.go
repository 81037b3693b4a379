package mcpproxy

import (
	"bytes"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// What the hooks write (the result policy's replacement of a result, a
// message hook's of a notification's params, a hook's own answer) is
// searched for the call's credential again before the runner gets it: a
// policy that removes invisible characters can put together a credential
// that an upstream wrote broken up, which redactCredential let pass.

// mayHoldCredential reports whether what the result hooks returned (out,
// for the result they were given) may hold the call's credential: a policy
// that removes invisible characters (from text, or from a blob of text)
// can put together a credential that an upstream wrote broken up. It is
// searched in full, as an upstream's message is; when out keeps the
// upstream's own members (see probe), only what the hooks wrote around
// them is, so that a megabyte the policy let through is not searched
// twice.
func (h *Handler) mayHoldCredential(call *gateway.Call, out gateway.Result, given []byte) bool {
	if secretOf(call.Credential) == "" {
		return false
	}
	res, ok := probe(out, given)
	if !ok {
		res = out.Bytes()
	}
	msg, err := mcpmsg.Parse(gateway.RPCResult(call.Message.ID, res), h.limits)
	if err != nil {
		return true // answerAfterHooks withholds what cannot be read
	}
	_, changed, err := h.redacted(call, msg)
	return changed || err != nil
}

// probe is out, what the result hooks returned for the result given, with
// the upstream's own members it keeps replaced by a placeholder member:
// what the hooks wrote, as a result of its own. The members are kept when
// a piece of out is a tail of given (a hook does not write into what it is
// given, gateway.ResultHook) that starts right after given's opening
// brace, so that no string of it began in what the hooks wrote: given was
// searched by redactCredential before the hooks ran. false: out keeps no
// such tail.
func probe(out gateway.Result, given []byte) ([]byte, bool) {
	for i, p := range out {
		k := len(given) - len(p)
		if len(p) == 0 || k < 0 || &given[k] != &p[0] || string(bytes.TrimSpace(given[:k])) != "{" {
			continue
		}
		placeholder := `"":0}`
		if t := bytes.TrimLeft(p, " \t\r\n"); len(t) > 0 && t[0] == '}' {
			placeholder = "}"
		}
		var b []byte
		for _, q := range out[:i] {
			b = append(b, q...)
		}
		b = append(b, placeholder...)
		for _, q := range out[i+1:] {
			b = append(b, q...)
		}
		return b, true
	}
	return nil, false
}

// afterHooks is a message the hooks wrote with the call's credential
// redacted again, should they have put it together (see
// mayHoldCredential); false when it cannot be read, and must be withheld.
// It is read in full, as an upstream's message is.
func (h *Handler) afterHooks(call *gateway.Call, raw []byte) ([]byte, bool) {
	if secretOf(call.Credential) == "" {
		return raw, true
	}
	msg, err := mcpmsg.Parse(raw, h.limits)
	if err == nil {
		msg, err = h.redactCredential(call, msg)
	}
	if err != nil {
		h.logger.Error("a message the result policy wrote cannot be read; it was withheld", zap.String("service", call.Service.ID), zap.Error(err))
		return nil, false
	}
	return msg.Raw, true
}

// answerAfterHooks is afterHooks for the answer to the runner's request,
// which toolgate's error replaces when it must be withheld.
func (h *Handler) answerAfterHooks(call *gateway.Call, raw []byte) []byte {
	if out, ok := h.afterHooks(call, raw); ok {
		return out
	}
	return gateway.RPCError(call.Message.ID, gateway.CodeInternalError, "toolgate could not check the answer for the credential it attached; it was withheld", nil)
}
