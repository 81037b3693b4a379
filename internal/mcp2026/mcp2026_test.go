package mcp2026

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

const meta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"sampling":{}}}`

func request(t *testing.T, body string, hdr map[string]string) (*http.Request, mcpmsg.Message) {
	t.Helper()
	msg, err := mcpmsg.Parse([]byte(body), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/mcp/svc", strings.NewReader(body))
	r.Header.Set(HeaderProtocolVersion, Version)
	r.Header.Set(HeaderMethod, msg.Method)
	if name, ok := Name(msg); ok {
		r.Header.Set(HeaderName, name)
	}
	for k, v := range hdr {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	return r, msg
}

func TestCheck(t *testing.T) {
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{},` + meta + `}}`
	read := `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a b/ü",` + meta + `}}`
	cases := []struct {
		name string
		body string
		hdr  map[string]string
		code int // 0: accepted
	}{
		{"well formed", call, nil, 0},
		{"whitespace around Mcp-Name", call, map[string]string{HeaderName: "  echo\t"}, 0},
		{"no version header", call, map[string]string{HeaderProtocolVersion: ""}, CodeHeaderMismatch},
		{"no _meta", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, nil, -32602},
		{"no params", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil, -32602},
		{"version not a string", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":1,"io.modelcontextprotocol/clientCapabilities":{}}}}`, nil, -32602},
		{"no capabilities", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, nil, -32602},
		{"capabilities not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":[]}}}`, nil, -32602},
		{"header and _meta disagree", call, map[string]string{HeaderProtocolVersion: "2099-01-01"}, CodeHeaderMismatch},
		{"unknown version", strings.Replace(call, Version, "2099-01-01", 1), map[string]string{HeaderProtocolVersion: "2099-01-01"}, CodeUnsupportedProtocolVersion},
		{"no Mcp-Method", call, map[string]string{HeaderMethod: ""}, CodeHeaderMismatch},
		{"Mcp-Method in another case", call, map[string]string{HeaderMethod: "TOOLS/CALL"}, CodeHeaderMismatch},
		{"Mcp-Name of another tool", call, map[string]string{HeaderName: "other"}, CodeHeaderMismatch},
		{"no Mcp-Name", call, map[string]string{HeaderName: ""}, CodeHeaderMismatch},
		{"Mcp-Name with a control character", call, map[string]string{HeaderName: "echo\x01"}, CodeHeaderMismatch},
		{"Base64 Mcp-Name of the URI", read, map[string]string{HeaderName: EncodeHeaderValue("file:///a b/ü")}, 0},
		{"plain Mcp-Name of a URI that needs Base64", read, map[string]string{HeaderName: "file:///a b/u"}, CodeHeaderMismatch},
		{"requestState not a string", strings.Replace(call, `"arguments":{}`, `"arguments":{},"requestState":1`, 1), nil, -32602},
	}
	for _, c := range cases {
		r, msg := request(t, c.body, c.hdr)
		st, refusal := Check(r, msg)
		switch {
		case c.code == 0 && refusal != nil:
			t.Errorf("%s: refused: %+v", c.name, refusal)
		case c.code == 0 && string(st.Capabilities) != `{"sampling":{}}`:
			t.Errorf("%s: capabilities %s", c.name, st.Capabilities)
		case c.code != 0 && (refusal == nil || refusal.Code != c.code || refusal.Status != http.StatusBadRequest):
			t.Errorf("%s: got %+v, want 400 with %d", c.name, refusal, c.code)
		}
	}
	// A header sent twice has no single value.
	r, msg := request(t, call, nil)
	r.Header.Add(HeaderName, "other")
	if _, refusal := Check(r, msg); refusal == nil || refusal.Code != CodeHeaderMismatch {
		t.Errorf("two Mcp-Name headers: %+v", refusal)
	}
}

func TestIsStateless(t *testing.T) {
	legacy := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	cases := []struct {
		body, version string
		want          bool
	}{
		{legacy, "", false},
		{legacy, "2025-11-25", false},
		{legacy, "2026-07-28", true},
		{legacy, "2099-01-01", true}, // answered with UnsupportedProtocolVersion
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta + `}}`, "", true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta + `}}`, "2025-11-25", false},
	}
	for _, c := range cases {
		r, msg := request(t, c.body, map[string]string{HeaderProtocolVersion: c.version})
		if got := IsStateless(r, msg); got != c.want {
			t.Errorf("%s with %q: %v, want %v", c.body, c.version, got, c.want)
		}
	}
}

func TestHeaderValueEncoding(t *testing.T) {
	for _, v := range []string{"us-west1", "Hello, 世界", " padded ", "line1\nline2", "=?base64?literal?=", ""} {
		enc := EncodeHeaderValue(v)
		if dec, ok := DecodeHeaderValue(enc); !ok || dec != v {
			t.Errorf("%q → %q → %q %v", v, enc, dec, ok)
		}
	}
	for _, bad := range []string{"=?base64?SGVsbG8?=", "=?base64?SGVs!!!bG8=?=", "a\x7fb", "=?base64?/w==?="} {
		if _, ok := DecodeHeaderValue(bad); ok {
			t.Errorf("%q decoded", bad)
		}
	}
	// Without both markers a value is literal.
	for _, lit := range []string{"SGVsbG8=", "=?base64?SGVsbG8="} {
		if dec, ok := DecodeHeaderValue(lit); !ok || dec != lit {
			t.Errorf("%q read as %q", lit, dec)
		}
	}
}

func TestParamHeaders(t *testing.T) {
	tool := []byte(`{"name":"q","inputSchema":{"type":"object","properties":{
		"region":{"type":"string","x-mcp-header":"Region"},
		"n":{"type":"integer","x-mcp-header":"N"},
		"opts":{"type":"object","properties":{"dry":{"type":"boolean","x-mcp-header":"Dry"}}},
		"query":{"type":"string"}}}}`)
	args := []byte(`{"region":"Zürich","n":42,"opts":{"dry":true},"query":"x"}`)
	hdr := ParamHeaders(tool, args)
	if hdr.Get("Mcp-Param-N") != "42" || hdr.Get("Mcp-Param-Dry") != "true" || hdr.Get("Mcp-Param-Region") != EncodeHeaderValue("Zürich") || len(hdr) != 3 {
		t.Fatalf("ParamHeaders: %v", hdr)
	}
	if rf := CheckParamHeaders(hdr, tool, args); rf != nil {
		t.Fatalf("its own headers refused: %+v", rf)
	}
	withN := func(v string) http.Header {
		h := hdr.Clone()
		h.Set("Mcp-Param-N", v)
		return h
	}
	if rf := CheckParamHeaders(withN("42.0"), tool, args); rf != nil {
		t.Errorf("42.0 for 42 refused: %+v", rf)
	}
	for name, h := range map[string]http.Header{
		"another value":     withN("41"),
		"missing":           func() http.Header { h := hdr.Clone(); h.Del("Mcp-Param-Region"); return h }(),
		"for absent values": hdr,
	} {
		a := args
		if name == "for absent values" {
			a = []byte(`{"query":"x"}`)
		}
		if rf := CheckParamHeaders(h, tool, a); rf == nil || rf.Code != CodeHeaderMismatch {
			t.Errorf("%s: %+v", name, rf)
		}
	}
}

func TestSealedState(t *testing.T) {
	s, err := newSealer([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	want := State{Caller: "alice", Session: "ref", Service: "svc", Method: "tools/call", Tool: "t", Args: ArgsDigest([]byte(`{}`))}
	st := want
	st.Approval, st.Expires = "a1", now.Add(time.Minute).Unix()
	text, err := s.Seal(st)
	if err != nil || !IsOwnState(text) {
		t.Fatal(text, err)
	}
	got, err := s.Open(text, now)
	if err != nil || got.Approval != "a1" || got.Matches(want) != nil {
		t.Fatalf("Open: %+v %v", got, err)
	}
	if _, err := s.Open(text, now.Add(time.Minute)); !errors.Is(err, ErrStateExpired) {
		t.Errorf("expired state: %v", err)
	}
	for i := len(statePrefix); i < len(text); i += 7 {
		b := []byte(text)
		b[i] ^= 1
		if _, err := s.Open(string(b), now); err == nil {
			t.Fatalf("a state changed at byte %d opened", i)
		}
	}
	other, _ := newSealer([]byte("another secret, another gateway!"))
	if _, err := other.Open(text, now); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("another key opened the state: %v", err)
	}
	// state_secret rotated: the old one, kept as a previous secret, opens
	// what it sealed; the ring seals with the new one.
	rotated, _ := newSealer([]byte("another secret, another gateway!"), []byte("0123456789abcdef0123456789abcdef"))
	if got, err := rotated.Open(text, now); err != nil || got.Approval != "a1" {
		t.Errorf("after rotation: %+v, %v", got, err)
	}
	if fresh, _ := rotated.Seal(st); func() bool { _, err := s.Open(fresh, now); return err == nil }() {
		t.Error("the rotated ring sealed with the previous secret")
	}
	for _, f := range []func(*State){
		func(s *State) { s.Caller = "bob" }, func(s *State) { s.Session = "other" }, func(s *State) { s.Service = "x" },
		func(s *State) { s.Tool = "u" }, func(s *State) { s.Args = ArgsDigest([]byte(`{"a":1}`)) },
	} {
		w := want
		f(&w)
		if got.Matches(w) == nil {
			t.Errorf("state matched another call: %+v", w)
		}
	}
	// Used once, across everyone sharing the storage.
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	ctx := context.Background()
	if err := consume(ctx, storage, got); err != nil {
		t.Fatal(err)
	}
	if err := consume(ctx, storage, got); !errors.Is(err, ErrStateReplayed) {
		t.Fatalf("second use: %v", err)
	}
}

func TestStripMetaAndOwnState(t *testing.T) {
	params := []byte(`{"name":"x",` + meta[:len(meta)-1] + `,"progressToken":"p"}}`)
	if got := string(StripMeta(params)); got != `{"name":"x","_meta":{"progressToken":"p"}}` {
		t.Errorf("StripMeta kept %s", got)
	}
	if got := string(StripMeta([]byte(`{"name":"x",` + meta + `}`))); got != `{"name":"x"}` {
		t.Errorf("StripMeta of only the revision's members: %s", got)
	}
	body := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","inputResponses":{"io.toolgate/approval":{"action":"accept"},"up":{"action":"decline"}},"requestState":"toolgate.1.x"}}`)
	got := string(WithoutOwnState(body, mcpmsg.MemberOf(body, "params")))
	if got != `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","inputResponses":{"up":{"action":"decline"}}}}` {
		t.Errorf("WithoutOwnState: %s", got)
	}
}

