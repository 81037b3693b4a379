package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// Call is what the pipeline knows about one runner request to
// /v1/mcp/{service}. Each step reads what earlier steps set and adds its own
// part; nothing is parsed twice. It travels in the request context.
type Call struct {
	Started time.Time

	// Set by toolgate_session.
	Caller     *Caller
	Session    *Session    // the toolgate session
	MCPSession *MCPSession // nil until the runner's initialize succeeded
	RemoteIP   string

	// Set by toolgate_registry.
	Service *Service
	Message mcpmsg.Message // for POST; zero for GET and DELETE
	// Method is the JSON-RPC method of Message, or for a runner's response
	// to a server→client request, the method of that request.
	Method string
	// ProtocolVersion is the protocol the runner speaks on this request.
	ProtocolVersion string
	// Stateless is set for a request of the stateless revision
	// (2026-07-28); MCPSession is then the session toolgate implies for
	// the caller, toolgate session, service, declared capabilities and
	// clientInfo, and client address.
	Stateless *Stateless
	// Room is the room held for Message's body under the request byte
	// limits, given back when the request ends. A step that keeps the body
	// beyond its request (a call held between rounds, a stream kept for
	// the runner to resume) takes the room over (RequestBytes.Handover).
	// Nil for a request without a body, or one made inside another whose
	// room covers it (WithOuterRequest).
	Room *RequestBytes

	// RequestJudged and ResultJudged are set by toolgate_policy and
	// toolgate_result_policy when the request reaches them: toolgate_proxy
	// relays nothing (no message, no stream) that did not pass both, as a
	// matcher on either may let a request by them.
	RequestJudged, ResultJudged bool
	// Prepare is what toolgate_registry leaves for toolgate_policy to do
	// before it decides a stateless tools/call: open the implied MCP
	// session, so that the decision sees the tool's definition. That
	// contacts the upstream, so it waits until a policy step has the
	// request: a request a policy's matcher lets by is refused by
	// toolgate_proxy before anything reaches the upstream. Prepare answers
	// the runner and returns false when the call is refused.
	Prepare func(w http.ResponseWriter, r *http.Request) bool

	// Set by toolgate_policy, then by toolgate_result_policy once it has
	// decided the result.
	Decision *Decision
	// ResultDecided is set by toolgate_result_policy when it will decide
	// this call's result, and so mark the result with its own decision
	// (_meta["toolgate/decision"]) instead of the request policy.
	ResultDecided bool
	// TasksOwned is set by toolgate_result_policy, which relays a task's
	// methods only for the tasks created in the call's MCP session and
	// judges what a task yields as its call's result; without it
	// toolgate_proxy relays no task (TaskMethod).
	TasksOwned bool
	// AnswerGeneration is, for a runner's answer to a server→client
	// request, the generation of the upstream session that asked it
	// (MCPSession.Upstream().Generation then; 0 when not known), set by
	// toolgate_registry: toolgate_proxy sends the answer to no other.
	AnswerGeneration uint64
	// AnswerUpstream names that upstream session (MCPSession.Upstream().Ref()
	// then; "" when not known): a later generation of it (a stdio program's
	// bridge keeps its session id through re-initializations, letting the
	// process replaced finish its calls) takes the answer too.
	AnswerUpstream string
	// Tool is the upstream's definition of the called tool, when known;
	// see ToolDefinition.
	Tool *ToolDefinition
	// Arguments, when not nil, replace the runner's tools/call arguments
	// upstream (a policy rewrite).
	Arguments []byte
	// RequestInput is what toolgate_policy built of this call for its
	// decision, which toolgate_result_policy reuses for its decision on
	// the result (a value of package policy). It is nil until the request
	// policy ran, and when it would be of no use there: arguments over a
	// few KiB, or rewritten by the policy.
	RequestInput any

	// Set by toolgate_credentials.
	Credential *Credential

	resultHooks  []ResultHook
	messageHooks []MessageHook
	roundHooks   []RoundHook
	streamHooks  []StreamHook
}

// Decision is the outcome of a policy evaluation.
type Decision struct {
	ID     string // appears in the audit log and in the answer's _meta
	Action string // ActionAllow, ActionDeny or ActionAsk
	Reason string
}

// Policy actions.
const (
	ActionAllow = "allow"
	ActionDeny  = "deny"
	ActionAsk   = "ask"
)

// Credential is what toolgate attaches to upstream requests for a call.
type Credential struct {
	Header string // e.g. "Authorization"
	Value  string // e.g. "Bearer …"; never logged
	// Grant names the per-user connection the credential is of
	// (Connection.Grant); "" for a service-wide one.
	Grant string
	// retired are the tokens the connection sent before Value's
	// (Connection.Retired): secrets as much as Value's.
	retired []RetiredToken
}

