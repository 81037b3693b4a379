package mcp2026

import (
	"slices"
	"time"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// An upstream of 2026-07-28 asks a stateless runner for input in an
// input_required result: its inputRequests, and a requestState of its own
// that the runner's retry echoes with the answers (inputResponses). The
// upstream's requestState is opaque: nothing in it tells toolgate which
// method each answer answers, so the request policy could not decide the
// answers as answers (method elicitation/create, …), as it does for every
// other pairing of revisions. So toolgate never hands the upstream's state
// to the runner: it seals it, with the methods of the input requests by
// key and what the retry must match (caller, session, service, the
// request), into a requestState of its own. The retry's state is opened
// (Redeem), each answer decided as the answer to its request, and the
// upstream gets its own state back byte for byte with the answers the
// policy allowed. An answer under a key toolgate relayed no request for
// (a retry with another requestState, or answers given before anything
// was asked, which a server that keeps no state cannot tell from
// answers to its requests) is decided as the answer to each method an
// input request may have, and goes upstream only when all allow it: no
// answer reaches an upstream undecided.

// RelayTTL is how long a runner may take to retry with the answers to an
// upstream's input requests (a person may be answering them).
const RelayTTL = time.Hour

// Relay returns the input_required result of an upstream of 2026-07-28
// with its requestState replaced by one toolgate sealed, bound to the call
// st describes, holding the upstream's and the methods of the result's
// input requests.
func (rt *Runtime) Relay(st State, result []byte) ([]byte, error) {
	st.Relayed = true
	if rs := mcpmsg.MemberOf(result, "requestState"); rs != nil {
		st.Upstream = string(rs)
	}
	gjson.GetBytes(result, "inputRequests").ForEach(func(k, v gjson.Result) bool {
		if st.Inputs == nil {
			st.Inputs = make(map[string]string)
		}
		st.Inputs[k.String()] = v.Get("method").String()
		return true
	})
	sealed, err := rt.Seal(st, RelayTTL)
	if err != nil {
		return nil, err
	}
	return mcpmsg.ReplaceMember(result, "requestState", mcpmsg.AppendQuote(nil, sealed)), nil
}

// RestoreUpstream returns the params of a retry that echoes a relayed
// state (upstream: the upstream's requestState, "" for none) with the
// upstream's own requestState back in its place.
func RestoreUpstream(params []byte, upstream string) []byte {
	if upstream == "" {
		return mcpmsg.RemoveMember(params, "requestState")
	}
	return mcpmsg.ReplaceMember(params, "requestState", []byte(upstream))
}

// WithoutAnswers returns params without the input responses under keys
// (and without inputResponses when nothing else is left in it).
func WithoutAnswers(params []byte, keys map[string]bool) []byte {
	ir := mcpmsg.MemberOf(params, "inputResponses")
	if ir == nil || ir[0] != '{' || len(keys) == 0 {
		return params
	}
	for key := range keys {
		ir = mcpmsg.RemoveMember(ir, key)
	}
	if isEmptyObject(ir) {
		return mcpmsg.RemoveMember(params, "inputResponses")
	}
	return mcpmsg.ReplaceMember(params, "inputResponses", ir)
}

// shapes are the members by which a decoder may tell an input response's
// type, and the method each stands for, in the order the go-sdk looks
// (unmarshalInputResponse: roots, then action, then role).
var shapes = [...]struct{ member, method string }{
	{"roots", "roots/list"}, {"action", "elicitation/create"}, {"role", "sampling/createMessage"},
}

// AnswerMethods are the methods an answer, the result of a runner's
// response to an input request of method (or "" when toolgate cannot tell
// which request it answers), is decided as: that method, and each one its
// shape may be read as. A server of 2026-07-28 that keeps no state tells an
// input response's type by its members — the go-sdk reads any answer with
// "action" as an elicitation's, whatever it asked under that key — so an
// answer is decided as whatever it may be read as, and goes on only when
// all are allowed. An answer whose request is not known is decided as each
// input method.
func AnswerMethods(method string, answer []byte) []string {
	if method == "" {
		return InputMethods
	}
	out := []string{method}
	mcpmsg.Members(answer, func(key, _ []byte) {
		for _, sh := range shapes {
			if k := string(key); (k == sh.member || mcpmsg.SameFold(k, sh.member)) && !slices.Contains(out, sh.method) {
				out = append(out, sh.method)
			}
		}
	})
	return out
}
