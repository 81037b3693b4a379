package mcpproxy

import (
	"bytes"
	"context"
	"testing"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// TestFinishSearchesOnlyWhatTheHooksWrote: after the result hooks, the
// pieces they wrote are searched for the call's credential again (a hook
// may have put it together); a tail of the result they were given, the
// upstream's bytes as redactCredential left them, is not searched twice.
// Here the result given to the hooks holds the credential (as no result
// that passed redactCredential does) to tell what was searched.
func TestFinishSearchesOnlyWhatTheHooksWrote(t *testing.T) {
	const secret = "gho_16C7e42F292c6912E7710c838347Ae178B4a"
	raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` + secret + `"}]}}`)
	msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte(`{"_meta":{"toolgate/decision":{"id":"d1","action":"allow"}},`)
	for _, c := range []struct {
		name     string
		hook     func(result []byte) gateway.Result
		redacted bool
	}{
		{"the result's own tail", func(r []byte) gateway.Result { return gateway.Result{prefix, r[1:]} }, false},
		{"a copy of the tail", func(r []byte) gateway.Result { return gateway.Result{prefix, bytes.Clone(r[1:])} }, true},
		{"a slice of the result that is not its tail", func(r []byte) gateway.Result {
			return gateway.Result{prefix, r[1 : len(r)-1], []byte("}")}
		}, true},
		{"the credential in a piece the hook wrote", func(r []byte) gateway.Result {
			return gateway.Result{[]byte(`{"_meta":{"note":"` + secret + `"},`), r[1:]}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := testHandler()
			call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
				Message:    mcpmsg.Message{ID: []byte("1")},
				Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer " + secret}}
			call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
				return c.hook(result), nil
			})
			m := h.finish(context.Background(), call, msg)
			out := bytes.Join(m.parts(), nil)
			if !bytes.Contains(out, []byte(`"toolgate/decision"`)) && !bytes.Contains(out, []byte(`"note"`)) {
				t.Fatalf("the hook's result was not sent: %s", out)
			}
			if got := bytes.Contains(out, []byte(secret)); got == c.redacted {
				t.Errorf("credential in the answer: %v, want %v: %s", got, !c.redacted, out)
			}
		})
	}
}

// TestFinishStatelessSearchesWhatTheHooksWrote: the answer to a request of
// the stateless revision is searched for the call's credential after the
// result hooks too: a hook that puts the credential together (a policy
// removing characters the search does not look through) does not hand it
// to the runner.
func TestFinishStatelessSearchesWhatTheHooksWrote(t *testing.T) {
	const secret = "gho_16C7e42F292c6912E7710c838347Ae178B4a"
	raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"gho_16C7e42F\u00b7292c6912E7710c838347Ae178B4a"}]}}`)
	msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	h := testHandler()
	call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
		Message: mcpmsg.Message{ID: []byte("1")}, Session: &gateway.Session{ID: "s"}, Stateless: &gateway.Stateless{Capabilities: []byte("{}")},
		Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer " + secret}}
	if out, err := h.redactCredential(call, msg); err != nil || !bytes.Equal(out.Raw, raw) {
		t.Fatalf("control: the search changed the upstream's answer: %s %v", out.Raw, err)
	}
	call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
		return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), bytes.ReplaceAll(result[1:], []byte(`\u00b7`), nil)}, nil
	})
	out := h.finishStateless(context.Background(), call, msg)
	if bytes.Contains(out, []byte(secret)) || !bytes.Contains(out, []byte(`"jsonrpc"`)) {
		t.Errorf("the answer holds the credential the hook put together, or is no answer: %s", out)
	}
}

// TestFinishStatelessKeepsWhatTheMessageHooksWrote: an input_required
// answer's input requests pass the message hooks (as the server→client
// requests of earlier revisions do), then the whole result the result
// hooks. What the message hooks wrote (a policy's rewrite of a sampling
// request) reaches the result hooks and the runner, not the upstream's
// own request; and it is searched for the call's credential.
func TestFinishStatelessKeepsWhatTheMessageHooksWrote(t *testing.T) {
	const secret = "gho_16C7e42F292c6912E7710c838347Ae178B4a"
	raw := []byte(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"s1":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"upstream's own words"}}],"maxTokens":10}}}}}`)
	msg, err := mcpmsg.Parse(raw, mcpmsg.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, words string
		resultHook  bool
	}{
		{"the message hooks only", "rewritten by the policy", false},
		{"and a result hook", "rewritten by the policy", true},
		{"the credential put together", "gho_16C7e42F" + "292c6912E7710c838347Ae178B4a", false},
		{"the credential put together, and a result hook", "gho_16C7e42F" + "292c6912E7710c838347Ae178B4a", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := testHandler()
			call := &gateway.Call{Service: &gateway.Service{ID: "svc"}, Caller: &gateway.Caller{User: "alice"},
				Message:    mcpmsg.Message{ID: []byte("1")},
				Session:    &gateway.Session{ID: "s"},
				Stateless:  &gateway.Stateless{Capabilities: []byte(`{"sampling":{}}`)},
				Credential: &gateway.Credential{Header: "Authorization", Value: "Bearer " + secret}}
			call.OnMessage(func(_ context.Context, _ *gateway.Call, m gateway.UpstreamMessage) ([]byte, bool, error) {
				return bytes.ReplaceAll(m.Payload, []byte("upstream's own words"), []byte(c.words)), false, nil
			})
			if c.resultHook {
				call.OnResult(func(_ context.Context, _ *gateway.Call, result []byte) (gateway.Result, error) {
					return gateway.Result{[]byte(`{"_meta":{"k":"v"},`), result[1:]}, nil
				})
			}
			out := h.finishStateless(context.Background(), call, msg)
			if bytes.Contains(out, []byte("upstream's own words")) {
				t.Errorf("the runner gets the input request the message hooks replaced: %s", out)
			}
			if bytes.Contains(out, []byte(secret)) {
				t.Errorf("the runner gets the credential the message hooks put together: %s", out)
			}
			if c.words != "" && !bytes.Contains(out, []byte(c.words)) && !bytes.Contains(out, []byte("REDACTED")) && !bytes.Contains(out, []byte("withheld")) {
				t.Errorf("the runner does not get the input request as the message hooks wrote it: %s", out)
			}
		})
	}
}
