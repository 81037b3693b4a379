package mcpproxy

// Adversarial review of dcc30a2 (a large answer's raw bytes searched for
// the credential on a goroutine while mcpmsg.Parse reads them:
// startPrescan, prescan.of, parseRedacted; redacted and redactedSecret
// taking the facts read).
//
// The prescan reads the same facts redactedSecret reads after the parse
// (needleSet.groupsIn, hidingEscapes, isASCII) from the same bytes, and
// prescan.of hands them out only for the very slice read (pointer and
// length) and one of the secrets read for: a message redacted for a first
// secret has new bytes (ReplaceStrings always appends into a new slice,
// then Parse keeps them as Raw), so a second secret is searched afresh.
// Parse neither writes into nor trims its input (Raw is the body), and
// parseRedacted waits for the goroutine on every way out, a parse error
// included. No finding was reproduced; what held is below.

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// preSecret is the token of preCalls' bearer and cookie credentials.
const preSecret = "tok-ABCdef/123+xyz"

// preCalls are calls with credentials of one secret and of several: a
// bearer token; HTTP Basic (the token and the password it encodes, the
// password also inside the token's own base64); a cookie header of three
// pieces, one of them twice; a secret JSON escapes otherwise (a quote
// and a backslash) and one with characters outside ASCII.
func preCalls() map[string]*gateway.Call {
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:pw-Secret/4567"))
	mk := func(header, value string) *gateway.Call {
		return &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
			Credential: &gateway.Credential{Header: header, Value: value}}
	}
	return map[string]*gateway.Call{
		"bearer":  mk("Authorization", "Bearer "+preSecret),
		"basic":   mk("Authorization", basic),
		"cookies": mk("Cookie", "sid="+preSecret+"; csrf=csrf-0123456789ab; other="+preSecret+", plainword-xyz"),
		"escaped": mk("X-Api-Key", `key"with\back-slash-42`),
		"wide":    mk("X-Api-Key", "clé-secrète-ünïcode"),
	}
}

// preSecrets are all of c's secrets.
func preSecrets(c *gateway.Credential) []string {
	var out []string
	c.EachSecret(func(s string) bool { out = append(out, s); return true })
	return out
}

