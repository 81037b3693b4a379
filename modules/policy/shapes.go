package policy

import (
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Where a payload holds MCP content blocks, by its shape: what the scan
// and the policy read as text, and what as binary data or base64.

// A shape says where a payload holds MCP content blocks: the base64 data
// of their images and audio is binary, not text, so it is not inspected,
// and the blob of an embedded resource is inspected decoded (by the
// policy; the scan checks that it can be). The policy has the same table
// (result.rego's block_paths and blob_strings).
type shape uint8

const (
	shapePlain            shape = iota // no content blocks: every string is text
	shapeOtherResult                   // a result of another method: no content blocks, unless input_required
	shapeToolResult                    // CallToolResult: content[i]
	shapePromptMessages                // GetPromptResult: messages[i].content
	shapeSamplingMessages              // sampling/createMessage params: messages[i].content, or its items (see leafBy)
	shapeResourceContents              // ReadResourceResult: contents[i], whose blob is base64
	// shapeInputRequests: a result of the stateless revision (2026-07-28)
	// whose resultType is input_required, of any method. It asks the
	// runner things, as server→client requests do in earlier revisions:
	// its sampling/createMessage input requests have messages with blocks
	// (inputRequests.<key>.params.messages[i].content, or its items).
	shapeInputRequests
)

// shapeOf is the shape of what the channel carries for method, unless it
// is input_required (see shapeInputRequests).
func shapeOf(channel, method string) shape {
	switch {
	case channel == channelResult && method == "tools/call":
		return shapeToolResult
	case channel == channelResult && method == "prompts/get":
		return shapePromptMessages
	case channel == channelResult && method == "resources/read":
		return shapeResourceContents
	case channel == channelResult:
		return shapeOtherResult
	case channel == gateway.ChannelServerRequest && method == "sampling/createMessage":
		return shapeSamplingMessages
	}
	return shapePlain
}

// result reports whether the shape is of a result, which may be
// input_required.
func (sh shape) result() bool {
	switch sh {
	case shapeOtherResult, shapeToolResult, shapePromptMessages, shapeResourceContents:
		return true
	}
	return false
}

type leafKind uint8

const (
	notLeaf      leafKind = iota
	leafData              // <block>.data: binary in an image or audio block
	leafBlob              // <block>.resource.blob: base64 in a resource block
	leafContents          // contents[i].blob: base64 in resource contents
)

// leaf says whether path may be a block's binary data or blob, the length
// of the block's path and, for a block of a sampling message's tool_result
// block (whose content is an array of blocks), the length of that
// tool_result block's path (else 0). Whether the blocks have the types
// that make it so is read once the payload is (see resultTerms).
func (sh shape) leaf(path []pathStep) (leafKind, int, int) { return sh.leafBy(path, isKey) }

// leafBy is leaf with the members of path compared to MCP's by isKey.
func (sh shape) leafBy(path []pathStep, isKey func(pathStep, *ast.Term) bool) (leafKind, int, int) {
	var blocks []int // the lengths a block's path may have
	switch sh {
	case shapeToolResult:
		if len(path) >= 2 && isKey(path[0], keyContent) && path[1].key == nil {
			blocks = []int{2}
		}
	case shapePromptMessages, shapeSamplingMessages:
		if len(path) >= 3 && isKey(path[0], keyMessages) && path[1].key == nil && isKey(path[2], keyContent) {
			blocks = []int{3}
			if sh == shapeSamplingMessages && len(path) >= 4 && path[3].key == nil {
				blocks = []int{4}
			}
		}
	case shapeResourceContents:
		if len(path) == 3 && isKey(path[0], keyContents) && path[1].key == nil && isKey(path[2], keyBlob) {
			return leafContents, 2, 0
		}
	case shapeInputRequests:
		if len(path) >= 6 && isKey(path[0], keyInputRequests) && path[1].key != nil && isKey(path[2], keyParams) &&
			isKey(path[3], keyMessages) && path[4].key == nil && isKey(path[5], keyContent) {
			blocks = []int{6}
			if len(path) >= 7 && path[6].key == nil {
				blocks = []int{7}
			}
		}
	}
	outer := 0
	if len(blocks) == 1 && (sh == shapeSamplingMessages || sh == shapeInputRequests) {
		// A sampling message's tool_result block holds blocks of its own
		// (the policy's block_paths of its sampling_blocks).
		if n := blocks[0]; len(path) >= n+2 && isKey(path[n], keyContent) && path[n+1].key == nil {
			blocks, outer = []int{n + 2}, n
		}
	}
	for _, n := range blocks {
		switch {
		case len(path) == n+1 && isKey(path[n], keyData):
			return leafData, n, outer
		case len(path) == n+2 && isKey(path[n], keyResource) && isKey(path[n+1], keyBlob):
			return leafBlob, n, outer
		}
	}
	return notLeaf, 0, 0
}

func isKey(step pathStep, key *ast.Term) bool {
	return step.key != nil && step.key.Value.Compare(key.Value) == 0
}

// isKeyFold is isKey ignoring case, as decoders that match members
// without regard to case (Go's encoding/json) read them.
func isKeyFold(step pathStep, key *ast.Term) bool {
	if step.key == nil {
		return false
	}
	a, ok := step.key.Value.(ast.String)
	return ok && strings.EqualFold(withoutIgnorable(string(a)), string(key.Value.(ast.String)))
}
