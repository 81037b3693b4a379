// Package mcp2026 is what the stateless MCP revision (2026-07-28) asks of
// toolgate on the runner side, and what toolgate needs to speak it to
// upstreams.
//
// In that revision there is no initialize and no Mcp-Session-Id: every
// request carries its protocol version and the client's capabilities in
// params._meta, and mirrors its method and name into the Mcp-Method and
// Mcp-Name headers (and chosen tool arguments into Mcp-Param-* headers)
// that intermediaries must check against the body. toolgate checks all of
// it before any policy sees the request, so that what a header-routing
// component, the policy and the upstream read is one and the same thing.
// Server→client requests became multi round-trip requests: a result of
// type input_required carries the requests, and the client retries with
// inputResponses and the server's opaque requestState, which toolgate seals
// (AEAD) when it is toolgate's own (an approval).
//
// A stateless request still has an authenticated caller and a toolgate
// session; toolgate binds it to an MCP session of its own, implied by the
// caller, the toolgate session, the service and the declared capabilities
// (see Runtime), which holds the upstream's tool catalog for the policy
// and, for an upstream that still initializes, the upstream session.
package mcp2026

import (
	"bytes"
	"encoding/base64"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Version is the stateless revision.
const Version = gateway.StatelessProtocolVersion

// metaNamespace is the prefix of the revision's _meta keys.
const metaNamespace = "io.modelcontextprotocol/"

// The _meta keys of the revision.
const (
	MetaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	MetaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	MetaClientInfo         = "io.modelcontextprotocol/clientInfo"
	MetaLogLevel           = "io.modelcontextprotocol/logLevel"
	MetaServerInfo         = "io.modelcontextprotocol/serverInfo"
	MetaSubscriptionID     = "io.modelcontextprotocol/subscriptionId"
)

// Error codes of the revision (renumbered on 2026-06-12; release
// candidates used -32001, -32003 and -32004).
const (
	CodeHeaderMismatch                  = -32020
	CodeMissingRequiredClientCapability = -32021
	CodeUnsupportedProtocolVersion      = -32022
)

// Header names.
const (
	HeaderProtocolVersion = "Mcp-Protocol-Version"
	HeaderMethod          = "Mcp-Method"
	HeaderName            = "Mcp-Name"
	HeaderParamPrefix     = "Mcp-Param-"
)

// Refusal is the answer to a request toolgate refuses before any policy
// sees it: an HTTP status and a JSON-RPC error.
type Refusal struct {
	Status  int
	Code    int
	Message string
	Data    any
}

// Write answers the request with the refusal.
func (f *Refusal) Write(w http.ResponseWriter, id []byte) {
	gateway.WriteRPCError(w, f.Status, id, f.Code, f.Message, f.Data)
}

func mismatch(msg string) *Refusal {
	return &Refusal{Status: http.StatusBadRequest, Code: CodeHeaderMismatch, Message: "Header mismatch: " + msg}
}

func invalidParams(msg string) *Refusal {
	return &Refusal{Status: http.StatusBadRequest, Code: gateway.CodeInvalidParams, Message: msg}
}

// IsLegacy reports whether v is a protocol version that initializes.
func IsLegacy(v string) bool { return gateway.SupportsProtocolVersion(v) || v == "2024-11-05" }

// ModernHeader reports whether the request's MCP-Protocol-Version header
// names a version that is not one of those that initialize: the request is
// then judged as one of the stateless revision (an unknown version gets
// UnsupportedProtocolVersion rather than a legacy error), and an
// Mcp-Session-Id it carries is ignored.
func ModernHeader(r *http.Request) bool {
	v := r.Header.Get(HeaderProtocolVersion)
	return v != "" && !IsLegacy(v)
}

// IsStateless reports whether msg, sent without an MCP session, is a
// request of the stateless revision: its MCP-Protocol-Version header is not
// a version that initializes, or its _meta declares a protocol version.
func IsStateless(r *http.Request, msg mcpmsg.Message) bool {
	if ModernHeader(r) {
		return true
	}
	v := r.Header.Get(HeaderProtocolVersion)
	return (v == "" || v == Version) && mcpmsg.MemberOf(msg.Meta, MetaProtocolVersion) != nil
}

// Check validates a stateless message's protocol version, _meta and
// standard headers (all but Mcp-Param-*, which need the tool's definition:
// CheckParamHeaders), in the order the revision gives: the version header,
// the required _meta members, the header against _meta, the version, then
// Mcp-Method and Mcp-Name.
func Check(r *http.Request, msg mcpmsg.Message) (*gateway.Stateless, *Refusal) {
	hv := r.Header.Get(HeaderProtocolVersion)
	if msg.Kind != mcpmsg.Request {
		// The revision defines no client notification over HTTP and no
		// client response: a notification passes on as one; a response
		// answers nothing.
		if msg.Kind == mcpmsg.Response {
			return nil, &Refusal{Status: http.StatusBadRequest, Code: gateway.CodeInvalidRequest,
				Message: "a client of protocol " + Version + " sends no responses: answer input requests in the retried request's inputResponses"}
		}
		if msg.Method == "subscriptions/listen" {
			return nil, &Refusal{Status: http.StatusBadRequest, Code: gateway.CodeInvalidRequest,
				Message: "subscriptions/listen is a request: send it with an id"}
		}
		if msg.InputResponses != nil || msg.RequestState != nil {
			// Answers go in a retried request, where each is decided;
			// a notification's would go upstream undecided.
			return nil, invalidParams("a notification carries no inputResponses or requestState: answer input requests in the retried request")
		}
		caps := mcpmsg.MemberOf(msg.Meta, MetaClientCapabilities)
		if caps == nil {
			caps = []byte("{}")
		}
		if why := CapabilityVariant(caps); why != "" {
			return nil, invalidParams(why)
		}
		return &gateway.Stateless{Capabilities: caps}, nil
	}
	if hv == "" {
		return nil, mismatch("the " + HeaderProtocolVersion + " header is required for requests carrying " + MetaProtocolVersion)
	}
	if msg.Meta == nil {
		why := "missing params._meta: every request of protocol " + Version + " carries " +
			MetaProtocolVersion + " and " + MetaClientCapabilities
		if hv != Version {
			// Most likely a client of another revision: say what is spoken.
			why = "unsupported MCP-Protocol-Version " + strconv.Quote(hv) + " (supported: " +
				strings.Join(gateway.AllProtocolVersions(), ", ") + "); " + why
		}
		return nil, invalidParams(why)
	}
	mv, ok := mcpmsg.String(mcpmsg.MemberOf(msg.Meta, MetaProtocolVersion))
	if !ok || mv == "" {
		return nil, invalidParams("missing or invalid _meta field " + strconv.Quote(MetaProtocolVersion))
	}
	caps := mcpmsg.MemberOf(msg.Meta, MetaClientCapabilities)
	if len(caps) == 0 || caps[0] != '{' {
		return nil, invalidParams("missing or invalid _meta field " + strconv.Quote(MetaClientCapabilities))
	}
	if why := CapabilityVariant(caps); why != "" {
		return nil, invalidParams(why)
	}
	info := mcpmsg.MemberOf(msg.Meta, MetaClientInfo)
	if info != nil && info[0] != '{' {
		return nil, invalidParams("invalid _meta field " + strconv.Quote(MetaClientInfo))
	}
	if hv != mv {
		return nil, mismatch(HeaderProtocolVersion + " header value " + strconv.Quote(hv) +
			" does not match " + MetaProtocolVersion + " " + strconv.Quote(mv))
	}
	if mv != Version {
		return nil, &Refusal{Status: http.StatusBadRequest, Code: CodeUnsupportedProtocolVersion,
			Message: "Unsupported protocol version " + strconv.Quote(mv),
			Data:    map[string]any{"supported": gateway.AllProtocolVersions(), "requested": mv}}
	}
	if rf := checkStandardHeaders(r.Header, msg); rf != nil {
		return nil, rf
	}
	if rs := msg.RequestState; rs != nil && rs[0] != '"' {
		return nil, invalidParams("params.requestState must be a string")
	}
	if ir := msg.InputResponses; ir != nil && ir[0] != '{' {
		return nil, invalidParams("params.inputResponses must be an object")
	} else if n := countMembers(ir); n > MaxInputResponses {
		return nil, invalidParams("params.inputResponses holds " + strconv.Itoa(n) + " answers; at most " + strconv.Itoa(MaxInputResponses) + " are taken")
	}
	if msg.Method == "subscriptions/listen" {
		if _, rf := ListenSubscriptions(msg.Params); rf != nil {
			return nil, rf
		}
	}
	return &gateway.Stateless{Capabilities: caps, ClientInfo: info}, nil
}

// NamedMethods are the methods whose params.name (or params.uri) is
// mirrored in Mcp-Name.
var NamedMethods = []string{"tools/call", "resources/read", "prompts/get"}

// Name returns the value Mcp-Name mirrors for msg, and whether msg's method
// has one.
func Name(msg mcpmsg.Message) (string, bool) {
	switch msg.Method {
	case "tools/call", "prompts/get":
		return msg.Name, true
	case "resources/read":
		return msg.URI, true
	}
	return "", false
}

func checkStandardHeaders(h http.Header, msg mcpmsg.Message) *Refusal {
	method, ok := headerValue(h, HeaderMethod)
	switch {
	case !ok:
		return mismatch("missing required " + HeaderMethod + " header")
	case method != msg.Method:
		return mismatch(HeaderMethod + " header value " + strconv.Quote(method) + " does not match body value " + strconv.Quote(msg.Method))
	}
	body, named := Name(msg)
	if !named {
		return nil
	}
	raw, ok := headerValue(h, HeaderName)
	if !ok {
		return mismatch("missing required " + HeaderName + " header for method " + strconv.Quote(msg.Method))
	}
	name, ok := DecodeHeaderValue(raw)
	switch {
	case !ok:
		return mismatch(HeaderName + " header value is not valid (invalid characters or Base64)")
	case name != body:
		return mismatch(HeaderName + " header value " + strconv.Quote(name) + " does not match body value " + strconv.Quote(body))
	}
	return nil
}

// headerValue returns the single value of a header, without surrounding
// whitespace. A header sent twice has no single value: it is refused as
// missing would be, so that no component can pick another one.
func headerValue(h http.Header, name string) (string, bool) {
	vs := h.Values(name)
	if len(vs) != 1 {
		return "", false
	}
	return strings.Trim(vs[0], " \t"), true
}

const (
	base64Prefix = "=?base64?"
	base64Suffix = "?="
)

// DecodeHeaderValue reads an Mcp-Name or Mcp-Param-* value: plain visible
// ASCII as it is, or the Base64 sentinel form =?base64?…?= decoded (strict
// standard Base64 with padding, holding UTF-8). ok is false for a value
// with characters a header may not carry, or a broken sentinel.
func DecodeHeaderValue(v string) (string, bool) {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c != '\t' && (c < 0x20 || c > 0x7e) {
			return "", false
		}
	}
	if !strings.HasPrefix(v, base64Prefix) || !strings.HasSuffix(v, base64Suffix) || len(v) < len(base64Prefix)+len(base64Suffix) {
		return v, true
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(v[len(base64Prefix) : len(v)-len(base64Suffix)])
	if err != nil || !utf8.Valid(raw) {
		return "", false
	}
	return string(raw), true
}

// EncodeHeaderValue writes a value for Mcp-Name or Mcp-Param-*: as it is
// when it is plain visible ASCII without surrounding whitespace, else (or
// when it looks like the sentinel form) as =?base64?…?=.
func EncodeHeaderValue(v string) string {
	plain := v != "" && v[0] != ' ' && v[0] != '\t' && v[len(v)-1] != ' ' && v[len(v)-1] != '\t'
	for i := 0; plain && i < len(v); i++ {
		if c := v[i]; c != ' ' && (c < 0x21 || c > 0x7e) {
			plain = false
		}
	}
	if plain && !(strings.HasPrefix(v, base64Prefix) && strings.HasSuffix(v, base64Suffix)) {
		return v
	}
	return base64Prefix + base64.StdEncoding.EncodeToString([]byte(v)) + base64Suffix
}

// StripMeta returns params without the stateless revision's per-request
// _meta members (and without _meta when nothing else is left in it), for
// an upstream that initializes: such upstreams may take a declared
// protocol version in _meta for a request of the stateless revision.
func StripMeta(params []byte) []byte {
	meta := mcpmsg.MemberOf(params, "_meta")
	if meta == nil || meta[0] != '{' {
		return params
	}
	stripped := meta
	for _, k := range []string{MetaProtocolVersion, MetaClientCapabilities, MetaClientInfo, MetaLogLevel} {
		stripped = mcpmsg.RemoveMemberFold(stripped, k) // in any case: an upstream's decoder may read a variant
	}
	if len(stripped) == len(meta) {
		return params // none of them
	}
	if len(bytes.TrimSpace(stripped)) == 2 || string(bytes.Join(bytes.Fields(stripped), nil)) == "{}" {
		return mcpmsg.RemoveMember(params, "_meta")
	}
	return mcpmsg.ReplaceMember(params, "_meta", stripped)
}

// RemovedMethods are the methods the stateless revision removed: a
// stateless request for one gets 404 and -32601, as from a server of the
// revision.
var RemovedMethods = []string{"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}

// IsRemoved reports whether method is one of RemovedMethods.
func IsRemoved(method string) bool { return slices.Contains(RemovedMethods, method) }

// MaxInputResponses bounds the answers one retry may carry: each is decided
// by the request policy (an answer toolgate cannot attribute, once per
// input method), with an audit entry.
const MaxInputResponses = 64

// countMembers is the number of members of obj, a JSON object (0 for nil).
func countMembers(obj []byte) int {
	n := 0
	mcpmsg.Members(obj, func(_, _ []byte) { n++ })
	return n
}

// clientCapabilities are the client capabilities of every revision
// toolgate speaks, with the members of those that have any.
var clientCapabilities = map[string][]string{
	"sampling": {"context", "tools"}, "elicitation": {"form", "url"}, "roots": {"listChanged"},
	"experimental": nil, "tasks": nil, "extensions": nil,
}

// clientCapabilityNames are clientCapabilities' names.
var clientCapabilityNames = slices.Sorted(maps.Keys(clientCapabilities))

// CapabilityVariant says why a client's declared capabilities are refused
// when one of their names, or of their members', is a known one spelled in
// another case ("SAMPLING", "ſampling"): a rule reads the capabilities by
// their exact names, and an upstream whose decoder ignores case would read
// the variant as the capability. It returns "" when there is none.
func CapabilityVariant(caps []byte) string {
	why := ""
	check := func(key string, known []string) bool {
		for _, k := range known {
			if mcpmsg.SameFold(key, k) {
				why = "the client capability " + strconv.Quote(key) + " must be spelled " + strconv.Quote(k)
				return false
			}
		}
		return true
	}
	mcpmsg.Members(caps, func(key, value []byte) {
		if why != "" || !check(string(key), clientCapabilityNames) {
			return
		}
		if members := clientCapabilities[string(key)]; members != nil {
			mcpmsg.Members(value, func(k, _ []byte) {
				if why == "" {
					check(string(k), members)
				}
			})
		}
	})
	return why
}
