package integration

// Second round of attacks on the result policy's redaction and the
// credential redaction (modules/mcpproxy/redact.go), after the fixes
// 05db148, 66c1c5e, 09050b9, cd1929b, b351105, b11f85d and decfe03. Same
// setup as adversarial_redaction_test.go (whose helpers these use): a real
// gateway with the shipped policies in front of an upstream whose answers
// the test writes.
//
// Attack (fixed): TestRedaction2AttackSplitWithNoMarkerInAnySeam — a secret split
//   over three or more text items so that no two consecutive items hold a
//   marker together ("key AK" | "" | "IAIOSFODNN7EXAMPLE", one letter per
//   item, a PEM key whose BEGIN and END lines are each broken around an
//   empty item): no seam is listed, the scan says clean, and the runner
//   joins its text items into the secret. Also with the marker whole in
//   the first item, over four items ("key AKIA" | "IOSF" | "ODNN" |
//   "7EXAMPLE"): the three-item window never holds a whole match.
// Attack (fixed): TestRedaction2AttackCredentialSplitAcrossTextItems — the
//   credential toolgate attached, written back in two consecutive text
//   items: each string is searched alone, the runner joins them.
// Attack (fixed): TestRedaction2AttackCredentialInBlobWithLineBreaks — the
//   credential base64-encoded in a resource blob with line breaks (MIME
//   style): the byte search for its base64 misses it, the policy decodes
//   blobs with line breaks (as runners do) and relays it.
// Attack (fixed): TestRedaction2AttackCredentialInBlobWithEscape — the same blob
//   with one base64 character written as a JSON \u escape.
// Attack (fixed): TestRedaction2AttackCredentialReassembledInTextBlob — the
//   credential with a zero-width space in it, in a text/plain blob: the
//   credential redaction looks for its base64 only, the policy strips the
//   zero-width space from the blob of text (decfe03) and re-encodes it:
//   toolgate itself puts the credential together again.
// Attack (fixed): TestRedaction2AttackCredentialBase64InTextWithInvisible — the
//   credential's base64 in a text item with a zero-width space in it: the
//   redaction looks through invisible characters for the credential only,
//   not for its base64; the policy strips the space.
// Attack (fixed): TestRedaction2AttackNonTextMimeBlob — decfe03's checks apply to
//   blobs of mimeType text/* or none only: an application/json blob keeps
//   a right-to-left override and zero-width spaces, and 200 KB of it
//   reaches the runner uncut.
// Attack (fixed): TestRedaction2AttackInvisibleInBlockMember — a block member
//   written with a zero-width space ("con\u200btents", "con\u200btent"):
//   neither the policy nor the scan's case-variant check (b351105) takes
//   it for the member, so its blob is read as base64 text; then the policy
//   removes the zero-width space from the key, and the runner gets
//   "contents" with a blob it decodes into an AWS key.
// Attack (fixed): TestRedaction2AttackManyTextBlobsUnderLimit — decfe03 withholds
//   a blob of text over the limit on its own, but blobs are still not
//   counted in the payload's bytes: four text/plain blobs of 60 KB each
//   (240 KB of text, nearly four times max_result_bytes) reach the runner
//   whole.
// Attack (fixed): TestRedaction2AttackSeamSkippedWhenFirstItemCut — a secret whose
//   label ends a text item long enough to be cut by the budget and whose
//   value is the whole start of the next item ("…Authorization: Bearer " |
//   "<token> …"): seam_secrets (and b11f85d's three-item check) skip a seam
//   whose first item is cut, the cut drops the label, and the value
//   reaches the runner whole.
// Attack (fixed): TestRedaction2AttackCredentialURLSafeBase64InText — a
//   credential whose base64 holds "+" or "/" (here from "~"), written
//   back in URL-safe base64 (JWT and URL style) in a text item: only the
//   standard alphabet is looked for.
// Holds: TestRedaction2HoldsFoldOrbits — every character that RE2's (?i)
//   matches as an ASCII letter is folded by the policy's folded(); the
//   fullwidth and other NFKC compatibility forms of a marker are matched
//   by no pattern (RE2 does not normalise), so nothing is left to redact.
// Holds: TestRedaction2HoldsOrdinaryResults — PascalCase keys (Content,
//   Type, Blob, Resource) inside structuredContent, chunked prose in many
//   text items, a text blob of normal size and a binary blob without
//   mimeType that is valid UTF-8 are relayed unchanged.
// Holds: TestRedaction2HoldsEscapedInvisibleInCredential — the credential
//   broken by a TAG character written as an escaped surrogate pair, and
//   the credential as an object key broken by a zero-width space, are
//   redacted.
// Attack (fixed): TestRedaction2AttackThreeItemCheckQuadratic — b11f85d's
//   three-item check is quadratic in the matches of its window: under
//   the default 100 ms deadline, three text items whose middle one lists
//   1600 AWS key ids (34 KB) are withheld as a timeout, where the same
//   keys in one item are redacted.
// Holds: TestRedaction2HoldsCostOfItemChecks — measured with a 60 s
//   deadline: the three-item check against one item (400/800/1600/3000
//   keys: one item 9/13/22/37 ms, three items 63 ms/0.24 s/1.1 s/4.0 s),
//   and the private key check with items that each close a key and open
//   one (50/100/200/400 items, 4/9/17/35 KB: 30 ms/0.17 s/1.1 s/8.0 s,
//   cubic; 800 items, 70 KB, ran past 60 s in one measurement); nothing is relayed unredacted, and under the default 100 ms
//   deadline such a message is withheld as a timeout, each one costing a
//   full deadline of CPU.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/tidwall/gjson"
)

