package integration

// Attacks on the default result policy's redaction (policies/result.rego,
// policies/text.rego, modules/policy/scan.go, modules/policy/json.go,
// modules/mcpproxy/redact.go) from the outside: an upstream MCP server,
// malicious or careless, that wants a secret, an invisible character or
// over-limit text to reach the runner unchanged, or the gateway's quick
// scan to say "clean" where the policy's long way (evaluated without
// input.scan) would change the result. Each test starts a real gateway
// with the shipped policies in front of a real upstream whose answers
// the test writes.
//
// Attack (fixed): TestRedactionAttackKelvinSignScanSaysClean — a marker
//   spelled with U+212A KELVIN SIGN ("access_to\u212Aen=…", "Account\u212Aey=…"):
//   the policy's long way lower-cases it to the marker and redacts (RE2's
//   (?i) folds K to k), the gateway's scan folded ASCII only, said clean,
//   and the secret reached the runner (JSON and SSE answers). Both now fold
//   the Kelvin sign, the long s and the dotted capital I.
// Attack (fixed): TestRedactionAttackLongSLabelNeverMatched —
//   "acce\u017Fs_token=…" (U+017F LONG S): the policy's own oauth_token
//   pattern matches it, but no marker was found on either path. Markers are
//   now looked for in text folded as RE2 folds it.
// Attack (fixed): TestRedactionAttackSecretSplitAcrossThreeTextItems — a
//   secret split over three text items (or two with an empty one between
//   them): no seam held a whole match. Such a result is now withheld.
// Attack (fixed): TestRedactionAttackCredentialReassembledByStripping — the
//   credential toolgate attached, written back with a zero-width space in
//   it: the credential redaction did not find it, and the policy then
//   removed the zero-width space. The redaction now looks through such
//   characters.
// Attack (fixed): TestRedactionAttackCredentialInBlob — the credential
//   written back base64-encoded in a resource blob reached the runner; it
//   is now redacted inside the blob.
// Attack (fixed): TestRedactionAttackInputRequiredToolResult — a tools/call
//   result of a 2025-11-25 session with "resultType":"input_required" was
//   not a tool result for the policy: a blob holding a secret and a content
//   item of an unknown type reached the runner (which ignores resultType).
//   What such a result holds besides its input requests is now inspected
//   as its method's result.
// Attack (fixed): TestRedactionAttackBlobKeepsInvisibleCharacters — a
//   text/plain resource blob holding bidi/zero-width characters was not
//   stripped; a blob of text now is.
// Attack (fixed): TestRedactionAttackBlobTextIsNotCut — 200 KB of text in a
//   resource blob was not counted against max_result_bytes; such a blob is
//   now withheld (a runner decodes a blob whole, so it is not cut).
// Attack (fixed): TestRedactionAttackCaseVariantContentsKey — resources/read
//   answered with "Contents" (one key, so the strict parser took it): its
//   blob was inspected as plain base64 text, not decoded, and a runner
//   decoding with encoding/json (case-insensitive fields) read the secret.
//   A block member spelled in another case now withholds the payload.
// Holds: TestRedactionHoldsEscapedSecrets — \u-escaped markers, surrogate
//   pairs around a key, \/ in a Slack webhook, are decoded before matching.
// Holds: TestRedactionHoldsDuplicateAndCaseVariantKeys — a result with
//   duplicate keys or keys differing in case is never relayed.
// Holds: TestRedactionHoldsTwoItemSeam — a secret split over two
//   consecutive text items is redacted in both.
// Holds: TestRedactionHoldsOtherChannels — secrets in error.data and in a
//   notifications/message on the call's SSE stream are redacted.
// Holds: TestRedactionHoldsBlobVariants — URL-safe, unpadded and
//   space-separated base64 blobs are withheld; one with line breaks is
//   decoded and redacted.
// Holds: TestRedactionHoldsScanThreshold — many strings just under the
//   4096-byte scan threshold, together over max_result_bytes, are cut.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/tidwall/gjson"
)

const rdAWSKey = "AKIAIOSFODNN7EXAMPLE"

