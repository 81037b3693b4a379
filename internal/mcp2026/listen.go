package mcp2026

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// MaxListenSubscriptions bounds the distinct resources one
// subscriptions/listen names: the policy decides each as a
// resources/subscribe, and toolgate subscribes an upstream of an earlier
// revision to each with a request of its own.
const MaxListenSubscriptions = 64

// The members of a subscriptions/listen's filter (SubscriptionFilter).
var listenFilterMembers = []string{"toolsListChanged", "promptsListChanged", "resourcesListChanged", "resourceSubscriptions"}

// ListenSubscriptions are the distinct resource URIs the filter of a
// subscriptions/listen names (params.notifications.resourceSubscriptions),
// in their first order. What the policy decides resource by resource must
// be what the upstream is asked for, so a filter is refused when another
// reading could find other resources in it: a filter that is not an
// object, a list that is not an array of strings, more than
// MaxListenSubscriptions distinct URIs, or a member spelled in another
// case ("ResourceSubscriptions", "Notifications", or with a long s, "ſ"),
// which a parser that matches keys regardless of case (encoding/json
// decoding into a struct) would read as the member.
func ListenSubscriptions(params []byte) ([]string, *Refusal) {
	filter, bad := member(gjson.ParseBytes(params), "notifications", []string{"notifications"}, "params")
	if bad != nil || !filter.Exists() {
		return nil, bad
	}
	if !filter.IsObject() {
		return nil, invalidParams("params.notifications of subscriptions/listen must be an object")
	}
	list, bad := member(filter, "resourceSubscriptions", listenFilterMembers, "params.notifications")
	if bad != nil || !list.Exists() {
		return nil, bad
	}
	if !list.IsArray() {
		return nil, invalidParams("params.notifications.resourceSubscriptions must be an array of resource URIs")
	}
	var uris []string
	seen := map[string]bool{}
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

// member returns the member name of the object obj (at path, for
// messages), refusing any key spelled like one of known in another case.
// Keys are compared decoded (gjson unescapes them).
func member(obj gjson.Result, name string, known []string, path string) (gjson.Result, *Refusal) {
	var found gjson.Result
	var bad *Refusal
	obj.ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		if key == name {
			found = v
			return true
		}
		for _, m := range known {
			if key != m && strings.EqualFold(key, m) {
				bad = invalidParams("the key " + strconv.Quote(key) + " of " + path + " must be spelled " + strconv.Quote(m))
				return false
			}
		}
		return true
	})
	if bad != nil {
		return gjson.Result{}, bad
	}
	return found, nil
}
