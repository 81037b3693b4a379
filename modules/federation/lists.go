package federation

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// listing is how one list method is merged: the result's array, the
// members of each item that get the service's prefix (the first one names
// the item), the capability a service declares when it has such items, and
// the JSON types of the item's members that runners decode (an item of
// another shape would fail the runner's whole merged list).
type listing struct {
	items      string
	prefixed   []string
	capability string
	types      map[string]gjson.Type // gjson.JSON stands for an object
	arrays     []string              // members that must be arrays
}

var listings = map[string]listing{
	"tools/list": {items: "tools", prefixed: []string{"name"}, capability: "tools",
		types: itemTypes("title description", "inputSchema outputSchema annotations _meta execution"), arrays: []string{"icons"}},
	"prompts/list": {items: "prompts", prefixed: []string{"name"}, capability: "prompts",
		types: itemTypes("title description", "_meta"), arrays: []string{"arguments", "icons"}},
	"resources/list": {items: "resources", prefixed: []string{"uri", "name"}, capability: "resources",
		types: itemTypes("title description mimeType", "annotations _meta"), arrays: []string{"icons"}},
	"resources/templates/list": {items: "resourceTemplates", prefixed: []string{"uriTemplate", "name"}, capability: "resources",
		types: itemTypes("title description mimeType", "annotations _meta"), arrays: []string{"icons"}},
}

// itemTypes maps the string and the object members of an item.
func itemTypes(strs, objects string) map[string]gjson.Type {
	types := map[string]gjson.Type{}
	for _, m := range strings.Fields(strs) {
		types[m] = gjson.String
	}
	for _, m := range strings.Fields(objects) {
		types[m] = gjson.JSON
	}
	return types
}

// malformed says what is wrong with a list item, "" when nothing is: it
// must be an object whose prefixed members are strings and whose other
// known members have their types.
func (l listing) malformed(item gjson.Result) string {
	if !item.IsObject() {
		return "an item is not an object"
	}
	for _, m := range l.prefixed {
		if item.Get(m).Type != gjson.String {
			return "an item's " + m + " is not a string"
		}
	}
	for m, want := range l.types {
		if v := item.Get(m); v.Exists() && (v.Type != want || want == gjson.JSON && !v.IsObject()) {
			return "an item's " + m + " has the wrong type"
		}
	}
	for _, m := range l.arrays {
		if v := item.Get(m); v.Exists() && !v.IsArray() {
			return "an item's " + m + " is not an array"
		}
	}
	return ""
}

// maxPages bounds the pages read of one service's list.
const maxPages = 50

// unavailableMeta is the _meta member naming the services missing from a
// merged list, or cut short in it.
const unavailableMeta = "toolgate/unavailable"

// list answers a list method with the items of every service of the
// session, each prefixed with its service, in the session's order. The
// services are asked at once; each item passed the service's own filters
// (allowlist, pins, policy) on the way.
func (x *exchange) list(l listing) {
	if gjson.GetBytes(x.msg.Params, "cursor").Exists() {
		// Everything comes in the first page: there is no second one.
		gateway.WriteRPCError(x.w, http.StatusOK, x.msg.ID, gateway.CodeInvalidParams, "unknown cursor", nil)
		return
	}
	services := x.services()
	items := make([][][]byte, len(services))
	gaps := make([]*gap, len(services))
	var wg sync.WaitGroup
	for i, svc := range services {
		wg.Go(func() { items[i], gaps[i] = x.listOne(svc, l) })
	}
	wg.Wait()

	out := []byte(`{`)
	out = mcpmsg.AppendQuote(out, l.items)
	out = append(out, `:[`...)
	n := 0
	for _, list := range items {
		for _, item := range list {
			if n > 0 {
				out = append(out, ',')
			}
			out = append(out, item...)
			n++
		}
	}
	out = append(out, ']')
	var missing []*gap
	for _, g := range gaps {
		if g != nil {
			missing = append(missing, g)
			x.h.logger.Warn("a service is missing from a federated list, or cut short", zap.String("service", g.Service),
				zap.String("method", x.msg.Method), zap.String("reason", g.Message))
		}
	}
	if missing != nil {
		meta, _ := json.Marshal(map[string]any{unavailableMeta: missing})
		out = append(out, `,"_meta":`...)
		out = append(out, meta...)
	}
	out = append(out, '}')
	gateway.WriteRPC(x.w, http.StatusOK, gateway.RPCResult(x.msg.ID, out))
}