const rd2Cred = "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"

// rd2TextItems is a tool result whose content is one text item per part.
func rd2TextItems(parts ...string) string {
	var items []string
	for _, p := range parts {
		items = append(items, `{"type":"text","text":`+string(mustJSON(p))+`}`)
	}
	return `{"content":[` + strings.Join(items, ",") + `]}`
}

// rd2Sent fails the test unless the upstream got the credential.
func rd2Sent(t *testing.T, up *upstream) {
	t.Helper()
	for _, r := range up.requestLog() {
		if r.Header.Get("X-Upstream-Key") == rd2Cred {
			return
		}
	}
	t.Fatalf("the upstream never got the credential")
}

// rd2CredSession is a session whose upstream calls carry rd2Cred.
func rd2CredSession(t *testing.T) (*upstream, *rawMCP) {
	return rdSession(t, gatewayConfig{Auth: "header X-Upstream-Key " + rd2Cred})
}

// Attack: the three-item check (b11f85d) starts from a listed seam, and a
// seam is listed only when the last and first characters of two
// consecutive text items hold a marker together. Split the marker itself
// around an empty item, or one letter per item, and no seam is listed:
// the scan says clean (and the policy's long way finds nothing either),
// and the runner joins the items into the secret.
func TestRedaction2AttackSplitWithNoMarkerInAnySeam(t *testing.T) {
	body := strings.Repeat("MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0\n", 12)
	cases := []struct {
		name   string
		parts  []string
		secret string
	}{
		{"aws key around an empty item", []string{"key AK", "", "IAIOSFODNN7EXAMPLE done"}, rdAWSKey},
		{"aws key a letter per item", []string{"key A", "K", "I", "A", "IOSFODNN7EXAMPLE done"}, rdAWSKey},
		{"aws key over four items, marker whole", []string{"key AKIA", "IOSF", "ODNN", "7EXAMPLE done"}, rdAWSKey},
		{"bearer around an empty item", []string{"token: Bea", "", "rer abcdefghijklmnop0123456789"}, "Bearer abcdefghijklmnop0123456789"},
		{"github token a piece per item", []string{"token gh", "p", "_0123456789abcdefghijklmnopqrstuvwxyzAB"}, "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"},
		{"pem key, BEGIN and END lines broken", []string{
			"-----BEGIN RSA PRIV", "", "ATE KEY-----\n" + body + "-----END RSA PRIV", "", "ATE KEY-----\n"},
			"-----BEGIN RSA PRIVATE KEY-----\n" + body[:80]},
	}
	for _, tc := range cases {
		result := rd2TextItems(tc.parts...)
		joined := strings.Join(tc.parts, "")
		if !strings.Contains(joined, tc.secret) {
			t.Fatalf("%s: the premise is wrong: the joined text does not hold the secret", tc.name)
		}
		// The policy's long way (no input.scan) lets it through as well.
		long := rdLongWay(t, "result", "tools/call", result)
		t.Logf("%s: the policy's long way decides %v", tc.name, long["action"])
	}
	for _, k := range rdKinds {
		t.Run(k.name, func(t *testing.T) {
			up, m := rdSession(t, gatewayConfig{})
			for i, tc := range cases {
				rdAnswer(up, "tools/call", k.sse, rd2TextItems(tc.parts...))
				ans := rdCall(t, m, 10+i)
				if gjson.GetBytes(ans, "result.isError").Bool() {
					continue // withheld
				}
				if strings.Contains(rdJoinedText(ans), tc.secret) {
					t.Errorf("%s: the runner's joined text holds the secret: %.400s", tc.name, ans)
				}
			}
		})
	}
}

