package mcpproxy

// Adversarial review of 522402d (finish searches only what the result
// hooks wrote, skipping a tail of the result they were given: written;
// finishStateless searches what the hooks wrote; answerOwn redacts).
//
// Attack (fixed): the credential put together across the seam between a
//   piece the hook wrote and the tail of the result it kept. The upstream
//   writes the credential broken by a character that is not ignorable
//   (U+00B7, escaped); redactCredential rightly lets it pass. A hook that
//   drops that character without copying the megabyte (the pieces design
//   invites it: its own bytes, then a slice of the upstream's) returns a
//   piece ending in the credential's first half and the tail of the result
//   starting with its second half. written drops the tail, the written
//   piece holds no whole credential, and the runner reads it joined. The
//   same with two slices of the result (head and tail): the head is
//   searched alone. Per-piece search (mayHoldCredential over parts) never
//   looks across a seam, before or after 522402d.
//   TestWrittenAdversarialCredentialAcrossTheSeam.
// Attack (fixed): what the hooks wrote holds the credential with '/'
//   escaped as \/ (a credential with '/', e.g. an AWS-style secret key or
//   a base64 token). redactCredential finds it so in an upstream's message
//   (mayEscape counts \/), but mayHoldCredential only decodes pieces that
//   hold \u: the credential a hook put together reaches the runner, in
//   finish and in the stateless answer 522402d says is now searched.
//   TestWrittenAdversarialEscapedSlashInWhatTheHooksWrote.
// Attack (fixed): what the hooks wrote holds the credential broken up by
//   an ignorable character (U+200B). redactCredential redacts that in an
//   upstream's message (redactIn: "a credential broken up by them would be
//   whole again by the time the runner reads it"), mayHoldCredential does
//   not look through ignorable characters at all.
//   TestWrittenAdversarialIgnorableInWhatTheHooksWrote.
// Attack (fixed): a piece the hook wrote that starts inside a JSON
//   string (pieces need not be member-aligned) holding the credential with
//   one character \u-escaped: mayHoldCredential's ContainsString reads
//   each piece as a JSON text from its first quote, so the escaped string
//   is never decoded. TestWrittenAdversarialPieceStartingInsideAString.
// Attack (fixed): a result hook that refuses the result with its own
//   answer (gateway.AnswerError, as the result policy does for a denied or
//   asked non-tool result, with the policy's reason in the message) writes
//   the answer the runner gets, but hookFailed sends it unsearched, in
//   finish and finishStateless. A reason that quotes what the policy read
//   (the credential put together) reaches the runner.
//   TestWrittenAdversarialHookAnswerIsNotSearched.
//
// All five failed on 522402d^ too (the search was per piece, and
//   mayHoldCredential and hookFailed are older). Fixed: what the hooks
//   return is parsed and searched in full, as an upstream's message is
//   (mayHoldCredential, afterHooks); a tail of the result they kept is
//   replaced by a placeholder member, and so not searched again, only when
//   it starts right after the result's opening brace, where no string of
//   it can have begun in what the hooks wrote (probe); hookFailed searches
//   a hook's own answer.
//
// Holds: the tail the hooks keep is of the redacted message:
//   redactCredential returns a message parsed again from the redacted text,
//   so msg.Result (and any tail of it) is the redacted bytes.
//   TestWrittenAdversarialHoldsTailIsOfTheRedactedMessage.
// Holds: a renumbered answer (rounds.go, translate.go: ReplaceMember of
//   "id", parsed again) keeps the redaction, and its tail is the redacted
//   bytes. TestWrittenAdversarialHoldsRenumberedAnswer.
// Holds: probe compares with the result the proxy gave the first hook
//   (msg.Result), not with what a later hook was given: a first hook that
//   puts the credential together and a second that keeps a tail of it are
//   searched. TestWrittenAdversarialHoldsChainedHooks.
// Holds: in the stateless path the result hooks are given what the
//   message hooks wrote, and a tail of that is not a tail of msg.Result, so
//   it is searched. TestWrittenAdversarialHoldsStatelessTailOfInspected.
// Holds: answerOwn redacts toolgate's own answers built from what the
//   upstream said (a discovery's instructions) before the hooks keep a tail
//   of them. TestWrittenAdversarialHoldsAnswerOwnRedacts.
// Holds (reviewed, no test of its own): every in-tree result hook
//   (policy markedResult/appendJSON, hideTools, markDecision,
//   discoverAsInitialize, registry allowlistTools, toolpin FilterList via
//   gateway.FilterTools, ReplaceMember/RemoveMember) copies or returns a
//   tail it did not write into; every deliver caller's message comes from
//   response.next/rejectedResponse (redactCredential), listen.go (same),
//   answerOwn (now redacted) or a renumbering of one of those.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/mcp2026"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