// listOne reads every page of svc's list, each item prefixed; a service
// that does not offer the capability has no items. What a service lists
// is bounded as one of its messages is (max_response_size): a list that
// is longer, has more than maxPages pages or loops (a cursor given twice)
// stops there, an item listed twice is kept once, and a list with an item
// runners could not decode is left out whole — each named in the answer's
// _meta, so that no service can make the merged list fail or grow without
// bound. A service MCP session the pipeline no longer knows (the caller
// connected again, or it expired while idle) is initialized again, once,
// as route does.
func (x *exchange) listOne(svc *gateway.Service, l listing) ([][]byte, *gap) {
	out, g, gone := x.listPages(svc, l)
	if gone {
		out, g, gone = x.listPages(svc, l)
	}
	if gone {
		return nil, unreachable(svc.ID, errSessionGone)
	}
	return out, g
}

// listPages is listOne with one service MCP session; gone reports that
// the pipeline did not know it (it is forgotten, and nothing is listed).
func (x *exchange) listPages(svc *gateway.Service, l listing) (out [][]byte, _ *gap, gone bool) {
	c, g := x.childSession(x.r.Context(), svc)
	if g != nil {
		return nil, g, false
	}
	if !c.capabilities.Get(l.capability).Exists() {
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(x.r.Context(), time.Duration(svc.Timeout))
	defer cancel()
	var cursor string
	cursors := map[string]bool{}
	names := map[string]bool{}
	size, limit := 0, int(x.h.app.MaxResponseBytes)
	for page := 0; ; page++ {
		if page == maxPages {
			return out, listCut(svc.ID, fmt.Sprintf("its list has more than %d pages: the rest is left out", maxPages)), false
		}
		// Each page its own id: lists of one session run at once.
		body := []byte(`{"jsonrpc":"2.0","id":"toolgate-federation-list-` + gateway.NewID() + `","method":`)
		body = mcpmsg.AppendQuote(body, x.msg.Method)
		if cursor != "" {
			body = append(body, `,"params":{"cursor":`...)
			body = append(body, cursor...)
			body = append(body, '}')
		}
		body = append(body, '}')
		a := x.h.subCall(ctx, x.r, x.next, x.call, svc, c.ms, http.MethodPost, body, "application/json")
		if a.status == http.StatusNotFound {
			a.drain()
			x.forget(svc, c.ms)
			return nil, nil, true
		}
		msg, g := a.response(svc.ID)
		if g != nil {
			return nil, g, false
		}
		res := gjson.ParseBytes(msg.Result)
		items := res.Get(l.items)
		if items.Exists() && !items.IsArray() {
			return nil, listCut(svc.ID, "its list is malformed ("+l.items+" is not an array) and is left out"), false
		}
		var bad string
		full := false
		items.ForEach(func(_, item gjson.Result) bool {
			if bad = l.malformed(item); bad != "" {
				return false
			}
			name := item.Get(l.prefixed[0]).Str
			if names[name] {
				return true
			}
			p := x.prefix(svc, []byte(item.Raw), l.prefixed)
			if size+len(p) > limit {
				full = true
				return false
			}
			names[name] = true
			size += len(p)
			out = append(out, p)
			return true
		})
		switch {
		case bad != "":
			return nil, listCut(svc.ID, "its list is malformed ("+bad+") and is left out"), false
		case full:
			return out, listCut(svc.ID, "its list is longer than one message may be (max_response_size): the rest is left out"), false
		}
		next := res.Get("nextCursor")
		if next.Type != gjson.String || next.Str == "" {
			return out, nil, false
		}
		if cursors[next.Raw] {
			return out, listCut(svc.ID, "its list gave a cursor twice: the rest is left out"), false
		}
		cursors[next.Raw] = true
		cursor = next.Raw
	}
}

// listCut is a service whose list is left out, or cut short, and why.
func listCut(service, why string) *gap {
	return &gap{Service: service, Code: gateway.CodeInternalError, Message: why}
}

// prefix puts svc's prefix before the string members of obj (their keys
// in any case).
func (x *exchange) prefix(svc *gateway.Service, obj []byte, members []string) []byte {
	for _, m := range members {
		name, v := mcpmsg.MemberFold(obj, m)
		if s, ok := mcpmsg.String(v); ok {
			obj = mcpmsg.ReplaceMember(obj, name, mcpmsg.Quote(svc.ID+x.h.Separator+s))
		}
	}
	return obj
}
