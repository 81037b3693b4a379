package toolpin

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/mcpmsg"
)

// pinnedMembers are the members of a tool definition a pin covers: what
// the model reads and what decides how the tool is called and trusted.
// Anything else (icons, _meta, execution hints) may change freely.
var pinnedMembers = []string{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}

// Digest is the digest of a tool definition (the JSON text of one entry of
// a tools/list result): "sha256:" and the hex SHA-256 of its pinned
// members, re-encoded canonically (object keys sorted, no insignificant
// space), so that spelling the same definition differently (key order,
// escapes, spacing) keeps its digest. A member named like a pinned one in
// another case ("Title") counts too, under its own name: runners that
// decode JSON without regard to case (Go's encoding/json) read it as the
// pinned member, so adding one is a change of the definition.
func Digest(raw []byte) string {
	b := make([]byte, 0, len(raw)+2)
	b = append(b, '{')
	gjson.ParseBytes(raw).ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		if !pinned(key) {
			return true
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = mcpmsg.AppendQuote(b, key)
		b = append(b, ':')
		b = append(b, v.Raw...)
		return true
	})
	b = append(b, '}')
	sum := sha256.Sum256(approval.Canonical(b))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// pinned reports whether a member of a tool definition is pinned: one of
// pinnedMembers, in any case.
func pinned(key string) bool {
	for _, m := range pinnedMembers {
		if key == m || mcpmsg.SameFold(key, m) {
			return true
		}
	}
	return false
}

// digests remembers the digests of definitions seen, by their text, so
// that a call does not pay for re-encoding its tool's definition. It holds
// at most maxDigests definitions and maxDigestBytes of their text (an
// upstream whose large tool differs a little on each listing, in a member
// the pin ignores, would otherwise have it keep each version), and starts
// over when either is reached.
type digests struct {
	mu    sync.Mutex
	m     map[string]string
	bytes int
}

const (
	maxDigests     = 10_000
	maxDigestBytes = 16 << 20
)

func (d *digests) of(raw []byte) string {
	d.mu.Lock()
	v, ok := d.m[string(raw)]
	d.mu.Unlock()
	if ok {
		return v
	}
	v = Digest(raw)
	size := len(raw) + len(v)
	if size > maxDigestBytes/16 {
		return v // worth no room: its digest costs little beside its listing
	}
	d.mu.Lock()
	if d.m == nil || len(d.m) >= maxDigests || d.bytes+size > maxDigestBytes {
		d.m, d.bytes = make(map[string]string), 0
	}
	d.bytes += size
	d.m[string(raw)] = v
	d.mu.Unlock()
	return v
}
