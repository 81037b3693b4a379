package integration

// Third round on the result policy's redaction and the credential
// redaction, after 9ecc432, 7639bcd and 937ab26 (spans.go, the blob text
// count, the credential in base64 of either alphabet and after the
// hooks). Same setup as adversarial_redaction_test.go and
// adversarial_redaction2_test.go, whose helpers these use. Two kinds of
// finding: false positives (an ordinary result withheld or corrupted) and
// secrets still reaching the runner.
//
// Attack (fixed): TestRedaction3AttackSecretWhollyInOneItemRefused — false
//   positive: a tool result of three or more text items laid out as label
//   / value / label ("Your session token:" | <JWT> | "Expires in 3600
//   seconds.", "access_token:" | <token> | "expires_in:" | "3599",
//   "Header:" | "Bearer <token>" | "OK"), the secret wholly in one item. The
//   policy redacts it in place (the seams as well), but spans.go matches the
//   joined text: the pattern's boundary character is the last of the item
//   before, its token runs on into the next item's first word, so the
//   match "crosses two boundaries" and the whole result is refused.
// Attack (fixed): TestRedaction3AttackPemHeaderMentionInChunkedLogRefused — false
//   positive: a log streamed one line per text item, one line quoting a PEM
//   BEGIN line ("expected -----BEGIN RSA PRIVATE KEY-----"): the policy
//   redacts that line from the BEGIN line on; spans.go's match of the
//   BEGIN alternative ([\s\S]* to the window's end) runs through the next
//   4 KB of items and the whole log is refused.
// Attack (fixed): TestRedaction3AttackBinaryBlobThatIsValidUTF8Stripped — false
//   positive (corruption): a binary blob (application/x-protobuf,
//   application/octet-stream) whose bytes happen to be valid UTF-8 was
//   taken for text, and its "invisible characters" removed: a protobuf
//   whose string field holds an emoji ZWJ sequence lost 6 bytes and no
//   longer parsed; a record with a UTF-8 BOM inside lost 3. Only blobs
//   without a mimeType or with one of text are text now (a blob without a
//   mimeType that is valid UTF-8 still is: runners cannot tell either).
// Attack (fixed): TestRedaction3AttackPemKeyCutOffAcrossItems — a private key cut
//   off upstream (BEGIN line, no END line) whose first text item holds
//   more than 1024 characters of body: the policy redacts item 0 from
//   BEGIN on, no seam is listed (no marker within 1024 characters of it),
//   spans.go does not look at two items, and with three the [\s\S]* match
//   stops at the window's end (4096 bytes) before the second boundary: the
//   rest of the key body reaches the runner.
// Attack (fixed): TestRedaction3AttackPemKeyEndOnlyAcrossItems — the other half:
//   a key whose BEGIN line is cut off (the policy's `\A…-----END` branch
//   redacts such a body from the start of the text). Its body across two
//   or three text items: the seam redacts the last 1024 characters of the
//   item before, spans.go's window starts 128 bytes before the marker, and
//   the first lines of the body reach the runner.
// Not kept as tests (known limits, in policies/README.md): the
//   credential's base64 broken into lines shorter than twelve characters,
//   and a token that runs more than 1024 characters past the seam between
//   two text items (the seam window) — only the window's part is redacted.
// Attack (fixed): TestRedaction3AttackContentTypeQuotedInError — an upstream that
//   answers a call with a Content-Type that is neither JSON nor SSE gets
//   it quoted in toolgate's own error ("the upstream answered with
//   Content-Type %q"), which no hook and no credential redaction sees: a
//   Content-Type carrying an AWS key id and the credential toolgate
//   attached reaches the runner.
// Attack (fixed): TestRedaction3AttackReinitializeErrorQuoted — the upstream forgets
//   the session (404) and answers toolgate's own initialize with an error:
//   its message is quoted in toolgate's error ("the upstream did not
//   re-create the session: %s") without the message policy: an AWS key id
//   and a Slack webhook in it reach the runner, where the same error
//   answering the runner's call is redacted.
// Attack (fixed): TestRedaction3AttackCredentialBase64WipesWholeText — false
//   positive (over-redaction): a log in one text item, one line of which
//   holds an outgoing "Authorization: Basic base64(alice:<credential>)":
//   redactBase64 cannot decode the whole string, finds the credential's
//   base64 in it and replaces the whole text by [REDACTED:credential]; the
//   runner loses the 50 other lines instead of the one span.
// Holds: TestRedaction3HoldsOrdinaryChunkedResults — ten log lines as ten
//   items, one holding an AWS key id (redacted in place, not refused);
//   "Authorization" and "Bearer" as words at item boundaries (unchanged);
//   PascalCase Content/Blob/Type in structuredContent of a three-item
//   result (unchanged); resources/read with five small CSV/JSON blobs
//   (unchanged).
// Holds: TestRedaction3HoldsCredentialServiceWithBinaryBlobs — a service
//   with a credential whose results carry a 48 KB PNG-like image and a
//   PDF-like blob (binary, invalid UTF-8): relayed byte for byte.

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// rd3Withheld reports whether the runner's answer withholds the result.
func rd3Withheld(ans []byte) bool {
	return gjson.GetBytes(ans, "result.isError").Bool() || gjson.GetBytes(ans, "error").Exists()
}

