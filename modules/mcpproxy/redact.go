package mcpproxy

import (
	"bytes"
	"strings"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// credentialRedaction replaces the credential toolgate attached to a
// call's upstream requests wherever the upstream writes it back.
const credentialRedaction = "[REDACTED:credential]"

// minSecret is the shortest credential looked for in what an upstream
// sends: shorter values would be found in ordinary text.
const minSecret = 8

// secretOf is the part of a credential that must never reach a runner:
// the token after the scheme of an Authorization-style value ("Bearer
// <token>"), else the whole value; "" when too short to look for.
func secretOf(c *gateway.Credential) string {
	if c == nil {
		return ""
	}
	v := c.Value
	if scheme, token, ok := strings.Cut(v, " "); ok && scheme != "" && !strings.ContainsAny(scheme, "\"'") {
		v = strings.TrimSpace(token)
	}
	if len(v) < minSecret {
		return ""
	}
	return v
}

// mayHide reports whether raw, a JSON text that does not hold secret as
// it is, might hold it escaped. A secret without control characters,
// quotes or backslashes (a header value has none) can be hidden only by
// \uXXXX or \/ escapes: without those, the byte search said it all — and
// a megabyte of text with line breaks (\n) is not decoded for nothing.
func mayHide(raw []byte, secret string) bool {
	if strings.ContainsAny(secret, "\"\\") || strings.ContainsFunc(secret, func(r rune) bool { return r < 0x20 }) {
		return true
	}
	return bytes.Contains(raw, []byte(`\u`)) || bytes.Contains(raw, []byte(`\/`))
}

// redactCredential is msg with the call's credential replaced in every
// string it appears in, however the upstream escaped it: runners get
// results, never the caller's credential, whether or not the result
// policy knows its shape. A message without it is returned as it is, at
// the cost of a byte search (and the decoding of its strings that hold
// escapes).
func (h *Handler) redactCredential(call *gateway.Call, msg mcpmsg.Message) (mcpmsg.Message, error) {
	secret := secretOf(call.Credential)
	if secret == "" || !bytes.Contains(msg.Raw, []byte(secret)) && !mayHide(msg.Raw, secret) {
		return msg, nil
	}
	if !mcpmsg.ContainsString(msg.Raw, secret) {
		return msg, nil
	}
	raw, changed := mcpmsg.ReplaceStrings(msg.Raw, func(s string) (string, bool) {
		if !strings.Contains(s, secret) {
			return s, false
		}
		return strings.ReplaceAll(s, secret, credentialRedaction), true
	})
	if !changed {
		return msg, nil
	}
	h.logger.Warn("an upstream sent back the credential toolgate attached to the call; it is redacted",
		zap.String("service", call.Service.ID), zap.String("user", call.Caller.User), zap.String("method", msg.Method))
	return mcpmsg.Parse(raw, h.limits)
}
