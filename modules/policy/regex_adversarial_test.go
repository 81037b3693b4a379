package policy

// Adversarial review of 61c2e9f (policies/text.rego: has_invisible
// matches trim(s, ascii), clean returns s when it has none;
// policies/result.rego: the private-key line check guarded by contains,
// blobs decoded once, a long blob of text no longer in marked_blobs but
// clean_of requiring blob_text_bytes <= long_blob) against 99fdecf.
//
// Attack: the ascii cutset of text.rego (a Rego string of \u escapes): a
//   character outside ASCII in it, or one missing, or a parse surprise
//   (\u0000, \u0022, \u005c, \u007f) would trim an invisible character off
//   the ends, or not trim: TestRegexAdvASCIICutsetIsASCII.
// Attack: text.has_invisible and text.clean against the 99fdecf rules
//   (textReference) on
//   every invisible character and its neighbours, at the start, the end
//   and the middle of ASCII text, alone, next to ASCII controls and DEL,
//   next to other characters outside ASCII (U+0080, U+00A0, é, emoji,
//   U+FFFD), and on blobs' bytes that are not UTF-8 (a lone lead byte or
//   continuation byte next to an invisible character, which trim and the
//   regular expression decode as U+FFFD): TestRegexAdvTextRulesAsBefore.
// Attack: the whole result policy of 99fdecf (rebuilt from the shipped one
//   by reverting the commit's hunks) against the shipped one, each with the
//   gateway's scan and the long way, on payloads of every channel aimed at
//   the change: blobs of text of 4095/4096/4097 bytes alone and together,
//   blobs of binary data, blobs with a marker or an invisible character
//   past long_blob, empty blobs, blobs over max_bytes, blobs that are not
//   UTF-8, blobs with CR/LF (decoded by StdEncoding), private key lines
//   across three or more text items (5 dashes, 4 dashes and a space,
//   lower case, "PRIVATE  KEY", a zero-width space inside "PRIVATE KEY",
//   across the BEGIN/END of two keys), invisible characters at the ends of
//   texts, keys and seams: 1650 decisions, compared once for this review
//   (the comparison rebuilt the old policy from the commit's hunks, so it
//   is not kept as a test).
// Attack (finding, pre-existing: 99fdecf decides the same; 61c2e9f's new
//   clean_of condition copies it): a blob of text over max_result_bytes but
//   within long_blob (4096 bytes), e.g. 1000 bytes with max_result_bytes
//   300. The policy's long way withholds it (blob_text_bytes > max_bytes);
//   the gateway's scan calls the result clean (blobText <= longBlob, and
//   scan.bytes leaves blobs out), so `untouched` allows it whole: the scan
//   and the long way disagree, and the limit is not applied to blobs of up
//   to 4 KiB. TestRegexAdvTextBlobOverTheLimit.
//
// Holds: ascii is exactly U+0000..U+007F.
// Holds: has_invisible and clean answer as before on every string tried,
//   including bytes that are not UTF-8.
// Holds: the shipped policy decides every payload tried exactly as the
//   policy of 99fdecf (action, reason, replacement result), with and
//   without the gateway's scan, and the two ways agree. A long blob of text
//   with nothing in it is no longer run through redact, but redact never
//   changed such a blob; the verdict "not clean" is kept by clean_of's
//   new blob_text_bytes <= long_blob, which is the scan's blobText <=
//   longBlob. The contains guard of the private key line check is implied
//   by key_line itself (both its alternatives hold "PRIVATE KEY").

import (
	"context"
	"encoding/base64"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"go.uber.org/zap"
)

// evalText evaluates query (over input.s) with the shipped text.rego and
// the reference rules of textReference.
func evalText(t *testing.T, query string) func(s string) *ast.Term {
	t.Helper()
	src, err := os.ReadFile("../../policies/text.rego")
	if err != nil {
		t.Fatal(err)
	}
	pq, err := rego.New(rego.Query(query), rego.Module("text.rego", string(src)), rego.Module("reference.rego", textReference)).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return func(s string) *ast.Term {
		rs, err := pq.Eval(context.Background(), rego.EvalParsedInput(ast.NewObject(ast.Item(ast.StringTerm("s"), ast.StringTerm(s)))))
		if err != nil {
			t.Fatalf("%s on %q: %v", query, s, err)
		}
		if len(rs) == 0 {
			return ast.StringTerm("<undefined>")
		}
		v, ok := rs[0].Bindings["x"]
		if !ok {
			t.Fatalf("%s: no binding of x", query)
		}
		term, err := ast.InterfaceToValue(v)
		if err != nil {
			t.Fatal(err)
		}
		return ast.NewTerm(term)
	}
}

func TestRegexAdvASCIICutsetIsASCII(t *testing.T) {
	v, ok := evalText(t, "x := data.toolgate.text.ascii")("").Value.(ast.String)
	if !ok {
		t.Fatal("ascii is not a string")
	}
	ascii := string(v)
	seen := map[rune]bool{}
	for _, r := range ascii {
		if r >= 0x80 {
			t.Errorf("ascii holds %U, outside ASCII: trim would take it off the ends of a text", r)
		}
		seen[r] = true
	}
	for r := rune(0); r < 0x80; r++ {
		if !seen[r] {
			t.Errorf("ascii lacks %U", r)
		}
	}
}

