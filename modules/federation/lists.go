package federation

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// listing is how one list method is merged: the result's array, the
// members of each item that get the service's prefix, and the capability
// a service declares when it has such items.
type listing struct {
	items      string
	prefixed   []string
	capability string
}

var listings = map[string]listing{
	"tools/list":               {items: "tools", prefixed: []string{"name"}, capability: "tools"},
	"prompts/list":             {items: "prompts", prefixed: []string{"name"}, capability: "prompts"},
	"resources/list":           {items: "resources", prefixed: []string{"uri", "name"}, capability: "resources"},
	"resources/templates/list": {items: "resourceTemplates", prefixed: []string{"uriTemplate", "name"}, capability: "resources"},
}

// maxPages bounds the pages read of one service's list.
const maxPages = 50

// unavailableMeta is the _meta member naming the services missing from a
// merged list.
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
			x.h.logger.Warn("a service is missing from a federated list", zap.String("service", g.Service),
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
// that does not offer the capability has no items.
func (x *exchange) listOne(svc *gateway.Service, l listing) ([][]byte, *gap) {
	c, g := x.childSession(x.r.Context(), svc)
	if g != nil {
		return nil, g
	}
	if !c.capabilities.Get(l.capability).Exists() {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(x.r.Context(), time.Duration(svc.Timeout))
	defer cancel()
	var out [][]byte
	var cursor string
	for range maxPages {
		body := []byte(`{"jsonrpc":"2.0","id":"toolgate-federation-list","method":`)
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
			return nil, unreachable(svc.ID, errSessionGone)
		}
		msg, g := a.response(svc.ID)
		if g != nil {
			return nil, g
		}
		res := gjson.ParseBytes(msg.Result)
		res.Get(l.items).ForEach(func(_, item gjson.Result) bool {
			out = append(out, x.prefix(svc, []byte(item.Raw), l.prefixed))
			return true
		})
		next := res.Get("nextCursor")
		if next.Type != gjson.String || next.Str == "" {
			break
		}
		cursor = next.Raw
	}
	return out, nil
}

// prefix puts svc's prefix before the string members of obj.
func (x *exchange) prefix(svc *gateway.Service, obj []byte, members []string) []byte {
	for _, m := range members {
		if v := gjson.GetBytes(obj, m); v.Type == gjson.String {
			obj = mcpmsg.ReplaceMember(obj, m, mcpmsg.Quote(svc.ID+x.h.Separator+v.Str))
		}
	}
	return obj
}
