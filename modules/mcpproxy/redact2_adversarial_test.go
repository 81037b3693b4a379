package mcpproxy

// Unit-level companions of integration/adversarial_redaction2_test.go for
// the credential redaction.
//
// Holds: TestRedaction2IgnorableCoversPolicyInvisibles — every character
//   of the policy's invisible_ranges (policies/text.rego), which the
//   result policy removes after the credential redaction ran, is one
//   ignorable looks through: none can reassemble the credential in text.
// Holds: TestRedaction2RedactionCostOfALongString — measured: a megabyte
//   string holding one zero-width space (and not the credential), and a
//   megabyte of text outside ASCII, cost the redaction linear work; the
//   allocations are logged (bytes per byte of message) and the message is
//   left as it is. Measured: one zero-width space in 1 MiB of ASCII costs
//   about 15 MB allocated (15 bytes per byte: redactIn's index of int per
//   byte) and 55 ms; 1 MiB of CJK text 9 ms; 1 MiB of \u escapes 15 ms.

import (
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

func TestRedaction2IgnorableCoversPolicyInvisibles(t *testing.T) {
	src, err := os.ReadFile("../../policies/text.rego")
	if err != nil {
		t.Fatal(err)
	}
	ranges := regexp.MustCompile(`\["([0-9A-F]{4,6})", "([0-9A-F]{4,6})"\]`).FindAllStringSubmatch(string(src), -1)
	if len(ranges) < 10 {
		t.Fatalf("found %d ranges in text.rego: the premise is wrong", len(ranges))
	}
	n := 0
	for _, r := range ranges {
		lo, _ := strconv.ParseUint(r[1], 16, 32)
		hi, _ := strconv.ParseUint(r[2], 16, 32)
		for c := rune(lo); c <= rune(hi); c++ {
			n++
			if !ignorable(c) {
				t.Errorf("%U is removed by the result policy (invisible_ranges) but not looked through by the credential redaction", c)
			}
		}
	}
	t.Logf("%d characters of invisible_ranges checked", n)
}

func TestRedaction2RedactionCostOfALongString(t *testing.T) {
	h := testHandler()
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Credential: &gateway.Credential{Header: "X-Key", Value: "tgcred-9Kp4Vx2Qm7Ws3Zn8Lr5T"}}
	for _, tc := range []struct{ name, text string }{
		{"1 MiB ASCII with one zero-width space", strings.Repeat("plain log text ", 1<<16) + "\u200b"},
		{"1 MiB of CJK text", strings.Repeat("日本語のテキスト", 1<<16/2)},
		{"1 MiB of \\u escapes (as the JSON text)", ""},
	} {
		raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":` + string(mcpmsg.Quote(tc.text)) + `}]}}`
		if tc.text == "" {
			raw = `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + strings.Repeat(`\u0041`, 1<<20/6) + `"}]}}`
		}
		msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		got, err := h.redactCredential(call, msg)
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if err != nil || string(got.Raw) != raw {
			t.Errorf("%s: the message was changed or refused (%v)", tc.name, err)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes of message, %d bytes allocated (%.1f per byte), %v", tc.name, len(raw), alloc, float64(alloc)/float64(len(raw)), took)
	}
}