// rd3KeyBody is n distinct lines of 64 base64 characters, as the body of
// a PEM key.
func rd3KeyBody(n int) []string {
	r := rand.New(rand.NewSource(int64(n)))
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	var lines []string
	for range n {
		b := make([]byte, 64)
		for j := range b {
			b[j] = alpha[r.Intn(len(alpha))]
		}
		lines = append(lines, string(b))
	}
	return lines
}

// rd3Leaked lists the lines that the runner's joined text holds.
func rd3Leaked(joined string, lines []string) []int {
	var out []int
	for i, l := range lines {
		if strings.Contains(joined, l) {
			out = append(out, i)
		}
	}
	return out
}

// False positive: a secret wholly inside one text item, between label
// items, is redacted in place by the policy; spans.go refuses the result.
func TestRedaction3AttackSecretWhollyInOneItemRefused(t *testing.T) {
	const jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	cases := []struct {
		name   string
		parts  []string
		secret string
	}{
		{"jwt in its own item", []string{"Your session token:", jwt, "Expires in 3600 seconds."}, jwt},
		{"oauth token as a key/value list", []string{"access_token:", "ya29.a0AfH6SMBxExampleToken0123", "expires_in:", "3599"}, "ya29.a0AfH6SMBxExampleToken0123"},
		{"bearer header as its own item", []string{"Header:", "Bearer abcdefghijklmnop0123456789", "OK"}, "abcdefghijklmnop0123456789"},
	}
	up, m := rdSession(t, gatewayConfig{})
	for i, tc := range cases {
		// Control: the label and the secret alone (two items) are relayed,
		// the secret redacted in place.
		rdAnswer(up, "tools/call", false, rd2TextItems(tc.parts[:2]...))
		if ans := rdCall(t, m, 10+i); rd3Withheld(ans) || strings.Contains(rdJoinedText(ans), tc.secret) {
			t.Fatalf("%s: control: the secret was not redacted in place: %s", tc.name, ans)
		}
		rdAnswer(up, "tools/call", i%2 == 1, rd2TextItems(tc.parts...))
		ans := rdCall(t, m, 20+i)
		if rd3Withheld(ans) {
			t.Errorf("%s: an ordinary result whose secret is wholly in one text item is withheld instead of redacted in place: %.400s", tc.name, ans)
			continue
		}
		if strings.Contains(rdJoinedText(ans), tc.secret) {
			t.Errorf("%s: relayed with the secret: %s", tc.name, ans)
		}
		if !strings.Contains(string(ans), "REDACTED") {
			t.Errorf("%s: relayed without a redaction: %s", tc.name, ans)
		}
	}
}

// False positive: a chunked log quoting a PEM BEGIN line in one item.
func TestRedaction3AttackPemHeaderMentionInChunkedLogRefused(t *testing.T) {
	var parts []string
	for i := range 12 {
		parts = append(parts, fmt.Sprintf("2026-12-03T07:%02d:00Z INFO tls: loading certificate chain for api.example.com\n", i))
	}
	parts[4] = "2026-12-03T07:04:00Z ERROR tls: key.pem: expected -----BEGIN RSA PRIVATE KEY-----, found a certificate\n"
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, rd2TextItems(parts...))
	ans := rdCall(t, m, 10)
	if rd3Withheld(ans) {
		t.Errorf("a log of 12 line items, one quoting a PEM BEGIN line, is withheld (the policy alone redacts that line): %.400s", ans)
		return
	}
	j := rdJoinedText(ans)
	if !strings.Contains(j, parts[11]) {
		t.Errorf("the last log line is not relayed: %.600s", j)
	}
}