// rdAnswer makes the upstream answer every POST of method with result
// (the JSON text of the JSON-RPC result, or of the whole message when it
// starts with `{"jsonrpc"`), as a JSON body or an SSE stream, after the
// messages pre (SSE only).
func rdAnswer(up *upstream, method string, sse bool, result string, pre ...string) {
	up.setIntercept(func(w http.ResponseWriter, r *http.Request, b []byte) bool {
		if r.Method != http.MethodPost || gjson.GetBytes(b, "method").String() != method {
			return false
		}
		id := gjson.GetBytes(b, "id").Raw
		msg := `{"jsonrpc":"2.0","id":` + id + `,"result":` + result + `}`
		if strings.HasPrefix(result, `{"jsonrpc"`) {
			msg = strings.Replace(result, "ID", id, 1)
		}
		if !sse {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(msg))
			return true
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, p := range append(pre, msg) {
			_, _ = fmt.Fprintf(w, "event: message\ndata: %s\n\n", p)
		}
		return true
	})
}

// rdKinds are the two ways the upstream answers.
var rdKinds = []struct {
	name string
	sse  bool
}{{"json", false}, {"sse", true}}

// rdSession is alice's MCP session through a gateway with the shipped
// policies (request and result) in front of a test upstream.
func rdSession(t *testing.T, cfg gatewayConfig) (*upstream, *rawMCP) {
	t.Helper()
	cfg.RequestPolicy = filepath.Join("..", "policies")
	up, _, m := aliceSession(t, cfg)
	return up, m
}

// rdCall sends a tools/call of echo and returns the runner's answer (the
// last message).
func rdCall(t *testing.T, m *rawMCP, id int) json.RawMessage {
	t.Helper()
	return rdRequest(t, m, id, "tools/call", `{"name":"echo","arguments":{"text":"x"}}`)
}

func rdRequest(t *testing.T, m *rawMCP, id int, method, params string) json.RawMessage {
	t.Helper()
	_, _, msgs := m.post(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params))
	if len(msgs) == 0 {
		t.Fatalf("%s: no answer", method)
	}
	return msgs[len(msgs)-1]
}

// rdDecoded is every string of the JSON text raw, decoded, joined by
// newlines: what a runner reads.
func rdDecoded(raw []byte) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			b.WriteString(x)
			b.WriteByte('\n')
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for k, e := range x {
				b.WriteString(k)
				b.WriteByte('\n')
				walk(e)
			}
		}
	}
	walk(v)
	return b.String()
}

// rdJoinedText is the text items of a tool result joined as runners join
// them (no separator).
func rdJoinedText(raw []byte) string {
	var b strings.Builder
	for _, item := range gjson.GetBytes(raw, "result.content").Array() {
		if item.Get("type").String() == "text" {
			b.WriteString(item.Get("text").String())
		}
	}
	return b.String()
}

// rdBlobs are the decoded blobs at the gjson paths of raw.
func rdBlob(t *testing.T, raw []byte, path string) string {
	t.Helper()
	s := gjson.GetBytes(raw, path).String()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("%s of %.300s is not base64: %v", path, raw, err)
	}
	return string(b)
}

// rdLongWay is the shipped result policy's decision on input, evaluated
// as `opa eval` would: without input.scan, the policy's long way.
func rdLongWay(t *testing.T, channel, method, result string) map[string]any {
	t.Helper()
	var res any
	if err := json.Unmarshal([]byte(result), &res); err != nil {
		t.Fatal(err)
	}
	r := rego.New(rego.Query("data.toolgate.result.decision"),
		rego.Load([]string{filepath.Join("..", "policies", "result.rego"), filepath.Join("..", "policies", "text.rego")}, nil),
		rego.Input(map[string]any{"channel": channel, "method": method, "service": map[string]any{"id": "svc"}, "result": res}))
	rs, err := r.Eval(context.Background())
	if err != nil || len(rs) != 1 {
		t.Fatalf("long way: %v %v", rs, err)
	}
	return rs[0].Expressions[0].Value.(map[string]any)
}

