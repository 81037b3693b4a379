package policy

// Unit-level companions of integration/adversarial_redaction2_test.go:
// the gateway's scan against the policy's long way (as
// FuzzScanDecidesAsThePolicy compares them), on payloads built to make
// them disagree.
//
// Holds: TestRedaction2ScanAgreesOnFoldedLabels — short labels spelled
//   with the long s and the Kelvin sign in every position (so that the
//   marker's anchor byte may be missing from the string's bytes, which
//   the scan's mayHold prefilter reads), on every channel of interest:
//   the scan decides as the long way.
// Holds: TestRedaction2ScanFoldsWhatLowerFolds — every character whose
//   lower case (the policy's lower()) or whose RE2 case folding is an
//   ASCII letter is folded by the scan's foldToASCII.

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// rd2Decide decides payload on channel and method with the gateway's
// scan and without it (the policy's long way), and returns both
// decisions' text.
func rd2Decide(t *testing.T, e *engine, channel, method, payload string) (fast, slow string, ok bool) {
	t.Helper()
	call, err := callOf(`{"name":"read_ticket"}`, `{"id":1}`)
	if err != nil {
		t.Fatal(err)
	}
	c := e.current.Load()
	s := subject{channel: channel, method: method, view: call}
	h := &ResultHandler{Config{engine: e}}
	scanned, err := h.input(c, call, s, []byte(payload), map[*ast.Term]string{})
	if err != nil {
		return "", "", false
	}
	long := ast.NewObject()
	scanned.Foreach(func(key, v *ast.Term) {
		if !key.Equal(keyScan) {
			long.Insert(key, v)
		}
	})
	ctx := context.Background()
	return decisionText(e.decideWith(ctx, c, scanned, time.Minute, "result")),
		decisionText(e.decideWith(ctx, c, long, time.Minute, "result")), true
}

func rd2Engine(t testing.TB) *engine {
	t.Helper()
	e, err := newEngine(newSource(shippedPolicies(t, map[string]string{"data.json": `{}`})), "data.toolgate.result.decision",
		stageResult, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	return e
}

// Holds: the labels of the patterns that match in any case, with each
// s written ſ and each k written K (one at a time and all at once), in
// short strings (the scan's prefilter, mayHold, looks for a marker's
// anchor byte in the string as sent): the scan decides as the long way.
func TestRedaction2ScanAgreesOnFoldedLabels(t *testing.T) {
	e := rd2Engine(t)
	labels := []struct{ label, value string }{
		{"access_token=", "ya29.a0AfH6SMBx0123"},
		{"client_secret=", "abcdefgh12345678"},
		{"AccountKey=", "abcdefghijklmnopqrstuvwxyz0123"},
		{"SharedAccessKey=", "abcdefghijklmnopqrst0123"},
		{"secret_access_key=", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
		{"secretaccesskey:", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
	}
	var texts []string
	for _, l := range labels {
		var variants []string
		variants = append(variants, strings.NewReplacer("s", "\u017f", "S", "\u017f", "k", "\u212a", "K", "\u212a").Replace(l.label))
		for i, r := range l.label {
			switch r {
			case 's', 'S':
				variants = append(variants, l.label[:i]+"\u017f"+l.label[i+1:])
			case 'k', 'K':
				variants = append(variants, l.label[:i]+"\u212a"+l.label[i+1:])
			}
		}
		for _, v := range variants {
			texts = append(texts, v+l.value)
		}
	}
	kinds := []struct{ channel, method, wrap string }{
		{channelResult, "tools/call", `{"content":[{"type":"text","text":%s}]}`},
		{channelResult, "resources/read", `{"contents":[{"uri":"a","text":%s}]}`},
		{gateway.ChannelNotification, "notifications/message", `{"level":"info","data":%s}`},
		{gateway.ChannelError, "tools/call", `{"code":-32000,"message":%s}`},
	}
	n := 0
	for _, text := range texts {
		for _, k := range kinds {
			payload := strings.Replace(k.wrap, "%s", string(mcpmsg.Quote(text)), 1)
			fast, slow, ok := rd2Decide(t, e, k.channel, k.method, payload)
			if !ok {
				continue
			}
			n++
			if fast != slow {
				t.Errorf("%s %s %q:\nwith the gateway's scan %.400s\nthe policy's long way   %.400s", k.channel, k.method, text, fast, slow)
			}
			if strings.HasPrefix(fast, "allow||||") {
				t.Errorf("%s %s %q: allowed unchanged, although a pattern matches it", k.channel, k.method, text)
			}
		}
	}
	t.Logf("%d payloads decided alike", n)
}

// Holds: foldToASCII (the scan) folds every character that the policy's
// folded() or RE2's (?i) turns into an ASCII letter.
func TestRedaction2ScanFoldsWhatLowerFolds(t *testing.T) {
	var odd []rune
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		ascii := unicode.ToLower(r) < 0x80
		for f := unicode.SimpleFold(r); f != r && !ascii; f = unicode.SimpleFold(f) {
			ascii = f < 0x80
		}
		if ascii {
			odd = append(odd, r)
		}
	}
	for _, r := range odd {
		if got := foldToASCII.Replace(string(r)); len(got) != 1 || got[0] >= 0x80 {
			t.Errorf("%U: lower() or RE2 makes it an ASCII letter, the scan's foldToASCII leaves it %q", r, got)
		}
	}
	if len(odd) != 3 {
		t.Logf("characters folding onto ASCII: %q", string(odd))
	}
}
