package mcp2026

import (
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// paramBinding is one tool argument an upstream asks to be mirrored into a
// header: the property path in the arguments and the header's name part.
type paramBinding struct {
	path   []string
	header string
}

// paramBindings reads the x-mcp-header annotations of a tool definition
// (the JSON text of the tool object), in its inputSchema's properties and
// their nested properties.
func paramBindings(tool []byte) []paramBinding {
	var out []paramBinding
	var walk func(props gjson.Result, prefix []string)
	walk = func(props gjson.Result, prefix []string) {
		props.ForEach(func(name, prop gjson.Result) bool {
			path := append(prefix[:len(prefix):len(prefix)], name.String())
			if h := prop.Get(`x-mcp-header`); h.Type == gjson.String && h.Str != "" {
				out = append(out, paramBinding{path: path, header: h.Str})
			}
			if sub := prop.Get("properties"); sub.IsObject() {
				walk(sub, path)
			}
			return true
		})
	}
	walk(gjson.GetBytes(tool, "inputSchema.properties"), nil)
	return out
}

// argument returns the argument at path, if present and not null.
func argument(args []byte, path []string) (gjson.Result, bool) {
	cur := gjson.ParseBytes(args)
	for _, p := range path {
		if !cur.IsObject() {
			return gjson.Result{}, false
		}
		var found gjson.Result
		ok := false
		cur.ForEach(func(k, v gjson.Result) bool {
			if k.String() == p {
				found, ok = v, true
				return false
			}
			return true
		})
		if !ok {
			return gjson.Result{}, false
		}
		cur = found
	}
	return cur, cur.Type != gjson.Null
}

// primitive is an argument as a header carries it: a string as it is, an
// integer in decimal, a boolean as true or false. ok is false for other
// values, which are not mirrored.
func primitive(v gjson.Result) (string, bool) {
	switch v.Type {
	case gjson.String:
		return v.Str, true
	case gjson.True:
		return "true", true
	case gjson.False:
		return "false", true
	case gjson.Number:
		f := v.Num
		if f != math.Trunc(f) || math.Abs(f) > 1<<53-1 {
			return "", false
		}
		return strconv.FormatInt(int64(f), 10), true
	}
	return "", false
}

// CheckParamHeaders checks the Mcp-Param-* headers of a tools/call against
// its arguments, for the tool definition tool (the upstream's, from
// toolgate's catalog): a mirrored argument present in the body needs its
// header with the same value (decoded, integers compared as numbers), and
// an absent or null one must not have one.
func CheckParamHeaders(h http.Header, tool, args []byte) *Refusal {
	for _, b := range paramBindings(tool) {
		name := HeaderParamPrefix + b.header
		raw, present := headerValue(h, name)
		if !present && len(h.Values(name)) > 1 {
			return mismatch(name + " header sent more than once")
		}
		v, inBody := argument(args, b.path)
		if !inBody {
			if present {
				return mismatch("unexpected " + name + " header for absent or null parameter " + strconv.Quote(strings.Join(b.path, ".")))
			}
			continue
		}
		if !present {
			return mismatch("missing " + name + " header for parameter " + strconv.Quote(strings.Join(b.path, ".")))
		}
		decoded, ok := DecodeHeaderValue(raw)
		if !ok {
			return mismatch(name + " header value is not valid (invalid characters or Base64)")
		}
		want, ok := primitive(v)
		if !ok {
			return mismatch(name + " header present but parameter " + strconv.Quote(strings.Join(b.path, ".")) + " is not a string, integer or boolean")
		}
		if decoded != want && !sameNumber(decoded, v) {
			return mismatch(name + " header value does not match the body value")
		}
	}
	return nil
}

func sameNumber(header string, v gjson.Result) bool {
	if v.Type != gjson.Number {
		return false
	}
	f, err := strconv.ParseFloat(header, 64)
	return err == nil && f == v.Num
}

// ParamHeaders returns the Mcp-Param-* headers for arguments args of the
// tool definition tool, encoded for a header.
func ParamHeaders(tool, args []byte) http.Header {
	var out http.Header
	for _, b := range paramBindings(tool) {
		v, ok := argument(args, b.path)
		if !ok {
			continue
		}
		s, ok := primitive(v)
		if !ok {
			continue
		}
		if out == nil {
			out = http.Header{}
		}
		out.Set(HeaderParamPrefix+b.header, EncodeHeaderValue(s))
	}
	return out
}
