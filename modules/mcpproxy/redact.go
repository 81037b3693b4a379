package mcpproxy

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

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
// it is, might hold it escaped or broken up by invisible characters. A
// secret without control characters, quotes or backslashes (a header
// value has none) can be hidden only by \uXXXX or \/ escapes, or by
// characters outside ASCII that the result policy removes: without those,
// the byte search said it all — and a megabyte of text with line breaks
// (\n) is not decoded for nothing.
func mayHide(raw []byte, secret string) bool {
	if strings.ContainsAny(secret, "\"\\") || strings.ContainsFunc(secret, func(r rune) bool { return r < 0x20 }) {
		return true
	}
	return bytes.Contains(raw, []byte(`\u`)) || bytes.Contains(raw, []byte(`\/`)) || !isASCII(raw)
}

// mayBreak reports whether raw may hold a character that ignorable
// reports, as it is or escaped (\uXXXX, or a surrogate pair of them).
func mayBreak(raw []byte) bool {
	if !isASCII(raw) && bytes.ContainsFunc(raw, ignorable) {
		return true
	}
	for i := 0; ; {
		j := bytes.Index(raw[i:], []byte(`\u`))
		if j < 0 {
			return false
		}
		i += j + 2
		r, ok := hex4(raw, i)
		if !ok {
			continue
		}
		if utf16.IsSurrogate(r) {
			if lo, ok := hex4(raw, i+6); ok && bytes.HasPrefix(raw[i+4:], []byte(`\u`)) {
				r = utf16.DecodeRune(r, lo)
			}
		}
		if ignorable(r) {
			return true
		}
	}
}

// hex4 is the code unit written in the four hexadecimal digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[i:i+4]), 16, 16)
	return rune(n), err == nil
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// ignorable reports whether r renders as nothing: a format character
// (Cf: zero-width spaces and joiners, bidirectional controls, tags …), a
// default-ignorable code point or a variation selector. The default
// result policy removes these (text.rego's invisible_ranges, a subset), so
// a credential broken up by them would be whole again by the time the
// runner reads it.
func ignorable(r rune) bool {
	return r >= 0x80 && unicode.In(r, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// redactIn is s with every occurrence of secret replaced, also where
// ignorable characters break it up (the whole span goes then); false when
// s holds none.
func redactIn(s, secret string) (string, bool) {
	changed := false
	if strings.Contains(s, secret) {
		s, changed = strings.ReplaceAll(s, secret, credentialRedaction), true
	}
	if !strings.ContainsFunc(s, ignorable) {
		return s, changed
	}
	// The text without ignorable characters, and where each of its bytes
	// is in s.
	var seen strings.Builder
	at := make([]int, 0, len(s))
	for i, r := range s {
		if !ignorable(r) {
			n, _ := seen.WriteRune(r)
			for range n {
				at = append(at, i)
			}
		}
	}
	text := seen.String()
	var out strings.Builder
	last := 0
	for from := 0; ; {
		i := strings.Index(text[from:], secret)
		if i < 0 {
			break
		}
		start, end := from+i, from+i+len(secret)
		spanEnd := len(s)
		if end < len(text) {
			spanEnd = at[end]
		}
		out.WriteString(s[last:at[start]])
		out.WriteString(credentialRedaction)
		last, from = spanEnd, end
	}
	if last == 0 {
		return s, changed
	}
	out.WriteString(s[last:])
	return out.String(), true
}

// redactCredential is msg with the call's credential replaced in every
// string it appears in, however the upstream escaped it: runners get
// results, never the caller's credential, whether or not the result
// policy knows its shape. A message without it is returned as it is, at
// the cost of a byte search (and the decoding of its strings that hold
// escapes).
func (h *Handler) redactCredential(call *gateway.Call, msg mcpmsg.Message) (mcpmsg.Message, error) {
	secret := secretOf(call.Credential)
	if secret == "" {
		return msg, nil
	}
	encoded := inBase64(secret)
	if !bytes.Contains(msg.Raw, []byte(secret)) && !mayHide(msg.Raw, secret) && !containsAny(msg.Raw, encoded) {
		return msg, nil
	}
	if !mcpmsg.ContainsString(msg.Raw, secret) && !mayBreak(msg.Raw) && !containsAny(msg.Raw, encoded) {
		return msg, nil
	}
	raw, changed := mcpmsg.ReplaceStrings(msg.Raw, func(s string) (string, bool) {
		if containsAny([]byte(s), encoded) {
			return redactBase64(s, secret)
		}
		return redactIn(s, secret)
	})
	if !changed {
		return msg, nil
	}
	h.logger.Warn("an upstream sent back the credential toolgate attached to the call; it is redacted",
		zap.String("service", call.Service.ID), zap.String("user", call.Caller.User), zap.String("method", msg.Method))
	return mcpmsg.Parse(raw, h.limits)
}

// inBase64 is what secret looks like inside base64 (standard encoding) at
// each of the three offsets it can have in the bytes encoded: the
// characters that encode its bytes alone. A blob (a resource's, or any
// base64 an upstream sends) holding the credential holds one of them.
func inBase64(secret string) [3]string {
	var out [3]string
	for k := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), secret...))
		first := (8*k + 5) / 6              // the first character whose bits are all the secret's
		last := (8*(k+len(secret)) - 6) / 6 // the last
		out[k] = enc[first : last+1]
	}
	return out
}

func containsAny(b []byte, subs [3]string) bool {
	for _, sub := range subs {
		if bytes.Contains(b, []byte(sub)) {
			return true
		}
	}
	return false
}

// redactBase64 is s, base64 that holds secret in what it encodes, encoded
// again with the secret replaced; s is replaced whole when it cannot be
// decoded (a runner decoding leniently could still read the secret).
func redactBase64(s, secret string) (string, bool) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return credentialRedaction, true
	}
	return base64.StdEncoding.EncodeToString(bytes.ReplaceAll(b, []byte(secret), []byte(credentialRedaction))), true
}
