package mcpproxy

import (
	"bytes"
	"slices"
	"strings"

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
	if !call.Credential.HasSecret() {
		return false
	}
	msg, ok := h.probe(call, out, given)
	if !ok {
		var err error
		if msg, err = mcpmsg.Parse(gateway.RPCResult(call.Message.ID, out.Bytes()), h.limits); err != nil {
			return true // answerAfterHooks withholds what cannot be read
		}
	}
	_, changed, err := h.redacted(call, msg, nil)
	return changed || err != nil
}

// keptMember names the placeholder member that stands for the upstream's
// members in a probe.
const keptMember = "toolgate/kept"

// probe is the answer of what the result hooks returned (out, for the
// result given) with the upstream's own members it keeps replaced by a
// placeholder member, parsed: what the hooks wrote, as a result of its
// own, to search instead of the whole — given was searched by
// redactCredential before the hooks ran, and a hook does not write into
// what it is given (gateway.ResultHook). The members count as kept only
// when out ends with a tail of given that starts right after its opening
// brace and holds members, the placeholder stands in the probe as a member
// of the result itself (not inside a key or a value the hooks opened, nor
// in an item of their own), and no key of the probe's result repeats one
// of given's, even in another case. The whole answer is then the probe's
// text with given's members in the placeholder's place, read by a runner
// as the probe is. false: search the whole.
func (h *Handler) probe(call *gateway.Call, out gateway.Result, given []byte) (mcpmsg.Message, bool) {
	n := len(out)
	for n > 0 && len(out[n-1]) == 0 {
		n--
	}
	if n == 0 {
		return mcpmsg.Message{}, false
	}
	tail := out[n-1]
	k := len(given) - len(tail)
	if k < 0 || &given[k] != &tail[0] || string(bytes.TrimSpace(given[:k])) != "{" {
		return mcpmsg.Message{}, false
	}
	members := bytes.TrimLeft(tail, " \t\r\n")
	if len(members) == 0 || members[0] == '}' {
		return mcpmsg.Message{}, false // nothing kept: the whole is small
	}
	var b []byte
	for _, p := range out[:n-1] {
		b = append(b, p...)
	}
	b = append(b, tail[:len(tail)-len(members)]...) // the blanks before the members
	b = append(b, `"`+keptMember+`":0}`...)
	msg, err := mcpmsg.Parse(gateway.RPCResult(call.Message.ID, b), h.limits)
	if err != nil || string(mcpmsg.MemberOf(msg.Result, keptMember)) != "0" {
		return mcpmsg.Message{}, false
	}
	var keys []string
	mcpmsg.Members(msg.Result, func(key, _ []byte) { keys = append(keys, string(key)) })
	repeated := false
	mcpmsg.Members(given, func(key, _ []byte) {
		repeated = repeated || slices.ContainsFunc(keys, func(k string) bool { return strings.EqualFold(k, string(key)) })
	})
	return msg, !repeated
}

// afterHooks is a message the hooks wrote with the call's credential
// redacted again, should they have put it together (see
// mayHoldCredential); false when it cannot be read, and must be withheld.
// It is read in full, as an upstream's message is.
func (h *Handler) afterHooks(call *gateway.Call, raw []byte) ([]byte, bool) {
	if !call.Credential.HasSecret() {
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
