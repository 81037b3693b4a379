package mcp2026

import (
	"strconv"

	"github.com/tidwall/gjson"
)

// MaxListenSubscriptions bounds the distinct resources one
// subscriptions/listen names: the policy decides each as a
// resources/subscribe, and toolgate subscribes an upstream of an earlier
// revision to each with a request of its own.
const MaxListenSubscriptions = 64

// ListenSubscriptions are the distinct resource URIs the filter of a
// subscriptions/listen names (params.notifications.resourceSubscriptions),
// in their first order. A filter that is not an object, a list that is not
// an array of strings, or more than MaxListenSubscriptions distinct URIs
// is refused: what the policy decides resource by resource must be what
// the upstream is asked for.
func ListenSubscriptions(params []byte) ([]string, *Refusal) {
	filter := gjson.GetBytes(params, "notifications")
	if !filter.Exists() {
		return nil, nil
	}
	if !filter.IsObject() {
		return nil, invalidParams("params.notifications of subscriptions/listen must be an object")
	}
	list := filter.Get("resourceSubscriptions")
	if !list.Exists() {
		return nil, nil
	}
	if !list.IsArray() {
		return nil, invalidParams("params.notifications.resourceSubscriptions must be an array of resource URIs")
	}
	var uris []string
	seen := map[string]bool{}
	var bad *Refusal
	list.ForEach(func(_, u gjson.Result) bool {
		if u.Type != gjson.String {
			bad = invalidParams("params.notifications.resourceSubscriptions must be an array of resource URIs (strings)")
			return false
		}
		if seen[u.Str] {
			return true
		}
		if len(uris) == MaxListenSubscriptions {
			bad = invalidParams("subscriptions/listen names more than " + strconv.Itoa(MaxListenSubscriptions) +
				" resources; toolgate takes at most " + strconv.Itoa(MaxListenSubscriptions) + " per listen: open another for the rest")
			return false
		}
		seen[u.Str] = true
		uris = append(uris, u.Str)
		return true
	})
	if bad != nil {
		return nil, bad
	}
	return uris, nil
}
