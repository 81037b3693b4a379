package mcpproxy

// Adversarial review of 7575f55 (and 522402d, c94a5c6): mayHoldCredential
// searches a probe instead of what the result hooks returned when a piece
// of it is a tail of the result they were given that starts right after
// its opening brace (probe: the tail is replaced by a placeholder member).
// probe checks where the tail starts in given (given[:k] is "{"), never
// where it lands in what the hooks wrote, nor what surrounds it there: the
// joined answer the runner reads is never parsed.
//
// Attack (fixed): the hooks put the kept tail inside a content item of
//   their own, so that the upstream's members become a text item that the
//   runner joins with the items around it. The upstream answers a tool
//   call with a result shaped like a text item ({"type":"text","text":…})
//   holding the second half of the credential; redactCredential rightly
//   lets it pass (no content, so no text items to join). A hook writes
//   {"content":[{"type":"text","text":<the first half, e.g. copied from
//   another member of the upstream's>},{ + the tail + ]}, or, writing no
//   text at all, puts the same tail in two items ({"content":[{ + tail +
//   ,{ + tail + ]}) whose text ends with the first half and starts with the
//   second. The probe is {"content":[{…},{"":0}]} (or one item of the
//   tail): acrossTextItems sees at most one text item and passes; the
//   runner reads the items joined, the credential across their boundary.
//   A full search (redacted on the joined answer) refuses it. Should be:
//   withheld, in finish and finishStateless.
//   TestProbeAdversarialTailNestedAsTextItem.
// Attack (fixed): the answer sent is never read as a whole, so what
//   toolgate would refuse from an upstream (and what answerAfterHooks
//   withholds: "what cannot be read") reaches the runner when only the
//   probe parses: (a) duplicate keys — the hooks write a member the kept
//   tail also has ("content"; a runner keeping the first reads the hook's,
//   one keeping the last the upstream's; gjson, which mcp2026.ResultType
//   uses in finishStateless, keeps the first); (b) an invalid escape — a
//   hook's key ending in a backslash before a tail that starts with a blank
//   (a pretty-printed upstream: "{ \"content\"…"), the placeholder having
//   dropped the blank; (c) a raw line break inside a string — the
//   placeholder "}" for a tail "\n}" inside a string the hook opened.
//   Should be: the runner gets a message toolgate's parser reads, or
//   toolgate's error. TestProbeAdversarialUnreadableAnswerIsSent.
// Attack (fixed): a string spans the seam after all — the hook's last
//   key, ending in a backslash, swallows the quote that opens the tail's
//   first member name, so the runner reads one key: what the hook wrote,
//   a quote, and the upstream's first member name. The probe's key ends at
//   the placeholder (`"x\"":0`). With a credential holding a quote (an API
//   key of its own header with punctuation; secretOf keeps it whole; mayEscape
//   handles such secrets), the hook writes its first part and the upstream
//   the rest as a member name: the runner reads the credential in a key;
//   the full search redacts it. TestProbeAdversarialKeyContinuesIntoTheTail.
//
// Fixed: the probe is taken only when the tail is the last piece and
//   holds members, the placeholder (keeping the tail's leading blanks) is
//   found as a member of the result itself once the probe is parsed, and
//   no key of the probe's result repeats one of given's, even in another
//   case; else the whole is parsed and searched.
//
// Holds: a hook prefix that leaves a string open before the tail (the
//   tail's first bytes inside the hook's string): the probe does not parse
//   and mayHoldCredential answers true, so the answer is read in full and
//   withheld. TestProbeAdversarialHoldsOpenStringPrefixIsWithheld (fails
//   if a probe that does not parse were taken as clean).
// Holds: nil and empty pieces around the tail, and the credential put
//   together in what the hook wrote before it: the probe holds every
//   piece but the tail, so it is found and redacted.
//   TestProbeAdversarialHoldsEmptyPiecesAroundTheTail (fails if the
//   pieces the hooks wrote were not searched).
// Holds: the hooks write members of the JSON-RPC envelope after closing
//   the result (a credential in an envelope member): the probe is wrapped
//   in the same envelope (gateway.RPCResult) and searched whole.
//   TestProbeAdversarialHoldsEnvelopeMember.
// Holds: a tail kept twice is searched (the probe replaces only the first
//   piece), and the credential put together inside it is found when the
//   hook joined it with what it wrote (TestProbeAdversarialHoldsPiecesAfterTheTail);
//   but see the text items finding above: searching it is not enough when
//   the structure around it changed.
// Holds (performance): the probe of a megabyte tail with the decision in
//   front of it is a few bytes, not the megabyte
//   (TestProbeAdversarialHoldsProbeIsSmall; BenchmarkProbeAdversarialMegabyteTail
//   for the cost, not asserted). The search of hook output stays linear for
//   the shapes tried (many pieces, tail kept many times: each copy is
//   searched once).
// Holds (reviewed, no test of its own): a chain of hooks (RunResultHooks
//   joins the pieces for a later hook, so a later hook's tail is not a tail
//   of msg.Result: TestWrittenAdversarialHoldsChainedHooks); the stateless
//   path's hooks given what the message hooks wrote
//   (TestWrittenAdversarialHoldsStatelessTailOfInspected); a given that is
//   not an object (given[:k] must be "{"); Unicode spaces or a BOM before
//   the tail (TrimSpace accepts U+0085/U+00A0, but given was parsed
//   strictly, so it holds only JSON blanks there); a hook's own answer
//   (hookFailed → answerAfterHooks, parsed in full).

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// probeJoinedText is the text of the result's text items as a runner joins
// them, "" when the answer has no result (toolgate's error).
func probeJoinedText(t *testing.T, out []byte) string {
	t.Helper()
	var m struct {
		Result *struct {
			Content []struct{ Type, Text string }
		}
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("the runner gets no JSON: %v: %s", err, out)
	}
	if m.Result == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range m.Result.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func probeRun(t *testing.T, stateless bool, c func(t *testing.T, stateless bool)) {
	t.Helper()
	t.Run(map[bool]string{false: "finish", true: "finishStateless"}[stateless], func(t *testing.T) { c(t, stateless) })
}

func TestProbeAdversarialTailNestedAsTextItem(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		hook      func(r []byte) gateway.Result
	}{
		// The upstream's result is one text item holding the second half
		// of the credential; another member of it (a title) holds the
		// first. A hook that makes such a result a standard one puts a
		// summary item (the title) before the upstream's item.
		{"a summary item before the upstream's", `{"jsonrpc":"2.0","id":1,"result":{"type":"text","text":"292c6912E7710c838347Ae178B4a","title":"gho_16C7e42F"}}`,
			func(r []byte) gateway.Result {
				var v struct{ Title string }
				_ = json.Unmarshal(r, &v)
				head := append([]byte(`{"content":[{"type":"text","text":`), mcpmsg.Quote(v.Title)...)
				head = append(head, `},{`...)
				return gateway.Result{head, r[1:], []byte(`]}`)}
			}},
		// The hook writes no text at all: the upstream's item twice. Its
		// text ends with the credential's first part and starts with the
		// rest.
		{"the upstream's item twice", `{"jsonrpc":"2.0","id":1,"result":{"type":"text","text":"292c6912E7710c838347Ae178B4agho_16C7e42F"}}`,
			func(r []byte) gateway.Result {
				return gateway.Result{[]byte(`{"content":[{`), r[1:], []byte(`,{`), r[1:], []byte(`]}`)}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, stateless := range []bool{false, true} {
				probeRun(t, stateless, func(t *testing.T, stateless bool) {
					h := testHandler()
					call := advCall("Bearer "+advSecret, stateless)
					msg := advUpstream(t, h, call, c.raw)
					call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
						return c.hook(result), nil
					})
					out := advFinish(h, call, msg)
					// Control: searched in full (as afterHooks does), the
					// answer is refused.
					if full, err := mcpmsg.Parse(out, mcpmsg.Limits{}); err == nil {
						if _, _, err := h.redacted(call, full, nil); err == nil && strings.Contains(probeJoinedText(t, out), advSecret) {
							t.Fatalf("control: the full search lets the answer pass: %s", out)
						}
					}
					if strings.Contains(withoutIgnorable(probeJoinedText(t, out)), advSecret) {
						t.Errorf("the runner reads the credential across the text items the hook built around the kept tail (the probe saw at most one): %s", out)
					}
				})
			}
		})
	}
}

