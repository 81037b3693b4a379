package policy

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// jsonSamples are documents mcpmsg accepts, with the cases the parser
// treats specially: escapes (a quote after backslashes, surrogate pairs),
// numbers of every shape, long strings, deep and repeated keys.
var jsonSamples = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-3`, `-12E+4`, `123456789012345678901234567890`, `true`, `false`, `null`,
	`{"a":1,"b":[true,false,null],"c":{"d":"e"}}`,
	` { "spaced" : [ 1 , 2 ] , "x" : "y" } `,
	`"quote \" inside"`, `"backslash at the end \\"`, `"\\\" both"`, `"\\\\\\\""`,
	`"escapes \b\f\n\r\t\/ and \u00e9 \u2028 \ud83d\udc4d"`,
	`"no escapes, just UTF-8: héllo 👍 and a zero-width\u200bspace"`,
	`{"long":"` + strings.Repeat("abcdefghij", 200) + `","escaped":"` + strings.Repeat(`line\n`, 300) + `"}`,
	`[` + strings.Repeat(`{"id":1,"name":"x","tags":["a","b"]},`, 50) + `{"id":2}]`,
	`{"<&>":"<script>&amp;</script>"}`,
	strings.Repeat("[", 40) + "1" + strings.Repeat("]", 40),
}

func TestJSONTermMatchesEncodingJSON(t *testing.T) {
	for _, doc := range jsonSamples {
		if err := mcpmsg.Validate([]byte(doc), mcpmsg.Limits{}); err != nil {
			t.Fatalf("sample %s is not valid: %v", doc, err)
		}
		got, err := jsonTerm([]byte(doc))
		if err != nil {
			t.Errorf("jsonTerm(%s): %v", doc, err)
			continue
		}
		if want := referenceValue(t, doc); got.Value.Compare(want) != 0 {
			t.Errorf("jsonTerm(%s) = %v, want %v", doc, got, want)
		}
	}
}

// referenceValue is doc as OPA's own conversion reads it.
func referenceValue(t testing.TB, doc string) ast.Value {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	want, err := ast.InterfaceToValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

func TestJSONTermRejectsMalformedText(t *testing.T) {
	for _, doc := range []string{``, `{`, `[1,`, `{"a"}`, `{"a":}`, `"open`, `"bad \x escape"`, `01`, `1.`, `-`, `tru`, `{"a":1}x`, `"\ud800"`} {
		if _, err := jsonTerm([]byte(doc)); err == nil {
			t.Errorf("jsonTerm(%q) succeeded", doc)
		}
	}
}

func TestAppendJSON(t *testing.T) {
	for _, doc := range jsonSamples {
		term, err := jsonTerm([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		out, err := appendJSON(nil, term, nil)
		if err != nil {
			t.Fatalf("appendJSON(%s): %v", doc, err)
		}
		if err := mcpmsg.Validate(out, mcpmsg.Limits{}); err != nil {
			t.Errorf("appendJSON(%s) = %s: %v", doc, out, err)
		}
		if back := referenceValue(t, string(out)); back.Compare(term.Value) != 0 {
			t.Errorf("appendJSON(%s) = %s, which reads as %v", doc, out, back)
		}
	}
	// Escaped as mcpmsg.AppendQuote escapes, invalid UTF-8 included.
	for _, s := range []string{"plain", "a\"b\\c\nd\re\tf\x01g", "<&>", "\u2028\u2029", "é👍", "bad \xff byte", "\x7f"} {
		if got, want := appendString(nil, s), mcpmsg.AppendQuote(nil, s); !bytes.Equal(got, want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got, want)
		}
	}
	// What JSON cannot hold is an error, not a guess.
	for _, v := range []string{`{1: "a"}`, `{"a": {"b": [x]}}`} {
		if _, err := appendJSON(nil, ast.MustParseTerm(v), nil); err == nil {
			t.Errorf("appendJSON(%s) succeeded", v)
		}
	}
	if out, err := appendJSON(nil, ast.MustParseTerm(`{"s": {"b", "a"}}`), nil); err != nil || string(out) != `{"s":["a","b"]}` {
		t.Errorf("a set: %s, %v", out, err)
	}
}

func TestAppendJSONWritesUnchangedValuesAsReceived(t *testing.T) {
	big := `{"keep": {"spacing" :  [1, 2.50, "\u0041"],   "pad": "` + strings.Repeat("x", spanMin) + `"}, "change": "old"}`
	spans := map[*ast.Term]string{}
	p := jsonParser{src: big, spans: spans}
	doc, err := p.parse()
	if err != nil {
		t.Fatal(err)
	}
	obj := doc.Value.(ast.Object)
	keep := obj.Get(ast.StringTerm("keep"))
	if _, ok := spans[keep]; !ok {
		t.Fatal("the large value was not recorded")
	}
	patched := ast.ObjectTerm(ast.Item(ast.StringTerm("keep"), keep), ast.Item(ast.StringTerm("change"), ast.StringTerm("new")))
	out, err := appendJSON(nil, patched, spans)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"change":"new","keep":{"spacing" :  [1, 2.50, "\u0041"],   "pad": "` + strings.Repeat("x", spanMin) + `"}}`
	if string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
}

func FuzzJSONTerm(f *testing.F) {
	for _, doc := range jsonSamples {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if mcpmsg.Validate(doc, mcpmsg.Limits{}) != nil {
			_, _ = jsonTerm(doc) // must not panic
			return
		}
		got, err := jsonTerm(doc)
		if err != nil {
			t.Fatalf("jsonTerm(%q): %v", doc, err)
		}
		out, err := appendJSON(nil, got, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The gateway keeps a number's text; OPA's own conversion refuses
		// one past float64's range ("1e70000"), and the reference with it.
		// Such a document is compared with itself written back instead.
		if want, ok := referenceValueOf(string(doc)); ok {
			if got.Value.Compare(want) != 0 {
				t.Fatalf("jsonTerm(%q) = %v, want %v", doc, got, want)
			}
			if back := referenceValue(t, string(out)); back.Compare(got.Value) != 0 {
				t.Fatalf("appendJSON(%v) = %s", got, out)
			}
			return
		}
		back, err := jsonTerm(out)
		if err != nil || back.Value.Compare(got.Value) != 0 {
			t.Fatalf("appendJSON(%v) = %s, read back as %v (%v)", got, out, back, err)
		}
	})
}

// referenceValueOf is referenceValue, false when OPA's conversion refuses
// the document (a number past float64's range).
func referenceValueOf(doc string) (ast.Value, bool) {
	d := json.NewDecoder(strings.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, false
	}
	want, err := ast.InterfaceToValue(v)
	return want, err == nil
}
