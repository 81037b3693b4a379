package gateway

import "github.com/tidwall/gjson"

// FilterTools returns a tools/list result without the tools keep rejects,
// or nil when keep accepts them all. The tools kept, and everything else in
// the result (nextCursor, _meta, unknown fields), pass through byte for byte.
func FilterTools(result []byte, keep func(tool gjson.Result) bool) []byte {
	tools := gjson.GetBytes(result, "tools")
	if !tools.IsArray() || tools.Index == 0 {
		return nil
	}
	kept := make([]byte, 0, len(tools.Raw))
	kept = append(kept, '[')
	removed := false
	tools.ForEach(func(_, tool gjson.Result) bool {
		if !keep(tool) {
			removed = true
			return true
		}
		if len(kept) > 1 {
			kept = append(kept, ',')
		}
		kept = append(kept, tool.Raw...)
		return true
	})
	if !removed {
		return nil
	}
	kept = append(kept, ']')
	out := make([]byte, 0, len(result)-len(tools.Raw)+len(kept))
	out = append(out, result[:tools.Index]...)
	out = append(out, kept...)
	return append(out, result[tools.Index+len(tools.Raw):]...)
}