// Attack: the credential redaction looks at one JSON string at a time.
// Written back in two consecutive text items, neither holds the
// credential; the policy does not know its shape; the runner joins the
// items (as the policy's own seam rules assume) and reads it.
func TestRedaction2AttackCredentialSplitAcrossTextItems(t *testing.T) {
	up, m := rd2CredSession(t)
	rdAnswer(up, "tools/call", false, rd2TextItems("your key is "+rd2Cred[:11], rd2Cred[11:]+" (keep it safe)"))
	ans := rdCall(t, m, 10)
	rd2Sent(t, up)
	if strings.Contains(rdJoinedText(ans), rd2Cred) {
		t.Errorf("the runner's joined text holds the credential toolgate attached: %s", ans)
	}
}

// rd2Blob is a tool result with one embedded resource whose blob is the
// raw JSON string body (without quotes) and whose mimeType is mime
// (none when empty).
func rd2Blob(blobJSON, mime string) string {
	m := ""
	if mime != "" {
		m = `"mimeType":"` + mime + `",`
	}
	return `{"content":[{"type":"resource","resource":{"uri":"file:///req.txt",` + m + `"blob":"` + blobJSON + `"}}]}`
}

// Attack: the credential base64-encoded in a blob, MIME style (a line
// break every 20 characters, written \n in JSON). The credential
// redaction searches the message's bytes for the credential's base64,
// which the line breaks interrupt; the policy decodes blobs with line
// breaks, as runners do (TestRedactionHoldsBlobVariants), finds no marker
// and relays the blob; the runner decodes the credential.
func TestRedaction2AttackCredentialInBlobWithLineBreaks(t *testing.T) {
	enc := base64.StdEncoding.EncodeToString([]byte("X-Upstream-Key: " + rd2Cred + "\n"))
	var lines []string
	for s := enc; s != ""; {
		n := min(20, len(s))
		lines = append(lines, s[:n])
		s = s[n:]
	}
	up, m := rd2CredSession(t)
	// Control: on one line the blob is redacted (09050b9).
	rdAnswer(up, "tools/call", false, rd2Blob(enc, "text/plain"))
	if got := rdBlob(t, rdCall(t, m, 10), "result.content.0.resource.blob"); strings.Contains(got, rd2Cred) {
		t.Fatalf("control: the blob on one line was not redacted: %q", got)
	}
	rd2Sent(t, up)
	rdAnswer(up, "tools/call", false, rd2Blob(strings.Join(lines, `\n`), "text/plain"))
	ans := rdCall(t, m, 11)
	if gjson.GetBytes(ans, "result.isError").Bool() {
		return
	}
	if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.Contains(got, rd2Cred) {
		t.Errorf("the runner decodes the credential toolgate attached from a blob with line breaks: %q", got)
	}
}

// Attack: the same blob on one line, with one base64 character of the
// credential's written as a JSON \u escape. The credential redaction
// decodes strings only when one might hold an invisible character or the
// credential itself, and searches the raw bytes for the base64: the
// escape hides it; the policy reads the decoded string, which is valid
// base64 without a marker.
func TestRedaction2AttackCredentialInBlobWithEscape(t *testing.T) {
	enc := base64.StdEncoding.EncodeToString([]byte("X-Upstream-Key: " + rd2Cred + "\n"))
	i := len(enc) - 12 // inside the credential's characters
	escaped := enc[:i] + fmt.Sprintf(`\u%04x`, enc[i]) + enc[i+1:]
	up, m := rd2CredSession(t)
	rdAnswer(up, "tools/call", true, rd2Blob(escaped, "text/plain"))
	ans := rdCall(t, m, 10)
	rd2Sent(t, up)
	if gjson.GetBytes(ans, "result.isError").Bool() {
		return
	}
	if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.Contains(got, rd2Cred) {
		t.Errorf("the runner decodes the credential toolgate attached from a blob with a \\u escape: %q", got)
	}
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///r.txt","blob":"`+escaped+`"}]}`)
	ans = rdRequest(t, m, 11, "resources/read", `{"uri":"file:///r.txt"}`)
	if gjson.GetBytes(ans, "result.contents.0.blob").Exists() {
		if got := rdBlob(t, ans, "result.contents.0.blob"); strings.Contains(got, rd2Cred) {
			t.Errorf("resources/read: the runner decodes the credential from a blob with a \\u escape: %q", got)
		}
	}
}

