package mcpproxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// BenchmarkRedactCredential is the search for the call's credential in
// what an upstream answers, on a message that does not hold it (nearly
// every one): a small result and a log of a megabyte, in ASCII and not,
// in one text item or two (whose ends are looked at together), before the
// result policy (redactCredential) and after it (afterHooks).
func BenchmarkRedactCredential(b *testing.B) {
	h := testHandler()
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer gho_16C7e42F292c6912E7710c838347Ae178B4a"}}
	var log strings.Builder
	for i := 0; log.Len() < 1<<20; i++ {
		fmt.Fprintf(&log, "2026-11-30T10:%02d:%02dZ INFO ticket TEST-%d updated by bob: status open, printer on fire in room %d\n", i/60%60, i%60, i, i%500)
	}
	for _, c := range []struct {
		name, text string
		items      int
	}{
		{"small", "TEST-123: printer on fire, assigned to bob", 1},
		{"small_two_items", "TEST-123: printer on fire, assigned to bob", 2},
		{"1MiB", log.String(), 1},
		{"1MiB_two_items", log.String(), 2},
		{"1MiB_not_ascii", strings.ReplaceAll(log.String(), "room", "salle n°"), 1},
		// Short lines, as make bench-compare's upstream sends: an escape
		// (\n) every 58 bytes of JSON.
		{"1MiB_short_lines", strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit\n", 1<<20/57), 1},
	} {
		item := `{"type":"text","text":` + string(mcpmsg.Quote(c.text)) + `}`
		if c.items == 2 {
			half := len(c.text) / 2
			item = `{"type":"text","text":` + string(mcpmsg.Quote(c.text[:half])) + `},{"type":"text","text":` + string(mcpmsg.Quote(c.text[half:])) + `}`
		}
		raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[` + item + `],"isError":false}}`)
		msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name+"/before", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if out, err := h.redactCredential(call, msg); err != nil || len(out.Raw) != len(raw) {
					b.Fatal(err)
				}
			}
		})
		// The upstream's message parsed and searched, as the runner waits
		// for them: one after the other, and as parseRedacted does (a
		// large message searched while it is parsed).
		b.Run(c.name+"/parsed_then_searched", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				msg, err := mcpmsg.Parse(raw, h.limits)
				if err == nil {
					msg, err = h.redactCredential(call, msg)
				}
				if err != nil || len(msg.Raw) != len(raw) {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/parseRedacted", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if msg, err := h.parseRedacted(call, raw); err != nil || len(msg.Raw) != len(raw) {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/after", func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if out, ok := h.afterHooks(call, raw); !ok || len(out) != len(raw) {
					b.Fatal("changed")
				}
			}
		})
	}
}