// False positive (corruption): binary blobs that happen to be valid UTF-8
// have bytes removed as if they were invisible characters of text.
func TestRedaction3AttackBinaryBlobThatIsValidUTF8Stripped(t *testing.T) {
	// A protobuf message: field 1 (string) "family 👨‍👩‍👧", field 2 (varint) 42.
	s := "family \U0001F468\u200d\U0001F469\u200d\U0001F467"
	proto := append([]byte{0x0a, byte(len(s))}, s...)
	proto = append(proto, 0x10, 0x2a)
	// A binary record (no mimeType): magic, a length, a UTF-8 text with its BOM.
	rec := append([]byte("REC\x01\x00\x10"), "\xef\xbb\xbfid,name\n1,x\n"...)
	cases := []struct {
		name, mime string
		data       []byte
	}{
		{"protobuf", "application/x-protobuf", proto},
		{"binary record", "application/octet-stream", rec},
	}
	up, m := rdSession(t, gatewayConfig{})
	for i, tc := range cases {
		mime := ""
		if tc.mime != "" {
			mime = `"mimeType":"` + tc.mime + `",`
		}
		rdAnswer(up, "resources/read", i%2 == 1, `{"contents":[{"uri":"file:///data.bin",`+mime+`"blob":"`+base64.StdEncoding.EncodeToString(tc.data)+`"}]}`)
		ans := rdRequest(t, m, 10+i, "resources/read", `{"uri":"file:///data.bin"}`)
		if rd3Withheld(ans) {
			t.Errorf("%s: withheld: %.300s", tc.name, ans)
			continue
		}
		if got := rdBlob(t, ans, "result.contents.0.blob"); got != string(tc.data) {
			t.Errorf("%s: the runner gets other bytes than the upstream's binary blob (%d bytes instead of %d): %q, want %q", tc.name, len(got), len(tc.data), got, tc.data)
		}
	}
}

// A private key without its END line, its body in more text items.
func TestRedaction3AttackPemKeyCutOffAcrossItems(t *testing.T) {
	body := rd3KeyBody(100)
	lines := func(a, b int) string { return strings.Join(body[a:b], "\n") + "\n" }
	begin := "-----BEGIN RSA PRIVATE KEY-----\n"
	cases := []struct {
		name  string
		parts []string
	}{
		{"two items", []string{begin + lines(0, 20), lines(20, 40)}},
		// The middle item is longer than spans.go's window after the marker.
		{"three items", []string{begin + lines(0, 20), lines(20, 90), lines(90, 100)}},
	}
	rd3KeyAcrossItems(t, body, begin+lines(0, 100), cases)
}

// rd3KeyAcrossItems answers a tool call with whole, a private key's text
// in one item (the control: no line of body relayed), then with each
// case's parts as text items, and wants no line of body relayed (a
// withheld result relays none).
func rd3KeyAcrossItems(t *testing.T, body []string, whole string, cases []struct {
	name  string
	parts []string
}) {
	t.Helper()
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, rd2TextItems(whole))
	if ans := rdCall(t, m, 9); rd3Withheld(ans) || len(rd3Leaked(rdJoinedText(ans), body)) > 0 {
		t.Fatalf("control: the key in one item was not redacted: %.400s", ans)
	}
	for i, tc := range cases {
		rdAnswer(up, "tools/call", i%2 == 1, rd2TextItems(tc.parts...))
		ans := rdCall(t, m, 10+i)
		if rd3Withheld(ans) {
			continue
		}
		if leaked := rd3Leaked(rdJoinedText(ans), body); len(leaked) > 0 {
			t.Errorf("%s: the runner reads %d lines of the private key's body (lines %d to %d)", tc.name, len(leaked), leaked[0], leaked[len(leaked)-1])
		}
	}
}

// A private key without its BEGIN line, its body in more text items.
func TestRedaction3AttackPemKeyEndOnlyAcrossItems(t *testing.T) {
	body := rd3KeyBody(60)
	lines := func(a, b int) string { return strings.Join(body[a:b], "\n") + "\n" }
	end := "-----END RSA PRIVATE KEY-----\n"
	cases := []struct {
		name  string
		parts []string
	}{
		{"two items", []string{lines(0, 40), lines(40, 60) + end}},
		{"three items", []string{lines(0, 20), lines(20, 40), lines(40, 60) + end}},
	}
	rd3KeyAcrossItems(t, body, lines(0, 60)+end, cases)
}

