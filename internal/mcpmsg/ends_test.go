package mcpmsg

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// StringEnds decodes what the whole string decodes to, at its ends: for
// strings of every length written with every kind of escape (surrogate
// pairs, escaped backslashes before a u, characters of one to four bytes
// as they are), and ends of every length, its head is the start of the
// decoded text without the skipped characters, its tail the end, each at
// least n bytes long, and a whole string is all of it.
func TestStringEndsDecodesAsTheWholeString(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pieces := []string{"a", "Z", "/", `\"`, `\\`, `\/`, `\n`, `\t`, `\u0041`, `\u00e9`, `\u200b`, `\ud83d\ude00`, `\udb40\udc20`,
		"é", "\u200b", "😀", "中", `\\u0041`, `\\\u0042`, "u0041"}
	skip := func(r rune) bool { return r == 0x200B || r == 0xE0020 }
	for trial := range 20000 {
		var b strings.Builder
		b.WriteByte('"')
		for range rng.IntN(40) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		b.WriteByte('"')
		raw := []byte(b.String())
		full, ok := String(raw)
		if !ok {
			t.Fatalf("not a string: %s", raw)
		}
		clean := strings.Map(func(r rune) rune {
			if skip(r) {
				return -1
			}
			return r
		}, full)
		n := 1 + rng.IntN(12)
		head, tail, whole := StringEnds(raw, n, skip)
		switch {
		case whole && head != clean:
			t.Fatalf("trial %d: %s (n %d): whole %q, want %q", trial, raw, n, head, clean)
		case !whole && (!strings.HasPrefix(clean, head) || !strings.HasSuffix(clean, tail) || len(head) < n || len(tail) < n ||
			!utf8.ValidString(head) || !utf8.ValidString(tail)):
			t.Fatalf("trial %d: %s (n %d): head %q, tail %q of %q", trial, raw, n, head, tail, clean)
		case !whole && len(head)+len(tail) > len(clean):
			t.Fatalf("trial %d: %s (n %d): head %q and tail %q overlap in %q", trial, raw, n, head, tail, clean)
		}
	}
}

func TestElementsAndMembers(t *testing.T) {
	var got []string
	Elements([]byte(` [ {"a":1} , "x\"]" ,[1,[2]], 3 ] `), func(e []byte) bool {
		got = append(got, string(e))
		return true
	})
	if want := []string{`{"a":1}`, `"x\"]"`, `[1,[2]]`, `3`}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("elements %q, want %q", got, want)
	}
	got = nil
	Elements([]byte(`[1,2,3]`), func(e []byte) bool {
		got = append(got, string(e))
		return len(got) < 2
	})
	if len(got) != 2 {
		t.Errorf("elements after false: %q", got)
	}
	Elements([]byte(`{"a":[1]}`), func([]byte) bool { t.Error("an element of an object"); return true })
	got = nil
	Members([]byte(`{"type":"text", "te\u0078t" : "a\"b" ,"n":{"x":[1]}}`), func(k, v []byte) {
		got = append(got, string(k)+"="+string(v))
	})
	if want := []string{`type="text"`, `text="a\"b"`, `n={"x":[1]}`}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("members %q, want %q", got, want)
	}
	Members([]byte(`[1]`), func(k, v []byte) { t.Error("a member of an array") })
}

// MemberSpan finds a member by its decoded key, past values that hold
// quotes, braces and the key itself, and only at the object's own level.
func TestMemberSpan(t *testing.T) {
	obj := `{"content":[{"text":"\"_meta\":{}"},{"_meta":1}], "\u005fme\u0074a" : {"a":"}"} ,"z":2}`
	start, end, ok := MemberSpan([]byte(obj), "_meta")
	if !ok || obj[start:end] != `{"a":"}"}` {
		t.Errorf("MemberSpan = %d %d %v (%q), want the escaped key's object", start, end, ok, obj[start:end])
	}
	for _, absent := range []string{`{"content":[{"_meta":1}],"x":"\"_meta\":1"}`, `[{"_meta":1}]`, `{}`, ``} {
		if _, _, ok := MemberSpan([]byte(absent), "_meta"); ok {
			t.Errorf("MemberSpan found _meta in %s", absent)
		}
	}
}

// Elements and Members read what encoding/json reads, in random values
// with random blanks, strings with escaped quotes and backslashes, and
// nesting.
func TestElementsAndMembersReadAsEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	blank := func() string { return []string{"", " ", "\n\t", "\r\n  "}[rng.IntN(4)] }
	strs := []string{`"a"`, `""`, `"x\"]}"`, `"\\"`, `"\\\""`, `"é\u00e9,"`, `"{["`}
	var value func(depth int) string
	value = func(depth int) string {
		switch k := rng.IntN(6); {
		case depth > 3 || k == 0:
			return []string{"1", "-2.5e3", "true", "false", "null"}[rng.IntN(5)]
		case k == 1 || k == 2:
			return strs[rng.IntN(len(strs))]
		case k == 3:
			var parts []string
			for range rng.IntN(4) {
				parts = append(parts, blank()+value(depth+1)+blank())
			}
			return "[" + strings.Join(parts, ",") + blank() + "]"
		}
		var parts []string
		for i := range rng.IntN(4) {
			parts = append(parts, blank()+fmt.Sprintf(`"k%d\"%d"`, i, i)+blank()+":"+blank()+value(depth+1)+blank())
		}
		return "{" + strings.Join(parts, ",") + blank() + "}"
	}
	for trial := range 5000 {
		arr := blank() + value(0) + blank()
		if !json.Valid([]byte(arr)) {
			t.Fatalf("generated invalid JSON %s", arr)
		}
		var wantElems []json.RawMessage
		if json.Unmarshal([]byte(arr), &wantElems) == nil {
			var got []string
			Elements([]byte(arr), func(e []byte) bool { got = append(got, string(e)); return true })
			if len(got) != len(wantElems) {
				t.Fatalf("trial %d: %s: elements %q, want %d", trial, arr, got, len(wantElems))
			}
			for i, e := range wantElems {
				if got[i] != strings.TrimSpace(string(e)) {
					t.Fatalf("trial %d: %s: element %d %q, want %q", trial, arr, i, got[i], e)
				}
			}
		}
		var wantMembers map[string]json.RawMessage
		if json.Unmarshal([]byte(arr), &wantMembers) == nil {
			got := map[string]string{}
			Members([]byte(arr), func(k, v []byte) { got[string(k)] = string(v) })
			if len(got) != len(wantMembers) {
				t.Fatalf("trial %d: %s: members %q, want %d", trial, arr, got, len(wantMembers))
			}
			for k, v := range wantMembers {
				if got[k] != strings.TrimSpace(string(v)) {
					t.Fatalf("trial %d: %s: member %q %q, want %q", trial, arr, k, got[k], v)
				}
			}
		}
	}
}
