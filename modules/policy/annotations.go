package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
)

// A tool's annotations are hints an upstream gives about its own tools, and
// an upstream can be wrong or lie: one that marks delete_all_tickets
// readOnlyHint: true would otherwise have it run on a read-only service. So
// the policy does not see them raw. input.tool is the upstream's definition
// with its annotations resolved the way MCP defines them and the
// administrator overrides them:
//
//   - readOnlyHint and destructiveHint come from the registry when the
//     service declares the tool (tool <name> read_only|additive|destructive),
//     else from the upstream, else from MCP's defaults: not read-only, and
//     destructive unless read-only (destructiveHint defaults to true and
//     means something only for a tool that is not read-only).
//   - idempotentHint and openWorldHint come from the upstream, else from
//     MCP's defaults (false and true).
//   - A hint that is not the JSON value true or false counts as missing.
//
// annotations_source says where readOnlyHint and destructiveHint came from:
// "registry", "upstream" (the upstream's annotations, with MCP's defaults
// for what they leave out) or "default" (no annotations at all, or no
// definition). upstream_annotations holds the upstream's annotations as it
// sent them, when it sent any.

var (
	keyAnnotations         = ast.StringTerm("annotations")
	keyUpstreamAnnotations = ast.StringTerm("upstream_annotations")
	keyAnnotationsSource   = ast.StringTerm("annotations_source")
	keyReadOnlyHint        = ast.StringTerm("readOnlyHint")
	keyDestructiveHint     = ast.StringTerm("destructiveHint")
	keyIdempotentHint      = ast.StringTerm("idempotentHint")
	keyOpenWorldHint       = ast.StringTerm("openWorldHint")
	keyDigest              = ast.StringTerm("digest")
	keyPinned              = ast.StringTerm("pinned")

	sourceRegistry = ast.StringTerm("registry")
	sourceUpstream = ast.StringTerm("upstream")
	sourceDefault  = ast.StringTerm("default")
)

// toolTerm is the policy's view of a tool of svc: the upstream's definition
// when known (converted once per definition and service), else just its
// name, with its annotations resolved (see above). A definition that
// cannot be read counts as unknown.
func toolTerm(def *gateway.ToolDefinition, name string, svc *gateway.Service) *ast.Term {
	if def != nil {
		if t, _ := def.Memo(svc, func() any {
			raw, err := jsonTerm(def.Raw)
			if err != nil {
				return nil
			}
			obj, ok := raw.Value.(ast.Object)
			if !ok {
				return nil
			}
			return toolView(obj, name, svc, toolpin.Digest(def.Raw))
		}).(*ast.Term); t != nil {
			return t
		}
	}
	return toolView(nil, name, svc, "")
}

// toolView is def (an upstream tool definition, or nil) as the policy sees
// it: every member as the upstream sent it, but annotations resolved and
// annotations_source and upstream_annotations set by toolgate (an upstream
// cannot set them), and, for a definition, its digest (package toolpin)
// and whether the registry pins exactly that digest.
func toolView(def ast.Object, name string, svc *gateway.Service, digest string) *ast.Term {
	var upstream ast.Object
	if def != nil {
		if a := def.Get(keyAnnotations); a != nil {
			upstream, _ = a.Value.(ast.Object)
		}
	}
	hint := func(key *ast.Term, otherwise bool) bool {
		if upstream != nil {
			if v := upstream.Get(key); v != nil {
				if b, ok := v.Value.(ast.Boolean); ok {
					return bool(b)
				}
			}
		}
		return otherwise
	}
	readOnly := hint(keyReadOnlyHint, false)
	destructive := hint(keyDestructiveHint, !readOnly)
	source := sourceDefault
	if upstream != nil {
		source = sourceUpstream
	}
	if svc != nil {
		if effect := svc.ToolEffect(name); effect != "" {
			readOnly = effect == gateway.EffectReadOnly
			destructive = effect == gateway.EffectDestructive
			source = sourceRegistry
		}
	}

	annotations := ast.NewObject()
	if upstream != nil {
		upstream.Foreach(func(k, v *ast.Term) { annotations.Insert(k, v) })
	}
	annotations.Insert(keyReadOnlyHint, ast.InternedTerm(readOnly))
	annotations.Insert(keyDestructiveHint, ast.InternedTerm(destructive))
	annotations.Insert(keyIdempotentHint, ast.InternedTerm(hint(keyIdempotentHint, false)))
	annotations.Insert(keyOpenWorldHint, ast.InternedTerm(hint(keyOpenWorldHint, true)))

	view := ast.NewObject()
	if def != nil {
		def.Foreach(func(k, v *ast.Term) {
			switch {
			case k.Equal(keyAnnotations), k.Equal(keyAnnotationsSource), k.Equal(keyUpstreamAnnotations),
				k.Equal(keyDigest), k.Equal(keyPinned):
			default:
				view.Insert(k, v)
			}
		})
	} else {
		view.Insert(keyName, ast.StringTerm(name))
	}
	view.Insert(keyAnnotations, ast.NewTerm(annotations))
	view.Insert(keyAnnotationsSource, source)
	if upstream != nil {
		view.Insert(keyUpstreamAnnotations, ast.NewTerm(upstream))
	}
	if digest != "" {
		view.Insert(keyDigest, ast.StringTerm(digest))
		view.Insert(keyPinned, ast.InternedTerm(svc != nil && svc.Pin(name) == digest))
	}
	return ast.NewTerm(view)
}