// Attack: the credential with a zero-width space in it, inside a blob of
// text. The credential redaction looks for the credential's base64 in
// blobs, not through invisible characters there; the result policy then
// removes the blob's invisible characters (decfe03) and encodes it again:
// the blob the runner decodes holds the credential whole.
func TestRedaction2AttackCredentialReassembledInTextBlob(t *testing.T) {
	hidden := rd2Cred[:10] + "\u200b" + rd2Cred[10:]
	enc := base64.StdEncoding.EncodeToString([]byte("X-Upstream-Key: " + hidden + "\n"))
	for _, mime := range []string{"text/plain", ""} {
		t.Run("mime="+mime, func(t *testing.T) {
			up, m := rd2CredSession(t)
			rdAnswer(up, "tools/call", false, rd2Blob(enc, mime))
			ans := rdCall(t, m, 10)
			rd2Sent(t, up)
			if gjson.GetBytes(ans, "result.isError").Bool() {
				return
			}
			if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.Contains(got, rd2Cred) {
				t.Errorf("the runner decodes the credential toolgate attached, reassembled by the policy's stripping of the blob: %q", got)
			}
		})
	}
}

// Attack: the credential's base64 in a text item, broken by a zero-width
// space. Unbroken, the gateway finds the base64 and replaces the string
// (control); broken, it looks through invisible characters only for the
// credential itself, and the policy then removes the space.
func TestRedaction2AttackCredentialBase64InTextWithInvisible(t *testing.T) {
	enc := base64.StdEncoding.EncodeToString([]byte(rd2Cred))
	up, m := rd2CredSession(t)
	rdAnswer(up, "tools/call", false, rd2TextItems("token (base64): "+enc))
	if ans := rdCall(t, m, 10); strings.Contains(rdDecoded(ans), enc) {
		t.Fatalf("control: the credential's base64 in text was not redacted: %s", ans)
	}
	rd2Sent(t, up)
	rdAnswer(up, "tools/call", false, rd2TextItems("token (base64): "+enc[:12]+"\u200b"+enc[12:]))
	if ans := rdCall(t, m, 11); strings.Contains(rdDecoded(ans), enc) {
		t.Errorf("the runner reads the credential's base64, reassembled by the policy's stripping: %s", ans)
	}
}

// Attack: decfe03 strips and bounds blobs of text: mimeType text/* or
// none. application/json — what most MCP servers serve, and what runners
// show a model as text — counts as binary: a right-to-left override and a
// zero-width space stay in it, and 200 KB of it reaches the runner,
// where the same text as text/plain is withheld.
func TestRedaction2AttackNonTextMimeBlob(t *testing.T) {
	tricky := `{"file":"invoice.` + "\u202E" + `fdp.exe","note":"pass` + "\u200b" + `word"}`
	big := `{"log":"` + strings.Repeat("log line: nothing secret here, just a lot of it. ", 4200) + `"}`
	up, m := rdSession(t, gatewayConfig{})
	// Control: as text/plain, the big blob is withheld.
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///l.json","mimeType":"text/plain","blob":"`+base64.StdEncoding.EncodeToString([]byte(big))+`"}]}`)
	if ans := rdRequest(t, m, 10, "resources/read", `{"uri":"file:///l.json"}`); gjson.GetBytes(ans, "result.contents.0.blob").Exists() {
		t.Fatalf("control: a text/plain blob of %d bytes was not withheld", len(big))
	}
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///t.json","mimeType":"application/json","blob":"`+base64.StdEncoding.EncodeToString([]byte(tricky))+`"}]}`)
	ans := rdRequest(t, m, 11, "resources/read", `{"uri":"file:///t.json"}`)
	if gjson.GetBytes(ans, "result.contents.0.blob").Exists() {
		if got := rdBlob(t, ans, "result.contents.0.blob"); strings.ContainsAny(got, "\u202E\u200b") {
			t.Errorf("the runner decodes invisible characters from an application/json blob: %+q", got)
		}
	}
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///l.json","mimeType":"application/json","blob":"`+base64.StdEncoding.EncodeToString([]byte(big))+`"}]}`)
	ans = rdRequest(t, m, 12, "resources/read", `{"uri":"file:///l.json"}`)
	if gjson.GetBytes(ans, "result.contents.0.blob").Exists() {
		if got := rdBlob(t, ans, "result.contents.0.blob"); len(got) > 65536 {
			t.Errorf("the runner decodes %d bytes of JSON text from one application/json blob, over max_result_bytes (65536)", len(got))
		}
	}
}

