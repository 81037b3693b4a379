package mcp2026

import (
	"slices"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// CacheableMethods are the methods whose complete results carry caching
// hints (ttlMs, cacheScope).
var CacheableMethods = []string{"server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"}

// Result types.
const (
	ResultComplete      = "complete"
	ResultInputRequired = "input_required"
)

// ResultType returns a result's resultType, "complete" when absent (as
// from an upstream of an earlier revision).
func ResultType(result []byte) string {
	if t, ok := mcpmsg.String(mcpmsg.MemberOf(result, "resultType")); ok {
		return t
	}
	return ResultComplete
}

// InputRequestsProblem says why the input requests of an upstream's result
// cannot reach a runner as toolgate inspects them, "" when they can (or the
// result has none). Runners read what toolgate does not: the go-sdk's
// fulfils inputRequests whatever the resultType, and clients decoding with
// encoding/json read member names in any case. So inputRequests is
// refused (unless null) in a result that is not input_required, spelled
// in another case, when it is not an object, and when an input request is
// not an object or spells method or params in another case. The problem
// is said in toolgate's words: nothing of the upstream's is quoted.
func InputRequestsProblem(result []byte) string {
	problem := ""
	mcpmsg.Members(result, func(key, value []byte) {
		switch {
		case problem != "" || !isInputRequests(key, value):
		case string(key) != "inputRequests":
			problem = "its input requests are under a key spelled in another case than inputRequests"
		case ResultType(result) != ResultInputRequired:
			problem = "it carries input requests, but its resultType is not input_required"
		case value[0] != '{':
			problem = "its inputRequests is not an object"
		default:
			mcpmsg.Members(value, func(_, req []byte) {
				if problem == "" {
					problem = inputRequestProblem(req)
				}
			})
		}
	})
	return problem
}

// isInputRequests reports whether a member of a result is its input
// requests, as a runner reads them: inputRequests in any case, not null.
func isInputRequests(key, value []byte) bool {
	return strings.EqualFold(string(key), "inputRequests") && len(value) > 0 && string(value) != "null"
}

// inputRequestProblem is InputRequestsProblem for one input request.
func inputRequestProblem(req []byte) string {
	if len(req) == 0 || req[0] != '{' {
		return "one of its input requests is not an object"
	}
	problem := ""
	mcpmsg.Members(req, func(k, _ []byte) {
		for _, m := range []string{"method", "params"} {
			if problem == "" && strings.EqualFold(string(k), m) && string(k) != m {
				problem = "one of its input requests spells " + m + " in another case"
			}
		}
	})
	return problem
}

// AsksInput reports whether an upstream's result asks the runner for
// input: its resultType is input_required, or it carries input requests
// (see InputRequestsProblem). One pass over the result's members, whose
// keys are read in any case, as runners decoding with encoding/json read
// them (a ResultType of input_required is a result asking for input).
func AsksInput(result []byte) bool {
	asks := false
	mcpmsg.Members(result, func(key, value []byte) {
		switch {
		case isInputRequests(key, value):
			asks = true
		case strings.EqualFold(string(key), "resultType"):
			t, ok := mcpmsg.String(value)
			asks = asks || ok && t == ResultInputRequired
		}
	})
	return asks
}

// Complete makes an upstream's result one of the stateless revision for the
// runner: resultType "complete" unless it is exactly input_required (runners
// read every other resultType — none, "Complete", a number — as a complete
// result, so toolgate does too, and writes it so that runners and caches in
// front of them all read the same), and, on a complete result of a
// cacheable method, the caching hints — ttlMs 0 when absent, and cacheScope
// "private" when private is set (toolgate filtered or changed the result
// for this caller, so no shared cache may serve it to another) or when
// absent. A complete result carries no requestState (an upstream's would
// reach the runner unsealed: see Relay). It returns result itself when
// nothing changes.
func Complete(method string, result []byte, private bool) []byte {
	if len(result) == 0 || result[0] != '{' {
		return result
	}
	t, isString := mcpmsg.String(mcpmsg.MemberOf(result, "resultType"))
	switch {
	case isString && t == ResultInputRequired:
		return result
	case !isString || t != ResultComplete:
		result = mcpmsg.ReplaceMember(result, "resultType", []byte(`"complete"`))
	}
	if mcpmsg.MemberOf(result, "requestState") != nil {
		result = mcpmsg.RemoveMember(result, "requestState")
	}
	if !slices.Contains(CacheableMethods, method) {
		return result
	}
	if mcpmsg.MemberOf(result, "ttlMs") == nil {
		result = mcpmsg.ReplaceMember(result, "ttlMs", []byte("0"))
	}
	raw := mcpmsg.MemberOf(result, "cacheScope")
	if scope, _ := mcpmsg.String(raw); raw == nil || private && scope != "private" {
		result = mcpmsg.ReplaceMember(result, "cacheScope", []byte(`"private"`))
	}
	return result
}

// DiscoverResult is toolgate's answer to a runner's server/discover for a
// service: the revisions toolgate speaks with runners, and the upstream's
// capabilities, identity, instructions and caching hints (cacheScope
// "private" for an upstream of an earlier revision, which toolgate
// initialized for the caller).
func DiscoverResult(d Discovery) []byte {
	caps := d.Capabilities
	if caps == nil {
		caps = []byte("{}")
	}
	b := []byte(`{"resultType":"complete","supportedVersions":[`)
	for i, v := range gateway.AllProtocolVersions() {
		if i > 0 {
			b = append(b, ',')
		}
		b = mcpmsg.AppendQuote(b, v)
	}
	b = append(b, `],"capabilities":`...)
	b = append(b, caps...)
	if d.Instructions != nil {
		b = append(b, `,"instructions":`...)
		b = append(b, d.Instructions...)
	}
	if d.ServerInfo != nil {
		b = append(b, `,"_meta":{"`+MetaServerInfo+`":`...)
		b = append(b, d.ServerInfo...)
		b = append(b, '}')
	}
	ttl, scope := d.TTLMs, d.CacheScope
	if ttl == nil {
		ttl = []byte("0")
	}
	switch {
	case scope != nil:
	case d.Stateless:
		scope = []byte(`"public"`)
	default:
		// toolgate initialized an upstream session for the caller, with
		// their credential: what it said is theirs.
		scope = []byte(`"private"`)
	}
	b = append(b, `,"ttlMs":`...)
	b = append(b, ttl...)
	b = append(b, `,"cacheScope":`...)
	b = append(b, scope...)
	return append(b, '}')
}

// RequiredCapability returns the client capability an input request
// (method and params) needs, as a ClientCapabilities object, and whether
// caps (the client's declared capabilities, JSON text) has it.
func RequiredCapability(caps []byte, method string, params gjson.Result) (map[string]any, bool) {
	return RequiredCapabilityIn(Version, caps, method, params)
}

// contextCapabilitySince is the revision that put sampling's
// includeContext ("thisServer", "allServers") behind the client's
// sampling.context capability: before it, the member needs sampling only.
const contextCapabilitySince = "2025-11-25"

// RequiredCapabilityIn is RequiredCapability for a client of the protocol
// revision version (a server→client request on a stream of an earlier
// revision's session).
func RequiredCapabilityIn(version string, caps []byte, method string, params gjson.Result) (map[string]any, bool) {
	c := gjson.ParseBytes(caps)
	switch method {
	case "elicitation/create":
		if memberFold(params, "mode").String() == "url" {
			return map[string]any{"elicitation": map[string]any{"url": map[string]any{}}}, c.Get("elicitation.url").IsObject()
		}
		e := c.Get("elicitation")
		// An empty elicitation capability means form mode.
		form := e.IsObject() && (e.Get("form").IsObject() || !e.Get("url").Exists())
		return map[string]any{"elicitation": map[string]any{"form": map[string]any{}}}, form
	case "sampling/createMessage":
		need, ok := map[string]any{}, c.Get("sampling").IsObject()
		if given(memberFold(params, "tools")) || given(memberFold(params, "toolChoice")) {
			// Tool use in sampling is a capability of its own.
			need["tools"] = map[string]any{}
			ok = ok && c.Get("sampling.tools").IsObject()
		}
		if ic := memberFold(params, "includeContext"); given(ic) && ic.String() != "none" && version >= contextCapabilitySince {
			// So is context from the client's servers ("thisServer",
			// "allServers": another server's, even).
			need["context"] = map[string]any{}
			ok = ok && c.Get("sampling.context").IsObject()
		}
		return map[string]any{"sampling": need}, ok
	case "roots/list":
		return map[string]any{"roots": map[string]any{}}, c.Get("roots").IsObject()
	}
	return map[string]any{}, false
}

// given reports whether a member is there and not null (a null member is
// none, as runners decode it).
func given(v gjson.Result) bool { return v.Exists() && v.Type != gjson.Null }

// memberFold is obj's member whose key is name in any case: clients decoding
// with encoding/json read it so (a case-variant duplicate is refused when
// the message is parsed).
func memberFold(obj gjson.Result, name string) gjson.Result {
	var found gjson.Result
	obj.ForEach(func(k, v gjson.Result) bool {
		if strings.EqualFold(k.String(), name) {
			found = v
			return false
		}
		return true
	})
	return found
}

// Undeclared returns the capabilities an input_required result's input
// requests need that caps does not declare, or nil when every one is
// declared. Such a result must not reach the client: it gets
// MissingRequiredClientCapability instead.
func Undeclared(caps, result []byte) map[string]any {
	var missing map[string]any
	gjson.GetBytes(result, "inputRequests").ForEach(func(_, req gjson.Result) bool {
		need, ok := RequiredCapability(caps, req.Get("method").String(), req.Get("params"))
		if ok {
			return true
		}
		if missing == nil {
			missing = map[string]any{}
		}
		for k, v := range need {
			missing[k] = v
		}
		return true
	})
	return missing
}

// MissingCapability is the MissingRequiredClientCapability error data.
func MissingCapability(required map[string]any) map[string]any {
	return map[string]any{"requiredCapabilities": required}
}

// ApprovalInput is toolgate's answer to a stateless call that waits for an
// approval: an input_required result whose one input request is a URL-mode
// elicitation of the approval page, and toolgate's sealed requestState,
// which the retry echoes. _meta carries the decision and the approval.
func ApprovalInput(page, message, state string, decision, approval []byte) []byte {
	b := []byte(`{"resultType":"input_required","inputRequests":{`)
	b = mcpmsg.AppendQuote(b, OwnInput)
	b = append(b, `:{"method":"elicitation/create","params":{"mode":"url","url":`...)
	b = mcpmsg.AppendQuote(b, page)
	b = append(b, `,"message":`...)
	b = mcpmsg.AppendQuote(b, message)
	b = append(b, `}}},"requestState":`...)
	b = mcpmsg.AppendQuote(b, state)
	b = append(b, `,"_meta":{"toolgate/decision":`...)
	b = append(b, decision...)
	b = append(b, `,"toolgate/approval":`...)
	b = append(b, approval...)
	return append(b, `}}`...)
}

// InputRequest is one input request of an input_required result: its key
// in inputRequests, its method, and its params (JSON text; nil for none).
type InputRequest struct {
	Key    string
	Method string
	Params []byte
}

// InputRequired is toolgate's input_required result for input requests it
// makes of an upstream's server→client requests, with toolgate's sealed
// requestState.
func InputRequired(reqs []InputRequest, state string) []byte {
	b := []byte(`{"resultType":"input_required","inputRequests":{`)
	for i, r := range reqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = mcpmsg.AppendQuote(b, r.Key)
		b = append(b, `:{"method":`...)
		b = mcpmsg.AppendQuote(b, r.Method)
		if r.Params != nil {
			b = append(b, `,"params":`...)
			b = append(b, r.Params...)
		}
		b = append(b, '}')
	}
	b = append(b, `},"requestState":`...)
	b = mcpmsg.AppendQuote(b, state)
	return append(b, '}')
}

// RoundMethods are the requests a server may answer with input_required.
var RoundMethods = []string{"tools/call", "prompts/get", "resources/read"}

// InputMethods are the server→client requests that may be input requests.
var InputMethods = []string{"elicitation/create", "sampling/createMessage", "roots/list"}

// InputMethodName is method, one of an upstream's input requests, for
// toolgate's words to a runner: the method when it is one of InputMethods,
// else no text of the upstream's (what no policy saw, or one withheld).
func InputMethodName(method string) string {
	if slices.Contains(InputMethods, method) {
		return method
	}
	return "an input request of another method"
}
