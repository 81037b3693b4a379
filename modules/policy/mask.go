package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// What the audit log shows of a payload or an input when an operator
// asks for them (log_payloads, log_input): masked first by the site's
// data.toolgate.log.mask, so that what it names never reaches the log.

// maskQuery names the audit-log masking rule: a set of JSON pointers into
// the logged payload.
const maskQuery = "data.toolgate.log.mask"

// maskedPayload returns the payload of an audit entry (the arguments or
// the result, as JSON text) with the values the policy's mask rule names
// replaced by "[masked]". If the mask cannot be evaluated, nothing of the
// payload is logged. Numbers keep their digits (approvers read them).
func (e *engine) maskedPayload(ctx context.Context, input ast.Value, stage string, payload []byte) any {
	var v any
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if len(payload) == 0 || dec.Decode(&v) != nil {
		return nil
	}
	return e.masked(ctx, input, v, "/"+payloadField(stage))
}

// maskedInput returns the policy input as JSON-like values for the audit
// log, with the values the policy's mask rule names (JSON pointers into the
// input) replaced by "[masked]" and the session id by its reference. If
// the mask cannot be evaluated, nothing of the input is logged.
func (e *engine) maskedInput(ctx context.Context, input ast.Value) any {
	v, err := ast.JSON(input)
	if err != nil {
		return "[not logged: the input cannot be written as JSON]"
	}
	if m, ok := v.(map[string]any); ok {
		if s, ok := m["session"].(map[string]any); ok {
			if id, ok := s["id"].(string); ok {
				s["id"] = sessionRef(id)
			}
		}
	}
	return e.masked(ctx, input, v, "")
}

// masked replaces in v the values the mask rule's pointers name, v being
// what the pointers starting with prefix address (the input itself for
// prefix ""), and returns it; the whole of v when a pointer is prefix.
func (e *engine) masked(ctx context.Context, input ast.Value, v any, prefix string) any {
	c := e.current.Load()
	if c == nil || c.mask == nil {
		return v
	}
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	rs, err := c.mask.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return "[not logged: the mask rule failed]"
	}
	for _, r := range rs {
		for _, expr := range r.Expressions {
			set, _ := expr.Value.([]any)
			for _, p := range set {
				ptr, _ := p.(string)
				rest, ok := strings.CutPrefix(ptr, prefix)
				switch {
				case !ok:
				case rest == "":
					return "[masked]"
				case rest[0] == '/':
					v = maskPointer(v, strings.Split(rest[1:], "/"))
				}
			}
		}
	}
	return v
}

// maskPointer replaces the value at the JSON pointer path in v.
func maskPointer(v any, path []string) any {
	if len(path) == 0 {
		return "[masked]"
	}
	key := strings.ReplaceAll(strings.ReplaceAll(path[0], "~1", "/"), "~0", "~")
	switch x := v.(type) {
	case map[string]any:
		if child, ok := x[key]; ok {
			x[key] = maskPointer(child, path[1:])
		}
	case []any:
		if i, err := strconv.Atoi(key); err == nil && i >= 0 && i < len(x) {
			x[i] = maskPointer(x[i], path[1:])
		}
	}
	return v
}