// Holds: RE2's (?i) matches a character as an ASCII letter when they are
// in one simple case folding orbit. Every such character outside ASCII
// must be folded by the policy's folded() (and so by the gateway's
// foldToASCII, which FuzzScanDecidesAsThePolicy keeps in step). NFKC
// compatibility forms (fullwidth letters, the ſt ligature, mathematical
// letters) are not in those orbits: no pattern of the policy matches
// them, so there is nothing to redact.
func TestRedaction2HoldsFoldOrbits(t *testing.T) {
	var odd []rune
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < 0x80 && unicode.IsLetter(f) {
				odd = append(odd, r)
				break
			}
		}
	}
	if len(odd) == 0 {
		t.Fatal("no character outside ASCII folds to an ASCII letter: the premise is wrong")
	}
	for _, r := range odd {
		got := rdPolicyEval(t, "data.toolgate.result.folded(input.s)", string(r))
		if g, ok := got.(string); !ok || len(g) != 1 || g[0] >= 0x80 {
			t.Errorf("folded(%U) = %q: RE2's (?i) matches it as an ASCII letter, the policy's markers would not", r, got)
		}
	}
	t.Logf("characters RE2 folds onto ASCII letters: %q", string(odd))
	pattern := regexp.MustCompile(rdPolicyValue(t, "data.toolgate.result.secret_patterns.oauth_token").(string))
	bearer := regexp.MustCompile(rdPolicyValue(t, "data.toolgate.result.secret_patterns.bearer_token").(string))
	for _, s := range []string{
		"ａｃｃｅｓｓ_token=ya29.a0AfH6SMBxFullwidth0123456789",
		"acce\uFB06_token=ya29.a0AfH6SMBxLigature0123456789", // no: ﬆ is "st"
		"\U0001D41A\U0001D41C\U0001D41C\U0001D41E\U0001D42C\U0001D42C_token=ya29.a0AfH6SMBxMath0123456789",
	} {
		if pattern.MatchString(s) {
			t.Errorf("the oauth_token pattern matches %q: its marker is not folded", s)
		}
	}
	if bearer.MatchString("ＢＥＡＲＥＲ abcdefghijklmnop0123456789") {
		t.Errorf("the bearer pattern matches a fullwidth Bearer")
	}
}

// rdPolicyEval evaluates query against the shipped result policy with
// input {"s": s}.
func rdPolicyEval(t *testing.T, query, s string) any {
	t.Helper()
	return rdPolicyEvalInput(t, query, map[string]any{"s": s})
}

// Holds: the fixes do not withhold ordinary results.
func TestRedaction2HoldsOrdinaryResults(t *testing.T) {
	prose := "The quarterly report lists revenue by region. "
	var chunks []string
	for range 40 {
		chunks = append(chunks, prose)
	}
	smallText := strings.Repeat("a plain line of a readme\n", 40) // 1 KB
	binaryUTF8 := []byte("\x00\x01\x02PK-ish header\x7f\x10 and more ascii control bytes \x05\x06")
	cases := []struct {
		name, result string
	}{
		{"PascalCase keys in structuredContent", `{"content":[{"type":"text","text":"ok"}],"structuredContent":{"Content":"body of the note","Type":"invoice","Blob":"not base64!","Resource":{"Blob":"x","Type":"y"},"Messages":[{"Content":"hi"}]}}`},
		{"chunked prose", rd2TextItems(chunks...)},
		{"text blob of normal size", rd2Blob(base64.StdEncoding.EncodeToString([]byte(smallText)), "text/plain")},
		{"binary blob without mimeType, valid UTF-8", rd2Blob(base64.StdEncoding.EncodeToString(binaryUTF8), "")},
	}
	up, m := rdSession(t, gatewayConfig{})
	for i, tc := range cases {
		rdAnswer(up, "tools/call", i%2 == 1, tc.result)
		ans := rdCall(t, m, 10+i)
		if gjson.GetBytes(ans, "result.isError").Bool() || gjson.GetBytes(ans, "error").Exists() {
			t.Errorf("%s: withheld: %.400s", tc.name, ans)
			continue
		}
		got := gjson.GetBytes(ans, "result")
		var want map[string]any
		_ = jsonUnmarshal(tc.result, &want)
		for k := range want {
			if g, w := got.Get(gjson.Escape(k)).Raw, string(mustJSON(want[k])); !jsonEqual(g, w) {
				t.Errorf("%s: %s changed: %.300s, want %.300s", tc.name, k, g, w)
			}
		}
	}
}