// preCompare reports how parseRedacted's result for raw differs from
// Parse followed by redactCredential: "" when it does not.
func preCompare(h *Handler, call *gateway.Call, raw []byte) string {
	orig := string(raw)
	var want mcpmsg.Message
	msg, wantErr := mcpmsg.Parse(raw, h.limits)
	want = msg
	if wantErr == nil {
		want, wantErr = h.redactCredential(call, msg)
	}
	got, err := h.parseRedacted(call, raw)
	switch {
	case string(raw) != orig:
		return "parseRedacted wrote into its input"
	case (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error():
		return fmt.Sprintf("error %v, searched after the parse %v", err, wantErr)
	case string(got.Raw) != string(want.Raw):
		return fmt.Sprintf("bytes %.120q…, searched after the parse %.120q…", got.Raw, want.Raw)
	case got.Method != want.Method || got.Kind != want.Kind || string(got.ID) != string(want.ID) ||
		string(got.Result) != string(want.Result):
		return "the message's members differ"
	}
	return ""
}

// preMessage is a tool result of one text item, inner being the inside of
// its JSON string, after filler enough for the prescan (64 KiB or more).
func preMessage(filler, inner string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"` + filler + inner + `"}]}}`)
}

// preForms are ways an upstream can write secret inside a JSON string:
// as it is, escaped, broken up by invisible characters, in base64, split
// by a line break inside base64.
func preForms(secret string) []string {
	q := func(s string) string { b := mcpmsg.AppendQuote(nil, s); return string(b[1 : len(b)-1]) }
	half := len(secret) / 2
	b64 := base64.StdEncoding.EncodeToString([]byte("user:" + secret + " trailing"))
	return []string{
		"",
		q(secret),
		q(secret) + " and again " + q(secret),
		escapeAll(secret),
		q(secret[:half]) + `\u200b` + q(secret[half:]),
		q(secret[:half]) + "\u2060" + q(secret[half:]),
		q(secret[:half]) + `\ud834\udd73` + q(secret[half:]), // a variation selector beyond the BMP, escaped
		b64,
		base64.URLEncoding.EncodeToString([]byte(secret)),
		b64[:len(b64)/2] + `\n` + b64[len(b64)/2:],
		strings.ReplaceAll(b64, "/", `\/`),
		q(secret[:half]) + `"},{"type":"text","text":"` + q(secret[half:]),
	}
}

// Holds: for every credential of preCalls (one secret, HTTP Basic's two,
// a cookie header's several, one of them twice, secrets JSON escapes and
// secrets outside ASCII), every form of each of its secrets in a message
// of 64 KiB and more (a filler of ASCII, and one of escapes, line
// breaks, characters outside ASCII and the secrets' own pieces), parseRedacted
// leaves what Parse and redactCredential leave, bytes and error alike, and
// no secret is left in a decoded string.
func TestPrescanAdvEveryFormEveryCredential(t *testing.T) {
	t.Parallel()
	h := testHandler()
	fillers := map[string]string{
		"ascii": strings.Repeat("lorem ipsum dolor sit amet ", prescanMin/26+1),
		"mixed": strings.Repeat(`line\nwith \"quotes\" \\ and \/ \u00e9 ünïcødé tok-ABCd pw-Secr csrf-012 `, prescanMin/75+1),
	}
	n := 0
	for name, call := range preCalls() {
		secrets := preSecrets(call.Credential)
		if len(secrets) == 0 {
			t.Fatalf("%s: no secret", name)
		}
		for fname, filler := range fillers {
			for _, secret := range secrets {
				for i, form := range preForms(secret) {
					raw := preMessage(filler, form)
					if len(raw) < prescanMin {
						t.Fatalf("message of %d bytes, under prescanMin", len(raw))
					}
					if d := preCompare(h, call, raw); d != "" {
						t.Errorf("%s, filler %s, secret %q, form %d: %s", name, fname, secret, i, d)
					}
					got, err := h.parseRedacted(call, raw)
					if err != nil {
						continue // refused: the runner gets toolgate's error
					}
					for _, s := range secrets {
						if mcpmsg.ContainsString(got.Raw, s) || fname == "ascii" && strings.Contains(runnerText(got.Raw), s) {
							t.Errorf("%s, filler %s, form %d: secret %q left in %.80q…", name, fname, i, s, got.Raw[len(got.Raw)-200:])
						}
					}
					n++
				}
			}
		}
	}
	t.Logf("%d messages compared", n)
}

// Holds: the second secret's facts are never the first's bytes. With
// HTTP Basic, the first secret (the token) is redacted, which makes new
// bytes; the password, in the token's base64 only before, is then looked
// for in bytes where the redaction's own text is. And a message where the
// first secret is absent (bytes kept) but the second present is searched
// with the facts read for the second.
func TestPrescanAdvSecondSecretAfterFirstRedacted(t *testing.T) {
	h := testHandler()
	call := preCalls()["basic"]
	secrets := preSecrets(call.Credential)
	if len(secrets) != 2 {
		t.Fatalf("HTTP Basic secrets: %q", secrets)
	}
	filler := strings.Repeat("x", prescanMin)
	for i, inner := range []string{
		secrets[0] + " " + secrets[1],
		secrets[1],                         // only the password: the token's facts say nothing, the password's are used
		escapeAll(secrets[1]),              // the password escaped
		secrets[0] + escapeAll(secrets[1]), // the token changes the bytes; the escaped password is searched afresh
	} {
		raw := preMessage(filler, inner)
		if d := preCompare(h, call, raw); d != "" {
			t.Errorf("message %d: %s", i, d)
		}
		got, err := h.parseRedacted(call, raw)
		if err != nil || mcpmsg.ContainsString(got.Raw, secrets[1]) || mcpmsg.ContainsString(got.Raw, secrets[0]) {
			t.Errorf("message %d: %v, %.80q…", i, err, got.Raw[len(got.Raw)-120:])
		}
	}
}