// rdPolicyValue is a value the shipped result policy defines.
func rdPolicyValue(t *testing.T, ref string) any {
	t.Helper()
	r := rego.New(rego.Query(ref),
		rego.Load([]string{filepath.Join("..", "policies", "result.rego"), filepath.Join("..", "policies", "text.rego")}, nil))
	rs, err := r.Eval(context.Background())
	if err != nil || len(rs) != 1 {
		t.Fatalf("%s: %v %v", ref, rs, err)
	}
	return rs[0].Expressions[0].Value
}

// Attack: a marker of a pattern that matches in any case, spelled with
// U+212A KELVIN SIGN. The policy compares such markers with lower(s), and
// Go's ToLower makes U+212A an ASCII "k"; RE2's (?i) folds it too. So
// the policy's long way (opa eval, no input.scan) finds the marker and
// redacts the token. The gateway's scan (hasMarker, hasPrefixFold) folds
// ASCII only: no marker, scan.clean, rule `untouched` allows the result
// as it is, and the runner reads the OAuth token / Azure key.
func TestRedactionAttackKelvinSignScanSaysClean(t *testing.T) {
	const token = "ya29.a0AfH6SMBxKelvinBypass0123456789"
	const azure = "Zm9vYmFyYmF6cXV4S2VsdmluQnlwYXNzMDEyMzQ1Njc4OQ=="
	texts := []struct{ kind, text, secret string }{
		{"oauth_token", "access_to\u212Aen=" + token, token},
		{"azure_storage_key", "DefaultEndpointsProtocol=https;Account\u212Aey=" + azure, azure[:40]},
		{"aws_secret_access_key", "aws_secret_access_\u212Aey = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
	}
	for _, tc := range texts {
		result := `{"content":[{"type":"text","text":` + string(mustJSON(tc.text)) + `}]}`
		// The policy's own definition redacts it.
		long := rdLongWay(t, "result", "tools/call", result)
		if got, _ := json.Marshal(long); strings.Contains(string(got), tc.secret) || !strings.Contains(string(got), "REDACTED:"+tc.kind) {
			t.Fatalf("%s: the policy's long way does not redact it either: %s", tc.kind, got)
		}
	}
	for _, k := range rdKinds {
		t.Run(k.name, func(t *testing.T) {
			up, m := rdSession(t, gatewayConfig{})
			for i, tc := range texts {
				rdAnswer(up, "tools/call", k.sse, `{"content":[{"type":"text","text":`+string(mustJSON(tc.text))+`}]}`)
				ans := rdCall(t, m, 10+i)
				if strings.Contains(rdDecoded(ans), tc.secret) {
					t.Errorf("%s: the runner reads the secret (the scan said clean, the policy's long way redacts it): %s", tc.kind, ans)
				}
			}
		})
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Attack: "acce\u017Fs_token=<token>" (U+017F LATIN SMALL LETTER LONG S).
// The policy's own oauth_token pattern matches it — RE2's (?i) folds ſ
// with s, as Go's encoding/json does with keys — but holds_marker lowers
// the text (ToLower(ſ) is ſ) and looks for "access_token": no marker on
// either path, the pattern is never run, and the token reaches the
// runner.
func TestRedactionAttackLongSLabelNeverMatched(t *testing.T) {
	const token = "ya29.a0AfH6SMBxLongSBypass0123456789"
	text := "acce\u017Fs_token=" + token
	pattern := rdPolicyValue(t, "data.toolgate.result.secret_patterns.oauth_token").(string)
	if !regexp.MustCompile(pattern).MatchString(text) {
		t.Fatalf("the policy's oauth_token pattern does not match %q: the premise is wrong", text)
	}
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"text","text":`+string(mustJSON(text))+`}]}`)
	if ans := rdCall(t, m, 10); strings.Contains(rdDecoded(ans), token) {
		t.Errorf("the runner reads a token that the policy's own oauth_token pattern matches: %s", ans)
	}
}

// Attack: a secret split over three text items, or over two with an
// empty text item between them. The seams are looked at pairwise (each
// pair of consecutive text items), and no pair holds a whole match: the
// runner, joining its text items, reads the key.
func TestRedactionAttackSecretSplitAcrossThreeTextItems(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{})
	for i, parts := range [][]string{
		{"key AKIAIOSF", "", "ODNN7EXAMPLE done"},
		{"key AK", "IAIOSFODNN7E", "XAMPLE done"},
	} {
		var items []string
		for _, p := range parts {
			items = append(items, `{"type":"text","text":`+string(mustJSON(p))+`}`)
		}
		rdAnswer(up, "tools/call", i%2 == 1, `{"content":[`+strings.Join(items, ",")+`]}`)
		ans := rdCall(t, m, 10+i)
		if strings.Contains(rdJoinedText(ans), rdAWSKey) {
			t.Errorf("split %q: the runner's joined text holds the key: %s", parts, ans)
		}
	}
}

// Attack: toolgate replaces the credential it attached wherever the
// upstream writes it back, "however escaped" — before the result policy.
// Written back with a zero-width space in it, the credential is not found
// there; the result policy then removes the zero-width space (rule 1) and
// the runner gets the credential verbatim: toolgate itself reassembled it.
func TestRedactionAttackCredentialReassembledByStripping(t *testing.T) {
	const cred = "tgcred-7Hq2Lm9Xw4Zr8Np3"
	up, m := rdSession(t, gatewayConfig{Auth: "header X-Upstream-Key " + cred})
	hidden := cred[:10] + "\u200b" + cred[10:]
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"text","text":"your key is `+hidden+`"}]}`)
	ans := rdCall(t, m, 10)
	// Control: the upstream did get the credential.
	var sent bool
	for _, r := range up.requestLog() {
		sent = sent || r.Header.Get("X-Upstream-Key") == cred
	}
	if !sent {
		t.Fatalf("the upstream never got the credential")
	}
	if strings.Contains(rdDecoded(ans), cred) {
		t.Errorf("the runner reads the credential toolgate attached (the policy stripped the zero-width space the credential redaction did not look through): %s", ans)
	}
	// Control: written back plainly, it is redacted.
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"text","text":"your key is `+cred+`"}]}`)
	if ans := rdCall(t, m, 11); strings.Contains(rdDecoded(ans), cred) || !strings.Contains(string(ans), "REDACTED:credential") {
		t.Errorf("control: the plain credential was not redacted: %s", ans)
	}
}

// Attack: the credential written back base64-encoded in an embedded
// resource's blob (which runners decode, and the policy inspects decoded)
// reaches the runner: the credential redaction looks at JSON strings
// only, and the policy does not know the credential's shape.
func TestRedactionAttackCredentialInBlob(t *testing.T) {
	const cred = "tgcred-7Hq2Lm9Xw4Zr8Np3"
	up, m := rdSession(t, gatewayConfig{Auth: "header X-Upstream-Key " + cred})
	blob := base64.StdEncoding.EncodeToString([]byte("X-Upstream-Key: " + cred + "\n"))
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"resource","resource":{"uri":"file:///req.txt","mimeType":"text/plain","blob":"`+blob+`"}}]}`)
	ans := rdCall(t, m, 10)
	if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.Contains(got, cred) {
		t.Errorf("the runner decodes the credential toolgate attached from a resource blob: %q", got)
	}
}