// String hides the value.
func (c *Credential) String() string { return c.Header + ": [hidden]" }

// Secret is the part of c's value that must never reach a runner or a
// log, as one string: the token after the scheme of an Authorization or
// Proxy-Authorization value ("Bearer <token>"), else the first of its
// pieces (EachSecret); "" when there is none, or none of MinSecret bytes
// (it would be found in ordinary text).
func (c *Credential) Secret() string {
	s := ""
	if c != nil {
		c.eachSecretOfValue(func(v string) bool { s = v; return false })
	}
	return s
}

// HasSecret reports whether EachSecret has anything to look for.
func (c *Credential) HasSecret() bool {
	found := false
	c.EachSecret(func(string) bool { found = true; return false })
	return found
}

// EachSecret calls f with each part of c that an upstream may quote on
// its own and that must never reach a runner or a log, until f returns
// false: for an Authorization or Proxy-Authorization value, the token
// after its scheme and, for HTTP Basic, the password it encodes (a server
// quoting the credentials it refused decodes them); for any other header,
// each piece of a value of several (cookies, words: split at ';', ','
// and blanks), a cookie's value without its name; then the tokens its
// connection sent before (Connection.Retired). Pieces shorter than
// MinSecret are left out.
func (c *Credential) EachSecret(f func(string) bool) {
	if c == nil || !c.eachSecretOfValue(f) {
		return
	}
	for _, r := range c.retired {
		if token := strings.TrimSpace(r.Token); len(token) >= MinSecret && !f(token) {
			return
		}
	}
}

// eachSecretOfValue is EachSecret for c.Value's own secrets; false when f
// returned false.
func (c *Credential) eachSecretOfValue(f func(string) bool) bool {
	v := strings.TrimSpace(c.Value)
	if strings.EqualFold(c.Header, "Authorization") || strings.EqualFold(c.Header, "Proxy-Authorization") {
		scheme, token, ok := strings.Cut(v, " ")
		if !ok || scheme == "" || strings.ContainsAny(scheme, "\"'") {
			token = v
		}
		token = strings.TrimSpace(token)
		if len(token) < MinSecret {
			return true
		}
		if !f(token) {
			return false
		}
		if strings.EqualFold(scheme, "Basic") {
			if pw := basicPassword(token); len(pw) >= MinSecret {
				return f(pw)
			}
		}
		return true
	}
	for piece := range strings.FieldsFuncSeq(v, func(r rune) bool { return r == ';' || r == ',' || r == ' ' || r == '\t' }) {
		if _, value, ok := strings.Cut(piece, "="); ok && len(value) >= MinSecret {
			piece = value
		}
		if len(piece) >= MinSecret && !f(piece) {
			return false
		}
	}
	return true
}

// basicPassword is the password of an HTTP Basic token (base64 of
// user:password, padded or not); "" when it is not one.
func basicPassword(token string) string {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
		if b, err := enc.DecodeString(token); err == nil {
			if _, pw, ok := strings.Cut(string(b), ":"); ok {
				return pw
			}
			return ""
		}
	}
	return ""
}

// MinSecret is the length of the shortest Secret.
const MinSecret = 8

// CredentialRedaction stands for a call's credential wherever toolgate
// removed it.
const CredentialRedaction = "[REDACTED:credential]"

// GrantName is c's Grant; "" for no credential at all.
func (c *Credential) GrantName() string {
	if c == nil {
		return ""
	}
	return c.Grant
}

// A ResultHook sees the result of a successful upstream response before the
// runner does. It returns the result to send instead, or nil to keep it.
// Hooks run in the order the steps registered them; each sees the result
// as the hooks before it left it, in one slice. A hook does not write into
// result: the pieces it returns may be slices of it, which the proxy knows
// to be the upstream's bytes as it checked them.
type ResultHook func(ctx context.Context, call *Call, result []byte) (Result, error)

// Result is the JSON text of a result a hook sends instead, in pieces
// written one after the other. A hook that adds a few bytes to a large
// result (the decision in its _meta) returns its own bytes and slices of
// the upstream's, which stay as they are: a result of a megabyte is not
// copied into one slice for a member at its start. Pieces are joined only
// for a later hook, which sees one slice.
type Result [][]byte

// Whole is the result text b in one piece, nil when b is nil (keep the
// result).
func Whole(b []byte) Result {
	if b == nil {
		return nil
	}
	return Result{b}
}