// Holds: the credential broken up by an invisible character written as
// an escaped surrogate pair (U+E0020, a TAG), and the credential as a
// member name broken by a zero-width space, are redacted.
func TestRedaction2HoldsEscapedInvisibleInCredential(t *testing.T) {
	up, m := rd2CredSession(t)
	rdAnswer(up, "tools/call", true, `{"content":[{"type":"text","text":"key `+rd2Cred[:9]+`\udb40\udc20`+rd2Cred[9:]+`"}],"structuredContent":{"`+rd2Cred[:5]+`\u200b`+rd2Cred[5:]+`":1}}`)
	ans := rdCall(t, m, 10)
	rd2Sent(t, up)
	if strings.Contains(rdDecoded(ans), rd2Cred) {
		t.Errorf("the runner reads the credential: %s", ans)
	}
	if !gjson.GetBytes(ans, "result.isError").Bool() && !strings.Contains(string(ans), "REDACTED:credential") {
		t.Errorf("neither redacted nor withheld: %s", ans)
	}
}

// Attack (fixed): b11f85d's three-item check summed, for every match in
// its window (the last 1024 characters of the first item, the whole
// middle one, the start of the next), the lengths of the pieces and
// matches before it: quadratic in the matches of the middle item. Under
// the default deadline (100 ms), a result of three text items whose middle
// one lists 1600 keys (34 KB, half of max_result_bytes) was withheld as a
// timeout, where the same keys in one item were redacted. The check is
// now the gateway's, linear (spans.go); with a deadline no machine misses
// (the race detector and a loaded machine make 100 ms a coin toss), both
// are redacted, not withheld.
func TestRedaction2AttackThreeItemCheckQuadratic(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{PolicyTimeout: "30s"})
	const n = 1600
	var mid strings.Builder
	for j := range n {
		fmt.Fprintf(&mid, "AKIA%016d ", j)
	}
	// Control: the same keys in one item are redacted in time.
	rdAnswer(up, "tools/call", false, rd2TextItems("first key AKIAIOSFODNN7EXAMPLE "+mid.String()+"end"))
	if ans := rdCall(t, m, 10); gjson.GetBytes(ans, "result.isError").Bool() || strings.Contains(rdJoinedText(ans), "AKIA0000") {
		t.Fatalf("control: one item with %d keys was not redacted in time: %.300s", n, ans)
	}
	result := rd2TextItems("first key AKIAIOSFODNN7EXAMPLE", mid.String(), "end")
	rdAnswer(up, "tools/call", false, result)
	ans := rdCall(t, m, 11)
	if gjson.GetBytes(ans, "result.isError").Bool() {
		t.Errorf("three items, %d keys in the middle one (%d bytes, under max_result_bytes): withheld instead of redacted: %.300s", n, len(result), ans)
	}
	if strings.Contains(rdJoinedText(ans), "AKIA0000") {
		t.Errorf("%d keys: not redacted", n)
	}
}