// Attack: a tools/call result of a 2025-11-25 session that says
// "resultType":"input_required" (a member of the stateless revision,
// which neither the runner nor the upstream speaks here). The policy
// takes it for an input_required result, not a tool result: content
// items are not checked (an unknown type passes), resource blobs are not
// decoded (their base64 is read as plain text). The gateway relays it,
// and a 2025-11-25 runner ignores resultType and reads the content.
func TestRedactionAttackInputRequiredToolResult(t *testing.T) {
	blob := base64.StdEncoding.EncodeToString([]byte("aws key " + rdAWSKey + "\n"))
	result := `{"resultType":"input_required","content":[` +
		`{"type":"resource","resource":{"uri":"file:///k.txt","mimeType":"text/plain","blob":"` + blob + `"}},` +
		`{"type":"html","html":"<img src=x onerror=alert(1)>"}]}`
	// Control: without resultType the same result is withheld (unknown type).
	for _, k := range rdKinds {
		t.Run(k.name, func(t *testing.T) {
			up, m := rdSession(t, gatewayConfig{})
			rdAnswer(up, "tools/call", k.sse, strings.Replace(result, `"resultType":"input_required",`, "", 1))
			if ans := rdCall(t, m, 10); gjson.GetBytes(ans, "result.isError").Bool() != true || strings.Contains(string(ans), blob) {
				t.Fatalf("control: the result without resultType was not withheld: %s", ans)
			}
			rdAnswer(up, "tools/call", k.sse, result)
			ans := rdCall(t, m, 11)
			if gjson.GetBytes(ans, "result.content.0.resource.blob").Exists() {
				if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.Contains(got, rdAWSKey) {
					t.Errorf("the runner decodes an AWS key from a resource blob of a result marked input_required: %q (%s)", got, ans)
				}
			}
			if gjson.GetBytes(ans, "result.content.1.type").String() == "html" {
				t.Errorf("a content item of unknown type reaches the runner: %s", ans)
			}
		})
	}
}