// Bytes returns the text in one slice, copied only when it is in pieces
// (nil for a nil Result).
func (r Result) Bytes() []byte {
	switch {
	case r == nil:
		return nil
	case len(r) == 1:
		return r[0]
	}
	return bytes.Join(r, nil)
}

// Len is the length of the text.
func (r Result) Len() int {
	n := 0
	for _, p := range r {
		n += len(p)
	}
	return n
}

// ToolDefinition returns the upstream's definition of the tool a tools/call
// names, from the MCP session's catalog, or nil when toolgate has not seen
// one. It is looked up once per call.
func (c *Call) ToolDefinition() *ToolDefinition {
	if c.Tool == nil && c.MCPSession != nil && c.Method == "tools/call" {
		c.Tool = c.MCPSession.Tool(c.Message.Name)
	}
	return c.Tool
}

// OnResult registers a hook for this call's result.
func (c *Call) OnResult(h ResultHook) { c.resultHooks = append(c.resultHooks, h) }

// RunResultHooks passes result through every registered hook and returns
// what the runner gets, nil when no hook replaced the result.
func (c *Call) RunResultHooks(ctx context.Context, result []byte) (Result, error) {
	var out Result
	for _, h := range c.resultHooks {
		if out != nil {
			result = out.Bytes() // a later hook reads one slice
			out = Result{result}
		}
		replaced, err := h(ctx, c, result)
		if err != nil {
			return nil, err
		}
		if replaced != nil {
			out = replaced
		}
	}
	return out, nil
}

// TaskMethod reports whether the call creates, reads or names a task: a
// tasks/ request, or a request asking for a task (params.task).
func (c *Call) TaskMethod() bool {
	return c.IsRequest() && (strings.HasPrefix(c.Method, "tasks/") || c.Message.Task != nil)
}

// HasResultHooks reports whether any step wants to see the result.
func (c *Call) HasResultHooks() bool { return len(c.resultHooks) > 0 }

// The channels of what an upstream sends toward a runner, besides the
// result of the runner's request.
const (
	// ChannelError: the error object of the upstream's error response to
	// the runner's request.
	ChannelError = "error"
	// ChannelNotification: the params of a notification.
	ChannelNotification = "notification"
	// ChannelServerRequest: the params of a server→client request
	// (sampling/createMessage, elicitation/create, roots/list, …).
	ChannelServerRequest = "server_request"
)

// UpstreamMessage is a message an upstream sends toward the runner other
// than the result of the runner's request.
type UpstreamMessage struct {
	Channel string // ChannelError, ChannelNotification or ChannelServerRequest
	Method  string // the notification's or request's method; "" for an error
	// Payload is the JSON text of the error object, or of the params (nil
	// when the message has none).
	Payload []byte
}

// A MessageHook sees an upstream message that is not the result of the
// runner's request before the runner does. It returns the payload to send
// instead (nil to keep it), or drop: the runner must not get the message
// (a notification is dropped, a server→client request refused, an error
// replaced by toolgate's own).
type MessageHook func(ctx context.Context, call *Call, msg UpstreamMessage) (replaced []byte, drop bool, err error)

// OnMessage registers a hook for the upstream's other messages of this
// call: the error answering it, and the notifications and server→client
// requests on its stream (or, for a GET, on the standalone stream).
func (c *Call) OnMessage(h MessageHook) { c.messageHooks = append(c.messageHooks, h) }

// RunMessageHooks passes msg through every registered hook, in order.
// changed reports whether a hook replaced the payload; drop, that one
// refused the message (the hooks after it do not run).
func (c *Call) RunMessageHooks(ctx context.Context, msg UpstreamMessage) (payload []byte, changed, drop bool, err error) {
	for _, h := range c.messageHooks {
		replaced, drop, err := h(ctx, c, msg)
		if err != nil || drop {
			return nil, false, drop, err
		}
		if replaced != nil {
			msg.Payload, changed = replaced, true
		}
	}
	return msg.Payload, changed, false, nil
}

// HasMessageHooks reports whether any step wants to see the upstream's
// other messages.
func (c *Call) HasMessageHooks() bool { return len(c.messageHooks) > 0 }

// A RoundHook sees a round toolgate sends on the runner's behalf before it
// goes upstream: the request sent again with inputResponses (the runner's
// answers to the upstream's input requests) and the upstream's
// requestState, when toolgate relays a request of a runner of an earlier
// revision to an upstream of the stateless one. It returns why the round
// must not be sent ("" to send it); the runner's request then ends with
// that reason.
type RoundHook func(ctx context.Context, call *Call, inputResponses, requestState []byte) (refused string)