// Holds: ordinary chunked results are relayed, redacted in place where
// they hold a secret.
func TestRedaction3HoldsOrdinaryChunkedResults(t *testing.T) {
	var log []string
	for i := range 10 {
		log = append(log, fmt.Sprintf("2026-12-03 07:%02d:00 worker %d finished a batch\n", i, i))
	}
	log[6] = "2026-12-03 07:06:00 configured aws key " + rdAWSKey + " for uploads\n"
	words := []string{"Send the request with the Authorization", " header set to Bearer", " and the token from", " the console; bearer", " tokens expire.\n"}
	sc := rd2TextItems("one", "two", "three")
	sc = strings.TrimSuffix(sc, "}") + `,"structuredContent":{"Content":"note body","Type":"invoice","Blob":"not base64!","Resource":{"Blob":"x","Type":"y"}}}`

	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, rd2TextItems(log...))
	ans := rdCall(t, m, 10)
	if rd3Withheld(ans) {
		t.Fatalf("a log of ten items with an AWS key id in one is withheld: %.400s", ans)
	}
	j := rdJoinedText(ans)
	if strings.Contains(j, rdAWSKey) || !strings.Contains(j, "[REDACTED:aws_access_key_id]") || !strings.Contains(j, log[9]) {
		t.Errorf("the AWS key id is not redacted in place: %s", j)
	}
	for i, res := range []string{rd2TextItems(words...), sc} {
		rdAnswer(up, "tools/call", i%2 == 1, res)
		ans := rdCall(t, m, 11+i)
		if rd3Withheld(ans) {
			t.Errorf("withheld: %.400s", ans)
			continue
		}
		var want map[string]any
		_ = jsonUnmarshal(res, &want)
		for k := range want {
			if g, w := gjson.GetBytes(ans, "result."+k).Raw, string(mustJSON(want[k])); !jsonEqual(g, w) {
				t.Errorf("%s changed: %s, want %s", k, g, w)
			}
		}
	}
	// resources/read with five small blobs of CSV and JSON.
	var contents []string
	var want []string
	for i := range 5 {
		text := fmt.Sprintf("id,name,amount\n%d,row %d,%d.50\n", i, i, i*10)
		mime := "text/csv"
		if i%2 == 1 {
			text, mime = fmt.Sprintf(`{"id":%d,"tags":["a","b"],"note":"café ☕"}`, i), "application/json"
		}
		want = append(want, text)
		contents = append(contents, fmt.Sprintf(`{"uri":"file:///f%d","mimeType":"%s","blob":"%s"}`, i, mime, base64.StdEncoding.EncodeToString([]byte(text))))
	}
	rdAnswer(up, "resources/read", true, `{"contents":[`+strings.Join(contents, ",")+`]}`)
	ans = rdRequest(t, m, 20, "resources/read", `{"uri":"file:///f0"}`)
	if rd3Withheld(ans) {
		t.Fatalf("five small blobs withheld: %.400s", ans)
	}
	for i, w := range want {
		if got := rdBlob(t, ans, fmt.Sprintf("result.contents.%d.blob", i)); got != w {
			t.Errorf("blob %d changed: %q, want %q", i, got, w)
		}
	}
}

// Holds: a service with a credential relays binary blobs byte for byte.
func TestRedaction3HoldsCredentialServiceWithBinaryBlobs(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	png := append([]byte("\x89PNG\r\n\x1a\n"), make([]byte, 48<<10)...)
	r.Read(png[8:])
	pdf := append([]byte("%PDF-1.7\n%\xe2\xe3\xcf\xd3\n"), make([]byte, 8<<10)...)
	r.Read(pdf[16:])
	res := `{"content":[{"type":"text","text":"here"},{"type":"image","mimeType":"image/png","data":"` + base64.StdEncoding.EncodeToString(png) +
		`"},{"type":"resource","resource":{"uri":"file:///r.pdf","mimeType":"application/pdf","blob":"` + base64.StdEncoding.EncodeToString(pdf) + `"}}]}`
	up, m := rd2CredSession(t)
	for i, k := range rdKinds {
		rdAnswer(up, "tools/call", k.sse, res)
		ans := rdCall(t, m, 10+i)
		rd2Sent(t, up)
		if rd3Withheld(ans) {
			t.Fatalf("%s: withheld: %.300s", k.name, ans)
		}
		img, err := base64.StdEncoding.DecodeString(gjson.GetBytes(ans, "result.content.1.data").String())
		if err != nil || !bytes.Equal(img, png) {
			t.Errorf("%s: the image changed (%v)", k.name, err)
		}
		if got := rdBlob(t, ans, "result.content.2.resource.blob"); got != string(pdf) {
			t.Errorf("%s: the PDF blob changed", k.name)
		}
	}
}