// Attack: a text/plain resource blob (embedded in a tool result, or
// resources/read contents) holding a right-to-left override and a
// zero-width space. The policy decodes blobs only to look for secret
// markers; invisible characters in them are neither flagged by the scan
// nor removed, and the runner decodes them.
func TestRedactionAttackBlobKeepsInvisibleCharacters(t *testing.T) {
	text := "invoice.\u202Efdp.exe and pass\u200bword"
	blob := base64.StdEncoding.EncodeToString([]byte(text))
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"resource","resource":{"uri":"file:///r.txt","mimeType":"text/plain","blob":"`+blob+`"}}]}`)
	ans := rdCall(t, m, 10)
	if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.ContainsAny(got, "\u202E\u200b") {
		t.Errorf("tools/call: the runner decodes invisible characters from a resource blob: %+q", got)
	}
	rdAnswer(up, "resources/read", true, `{"contents":[{"uri":"file:///r.txt","mimeType":"text/plain","blob":"`+blob+`"}]}`)
	ans = rdRequest(t, m, 11, "resources/read", `{"uri":"file:///r.txt"}`)
	if got := rdBlob(t, ans, "result.contents.0.blob"); strings.ContainsAny(got, "\u202E\u200b") {
		t.Errorf("resources/read: the runner decodes invisible characters from a blob: %+q", got)
	}
	// Control: the same text as text is stripped.
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"text","text":`+string(mustJSON(text))+`}]}`)
	if ans := rdCall(t, m, 12); strings.ContainsAny(rdDecoded(ans), "\u202E\u200b") {
		t.Errorf("control: the text was not stripped: %s", ans)
	}
}

// Attack: 200 KB of text in a text/plain resource blob. Blobs are not
// counted in scan.bytes (nor in the policy's own), so a result whose text
// is three times max_result_bytes (64 KiB) reaches the runner whole.
func TestRedactionAttackBlobTextIsNotCut(t *testing.T) {
	text := strings.Repeat("log line: nothing secret here, just a lot of it\n", 4200) // ~200 KB
	blob := base64.StdEncoding.EncodeToString([]byte(text))
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///log.txt","mimeType":"text/plain","blob":"`+blob+`"}]}`)
	ans := rdRequest(t, m, 10, "resources/read", `{"uri":"file:///log.txt"}`)
	if got := rdBlob(t, ans, "result.contents.0.blob"); len(got) > 65536 {
		t.Errorf("the runner decodes %d bytes of text from one blob, over max_result_bytes (65536)", len(got))
	}
	// Control: the same text as text is cut.
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///log.txt","mimeType":"text/plain","text":`+string(mustJSON(text))+`}]}`)
	ans = rdRequest(t, m, 11, "resources/read", `{"uri":"file:///log.txt"}`)
	if n := len(gjson.GetBytes(ans, "result.contents.0.text").String()); n > 66000 || !strings.Contains(string(ans), "truncated by toolgate") {
		t.Errorf("control: the text was not cut (%d bytes)", n)
	}
}