// textCorpus: invisible characters and their neighbours in every position.
func textCorpus() []string {
	var invisibles []string
	for _, r := range [][2]rune{{0x00AD, 0x00AD}, {0x034F, 0x034F}, {0x061C, 0x061C}, {0x115F, 0x1160}, {0x17B4, 0x17B5}, {0x180B, 0x180F},
		{0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x206F}, {0x3164, 0x3164}, {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF}, {0xFFA0, 0xFFA0},
		{0xFFF0, 0xFFFB}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF}} {
		for c := r[0] - 1; c <= r[1]+1; c++ {
			if c-r[0] > 4 && r[1]-c > 4 {
				continue
			}
			invisibles = append(invisibles, string(c))
		}
	}
	around := []string{"", "a", "\x00", "\x7f", "\t\n", "\u0080", "\u00a0", "é", "👍", "\ufffd", "\xff", "\xe2\x80", "\x80", "ab\u00e9cd"}
	var out []string
	for _, inv := range invisibles {
		for _, a := range around {
			out = append(out, inv, a+inv, inv+a, a+inv+a, "plain "+a+inv+" text", a+"x"+inv+"y"+a, inv+strings.Repeat("z", 50)+inv)
		}
	}
	return append(out, "", "plain ascii", "\x00\x7f", "é", "\xff", "\u00a0 \u00a0", strings.Repeat("log line\n", 100))
}

// textReference is text.has_invisible and text.clean as they were before
// 61c2e9f: the regular expression over the whole string.
const textReference = `package reference

import data.toolgate.text

has_invisible(s) := regex.match(text.invisible_pattern, s)

clean(s) := regex.replace(s, text.invisible_pattern, "")
`

func TestRegexAdvTextRulesAsBefore(t *testing.T) {
	newHas, oldHas := evalText(t, "x := data.toolgate.text.has_invisible(input.s)"), evalText(t, "x := data.reference.has_invisible(input.s)")
	newClean, oldClean := evalText(t, "x := data.toolgate.text.clean(input.s)"), evalText(t, "x := data.reference.clean(input.s)")
	n, with, cleaned := 0, 0, 0
	for _, s := range textCorpus() {
		n++
		a, b := newHas(s), oldHas(s)
		if !a.Equal(b) {
			t.Errorf("has_invisible(%q) = %v, before %v", s, a, b)
		}
		if a.Equal(ast.BooleanTerm(true)) {
			with++
		}
		c, d := newClean(s), oldClean(s)
		if !c.Equal(d) {
			t.Errorf("clean(%q) = %v, before %v", s, c, d)
		}
		if !c.Equal(ast.StringTerm(s)) {
			cleaned++
		}
	}
	if with == 0 || with == n || cleaned == 0 {
		t.Fatalf("the rules were not evaluated: %d of %d strings with an invisible character, %d cleaned", with, n, cleaned)
	}
	t.Logf("%d strings, %d with an invisible character, %d changed by clean", n, with, cleaned)
}

// A blob of text over max_result_bytes but within long_blob (4096 bytes),
// with nothing else in the result: the policy's long way withholds it
// (blob_text_bytes > max_bytes), but the gateway's scan calls the result
// clean (blobText <= longBlob, and scan.bytes leaves blobs out), so
// `untouched` let it through whole. Pre-existing (99fdecf decided the
// same); fixed: untouched needs a limit of long_blob or more.
func TestRegexAdvTextBlobOverTheLimit(t *testing.T) {
	dir := shippedPolicies(t, map[string]string{"data.json": `{"toolgate": {"settings": {"max_result_bytes": 300}}}`})
	e, err := newEngine(newSource(dir), "data.toolgate.result.decision", stageResult, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	call, err := callOf(`{"name":"read_ticket"}`, `{"id":1}`)
	if err != nil {
		t.Fatal(err)
	}
	blob := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("a log line of plain text\n", 40))) // 1000 bytes
	for _, k := range [][2]string{
		{"resources/read", `{"contents":[{"uri":"file:///log","mimeType":"text/plain","blob":"` + blob + `"}]}`},
		{"tools/call", `{"content":[{"type":"resource","resource":{"uri":"file:///log","blob":"` + blob + `"}}]}`},
	} {
		c := e.current.Load()
		h := &ResultHandler{Config{engine: e}}
		scanned, err := h.input(c, call, subject{channel: channelResult, method: k[0], view: call}, []byte(k[1]), map[*ast.Term]string{})
		if err != nil {
			t.Fatal(err)
		}
		long := ast.NewObject()
		scanned.Foreach(func(key, v *ast.Term) {
			if !key.Equal(keyScan) {
				long.Insert(key, v)
			}
		})
		ctx := context.Background()
		fast := e.decideWith(ctx, c, scanned, time.Minute, "result")
		slow := e.decideWith(ctx, c, long, time.Minute, "result")
		if fast.Action != slow.Action || fast.Action != "deny" {
			t.Errorf("%s, 1000 bytes of text in a blob, max_result_bytes 300: with the gateway's scan %s, the policy's long way %s (%s)",
				k[0], fast.Action, slow.Action, slow.Reason)
		}
	}
}
