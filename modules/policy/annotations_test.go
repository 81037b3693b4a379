package policy

import (
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/internal/toolpin"
	"github.com/toolgate/toolgate/modules/gateway"
)

func TestToolAnnotationsAsThePolicySeesThem(t *testing.T) {
	svc := &gateway.Service{ID: "tracker", Tools: []string{"t"}, ToolEffects: map[string]string{}}
	const all = `"idempotentHint":false,"openWorldHint":true`
	for _, tc := range []struct {
		name, def, effect string
		want              string // input.tool
	}{
		{"no definition", ``, "",
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"default"}`},
		{"no annotations", `{"name":"t","description":"d"}`, "",
			`{"name":"t","description":"d","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"default"}`},
		{"read-only: destructiveHint defaults to false", `{"name":"t","annotations":{"readOnlyHint":true,"title":"T"}}`, "",
			`{"name":"t","annotations":{"title":"T","readOnlyHint":true,"destructiveHint":false,` + all + `},"annotations_source":"upstream","upstream_annotations":{"readOnlyHint":true,"title":"T"}}`},
		{"not read-only: destructiveHint defaults to true", `{"name":"t","annotations":{"readOnlyHint":false}}`, "",
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"upstream","upstream_annotations":{"readOnlyHint":false}}`},
		{"additive", `{"name":"t","annotations":{"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}}`, "",
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false},"annotations_source":"upstream",` +
				`"upstream_annotations":{"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}}`},
		{"hints that are not booleans count as missing", `{"name":"t","annotations":{"readOnlyHint":"true","destructiveHint":"false","openWorldHint":0}}`, "",
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"upstream",` +
				`"upstream_annotations":{"readOnlyHint":"true","destructiveHint":"false","openWorldHint":0}}`},
		{"annotations that are not an object", `{"name":"t","annotations":[true]}`, "",
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"default"}`},
		{"the registry beats a lying upstream", `{"name":"t","annotations":{"readOnlyHint":true}}`, gateway.EffectDestructive,
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"registry","upstream_annotations":{"readOnlyHint":true}}`},
		{"the registry declares read-only", `{"name":"t"}`, gateway.EffectReadOnly,
			`{"name":"t","annotations":{"readOnlyHint":true,"destructiveHint":false,` + all + `},"annotations_source":"registry"}`},
		{"the registry declares additive", `{"name":"t","annotations":{"destructiveHint":true}}`, gateway.EffectAdditive,
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":false,` + all + `},"annotations_source":"registry","upstream_annotations":{"destructiveHint":true}}`},
		{"an upstream cannot name the source", `{"name":"t","annotations_source":"registry","upstream_annotations":{"readOnlyHint":true},"annotations":{}}`, "",
			`{"name":"t","annotations":{"readOnlyHint":false,"destructiveHint":true,` + all + `},"annotations_source":"upstream","upstream_annotations":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(svc.ToolEffects)
			if tc.effect != "" {
				svc.ToolEffects["t"] = tc.effect
			}
			var def *gateway.ToolDefinition
			if tc.def != "" {
				def = &gateway.ToolDefinition{Name: "t", Raw: []byte(tc.def)}
			}
			got := toolTerm(def, "t", svc)
			// Every definition has its digest (see TestToolDigestAndPin).
			if obj := got.Value.(ast.Object); def != nil {
				if d := obj.Get(keyDigest); d == nil || !d.Equal(ast.StringTerm(toolpin.Digest(def.Raw))) {
					t.Errorf("digest = %v", d)
				}
				rest := ast.NewObject()
				obj.Foreach(func(k, v *ast.Term) {
					if !k.Equal(keyDigest) && !k.Equal(keyPinned) {
						rest.Insert(k, v)
					}
				})
				got = ast.NewTerm(rest)
			}
			if want := ast.MustParseTerm(tc.want); !got.Equal(want) {
				t.Errorf("tool\n got %v\nwant %v", got, want)
			}
		})
	}
}

// The policy sees a definition's digest, and whether the registry pins
// exactly that digest; an upstream can set neither.
func TestToolDigestAndPin(t *testing.T) {
	raw := []byte(`{"name":"t","description":"Reads.","digest":"sha256:0","pinned":true}`)
	digest := toolpin.Digest(raw)
	for _, tc := range []struct {
		name   string
		pins   map[string]string
		pinned bool
	}{
		{"not pinned", nil, false},
		{"pinned to this digest", map[string]string{"t": digest}, true},
		{"pinned to another digest", map[string]string{"t": "sha256:" + strings.Repeat("0", 64)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &gateway.Service{ID: "s", Tools: []string{"t"}, Pins: tc.pins}
			obj := toolTerm(&gateway.ToolDefinition{Name: "t", Raw: raw}, "t", svc).Value.(ast.Object)
			if d := obj.Get(keyDigest); d == nil || !d.Equal(ast.StringTerm(digest)) {
				t.Errorf("digest = %v, want %s", d, digest)
			}
			if p := obj.Get(keyPinned); p == nil || !p.Equal(ast.InternedTerm(tc.pinned)) {
				t.Errorf("pinned = %v, want %v", p, tc.pinned)
			}
		})
	}
	if obj := toolTerm(nil, "t", &gateway.Service{ID: "s"}).Value.(ast.Object); obj.Get(keyDigest) != nil || obj.Get(keyPinned) != nil {
		t.Errorf("a tool without a definition: %v", obj)
	}
}

// The view of a definition is kept per service: after a config reload
// declares the tool, the next call sees the declaration.
func TestToolViewFollowsTheRegistry(t *testing.T) {
	def := &gateway.ToolDefinition{Name: "t", Raw: []byte(`{"name":"t","annotations":{"readOnlyHint":true}}`)}
	before := &gateway.Service{ID: "s", Tools: []string{"t"}}
	after := &gateway.Service{ID: "s", Tools: []string{"t"}, ToolEffects: map[string]string{"t": gateway.EffectDestructive}}
	source := func(svc *gateway.Service) string {
		return string(toolTerm(def, "t", svc).Value.(ast.Object).Get(keyAnnotationsSource).Value.(ast.String))
	}
	if got := source(before); got != "upstream" {
		t.Fatalf("before the reload: %s", got)
	}
	if a, b := toolTerm(def, "t", before), toolTerm(def, "t", before); a != b {
		t.Error("the view is built again for the same service")
	}
	if got := source(after); got != "registry" {
		t.Errorf("after the reload: %s, want registry", got)
	}
}