// The upstream's Content-Type, quoted in toolgate's own error: neither the
// message policy nor the credential redaction sees it.
func TestRedaction3AttackContentTypeQuotedInError(t *testing.T) {
	up, m := rd2CredSession(t)
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost || gjson.GetBytes(b, "method").String() != "tools/call" {
			return false
		}
		w.Header().Set("Content-Type", "text/plain; key="+rdAWSKey+"; x="+rd2Cred)
		_, _ = w.Write([]byte("hello"))
		return true
	})
	ans := rdCall(t, m, 10)
	rd2Sent(t, up)
	if d := rdDecoded(ans); strings.Contains(d, rdAWSKey) || strings.Contains(d, rd2Cred) {
		t.Errorf("the runner's error quotes the upstream's Content-Type with an AWS key id and the credential toolgate attached: %s", ans)
	}
}

// The upstream's error message to toolgate's own initialize (the session
// re-created after a 404), quoted in toolgate's own error: the message
// policy never sees it.
func TestRedaction3AttackReinitializeErrorQuoted(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, rd2TextItems("before"))
	if ans := rdCall(t, m, 9); rd3Withheld(ans) {
		t.Fatalf("control: %s", ans)
	}
	up.reset() // the upstream forgets the session: 404 from now on
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if gjson.GetBytes(b, "method").String() != "initialize" {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"cannot start: aws key %s, slack https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX rejected"}}`,
			gjson.GetBytes(b, "id").Raw, rdAWSKey)
		return true
	})
	ans := rdCall(t, m, 10)
	if d := rdDecoded(ans); strings.Contains(d, rdAWSKey) || strings.Contains(d, "hooks.slack.com/services/T0000") {
		t.Errorf("the runner's error quotes the upstream's error with an AWS key id and a Slack webhook, unredacted: %s", ans)
	}
	// Control: the same error message as the answer to the runner's own
	// call is redacted (the message policy's error channel).
	up.setIntercept(nil)
	rdAnswer(up, "tools/call", false, `{"jsonrpc":"2.0","id":ID,"error":{"code":-32603,"message":"cannot start: aws key `+rdAWSKey+` rejected"}}`)
	if ans := rdCall(t, m, 11); strings.Contains(rdDecoded(ans), rdAWSKey) {
		t.Errorf("control: the error answering the runner's call is not redacted: %s", ans)
	}
}

// The credential's base64 inside a longer text: the whole text is replaced.
func TestRedaction3AttackCredentialBase64WipesWholeText(t *testing.T) {
	var lines []string
	for i := range 50 {
		lines = append(lines, fmt.Sprintf("2026-12-03 07:%02d:00 request %d served in %d ms", i, i, 10+i))
	}
	header := "2026-12-03 07:25:30 outgoing Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+rd2Cred))
	text := strings.Join(lines[:25], "\n") + "\n" + header + "\n" + strings.Join(lines[25:], "\n") + "\n"
	up, m := rd2CredSession(t)
	rdAnswer(up, "tools/call", false, rd2TextItems(text))
	ans := rdCall(t, m, 10)
	rd2Sent(t, up)
	j := rdJoinedText(ans)
	if strings.Contains(rdDecoded(ans), base64.StdEncoding.EncodeToString([]byte("alice:"+rd2Cred))) {
		t.Fatalf("the credential's base64 reached the runner: %s", ans)
	}
	kept := 0
	for _, l := range lines {
		if strings.Contains(j, l) {
			kept++
		}
	}
	if kept != len(lines) {
		t.Errorf("a log of %d lines with the credential's base64 in one line: the runner gets %d of the other lines (%q)", len(lines)+1, kept, j)
	}
}