// Holds (measured, a deadline of 60 s): the cost of the three-item check
// against the same keys in one item, and of the private key check with
// items that each close a key and open one (every pair of items is
// looked at). Nothing is relayed unredacted.
func TestRedaction2HoldsCostOfItemChecks(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{PolicyTimeout: "60s"})
	id := 10
	for _, n := range []int{400, 800, 1600, 3000} {
		var mid strings.Builder
		for j := range n {
			fmt.Fprintf(&mid, "AKIA%016d ", j)
		}
		var took [2]time.Duration
		for k, result := range []string{
			rd2TextItems("first key AKIAIOSFODNN7EXAMPLE " + mid.String() + "end"),
			rd2TextItems("first key AKIAIOSFODNN7EXAMPLE", mid.String(), "end"),
		} {
			rdAnswer(up, "tools/call", false, result)
			start := time.Now()
			id++
			ans := rdCall(t, m, id)
			took[k] = time.Since(start)
			if strings.Contains(rdJoinedText(ans), "AKIA0000") {
				t.Errorf("%d keys: not redacted", n)
			}
		}
		t.Logf("%d keys (%d bytes): one item %v, three items %v", n, mid.Len(), took[0], took[1])
	}
	for _, n := range []int{50, 100, 200, 400} {
		var parts []string
		for range n {
			parts = append(parts, "-----END RSA PRIVATE KEY----- -----BEGIN RSA PRIVATE KEY-----")
		}
		result := rd2TextItems(parts...)
		rdAnswer(up, "tools/call", false, result)
		start := time.Now()
		id++
		ans := rdCall(t, m, id)
		t.Logf("%d items each closing and opening a key (%d bytes): %v, withheld %v", n, len(result), time.Since(start), gjson.GetBytes(ans, "result.isError").Bool())
		if strings.Contains(rdJoinedText(ans), "BEGIN RSA PRIVATE KEY-----") && !strings.Contains(rdJoinedText(ans), "REDACTED") {
			t.Errorf("%d items: key lines relayed unredacted", n)
		}
	}
}

// Attack: b351105 withholds a block member spelled in another case, since
// a runner would read it as the member while the policy reads its blob as
// text. A member written with an invisible character is not that member
// for the policy or the scan either — but rule 1 removes invisible
// characters from keys too, so toolgate itself hands the runner the
// member, with a blob that was never decoded.
func TestRedaction2AttackInvisibleInBlockMember(t *testing.T) {
	blob := base64.StdEncoding.EncodeToString([]byte("aws key " + rdAWSKey + "\n"))
	up, m := rdSession(t, gatewayConfig{})
	// Control: spelled "contents", the blob is decoded and redacted.
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///k.txt","mimeType":"text/plain","blob":"`+blob+`"}]}`)
	if ans := rdRequest(t, m, 10, "resources/read", `{"uri":"file:///k.txt"}`); strings.Contains(rdBlob(t, ans, "result.contents.0.blob"), rdAWSKey) {
		t.Fatalf("control: the blob was not redacted: %s", ans)
	}
	rdAnswer(up, "resources/read", false, `{"con\u200btents":[{"uri":"file:///k.txt","mimeType":"text/plain","blob":"`+blob+`"}]}`)
	ans := rdRequest(t, m, 11, "resources/read", `{"uri":"file:///k.txt"}`)
	if gjson.GetBytes(ans, "result.contents.0.blob").Exists() {
		if got := rdBlob(t, ans, "result.contents.0.blob"); strings.Contains(got, rdAWSKey) {
			t.Errorf("resources/read: the runner gets \"contents\" (made by the policy from \"con\\u200btents\") and decodes an AWS key from its blob: %s", ans)
		}
	}
	rdAnswer(up, "prompts/get", true, `{"messages":[{"role":"user","con\u200btent":{"type":"resource","resource":{"uri":"file:///k.txt","mimeType":"text/plain","blob":"`+blob+`"}}}]}`)
	ans = rdRequest(t, m, 12, "prompts/get", `{"name":"p"}`)
	if gjson.GetBytes(ans, "result.messages.0.content.resource.blob").Exists() {
		if got := rdBlob(t, ans, "result.messages.0.content.resource.blob"); strings.Contains(got, rdAWSKey) {
			t.Errorf("prompts/get: the runner gets \"content\" (made by the policy from \"con\\u200btent\") and decodes an AWS key from its blob: %s", ans)
		}
	}
}

// Attack: a blob of text is withheld when it alone is over the limit;
// several blobs just under it are not added up (nor to the text of the
// payload), so the whole payload's text is not bounded.
func TestRedaction2AttackManyTextBlobsUnderLimit(t *testing.T) {
	text := strings.Repeat("log line: nothing secret here, just a lot of it\n", 1250) // 60 KB
	blob := base64.StdEncoding.EncodeToString([]byte(text))
	var contents []string
	for i := range 4 {
		contents = append(contents, fmt.Sprintf(`{"uri":"file:///log%d.txt","mimeType":"text/plain","blob":"%s"}`, i, blob))
	}
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "resources/read", false, `{"contents":[`+strings.Join(contents, ",")+`]}`)
	ans := rdRequest(t, m, 10, "resources/read", `{"uri":"file:///log.txt"}`)
	total := 0
	for i := range 4 {
		if gjson.GetBytes(ans, fmt.Sprintf("result.contents.%d.blob", i)).Exists() {
			total += len(rdBlob(t, ans, fmt.Sprintf("result.contents.%d.blob", i)))
		}
	}
	if total > 65536 {
		t.Errorf("the runner decodes %d bytes of text from four text/plain blobs of %d bytes each, over max_result_bytes (65536)", total, len(text))
	}
}