// Attack: resources/read answered with "Contents" instead of "contents".
// The strict parser refuses two keys that differ only in case, not one;
// the policy's table of blobs (blob_strings) knows "contents" only, so
// the blob is inspected as base64 text and passes. A runner that decodes
// with Go's encoding/json (which matches struct fields ignoring case, as
// mcpmsg's own comment says) reads Contents as contents and decodes the
// key from the blob.
func TestRedactionAttackCaseVariantContentsKey(t *testing.T) {
	blob := base64.StdEncoding.EncodeToString([]byte("aws key " + rdAWSKey + "\n"))
	up, m := rdSession(t, gatewayConfig{})
	// Control: spelled "contents", the blob is decoded and redacted.
	rdAnswer(up, "resources/read", false, `{"contents":[{"uri":"file:///k.txt","mimeType":"text/plain","blob":"`+blob+`"}]}`)
	if ans := rdRequest(t, m, 10, "resources/read", `{"uri":"file:///k.txt"}`); strings.Contains(rdBlob(t, ans, "result.contents.0.blob"), rdAWSKey) {
		t.Fatalf("control: the blob was not redacted: %s", ans)
	}
	rdAnswer(up, "resources/read", false, `{"Contents":[{"uri":"file:///k.txt","mimeType":"text/plain","blob":"`+blob+`"}]}`)
	ans := rdRequest(t, m, 11, "resources/read", `{"uri":"file:///k.txt"}`)
	var runner struct {
		Result struct {
			Contents []struct {
				URI  string `json:"uri"`
				Blob []byte `json:"blob"`
			} `json:"contents"`
		} `json:"result"`
	}
	if err := json.Unmarshal(ans, &runner); err == nil {
		for _, c := range runner.Result.Contents {
			if strings.Contains(string(c.Blob), rdAWSKey) {
				t.Errorf("a runner decoding with encoding/json reads the AWS key from the blob of %q: %s", c.URI, ans)
			}
		}
	}
}

// Holds: escapes. The gateway's parser decodes \u escapes (a marker
// written \u0041KIA, a key next to a surrogate pair) and \/ (a Slack
// webhook) before the scan and the policy look, so each is redacted,
// from JSON and SSE answers.
func TestRedactionHoldsEscapedSecrets(t *testing.T) {
	texts := map[string]string{
		"aws_access_key_id": `key \u0041KIAIOSFODNN7EXAMPL\u0045 \ud83d\ude00`,
		"slack_webhook":     `hook https:\/\/hooks.slack.com\/services\/T0000000\/B0000000\/XXXXXXXXXXXXXXXXXXXXXXXX`,
		"github_token":      `\u0067hp_0123456789abcdefghijklmnopqrstuvwxyzAB`,
		"jwt":               `eyJhbGciOiJIUzI1NiJ9\u002eeyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U`,
	}
	for _, k := range rdKinds {
		t.Run(k.name, func(t *testing.T) {
			up, m := rdSession(t, gatewayConfig{})
			id := 10
			for kind, text := range texts {
				id++
				rdAnswer(up, "tools/call", k.sse, `{"content":[{"type":"text","text":"`+text+`"}],"structuredContent":{"v":"`+text+`"}}`)
				ans := rdCall(t, m, id)
				if n := strings.Count(string(ans), "[REDACTED:"+kind+"]"); n != 2 {
					t.Errorf("%s: %d redactions, want 2: %s", kind, n, ans)
				}
			}
		})
	}
}

// Holds: a result with duplicate keys, or keys differing only in case,
// has no single reading; it is never relayed, whichever key holds the
// secret.
func TestRedactionHoldsDuplicateAndCaseVariantKeys(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{})
	for i, result := range []string{
		`{"content":[{"type":"text","text":"fine","text":"` + rdAWSKey + `"}]}`,
		`{"content":[{"type":"text","text":"fine"}],"Content":[{"type":"text","text":"` + rdAWSKey + `"}]}`,
		`{"content":[{"type":"text","text":"fine","te\u0078t":"` + rdAWSKey + `"}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"a","text":"ok"},"re\u017fource":{"uri":"a","text":"` + rdAWSKey + `"}}]}`,
	} {
		rdAnswer(up, "tools/call", i%2 == 1, result)
		ans := rdCall(t, m, 10+i)
		if strings.Contains(rdDecoded(ans), rdAWSKey) || gjson.GetBytes(ans, "error").Exists() == false && !gjson.GetBytes(ans, "result.isError").Bool() {
			t.Errorf("%s: relayed: %s", result, ans)
		}
	}
}