func TestCompleteAndUndeclared(t *testing.T) {
	if got := string(Complete("tools/list", []byte(`{"tools":[]}`), true)); got != `{"tools":[],"resultType":"complete","ttlMs":0,"cacheScope":"private"}` {
		t.Errorf("Complete of a legacy listing: %s", got)
	}
	if got := string(Complete("tools/list", []byte(`{"resultType":"complete","tools":[],"ttlMs":5,"cacheScope":"public"}`), true)); !strings.Contains(got, `"cacheScope":"private"`) || !strings.Contains(got, `"ttlMs":5`) {
		t.Errorf("a listing filtered per caller stays public: %s", got)
	}
	for _, rt := range []string{`"Complete"`, `"Input_Required"`, `"done"`, `5`, `null`, `"input_required "`} {
		got := string(Complete("resources/read", []byte(`{"resultType":`+rt+`,"contents":[],"ttlMs":5,"cacheScope":"public"}`), true))
		if got != `{"resultType":"complete","contents":[],"ttlMs":5,"cacheScope":"private"}` {
			t.Errorf("a resultType %s, which runners read as complete, kept its hints: %s", rt, got)
		}
	}
	in := []byte(`{"resultType":"input_required","inputRequests":{"a":{"method":"sampling/createMessage","params":{}},"b":{"method":"elicitation/create","params":{"mode":"url","url":"https://x"}}}}`)
	if got := Complete("tools/call", in, true); string(got) != string(in) {
		t.Errorf("an input_required result got caching hints: %s", got)
	}
	missing := Undeclared([]byte(`{"sampling":{}}`), in)
	if len(missing) != 1 || missing["elicitation"] == nil {
		t.Errorf("Undeclared: %v", missing)
	}
	if Undeclared([]byte(`{"sampling":{},"elicitation":{"url":{}}}`), in) != nil {
		t.Error("declared capabilities reported missing")
	}
}

// An upstream's input request under toolgate's key, in any case, poses as
// toolgate's own.
func TestReservedInput(t *testing.T) {
	for body, want := range map[string]bool{
		`{"inputRequests":{"io.toolgate/approval":{}}}`: true,
		`{"inputRequests":{"IO.Toolgate/approval":{}}}`: true,
		`{"inputRequests":{"io.toolgat":{}}}`:           false,
		`{"inputRequests":{"github_login":{}}}`:         false,
	} {
		if got := ReservedInput([]byte(body)); got != want {
			t.Errorf("ReservedInput(%s) = %v, want %v", body, got, want)
		}
	}
}
