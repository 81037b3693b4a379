package mcpproxy

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// redacted is the message raw as redactCredential leaves it for call,
// checked to be what it leaves when the raw bytes were searched while the
// message was parsed (a large message's way, parseRedacted).
func redacted(t *testing.T, h *Handler, call *gateway.Call, raw string) []byte {
	t.Helper()
	msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.redactCredential(call, msg)
	if err != nil {
		t.Fatal(err)
	}
	pre := startPrescan(call.Credential, msg.Raw)
	<-pre.done
	if alike, _, err := h.redacted(call, msg, pre); err != nil || string(alike.Raw) != string(got.Raw) {
		t.Errorf("searched while parsed: %s, %v; searched after: %s", alike.Raw, err, got.Raw)
	}
	return got.Raw
}

// An upstream that writes back the credential toolgate attached, however
// it escapes it, hands the runner a message without it; one that does not
// is left as it is.
func TestRedactCredential(t *testing.T) {
	h := testHandler()
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer tok-ABCdef/123"}}
	for _, c := range []struct{ text, want string }{
		{`"plain text"`, `"plain text"`},
		{`"carried Bearer tok-ABCdef/123"`, `"carried Bearer [REDACTED:credential]"`},
		{`"key tok-ABCdef\/123 is valid"`, `"key [REDACTED:credential] is valid"`},
		{`"\u0074ok-ABCdef/123"`, `"[REDACTED:credential]"`},
		{`"line\nbreak"`, `"line\nbreak"`},
		// Broken up by characters the result policy removes, which would
		// put it together again for the runner.
		{"\"key tok-ABC\u200bdef/123 is valid\"", `"key [REDACTED:credential] is valid"`},
		{`"key tok-\u2062ABCdef/1\u00ad23!"`, `"key [REDACTED:credential]!"`},
		{`"tok-ABC\udb40\udc20def/123 \u00e9"`, `"[REDACTED:credential] é"`},
		{`"tok-ABC\u00e9def/123 \u00e9"`, `"tok-ABC\u00e9def/123 \u00e9"`},
		{"\"tok-ABCdef/123 and t\u200bok-ABCdef/123 é\"", `"[REDACTED:credential] and [REDACTED:credential] é"`},
		{"\"plain \u200b text é\"", "\"plain \u200b text é\""},
	} {
		raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":` + c.text + `}]}}`
		if got, want := redacted(t, h, call, raw), strings.Replace(raw, c.text, c.want, 1); string(got) != want {
			t.Errorf("%s: got %s, want %s", c.text, got, want)
		}
	}
	// Encoded in base64, at each offset, as a blob or any other string:
	// encoded again without it; base64 that cannot be decoded goes whole.
	for _, text := range []string{"tok-ABCdef/123", "a tok-ABCdef/123", "X-Key: tok-ABCdef/123\n", "ab tok-ABCdef/123 cd", strings.Repeat("x", 100) + "tok-ABCdef/123"} {
		blob := base64.StdEncoding.EncodeToString([]byte(text))
		got := redacted(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"contents":[{"uri":"file:///k","blob":"`+blob+`"}]}}`)
		decoded, _ := base64.StdEncoding.DecodeString(gjson.GetBytes(got, "result.contents.0.blob").String())
		if want := strings.ReplaceAll(text, "tok-ABCdef/123", credentialRedaction); string(decoded) != want {
			t.Errorf("a blob of %q decodes to %q, want %q", text, decoded, want)
		}
	}
	// In a longer text, the run of base64 is encoded again; one that does
	// not decode is replaced; the rest of the text stays.
	for _, c := range []struct{ text, want string }{
		{"Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("alice:tok-ABCdef/123")) + " (line 2 of 50)",
			"Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+credentialRedaction)) + " (line 2 of 50)"},
		{"x " + base64.StdEncoding.EncodeToString([]byte("a tok-ABCdef/123")) + "YSB y", "x " + credentialRedaction + " y"},
	} {
		got := redacted(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"t":`+string(mcpmsg.Quote(c.text))+`}}`)
		if s := gjson.GetBytes(got, "result.t").String(); s != c.want {
			t.Errorf("%q: got %q, want %q", c.text, s, c.want)
		}
	}

	// In URL-safe base64, in lines, or with an escaped character.
	url := base64.URLEncoding.EncodeToString([]byte("~~" + "tok-ABCdef/123"))
	std := base64.StdEncoding.EncodeToString([]byte("key: tok-ABCdef/123 and more text"))
	for _, blob := range []string{url, std[:20] + `\n` + std[20:40] + `\n` + std[40:], `\u00` + fmt.Sprintf("%x", std[0]) + std[1:]} {
		got := redacted(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"contents":[{"uri":"file:///k","blob":"`+blob+`"}]}}`)
		b := gjson.GetBytes(got, "result.contents.0.blob").String()
		decoded, err := base64.StdEncoding.DecodeString(b)
		if err != nil {
			decoded, _ = base64.URLEncoding.DecodeString(b)
		}
		if strings.Contains(string(decoded), "tok-ABCdef/123") || !strings.Contains(string(decoded), credentialRedaction) {
			t.Errorf("a blob %s: decodes to %q", blob, decoded)
		}
	}
	// Split across text items, which runners join: refused.
	msg, err := mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"key tok-ABC"},{"type":"text","text":"def/123 end"}]}}`), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.redactCredential(call, msg); err == nil {
		t.Error("a credential split across two text items was not refused")
	}

	// Too short a value is not looked for (it would be found in ordinary text).
	short := &gateway.Call{Credential: &gateway.Credential{Header: "X-Key", Value: "abc"}}
	msg, _ = mcpmsg.Parse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"t":"abc"}}`), mcpmsg.Limits{})
	if got, _ := h.redactCredential(short, msg); string(got.Raw) != string(msg.Raw) {
		t.Errorf("a short value was redacted: %s", got.Raw)
	}
}

// Base64 of the credential in a longer text: on a log line, the next
// line's date is not taken into the decoding (a lenient decoder would
// read "2026-12-03" as base64 too); in a MIME part of thousands of lines,
// the lines holding it are re-encoded and the rest stays.
func TestRedactBase64InLinesOfText(t *testing.T) {
	h := testHandler()
	secret := "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer " + secret}}
	basic := base64.StdEncoding.EncodeToString([]byte("alice:" + secret))
	log := "07:25:30 outgoing Authorization: Basic " + basic + "\n2026-12-03 07:26:00 request 26 served\n"
	got := redacted(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":`+string(mcpmsg.Quote(log))+`}]}}`)
	text := gjson.GetBytes(got, "result.content.0.text").String()
	if strings.Contains(text, basic) || !strings.Contains(text, "\n2026-12-03 07:26:00 request 26 served\n") {
		t.Errorf("log line: %q", text)
	}
	payload := strings.Repeat("x", 300000) + "Authorization: Bearer " + secret + "\n"
	b64 := base64.StdEncoding.EncodeToString([]byte(payload))
	var lines []string
	for i := 0; i < len(b64); i += 76 {
		lines = append(lines, b64[i:min(len(b64), i+76)])
	}
	mime := "Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n" + strings.Join(lines, "\r\n") + "\r\n--b--\r\n"
	got = redacted(t, h, call, `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":`+string(mcpmsg.Quote(mime))+`}]}}`)
	text = gjson.GetBytes(got, "result.content.0.text").String()
	compact := strings.NewReplacer("\r", "", "\n", "").Replace(text)
	for _, w := range inBase64(secret).whole {
		if strings.Contains(compact, w) {
			t.Fatalf("the credential's base64 is still in the MIME part")
		}
	}
	if !strings.HasPrefix(text, "Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n"+lines[0]) {
		t.Errorf("the MIME part's head was not kept: %.200q", text)
	}
}

// TestHidingEscapesMatchesTheSearches checks the one-pass search of
// hidingEscapes against what it stands for — bytes.Contains of `\u` or
// `\/` — on every string of up to six bytes of an alphabet that holds
// those bytes and their neighbours (escaped backslashes, a backslash
// last), after 0 to 8 bytes of padding.
func TestHidingEscapesMatchesTheSearches(t *testing.T) {
	alphabet := []byte{'\\', 'u', '/', 'n', 0xc3, ']'}
	var b []byte
	var walk func(n int)
	checked := 0
	walk = func(n int) {
		want := bytes.Contains(b, []byte(`\u`)) || bytes.Contains(b, []byte(`\/`))
		if got := hidingEscapes(b); got != want {
			t.Fatalf("hidingEscapes(%q) = %v, want %v", b, got, want)
		}
		checked++
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			b = append(b, c)
			walk(n - 1)
			b = b[:len(b)-1]
		}
	}
	for pad := range 9 {
		b = bytes.Repeat([]byte{'a'}, pad)
		walk(6)
	}
	if checked < 9*50000 {
		t.Fatalf("checked only %d strings", checked)
	}
}