const advSecret = "gho_16C7e42F292c6912E7710c838347Ae178B4a"

// advCall is a tools/call request of alice's with the credential value
// attached (stateless when stateless is set).
func advCall(value string, stateless bool) *gateway.Call {
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Method:     "tools/call",
		Message:    mcpmsg.Message{Kind: mcpmsg.Request, ID: []byte("1"), Method: "tools/call"},
		Credential: &gateway.Credential{Header: "Authorization", Value: value}}
	if stateless {
		call.Stateless, call.Session = &gateway.Stateless{Capabilities: []byte(`{"sampling":{}}`)}, &gateway.Session{ID: "s"}
	}
	return call
}

// advUpstream parses raw as an upstream's answer and passes it through
// redactCredential, as every caller of deliver does; it fails the test
// when the search changed it (the attack needs an answer that passes).
func advUpstream(t *testing.T, h *Handler, call *gateway.Call, raw string) mcpmsg.Message {
	t.Helper()
	msg, err := mcpmsg.Parse([]byte(raw), mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := h.redactCredential(call, msg)
	if err != nil || !bytes.Equal(out.Raw, msg.Raw) {
		t.Fatalf("control: redactCredential changed or refused the upstream's answer: %s %v", out.Raw, err)
	}
	return out
}

// runnerReads is every string (member names included) of the JSON text
// out as a runner decodes it, joined with NULs.
func runnerReads(t *testing.T, out []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("the runner gets no JSON: %v: %s", err, out)
	}
	var b strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			b.WriteString(v)
			b.WriteByte(0)
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for k, e := range v {
				b.WriteString(k)
				b.WriteByte(0)
				walk(e)
			}
		}
	}
	walk(v)
	return b.String()
}

// withoutIgnorable is s without the characters ignorable reports.
func withoutIgnorable(s string) string {
	return strings.Map(func(r rune) rune {
		if ignorable(r) {
			return -1
		}
		return r
	}, s)
}

// advFinish runs the call's hooks on msg as deliver does (finish, or
// finishStateless for a stateless call) and returns what the runner gets.
func advFinish(h *Handler, call *gateway.Call, msg mcpmsg.Message) []byte {
	if call.Stateless != nil {
		return h.finishStateless(context.Background(), call, msg)
	}
	m := h.finish(context.Background(), call, msg)
	return bytes.Join(m.parts(), nil)
}

func TestWrittenAdversarialCredentialAcrossTheSeam(t *testing.T) {
	const dot = `\u00b7`
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"gho_16C7e42F` + dot + `292c6912E7710c838347Ae178B4a"}]}}`
	meta := []byte(`"_meta":{"toolgate/decision":{"id":"d1","action":"allow"}},`)
	for _, c := range []struct {
		name string
		hook func(r []byte) gateway.Result
	}{
		// The hook's own bytes (the decision, and the result up to the
		// character it drops), then the rest of the upstream's bytes,
		// not copied.
		{"a written piece, then the tail", func(r []byte) gateway.Result {
			i := bytes.Index(r, []byte(dot))
			own := append(append([]byte{'{'}, meta...), r[1:i]...)
			return gateway.Result{own, r[i+len(dot):]}
		}},
		// Two slices of the upstream's bytes, nothing copied.
		{"a head and the tail of the result", func(r []byte) gateway.Result {
			i := bytes.Index(r, []byte(dot))
			return gateway.Result{r[:i], r[i+len(dot):]}
		}},
	} {
		for _, stateless := range []bool{false, true} {
			name := c.name
			if stateless {
				name += ", stateless"
			}
			t.Run(name, func(t *testing.T) {
				h := testHandler()
				call := advCall("Bearer "+advSecret, stateless)
				msg := advUpstream(t, h, call, raw)
				call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
					return c.hook(result), nil
				})
				out := advFinish(h, call, msg)
				if strings.Contains(runnerReads(t, out), advSecret) {
					t.Errorf("the runner reads the credential the hook put together across a seam of its pieces: %s", out)
				}
			})
		}
	}
}

func TestWrittenAdversarialEscapedSlashInWhatTheHooksWrote(t *testing.T) {
	// A secret with '/' (an AWS-style secret access key) in a header of
	// its own; the upstream writes it with '/' escaped and broken by U+00B7.
	const secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"wJalrXUtnFEMI\/K7MDENG\/bPxRfi\u00b7CYEXAMPLEKEY"}]}}`
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "finish", true: "finishStateless"}[stateless], func(t *testing.T) {
			h := testHandler()
			call := advCall(secret, stateless)
			call.Credential.Header = "X-Api-Key"
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				// A policy removing characters the search does not look
				// through (as in TestFinishStatelessSearchesWhatTheHooksWrote).
				return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), bytes.ReplaceAll(result[1:], []byte(`\u00b7`), nil)}, nil
			})
			out := advFinish(h, call, msg)
			if strings.Contains(runnerReads(t, out), secret) {
				t.Errorf("the runner reads the credential the hook put together (\\/ escaped): %s", out)
			}
		})
	}
}