// Attack: seam_secrets skips a seam whose first item is cut to fit the
// budget ("its text then ends with a note"), reasoning that the cut
// removes the secret's beginning. It removes only what is in that item:
// when the secret's value is wholly in the next item (its label, the
// marker, at the end of the cut one), nothing redacts it.
func TestRedaction2AttackSeamSkippedWhenFirstItemCut(t *testing.T) {
	filler := strings.Repeat("filler line of ordinary log output\n", 2400) // 84 KB, over max_result_bytes
	cases := []struct{ a, b, secret string }{
		{filler + "Authorization: Bearer ", "tok9Kp4Vx2Qm7Ws3Zn8Lr5TabcdEFGH done", "tok9Kp4Vx2Qm7Ws3Zn8Lr5TabcdEFGH"},
		{filler + `{"access_token": "`, `ya29.a0AfH6SMBxWholeTokenInTheNextItem0123", "expires_in": 3599}`, "ya29.a0AfH6SMBxWholeTokenInTheNextItem0123"},
		{filler + "aws_secret_access_key = ", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
	}
	up, m := rdSession(t, gatewayConfig{})
	for i, tc := range cases {
		// Control: the same two items without the filler: redacted.
		rdAnswer(up, "tools/call", false, rd2TextItems(tc.a[len(filler):], tc.b))
		if ans := rdCall(t, m, 10+i); strings.Contains(rdJoinedText(ans), tc.secret) {
			t.Fatalf("control: the seam was not redacted: %s", ans)
		}
		rdAnswer(up, "tools/call", i%2 == 1, rd2TextItems(tc.a, tc.b))
		ans := rdCall(t, m, 20+i)
		if gjson.GetBytes(ans, "result.isError").Bool() {
			continue
		}
		if j := rdJoinedText(ans); strings.Contains(j, tc.secret) {
			t.Errorf("the runner's joined text holds the secret whole (the first item was cut, the seam skipped): ...%s", j[max(0, strings.Index(j, "[truncated")):])
		}
	}
}

// Attack: the credential redaction looks for the credential's base64 in
// the standard alphabet only. A credential with "~" (allowed in OAuth's
// b64token and in many API keys) encodes with "+" there; in URL-safe
// base64 (JWTs, URLs) that is "-", and the redaction does not see it.
func TestRedaction2AttackCredentialURLSafeBase64InText(t *testing.T) {
	const cred = "tgcred~~~9Kp4Vx2Qm7Ws3Zn8"
	std := base64.StdEncoding.EncodeToString([]byte(cred))
	url := base64.URLEncoding.EncodeToString([]byte(cred))
	if std == url {
		t.Fatalf("the premise is wrong: %q has the same base64 in both alphabets", cred)
	}
	up, m := rdSession(t, gatewayConfig{Auth: "header X-Upstream-Key " + cred})
	// Control: in the standard alphabet it is redacted.
	rdAnswer(up, "tools/call", false, rd2TextItems("state="+std))
	if ans := rdCall(t, m, 10); strings.Contains(rdDecoded(ans), std) {
		t.Fatalf("control: the standard base64 was not redacted: %s", ans)
	}
	rdAnswer(up, "tools/call", false, rd2TextItems("state="+url))
	if ans := rdCall(t, m, 11); strings.Contains(rdDecoded(ans), url) {
		t.Errorf("the runner reads the credential toolgate attached in URL-safe base64 (%s decodes to it): %s", url, ans)
	}
}

// rdPolicyEvalInput evaluates query against the shipped result policy
// (result.rego, text.rego) with input.
func rdPolicyEvalInput(t *testing.T, query string, input map[string]any) any {
	t.Helper()
	r := rego.New(rego.Query(query),
		rego.Load([]string{filepath.Join("..", "policies", "result.rego"), filepath.Join("..", "policies", "text.rego")}, nil),
		rego.Input(input))
	rs, err := r.Eval(context.Background())
	if err != nil || len(rs) != 1 {
		t.Fatalf("%s: %v %v", query, rs, err)
	}
	return rs[0].Expressions[0].Value
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// jsonEqual reports whether two JSON texts hold equal values.
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