// Holds: CR bytes. An answer's CRs become spaces before parseRedacted
// (normalizeCR, a copy), and parseRedacted given bytes with CRs still in
// them (whitespace between tokens) decides as the sequential path does; a
// CR inside a string makes both refuse the message alike.
func TestPrescanAdvCR(t *testing.T) {
	h := testHandler()
	call := preCalls()["bearer"]
	filler := strings.Repeat("abc ", prescanMin/4)
	for i, raw := range [][]byte{
		[]byte("{\r\n\"jsonrpc\":\"2.0\",\r\n\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"" + filler + preSecret + "\"}]}}\r\n"),
		[]byte("{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"" + filler + "tok-ABC\rdef/123+xyz\"}]}}"),
		[]byte("\r\r\r" + string(preMessage(filler, preSecret)) + "\r"),
	} {
		for _, in := range [][]byte{raw, normalizeCR(raw)} {
			if d := preCompare(h, call, in); d != "" {
				t.Errorf("message %d (%d CRs): %s", i, strings.Count(string(in), "\r"), d)
			}
		}
	}
}

// Holds: messages that fail to parse (cut short, data after them, a
// batch, invalid UTF-8, a duplicate key, too deep, too many values): the
// same error as Parse's, and the goroutine ended (the goroutine count is
// back where it was after 200 of them).
func TestPrescanAdvParseErrorsNoLeak(t *testing.T) {
	h := &Handler{logger: zap.NewNop(), limits: mcpmsg.Limits{MaxDepth: 8, MaxValues: 50000}}
	call := preCalls()["cookies"]
	filler := strings.Repeat("y", prescanMin)
	ok := preMessage(filler, preSecret)
	bad := [][]byte{
		ok[:len(ok)-1],
		append(append([]byte(nil), ok...), `{}`...),
		[]byte("[" + string(ok) + "]"),
		preMessage(filler, "\xff\xfe"+preSecret),
		[]byte(`{"jsonrpc":"2.0","id":1,"id":2,"result":"` + filler + `"}`),
		[]byte(`{"jsonrpc":"2.0","id":1,"result":` + strings.Repeat(`[`, 20) + `"` + filler + `"` + strings.Repeat(`]`, 20) + `}`),
		[]byte(`{"jsonrpc":"2.0","id":1,"result":[` + strings.Repeat(`1,`, 60000) + `"` + preSecret + `"]}`),
		[]byte(strings.Repeat(" ", prescanMin)),
	}
	for i, raw := range bad {
		if len(raw) < prescanMin {
			t.Fatalf("message %d under prescanMin", i)
		}
		if _, err := h.parseRedacted(call, raw); err == nil {
			t.Errorf("message %d parsed", i)
		}
		if d := preCompare(h, call, raw); d != "" {
			t.Errorf("message %d: %s", i, d)
		}
	}
	runtime.GC()
	before := runtime.NumGoroutine()
	for range 25 {
		for _, raw := range bad {
			_, _ = h.parseRedacted(call, raw)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines: %d before, %d after 200 failed parses", before, after)
	}
}

// Holds (under -race): many calls at once on shared bytes, with the
// needle cache cleared under them (more credentials than
// maxCachedNeedles), each call's result as the sequential path's.
func TestPrescanAdvConcurrentSharedBytesCacheChurn(t *testing.T) {
	h := testHandler()
	filler := strings.Repeat("z", prescanMin)
	calls := preCalls()
	raws := [][]byte{preMessage(filler, preSecret), preMessage(filler, ""), preMessage(filler, escapeAll(preSecret))}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // churns the needle cache
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			needlesOf(fmt.Sprintf("churn-secret-%08d", i))
		}
	})
	var mu sync.Mutex
	var diffs []string
	var workers sync.WaitGroup
	for w := range 8 {
		workers.Go(func() {
			names := []string{"bearer", "basic", "cookies", "escaped", "wide"}
			for i := range 10 {
				name := names[(w+i)%len(names)]
				if d := preCompare(h, calls[name], raws[(w+i)%len(raws)]); d != "" {
					mu.Lock()
					diffs = append(diffs, name+": "+d)
					mu.Unlock()
				}
			}
		})
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	for _, d := range diffs {
		t.Error(d)
	}
}

// Holds: a prescan started for one credential is of no use to another:
// its facts are for the secrets it read, and a secret of a second
// credential (redactCredential of an earlier round's credential, as
// response.next does for r.sent) is searched afresh.
func TestPrescanAdvFactsOfAnotherCredential(t *testing.T) {
	filler := strings.Repeat("w", prescanMin)
	raw := preMessage(filler, "other-token-9876543")
	pre := startPrescan(preCalls()["bearer"].Credential, raw)
	<-pre.done
	if f := pre.of("other-token-9876543", raw); f != nil {
		t.Errorf("facts of a secret not read for: %+v", *f)
	}
	h := testHandler()
	other := preCalls()["bearer"]
	other.Credential = &gateway.Credential{Header: "Authorization", Value: "Bearer other-token-9876543"}
	msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := h.redacted(other, msg, pre)
	if err != nil || mcpmsg.ContainsString(got.Raw, "other-token-9876543") {
		t.Errorf("another credential's secret with a prescan of the first: %v", err)
	}
}