func TestWrittenAdversarialIgnorableInWhatTheHooksWrote(t *testing.T) {
	// U+200B (ignorable: redactCredential looks through it), then U+00B7
	// (not ignorable), which the hook drops.
	for _, c := range []struct{ name, zwsp string }{
		{"escaped", `\u200b`},
		{"as it is", "\u200b"},
	} {
		raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"gho_16C7e42F` + c.zwsp + `\u00b7292c6912E7710c838347Ae178B4a"}]}}`
		for _, stateless := range []bool{false, true} {
			name := c.name
			if stateless {
				name += ", stateless"
			}
			t.Run(name, func(t *testing.T) {
				h := testHandler()
				call := advCall("Bearer "+advSecret, stateless)
				msg := advUpstream(t, h, call, raw)
				call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
					return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), bytes.ReplaceAll(result[1:], []byte(`\u00b7`), nil)}, nil
				})
				out := advFinish(h, call, msg)
				// What redactCredential redacts in an upstream's message
				// (redactIn: the secret broken up by ignorable characters).
				if strings.Contains(withoutIgnorable(runnerReads(t, out)), advSecret) {
					t.Errorf("the runner reads the credential broken up only by an ignorable character, which the hook put together: %s", out)
				}
			})
		}
	}
}

func TestWrittenAdversarialPieceStartingInsideAString(t *testing.T) {
	// The upstream escapes the credential's first character and breaks it
	// with U+00B7; the hook drops U+00B7 (a copy) and returns its result
	// in two pieces it wrote, split where the text's value begins.
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\u0067ho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}]}}`
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "finish", true: "finishStateless"}[stateless], func(t *testing.T) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				own := append([]byte(`{"_meta":{"k":"v"},`), bytes.ReplaceAll(result[1:], []byte(`\u00b7`), nil)...)
				i := bytes.Index(own, []byte(`"text":"`)) + len(`"text":"`)
				return gateway.Result{own[:i:i], own[i:]}, nil
			})
			out := advFinish(h, call, msg)
			if strings.Contains(runnerReads(t, out), advSecret) {
				t.Errorf("the runner reads the credential the hook put together, in a piece that starts inside a string: %s", out)
			}
		})
	}
}

func TestWrittenAdversarialHookAnswerIsNotSearched(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"contents":[{"uri":"file:///notes","text":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}]}}`
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "finish", true: "finishStateless"}[stateless], func(t *testing.T) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg := advUpstream(t, h, call, raw)
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				// A policy denying the result with a reason that quotes
				// what it read, cleaned (as channels.go's withheld does
				// with the policy's reason).
				var r struct {
					Contents []struct{ Text string }
				}
				if err := json.Unmarshal(result, &r); err != nil || len(r.Contents) == 0 {
					return nil, err
				}
				reason := strings.ReplaceAll(r.Contents[0].Text, "\u00b7", "")
				return nil, &gateway.AnswerError{Code: gateway.CodePolicyDenied,
					Message: "the upstream's answer was withheld by policy: it holds a token: " + reason}
			})
			out := advFinish(h, call, msg)
			if strings.Contains(runnerReads(t, out), advSecret) {
				t.Errorf("the runner reads the credential in the hook's own answer, which is not searched: %s", out)
			}
		})
	}
}

func TestWrittenAdversarialHoldsTailIsOfTheRedactedMessage(t *testing.T) {
	raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"token: ` + advSecret + `"}]}}`)
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "finish", true: "finishStateless"}[stateless], func(t *testing.T) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if msg, err = h.redactCredential(call, msg); err != nil {
				t.Fatal(err)
			}
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), result[1:]}, nil
			})
			out := advFinish(h, call, msg)
			if bytes.Contains(out, []byte(advSecret)) || !bytes.Contains(out, []byte(credentialRedaction)) {
				t.Errorf("the kept tail is not the redacted upstream's bytes: %s", out)
			}
		})
	}
}