// Holds: a secret split over two consecutive text items (the seam) is
// redacted on both sides.
func TestRedactionHoldsTwoItemSeam(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"text","text":"key AKIAIOSF"},{"type":"text","text":"ODNN7EXAMPLE done"}]}`)
	ans := rdCall(t, m, 10)
	if j := rdJoinedText(ans); strings.Contains(j, rdAWSKey) || strings.Contains(j, "ODNN7EXAMPLE") || !strings.Contains(j, "REDACTED:aws_access_key_id") {
		t.Errorf("the split key was not redacted: %s", ans)
	}
}

// Holds: a secret in an error's data and in a log notification on the
// call's SSE stream is redacted on those channels too.
func TestRedactionHoldsOtherChannels(t *testing.T) {
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", true,
		`{"jsonrpc":"2.0","id":ID,"error":{"code":-32000,"message":"failed","data":{"auth":"Bearer abcdefghijklmnop0123456789"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":{"line":"key `+rdAWSKey+`"}}}`)
	_, _, msgs := m.post(`{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	all := ""
	for _, msg := range msgs {
		all += string(msg) + "\n"
	}
	if len(msgs) != 2 || strings.Contains(all, rdAWSKey) || strings.Contains(all, "abcdefghijklmnop0123456789") || strings.Count(all, "REDACTED") != 2 {
		t.Errorf("the secrets on the error and notification channels were not redacted: %s", all)
	}
}

// Holds: blobs runners might decode leniently but Go's standard decoder
// refuses (URL-safe alphabet, no padding, spaces) are withheld; a blob with
// line breaks is decoded as runners do and redacted.
func TestRedactionHoldsBlobVariants(t *testing.T) {
	secret := []byte("k=" + rdAWSKey + "??>")
	std := base64.StdEncoding.EncodeToString(secret)
	up, m := rdSession(t, gatewayConfig{})
	for i, blob := range []string{
		base64.URLEncoding.EncodeToString(secret),
		base64.RawStdEncoding.EncodeToString(secret),
		std[:8] + " " + std[8:],
	} {
		rdAnswer(up, "tools/call", false, `{"content":[{"type":"resource","resource":{"uri":"file:///b","blob":"`+blob+`"}}]}`)
		if ans := rdCall(t, m, 10+i); !gjson.GetBytes(ans, "result.isError").Bool() || strings.Contains(string(ans), blob) {
			t.Errorf("blob %q was not withheld: %s", blob, ans)
		}
	}
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"resource","resource":{"uri":"file:///b","blob":"`+std[:8]+`\n`+std[8:]+`"}}]}`)
	ans := rdCall(t, m, 20)
	if got := rdBlob(t, ans, "result.content.0.resource.blob"); strings.Contains(got, rdAWSKey) || !strings.Contains(got, "REDACTED") {
		t.Errorf("a blob with a line break was not redacted: %q", got)
	}
}

// Holds: many strings, each just under the scan's 4096-byte threshold
// (so the scan lists none), together over max_result_bytes: the policy
// does not trust the scan there and cuts them.
func TestRedactionHoldsScanThreshold(t *testing.T) {
	var members []string
	for i := range 20 {
		members = append(members, fmt.Sprintf(`"k%02d":"%s"`, i, strings.Repeat("y", 4096)))
	}
	up, m := rdSession(t, gatewayConfig{})
	rdAnswer(up, "tools/call", false, `{"content":[{"type":"text","text":"ok"}],"structuredContent":{`+strings.Join(members, ",")+`}}`)
	ans := rdCall(t, m, 10)
	if n := len(gjson.GetBytes(ans, "result.structuredContent").Raw); n > 70000 || !strings.Contains(string(ans), "truncated by toolgate") {
		t.Errorf("%d bytes of structured content reached the runner uncut", n)
	}
}
