package policy

import (
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/toolgate/toolgate/modules/gateway"
)

var (
	keyMeta     = ast.StringTerm("_meta")
	keyDecision = ast.StringTerm("toolgate/decision")
	keyAction   = ast.StringTerm("action")
)

// markResult returns the JSON text of the tools/call result res with the
// decision d in _meta["toolgate/decision"], in one slice (see markedResult).
func markResult(raw []byte, res *ast.Term, d *gateway.Decision, spans map[*ast.Term]string) ([]byte, error) {
	out, err := markedResult(raw, res, d, spans)
	return out.Bytes(), err
}

// markedResult returns the JSON text of the tools/call result res with the
// decision d in _meta["toolgate/decision"] (see withDecision). raw, when
// not nil, is the text res was read from (spans its values' texts): a
// result without _meta is then written as raw with the member put first,
// every other byte as the upstream wrote it, in two pieces: the opening
// brace and the member, then raw after its opening brace, not a copy.
func markedResult(raw []byte, res *ast.Term, d *gateway.Decision, spans map[*ast.Term]string) (gateway.Result, error) {
	if obj, ok := res.Value.(ast.Object); ok && raw != nil && obj.Get(keyMeta) == nil {
		open := skipSpace(raw, 0)
		if open < len(raw) && raw[open] == '{' {
			b := make([]byte, 0, open+96)
			b = append(b, raw[:open+1]...)
			b = append(b, `"_meta":{"toolgate/decision":`...)
			b = gateway.AppendDecisionMeta(b, d)
			b = append(b, '}')
			if next := skipSpace(raw, open+1); next < len(raw) && raw[next] != '}' {
				b = append(b, ',')
			}
			return gateway.Result{b, raw[open+1:]}, nil
		}
	}
	out, err := appendJSON(nil, withDecision(res, d), spans)
	if err != nil {
		return nil, err
	}
	return gateway.Result{out}, nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// ownMetaPrefix starts the _meta keys toolgate writes (the decision, an
// approval): an upstream's own are dropped, so that none can pose as
// toolgate's (a "toolgate/approval" sending the person to another page).
const ownMetaPrefix = "toolgate/"

// ownMetaKey reports whether key starts with ownMetaPrefix in any case: a
// runner that matches keys without regard to case would take
// "Toolgate/approval" for toolgate's own.
func ownMetaKey(key string) bool {
	return len(key) >= len(ownMetaPrefix) && strings.EqualFold(key[:len(ownMetaPrefix)], ownMetaPrefix)
}

// withDecision returns the tools/call result res with
// _meta["toolgate/decision"] set to {"id": id, "action": action}, so the
// runner (and whoever reads its transcript) can find the decision in the
// audit log. The rest of _meta and of the result is kept but for the
// upstream's "toolgate/…" keys, which are dropped, and a _meta that is not
// an object, which is replaced. res itself is not changed (its terms are shared with
// the policy input). A result that is not an object is returned as is.
func withDecision(res *ast.Term, d *gateway.Decision) *ast.Term {
	obj, ok := res.Value.(ast.Object)
	if !ok {
		return res
	}
	meta := ast.NewObject()
	if t := obj.Get(keyMeta); t != nil {
		if m, ok := t.Value.(ast.Object); ok {
			m.Foreach(func(k, v *ast.Term) {
				if s, ok := k.Value.(ast.String); !ok || !ownMetaKey(string(s)) {
					meta.Insert(k, v)
				}
			})
		}
	}
	meta.Insert(keyDecision, ast.ObjectTerm(
		ast.Item(keyID, ast.StringTerm(d.ID)),
		ast.Item(keyAction, ast.StringTerm(d.Action)),
	))
	out := ast.NewObject()
	obj.Foreach(func(k, v *ast.Term) {
		if !k.Equal(keyMeta) {
			out.Insert(k, v)
		}
	})
	out.Insert(keyMeta, ast.NewTerm(meta))
	return ast.NewTerm(out)
}