// OnRound registers a hook for the rounds toolgate sends for this call.
func (c *Call) OnRound(h RoundHook) { c.roundHooks = append(c.roundHooks, h) }

// RunRoundHooks passes a round through every registered hook, in order,
// and returns the first refusal ("" when every hook lets it go).
func (c *Call) RunRoundHooks(ctx context.Context, inputResponses, requestState []byte) string {
	for _, h := range c.roundHooks {
		if refused := h(ctx, c, inputResponses, requestState); refused != "" {
			return refused
		}
	}
	return ""
}

// A StreamHook decides the request toolgate sends upstream to serve a
// runner's standalone stream (a GET, which carries no message of its
// own): toward an upstream of the stateless revision, a
// subscriptions/listen with params. It is decided as if the runner had
// sent it; it returns why the request must not be sent ("" to send it).
type StreamHook func(ctx context.Context, call *Call, method string, params []byte) (refused string)

// OnStream registers a hook for the request that serves this call's
// standalone stream.
func (c *Call) OnStream(h StreamHook) { c.streamHooks = append(c.streamHooks, h) }

// RunStreamHooks passes the request that serves the call's standalone
// stream through every registered hook, in order, and returns the first
// refusal ("" when every hook lets it go).
func (c *Call) RunStreamHooks(ctx context.Context, method string, params []byte) string {
	for _, h := range c.streamHooks {
		if refused := h(ctx, c, method, params); refused != "" {
			return refused
		}
	}
	return ""
}

// AnswerError is what a result hook returns to answer the runner's request
// with a JSON-RPC error of its own instead of the upstream's result.
type AnswerError struct {
	Code    int
	Message string
	Data    any
}

func (e *AnswerError) Error() string { return e.Message }

// HookAnswer is the answer to the request id when a hook failed with err:
// the hook's own (an *AnswerError), and true; false for any other error,
// which the caller logs and answers with an error of its own.
func HookAnswer(id []byte, err error) ([]byte, bool) {
	var answer *AnswerError
	if errors.As(err, &answer) {
		return RPCError(id, answer.Code, answer.Message, answer.Data), true
	}
	return nil, false
}

type callKey struct{}

// WithCall returns r carrying call.
func WithCall(r *http.Request, call *Call) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), callKey{}, call))
}

// CallFrom returns the call r carries, or nil when no toolgate_session
// step ran before.
func CallFrom(r *http.Request) *Call {
	c, _ := r.Context().Value(callKey{}).(*Call)
	return c
}

// IsRequest reports whether the runner sent a JSON-RPC request, which is
// answered with a JSON-RPC response (as opposed to a notification, a
// response or a GET/DELETE, which get an HTTP status).
func (c *Call) IsRequest() bool { return c.Message.Kind == mcpmsg.Request }

// Fail answers the call with a JSON-RPC error. A request gets the error as
// its response (HTTP 200, so MCP clients read it); anything else gets the
// error body with the HTTP status given.
func (c *Call) Fail(w http.ResponseWriter, status, code int, message string, data any) {
	if c.IsRequest() {
		WriteRPCError(w, http.StatusOK, c.Message.ID, code, message, data)
		return
	}
	WriteRPCError(w, status, nil, code, message, data)
}

// RefuseUnjudged refuses a request that reached a step answering in the
// upstream's place without passing both policy steps (RequestJudged,
// ResultJudged): a matcher on either let it by. It fails closed, and says
// so in the log, which names the request.
func (c *Call) RefuseUnjudged(w http.ResponseWriter, logger *zap.Logger) {
	logger.Error("refused a request no policy judged: every request must pass toolgate_policy and toolgate_result_policy before toolgate_proxy; check their matchers",
		zap.String("service", c.Service.ID), zap.String("method", c.Method))
	c.Fail(w, http.StatusInternalServerError, CodeInternalError,
		"toolgate's configuration let this request reach the upstream without a policy's judgement, so it was not relayed: an administrator must route it through toolgate_policy and toolgate_result_policy", nil)
}

// ReplyID is the id of an error toolgate writes the runner about the call:
// its request's, none for anything else. A runner's answer to a
// server→client request carries, once read, the id the upstream gave the
// request (toolgate_registry), which no policy reads and the runner never
// had.
func (c *Call) ReplyID() []byte {
	if c.IsRequest() {
		return c.Message.ID
	}
	return nil
}

// Unavailable answers the call with a retryable error.
func (c *Call) Unavailable(w http.ResponseWriter, message string) {
	c.Fail(w, http.StatusServiceUnavailable, CodeUnavailable, message, Retryable)
}