func TestProbeAdversarialUnreadableAnswerIsSent(t *testing.T) {
	for _, c := range []struct {
		name, raw string
		hook      func(r []byte) gateway.Result
	}{
		{"duplicate keys: the hook's content and the upstream's", `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"the upstream's words"}]}}`,
			func(r []byte) gateway.Result {
				return gateway.Result{[]byte(`{"content":[{"type":"text","text":"the policy's words"}],`), r[1:]}
			}},
		{"duplicate keys in another case", `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"the upstream's words"}]}}`,
			func(r []byte) gateway.Result {
				return gateway.Result{[]byte(`{"Content":[{"type":"text","text":"the policy's words"}],`), r[1:]}
			}},
		{"an escape the placeholder completes, a blank in the tail", `{"jsonrpc":"2.0","id":1,"result":{ "content": [ {"type": "text", "text": "hi"} ] }}`,
			func(r []byte) gateway.Result {
				return gateway.Result{[]byte(`{"_meta":{"k":"v"},"x\`), r[1:]}
			}},
		{"a line break of the tail inside the hook's string", "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\n}}",
			func(r []byte) gateway.Result {
				return gateway.Result{[]byte(`{"note":"a`), r[1:], []byte(`"}`)}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, stateless := range []bool{false, true} {
				probeRun(t, stateless, func(t *testing.T, stateless bool) {
					h := testHandler()
					call := advCall("Bearer "+advSecret, stateless)
					msg := advUpstream(t, h, call, c.raw)
					call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
						return c.hook(result), nil
					})
					out := advFinish(h, call, msg)
					if _, err := mcpmsg.Parse(out, mcpmsg.Limits{}); err != nil {
						t.Errorf("the runner gets an answer toolgate cannot read (%v), never searched as a whole; it should be withheld: %q", err, out)
					}
				})
			}
		})
	}
}

func TestProbeAdversarialKeyContinuesIntoTheTail(t *testing.T) {
	// An API key of its own header, with a quote in it.
	const secret = `sk-live-7Fq2"Zx9LmB4vT8nRw3Yk6Hd`
	first, rest, _ := strings.Cut(secret, `"`)
	// The upstream's first member is named after the credential's part
	// after the quote.
	raw := `{"jsonrpc":"2.0","id":1,"result":{"` + rest + `":1,"content":[{"type":"text","text":"ok"}]}}`
	for _, stateless := range []bool{false, true} {
		probeRun(t, stateless, func(t *testing.T, stateless bool) {
			h := testHandler()
			call := advCall(secret, stateless)
			call.Credential.Header = "X-Api-Key"
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				// The hook's last key, ending in a backslash: it swallows
				// the quote opening the tail's first member name.
				return gateway.Result{[]byte(`{"_meta":{"k":"v"},"` + first + `\`), result[1:]}, nil
			})
			out := advFinish(h, call, msg)
			// Control: searched in full (as afterHooks does), the key is
			// redacted.
			if full, err := mcpmsg.Parse(out, mcpmsg.Limits{}); err == nil {
				if _, changed, err := h.redacted(call, full, nil); err == nil && !changed && strings.Contains(runnerReads(t, out), secret) {
					t.Fatalf("control: the full search lets the answer pass: %s", out)
				}
			}
			if strings.Contains(runnerReads(t, out), secret) {
				t.Errorf("the runner reads the credential in a key spanning the seam between the hook's bytes and the kept tail: %s", out)
			}
		})
	}
}

func TestProbeAdversarialHoldsOpenStringPrefixIsWithheld(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"292c6912E7710c838347Ae178B4a"}]}}`
	for _, stateless := range []bool{false, true} {
		probeRun(t, stateless, func(t *testing.T, stateless bool) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				// The tail's first bytes inside the hook's string.
				return gateway.Result{[]byte(`{"note":"gho_16C7e42F`), result[1:], []byte(`"}`)}, nil
			})
			out := advFinish(h, call, msg)
			if bytes.Contains(out, []byte(`"result"`)) {
				t.Errorf("an answer whose probe does not parse was sent: %s", out)
			}
		})
	}
}

func TestProbeAdversarialHoldsEmptyPiecesAroundTheTail(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}],"structuredContent":{"t":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}}}`
	for _, stateless := range []bool{false, true} {
		probeRun(t, stateless, func(t *testing.T, stateless bool) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				var v struct{ StructuredContent struct{ T string } }
				_ = json.Unmarshal(result, &v)
				note := strings.ReplaceAll(v.StructuredContent.T, "\u00b7", "")
				own := append(append([]byte(`{"_meta":{"note":`), mcpmsg.Quote(note)...), `},`...)
				return gateway.Result{nil, []byte{}, own, []byte{}, result[1:], nil, []byte{}}, nil
			})
			out := advFinish(h, call, msg)
			if strings.Contains(runnerReads(t, out), advSecret) {
				t.Errorf("the credential the hook put together, among empty pieces, reaches the runner: %s", out)
			}
		})
	}
}

func TestProbeAdversarialHoldsEnvelopeMember(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}]}}`
	h := testHandler()
	call := advCall("Bearer "+advSecret, false)
	msg := advUpstream(t, h, call, raw)
	call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
		// The result closed, a member of the envelope with the credential
		// put together, then the tail inside an object of the envelope's.
		clean := bytes.ReplaceAll(result, []byte(`\u00b7`), nil)
		own := append(append([]byte(`{"k":"v"},"extra":`), clean...), `,"more":{`...)
		return gateway.Result{own, result[1:]}, nil
	})
	out := advFinish(h, call, msg)
	if bytes.Contains(out, []byte(advSecret)) {
		t.Errorf("a credential in a member of the envelope the hook wrote reaches the runner: %s", out)
	}
}

func TestProbeAdversarialHoldsPiecesAfterTheTail(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}]}}`
	for _, stateless := range []bool{false, true} {
		probeRun(t, stateless, func(t *testing.T, stateless bool) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				// The tail twice, and the result as the hook cleaned it
				// between and after them.
				clean := bytes.ReplaceAll(result, []byte(`\u00b7`), nil)
				return gateway.Result{[]byte(`{"a":{`), result[1:], []byte(`,"b":{`), result[1:], []byte(`,"c":`), clean, []byte(`}`)}, nil
			})
			out := advFinish(h, call, msg)
			if bytes.Contains(out, []byte(advSecret)) {
				t.Errorf("the credential in a second copy of the tail reaches the runner: %s", out)
			}
		})
	}
}

// probeMegabyte is an upstream's answer with a megabyte of text.
func probeMegabyte() string {
	return `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + strings.Repeat("lorem ipsum ", 1<<17) + `"}]}}`
}

func TestProbeAdversarialHoldsProbeIsSmall(t *testing.T) {
	msg, err := mcpmsg.Parse([]byte(probeMegabyte()), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	out := gateway.Result{[]byte(`{"_meta":{"toolgate/decision":{"id":"d1","action":"allow"}},`), msg.Result[1:]}
	h := testHandler()
	p, ok := h.probe(advCall("Bearer "+advSecret, false), out, msg.Result)
	if !ok || len(p.Raw) > 200 {
		t.Errorf("the probe of a kept megabyte is %d bytes (ok %v), want the few the hook wrote", len(p.Raw), ok)
	}
}

func BenchmarkProbeAdversarialMegabyteTail(b *testing.B) {
	h := testHandler()
	call := advCall("Bearer "+advSecret, false)
	msg, err := mcpmsg.Parse([]byte(probeMegabyte()), mcpmsg.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	out := gateway.Result{[]byte(`{"_meta":{"toolgate/decision":{"id":"d1","action":"allow"}},`), msg.Result[1:]}
	b.ResetTimer()
	for range b.N {
		if h.mayHoldCredential(call, out, msg.Result) {
			b.Fatal("found")
		}
	}
}
