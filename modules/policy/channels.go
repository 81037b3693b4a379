package policy

import (
	"bytes"
	"context"
	"net/http"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// The result stage decides everything an upstream sends toward a runner,
// each message on its channel (input.channel, see policies/README.md):
//
//   - result: the result of the runner's request — a tools/call result, a
//     task's deferred tool result (tasks/result, decided as the result of
//     the task's tools/call), a tool listing, resource contents, prompt
//     messages, completions, initialize's instructions, …
//   - task: the state of a task — the CreateTaskResult answering a
//     task-augmented tools/call, and what tasks/get and tasks/cancel say;
//   - error: the error object of an error response;
//   - notification and server_request: the params of a notification, or
//     of a server→client request (sampling/createMessage,
//     elicitation/create, …), on the stream of the runner's request or on
//     the standalone stream.
//
// What the runner gets when the policy does not allow a message depends on
// what it can be told (see apply and message). A message with nothing in
// it (no params, {}) is relayed without a decision: there is nothing to
// inspect. A tool result is always decided.

const (
	channelResult = "result"
	channelTask   = "task"
)

var (
	keyChannel = ast.StringTerm("channel")
	keyTask    = ast.StringTerm("task")
	keyDuring  = ast.StringTerm("during")
	keyCode    = ast.StringTerm("code")
	keyMessage = ast.StringTerm("message")

	channelTerms = map[string]*ast.Term{}
)

func init() {
	for _, c := range []string{channelResult, channelTask, gateway.ChannelError, gateway.ChannelNotification, gateway.ChannelServerRequest} {
		channelTerms[c] = ast.StringTerm(c)
	}
}

func channelTerm(c string) *ast.Term { return channelTerms[c] }

// asked is the runner's request as the result stage describes what
// answers it: for the methods that name a task, the task's tools/call.
type asked struct {
	method string        // input.method of the answer: tools/call for tasks/result
	view   *gateway.Call // the call whose request input describes the answer
	task   string        // the task the request names, if any
	// approved is the approval that released the answer being judged
	// again (see [ResultHandler.judgeReleased]).
	approved *approval.Approval
}

// asked describes the runner's request call. A request naming a task
// toolgate did not see created in this MCP session is refused (false),
// since what the task yields could not be decided as its call's result.
func (h *ResultHandler) asked(ctx context.Context, w http.ResponseWriter, call *gateway.Call) (*asked, bool) {
	rq := &asked{method: call.Method, view: call}
	switch call.Method {
	case "tasks/result", "tasks/get", "tasks/cancel":
	default:
		return rq, true
	}
	id := call.Message.TaskID
	var t gateway.Task
	ok := call.MCPSession != nil
	if ok {
		var err error
		if t, ok, err = call.MCPSession.Task(ctx, id); err != nil {
			call.Fail(w, http.StatusServiceUnavailable, gateway.CodeUnavailable, "toolgate's storage is unavailable; try again", gateway.Retryable)
			return nil, false
		}
	}
	if !ok {
		call.Fail(w, http.StatusBadRequest, gateway.CodeInvalidParams, "toolgate knows no task "+quoteText(id)+
			" in this MCP session: it relays "+call.Method+" only for tasks created through it, so that what a task yields is checked like the result of the call that created it", nil)
		return nil, false
	}
	if call.Method == "tasks/result" && !call.Service.AllowsTool(t.Tool) {
		// The tool left the allowlist since the task began: what it
		// yields is not delivered, as its call would not run now.
		call.Fail(w, http.StatusOK, gateway.CodeInvalidParams, "task "+quoteText(id)+" is a call of "+quoteText(t.Tool)+
			", which service "+call.Service.ID+" no longer allows: its result is not delivered", nil)
		return nil, false
	}
	view := *call
	view.Method, view.Message.Name, view.Arguments, view.Tool = "tools/call", t.Tool, t.Arguments, nil
	rq.view, rq.task = &view, id
	if call.Method == "tasks/result" {
		rq.method = "tools/call"
	}
	return rq, true
}

// subject is what one result-stage decision is about.
type subject struct {
	channel string
	method  string        // input.method
	view    *gateway.Call // answers: the call whose request input the input holds
	task    string        // input.task.id, when set
	// during is the runner's request on whose stream a notification or a
	// server→client request came (nil on the standalone stream).
	during *gateway.Call
	// approved: the payload is a withheld answer this approval released,
	// judged again by a policy that changed since; an ask it still covers
	// releases the payload.
	approved *approval.Approval
}

// toolResult: the payload is a CallToolResult.
func (s subject) toolResult() bool { return s.channel == channelResult && s.method == "tools/call" }

// marked: an allowed payload carries the decision in its _meta: a tool
// result, and the task created for a tools/call.
func (s subject) marked() bool {
	return s.method == "tools/call" && (s.channel == channelResult || s.channel == channelTask)
}

// audited is the call as the audit entry names it: the runner's method,
// with the task's tool for a task's answers; the method of a notification
// or server→client request, with the tool of the call it came during.
func (s subject) audited(call *gateway.Call) *gateway.Call {
	if s.view == call {
		return call
	}
	a := *call
	switch {
	case s.view != nil:
		a.Message.Name = s.view.Message.Name
	case s.during == nil || s.during.Method != "tools/call":
		a.Method, a.Message.Name = s.method, ""
	default:
		a.Method = s.method
	}
	return &a
}

// complete finishes the input of a decision made for call from own (the
// channel, the result and the scan). An answer to call itself reuses the
// members its request stage built, while they still describe it.
func (s subject) complete(call *gateway.Call, own ...[2]*ast.Term) (ast.Object, error) {
	v := s.view
	if v == nil {
		items := append(commonItems(call), own...)
		items = append(items, ast.Item(keyListing, ast.InternedTerm(false)), ast.Item(keyMethod, ast.StringTerm(s.method)))
		if d := s.during; d != nil {
			during := [][2]*ast.Term{ast.Item(keyMethod, ast.StringTerm(d.Method))}
			if d.Method == "tools/call" {
				during = append(during, ast.Item(keyTool, ast.StringTerm(d.Message.Name)))
			}
			items = append(items, ast.Item(keyDuring, ast.ObjectTerm(during...)))
		}
		return ast.NewObject(items...), nil
	}
	var items [][2]*ast.Term
	if m := requestMembersOf(call); v == call && m != nil {
		items = append(m.items[:len(m.items):len(m.items)], own...)
	} else {
		var tool *ast.Term
		if v.Method == "tools/call" {
			tool = toolTerm(v.ToolDefinition(), v.Message.Name, v.Service)
		}
		var err error
		if items, err = inputItems(append(commonItems(call), own...), v, tool, false); err != nil {
			return nil, err
		}
	}
	if s.task != "" {
		items = append(items, ast.Item(keyTask, ast.ObjectTerm(ast.Item(keyID, ast.StringTerm(s.task)))))
	}
	input := ast.NewObject(items...)
	if v.Method != s.method {
		input.Insert(keyMethod, ast.StringTerm(s.method)) // tasks/get, tasks/cancel: about the task's tools/call
	}
	return input, nil
}

// result decides the result of the runner's request rq.
func (h *ResultHandler) result(ctx context.Context, call *gateway.Call, rq *asked, result []byte, base string) (gateway.Result, error) {
	s := subject{channel: channelResult, method: rq.method, view: rq.view, task: rq.task, approved: rq.approved}
	switch {
	case call.Method == "tools/call" && call.Message.Task != nil:
		if id := createdTask(result); id != "" {
			// The upstream made a task of the call: what it yields later
			// is decided as this call's result. (An answer that has
			// content too is decided as a tool result, the stricter.)
			if ms := call.MCPSession; ms != nil {
				args := call.Arguments
				if args == nil {
					args = call.Message.Arguments
				}
				ms.TaskCreated(ctx, id, gateway.Task{Tool: call.Message.Name, Arguments: args})
			}
			s.task = id
			if !gjson.GetBytes(result, "content").Exists() {
				s.channel = channelTask
			}
		}
	case call.Method == "tasks/get" || call.Method == "tasks/cancel":
		s.channel = channelTask
	}
	if s.toolResult() {
		return h.toolResult(ctx, call, s, result, base)
	}
	if empty(result) {
		return nil, nil
	}
	var own []byte // a tasks/list cut to this MCP session's tasks
	if call.Method == "tasks/list" {
		if cut, changed := h.ownTasks(ctx, call, result); changed {
			own, result = cut, cut
		}
	}
	v := h.evaluate(ctx, call, s, result)
	call.Decision = v.d
	o := v.o
	switch {
	case o.Action == gateway.ActionAllow && call.Method == "server/discover" && s.channel == channelResult:
		if v.out == nil {
			return h.discoverAsInitialize(ctx, call, result)
		}
		out, err := h.discoverAsInitialize(ctx, call, bytes.Join(v.out, nil))
		if out == nil && err == nil {
			out = v.out
		}
		return out, err
	case o.Action == gateway.ActionAllow:
		if v.out == nil && own != nil {
			return gateway.Whole(own), nil
		}
		return v.out, nil
	case o.Action == gateway.ActionAsk && s.channel == channelResult && call.Method != "initialize":
		if h.approvals == nil {
			data := decisionData(v.d)
			data["approval_required"] = true
			return nil, &gateway.AnswerError{Code: gateway.CodeApprovalRequired, Data: data, Message: "the upstream's answer is withheld pending approval: " +
				o.Reason + " (this gateway cannot take approvals: it has no cipher to keep them; an administrator must configure one)"}
		}
		withheld := result
		if o.Result != nil {
			var err error
			if withheld, err = appendJSON(nil, o.Result, v.spans); err != nil {
				return nil, withheldError(v.d, "the policy's cleaned answer cannot be written as JSON")
			}
		}
		return whole(h.withhold(ctx, call, s, v, withheld, base, false))
	case s.marked():
		// A task-augmented tools/call: answered like a denied call.
		return gateway.Whole(gateway.ToolError("the result was withheld by policy: "+o.Reason, v.d)), nil
	}
	return nil, withheldError(v.d, o.Reason)
}

// ownTasks is a tasks/list result with only the tasks created through
// call's MCP session, and whether any was left out. An upstream lists the
// tasks of its own caller or session, and toolgate may call it for many
// people (with one service-wide credential, or one program's session):
// only toolgate knows whose a task is, as it does for tasks/get.
func (h *ResultHandler) ownTasks(ctx context.Context, call *gateway.Call, result []byte) ([]byte, bool) {
	tasks := gjson.GetBytes(result, "tasks")
	if !tasks.IsArray() {
		return result, false
	}
	out, cut := []byte{'['}, false
	tasks.ForEach(func(_, t gjson.Result) bool {
		if !h.ownTask(ctx, call, t.Get("taskId").String()) {
			cut = true
			return true
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, t.Raw...)
		return true
	})
	if !cut {
		return result, false
	}
	return mcpmsg.ReplaceMember(result, "tasks", append(out, ']')), true
}

// ownTask reports whether the task id was created through call's MCP
// session (false when that cannot be read: what is not known to be the
// runner's is not shown to it).
func (h *ResultHandler) ownTask(ctx context.Context, call *gateway.Call, id string) bool {
	ms := call.MCPSession
	if ms == nil || id == "" {
		return false
	}
	_, mine, err := ms.Task(ctx, id)
	if err != nil {
		h.logger.Warn("cannot read a task of the MCP session; what names it is left out", zap.String("service", call.Service.ID), zap.Error(err))
	}
	return mine
}

// withheldError answers the runner's request when its answer is withheld.
func withheldError(d *gateway.Decision, reason string) error {
	return &gateway.AnswerError{Code: gateway.CodePolicyDenied, Message: "the upstream's answer was withheld by policy: " + reason, Data: decisionData(d)}
}

// message decides an upstream message of the call other than its result:
// the error answering the runner's request rq, or a notification or
// server→client request (rq is nil on the standalone stream). Allowed, it
// goes on, replaced if the policy says so. Otherwise a notification is
// dropped and a server→client request refused (both have their audit
// entry; neither can wait for an approval), and an error is replaced by
// toolgate's own, which says why and names the decision.
func (h *ResultHandler) message(ctx context.Context, call *gateway.Call, rq *asked, msg gateway.UpstreamMessage) ([]byte, bool, error) {
	if empty(msg.Payload) {
		return nil, false, nil
	}
	if msg.Method == "notifications/tasks/status" && !h.ownTask(ctx, call, gjson.GetBytes(msg.Payload, "taskId").String()) {
		// Another session's task (an upstream called for many people, or
		// a program's one session shared): not this runner's to hear of.
		return nil, true, nil
	}
	s := subject{channel: msg.Channel, method: msg.Method}
	switch {
	case msg.Channel == gateway.ChannelError && rq != nil:
		s.method, s.view, s.task = rq.method, rq.view, rq.task
	case msg.Channel == gateway.ChannelError:
		return nil, true, nil // no request to answer: nothing to relay
	case call.IsRequest():
		s.during = call
	}
	v := h.evaluate(ctx, call, s, msg.Payload)
	switch {
	case v.o.Action == gateway.ActionAllow:
		return v.out.Bytes(), false, nil
	case msg.Channel != gateway.ChannelError:
		return nil, true, nil
	}
	call.Decision = v.d
	return gateway.RPCErrorObject(gateway.CodePolicyDenied, "the upstream answered with an error, which was withheld by policy: "+v.o.Reason,
		decisionData(v.d)), false, nil
}

// createdTask is the task id of a CreateTaskResult, "" for any other
// result.
func createdTask(result []byte) string {
	id := gjson.GetBytes(result, "task.taskId")
	if id.Type != gjson.String || id.Str == "" {
		return ""
	}
	return id.Str
}

// errorObject reports whether t is a JSON-RPC error object: an integer
// code and a string message.
func errorObject(t *ast.Term) bool {
	obj, ok := t.Value.(ast.Object)
	if !ok {
		return false
	}
	code, ok := termValue(obj.Get(keyCode)).(ast.Number)
	if _, isInt := code.Int64(); !ok || !isInt {
		return false
	}
	_, ok = stringAt(obj, keyMessage)
	return ok
}

// empty: a payload with nothing in it to inspect (absent, or {}).
func empty(payload []byte) bool {
	p := bytes.TrimSpace(payload)
	return len(p) == 0 || len(p) >= 2 && p[0] == '{' && len(bytes.TrimSpace(p[1:len(p)-1])) == 0
}

// quoteText is s as a JSON string, for a message that names something a
// client sent (at most 64 characters of it).
func quoteText(s string) string {
	if r := []rune(s); len(r) > 64 {
		s = string(r[:64]) + "…"
	}
	return string(mcpmsg.Quote(s))
}