// preSeeds are large messages for TestPrescanAdvRandomEdits.
func preSeeds() [][]byte {
	var out [][]byte
	for _, filler := range []string{strings.Repeat("a", prescanMin), strings.Repeat(`\n`, prescanMin/2)} {
		for _, form := range preForms(preSecret) {
			out = append(out, preMessage(filler, form))
		}
	}
	out = append(out, []byte(strings.Repeat(" ", prescanMin)+`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"`+preSecret+`"}}`))
	return out
}

// preFuzzFillers are what the fuzzed bytes follow: blanks before a whole
// message (which Parse skips), or the start of a text item's string after
// text of ASCII, or of escapes and characters outside ASCII.
var preFuzzFillers = []string{
	strings.Repeat(" ", prescanMin),
	`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"` + strings.Repeat("lorem ipsum ", prescanMin/12),
	`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"` + strings.Repeat(`a\nb\u00e9 ü\/`, prescanMin/16),
}

// Holds (fuzzed): parseRedacted and Parse followed by redactCredential
// agree on any bytes, for every credential of preCalls. The fuzzed bytes
// are small and follow 64 KiB of filler (preFuzzFillers), so that the
// prescan runs on every input (the fuzzer stalls on seeds of 64 KiB). Run
// it with
//
//	go test -run '^$' -fuzz FuzzPrescanAdvDifferential -fuzztime 60s ./modules/mcpproxy/
func FuzzPrescanAdvDifferential(f *testing.F) {
	msgEnd := `"}]}}`
	for _, form := range preForms(preSecret) {
		f.Add([]byte(form+msgEnd), uint8(0), uint8(1))
		f.Add([]byte(form+msgEnd), uint8(1), uint8(2))
	}
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"tok-ABC"},{"type":"text","text":"def/123+xyz"}]}}`), uint8(0), uint8(0))
	f.Add([]byte(`{"jsonrpc":"2.0","method":"x","params":{"data":"`+preSecret+`"}}`), uint8(2), uint8(0))
	f.Add([]byte(`pw-Secret/4567 `+base64.StdEncoding.EncodeToString([]byte("alice:pw-Secret/4567"))+msgEnd), uint8(1), uint8(1))
	h := testHandler()
	calls := preCalls()
	names := []string{"bearer", "basic", "cookies", "escaped", "wide"}
	f.Fuzz(func(t *testing.T, tail []byte, which, filler uint8) {
		raw := append([]byte(preFuzzFillers[int(filler)%len(preFuzzFillers)]), tail...)
		call := calls[names[int(which)%len(names)]]
		if d := preCompare(h, call, raw); d != "" {
			t.Fatal(d)
		}
	})
}

// Holds: random edits of large messages (a secret's characters escaped
// or broken up at random places, CRs, bytes outside ASCII, the message cut
// short) agree between the two paths; a seeded walk of the fuzz target's
// space that runs with go test.
func TestPrescanAdvRandomEdits(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	h := testHandler()
	calls := preCalls()
	names := []string{"bearer", "basic", "cookies", "escaped", "wide"}
	seeds := preSeeds()
	edits := []string{`\u0074`, "\u200b", `\u200b`, `\/`, "\r", "é", `\\`, `"`, `\n`, "=", "\xff"}
	for range 120 {
		raw := []byte(string(seeds[rng.IntN(len(seeds))]))
		tail := len(raw) - 400
		for range rng.IntN(6) {
			at := tail + rng.IntN(len(raw)-tail)
			e := edits[rng.IntN(len(edits))]
			raw = append(raw[:at:at], append([]byte(e), raw[at:]...)...)
		}
		name := names[rng.IntN(len(names))]
		if d := preCompare(h, calls[name], raw); d != "" {
			t.Fatalf("%s, %.200q: %s", name, raw[tail:], d)
		}
	}
}
