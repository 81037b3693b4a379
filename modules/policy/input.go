package policy

import (
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Input documents are built straight into OPA's AST from the raw JSON the
// runner sent (already checked by mcpmsg: no duplicate keys, one reading),
// without an intermediate map[string]any.

var (
	keyCaller    = ast.StringTerm("caller")
	keySession   = ast.StringTerm("session")
	keyService   = ast.StringTerm("service")
	keyMethod    = ast.StringTerm("method")
	keyTool      = ast.StringTerm("tool")
	keyArguments = ast.StringTerm("arguments")
	keyParams    = ast.StringTerm("params")
	keyListing   = ast.StringTerm("listing")
	keyRequest   = ast.StringTerm("request")
	keyTime      = ast.StringTerm("time")
	keyResult    = ast.StringTerm("result")
	keyUser      = ast.StringTerm("user")
	keyGroups    = ast.StringTerm("groups")
	keyClaims    = ast.StringTerm("claims")
	keyID        = ast.StringTerm("id")
	keyServices  = ast.StringTerm("services")
	keyAuth      = ast.StringTerm("auth")
	keyTools     = ast.StringTerm("tools")
	keyName      = ast.StringTerm("name")
	keyRemoteIP  = ast.StringTerm("remote_ip")
	keyProtocol  = ast.StringTerm("protocol_version")
	emptyObject  = ast.NewObject()
)

// requestInput builds the request-stage input for call. tool is the tool
// definition for tools/call (nil when unknown); listing marks the
// evaluation of a tool's visibility in tools/list (no arguments then).
func requestInput(call *gateway.Call, tool *ast.Term, listing bool) ast.Object {
	obj := ast.NewObject(
		ast.Item(keyCaller, callerTerm(call.Caller)),
		ast.Item(keySession, sessionTerm(call.Session)),
		ast.Item(keyService, serviceTerm(call.Service)),
		ast.Item(keyListing, ast.InternedTerm(listing)),
		ast.Item(keyRequest, ast.ObjectTerm(
			ast.Item(keyRemoteIP, ast.StringTerm(call.RemoteIP)),
			ast.Item(keyProtocol, ast.StringTerm(call.ProtocolVersion)),
		)),
		ast.Item(keyTime, ast.StringTerm(call.Started.UTC().Format(time.RFC3339))),
	)
	if listing {
		obj.Insert(keyMethod, ast.StringTerm("tools/call"))
		obj.Insert(keyTool, tool)
		return obj
	}
	obj.Insert(keyMethod, ast.StringTerm(call.Method))
	if call.Method == "tools/call" {
		obj.Insert(keyTool, tool)
		// What goes upstream: a rewrite (seen by the result stage) or the
		// runner's own arguments.
		raw := call.Arguments
		if raw == nil {
			raw = call.Message.Arguments
		}
		args := ast.NewTerm(emptyObject)
		if raw != nil {
			args = ast.NewTerm(jsonValue(gjson.ParseBytes(raw)))
		}
		obj.Insert(keyArguments, args)
	} else if call.Message.Params != nil {
		obj.Insert(keyParams, ast.NewTerm(jsonValue(gjson.ParseBytes(call.Message.Params))))
	}
	return obj
}

// toolTerm is the policy's view of a tool: the upstream's definition when
// known, else just its name.
func toolTerm(def *gateway.ToolDefinition, name string) *ast.Term {
	if def == nil {
		return ast.ObjectTerm(ast.Item(keyName, ast.StringTerm(name)))
	}
	return def.Memo(func() any {
		return ast.NewTerm(jsonValue(gjson.ParseBytes(def.Raw)))
	}).(*ast.Term)
}

func callerTerm(c *gateway.Caller) *ast.Term {
	groups := make([]*ast.Term, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = ast.StringTerm(g)
	}
	claims := ast.NewTerm(emptyObject)
	if c.Claims != nil {
		if v, err := ast.InterfaceToValue(c.Claims); err == nil {
			claims = ast.NewTerm(v)
		}
	}
	return ast.ObjectTerm(
		ast.Item(keyUser, ast.StringTerm(c.User)),
		ast.Item(keyGroups, ast.ArrayTerm(groups...)),
		ast.Item(keyClaims, claims),
	)
}

func sessionTerm(s *gateway.Session) *ast.Term {
	services := make([]*ast.Term, len(s.Services))
	for i, id := range s.Services {
		services[i] = ast.StringTerm(id)
	}
	return ast.ObjectTerm(
		ast.Item(keyID, ast.StringTerm(s.ID)),
		ast.Item(keyServices, ast.ArrayTerm(services...)),
	)
}

func serviceTerm(s *gateway.Service) *ast.Term {
	tools := make([]*ast.Term, len(s.Tools))
	for i, t := range s.Tools {
		tools[i] = ast.StringTerm(t)
	}
	return ast.ObjectTerm(
		ast.Item(keyID, ast.StringTerm(s.ID)),
		ast.Item(keyAuth, ast.StringTerm(s.Auth.Kind)),
		ast.Item(keyTools, ast.ArrayTerm(tools...)),
	)
}

// jsonValue converts parsed JSON to an AST value.
func jsonValue(r gjson.Result) ast.Value {
	switch r.Type {
	case gjson.Null:
		return ast.NullValue
	case gjson.False:
		return ast.InternedValue(false)
	case gjson.True:
		return ast.InternedValue(true)
	case gjson.Number:
		return ast.Number(r.Raw)
	case gjson.String:
		return ast.String(r.Str)
	}
	if r.IsArray() {
		var terms []*ast.Term
		r.ForEach(func(_, v gjson.Result) bool {
			terms = append(terms, ast.NewTerm(jsonValue(v)))
			return true
		})
		return ast.NewArray(terms...)
	}
	obj := ast.NewObject()
	r.ForEach(func(k, v gjson.Result) bool {
		obj.Insert(ast.StringTerm(k.Str), ast.NewTerm(jsonValue(v)))
		return true
	})
	return obj
}