func TestWrittenAdversarialHoldsRenumberedAnswer(t *testing.T) {
	raw := []byte(`{"jsonrpc":"2.0","id":"gw-7","result":{"content":[{"type":"text","text":"` + advSecret + `"}]}}`)
	h := testHandler()
	call := advCall("Bearer "+advSecret, true)
	msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err = h.redactCredential(call, msg); err != nil {
		t.Fatal(err)
	}
	// As rounds.go and translate.go renumber the answer to the runner's id.
	if msg, err = mcpmsg.Parse(mcpmsg.ReplaceMember(msg.Raw, "id", call.Message.ID), mcpmsg.Limits{}); err != nil {
		t.Fatal(err)
	}
	call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
		return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), result[1:]}, nil
	})
	for _, stateless := range []bool{false, true} {
		if !stateless {
			call.Stateless = nil
		}
		out := advFinish(h, call, msg)
		if bytes.Contains(out, []byte(advSecret)) {
			t.Errorf("the renumbered answer holds the credential (stateless %v): %s", stateless, out)
		}
	}
}

func TestWrittenAdversarialHoldsChainedHooks(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}]}}`
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "finish", true: "finishStateless"}[stateless], func(t *testing.T) {
			h := testHandler()
			call := advCall("Bearer "+advSecret, stateless)
			msg := advUpstream(t, h, call, raw)
			// The first hook puts the credential together, in one piece;
			// the second is given that piece itself (Result.Bytes does not
			// copy one piece) and keeps a tail of it.
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				return gateway.Whole(bytes.ReplaceAll(result, []byte(`\u00b7`), nil)), nil
			})
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), result[1:]}, nil
			})
			out := advFinish(h, call, msg)
			if bytes.Contains(out, []byte(advSecret)) {
				t.Errorf("a tail of what an earlier hook wrote was taken for the upstream's bytes: %s", out)
			}
		})
	}
}

func TestWrittenAdversarialHoldsStatelessTailOfInspected(t *testing.T) {
	raw := `{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"s1":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}}],"maxTokens":10}}}}}`
	h := testHandler()
	call := advCall("Bearer "+advSecret, true)
	msg := advUpstream(t, h, call, raw)
	call.OnMessage(func(_ context.Context, _ *gateway.Call, m gateway.UpstreamMessage) ([]byte, bool, error) {
		return bytes.ReplaceAll(m.Payload, []byte(`\u00b7`), nil), false, nil
	})
	call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
		return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), result[1:]}, nil
	})
	out := h.finishStateless(context.Background(), call, msg)
	if bytes.Contains(out, []byte(advSecret)) {
		t.Errorf("a tail of what the message hooks wrote was taken for the upstream's bytes: %s", out)
	}
	if !bytes.Contains(out, []byte(`"k":"v"`)) && !bytes.Contains(out, []byte(`"error"`)) {
		t.Errorf("the result hook's answer was not sent: %s", out)
	}
}

func TestWrittenAdversarialHoldsAnswerOwnRedacts(t *testing.T) {
	h := testHandler()
	call := advCall("Bearer "+advSecret, true)
	call.Method, call.Message.Method = "server/discover", "server/discover"
	call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
		return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), result[1:]}, nil
	})
	// A discovery whose instructions (the upstream's words) hold the
	// credential.
	d := mcp2026.Discovery{Capabilities: []byte(`{}`), Instructions: []byte(`"use ` + advSecret + `"`)}
	w := httptest.NewRecorder()
	h.answerOwn(context.Background(), w, call, gateway.RPCResult(call.Message.ID, mcp2026.DiscoverResult(d)))
	out := w.Body.Bytes()
	if bytes.Contains(out, []byte(advSecret)) || !bytes.Contains(out, []byte(`"k":"v"`)) {
		t.Errorf("toolgate's own answer holds the credential, or is not the hook's: %s", out)
	}
}
