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
// Of _meta, the members hosts act on are pinned too (pinnedMeta); anything
// else (icons, the rest of _meta, execution hints) may change freely.
var pinnedMembers = []string{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}

// pinnedMeta are the members of a tool's _meta a pin covers: the MCP Apps
// extension's (io.modelcontextprotocol/ui, 2026-01-26) — the interface a
// host renders for the tool and lets call tools (ui.resourceUri), and who
// may call the tool (ui.visibility) — and the flat key of its earlier
// drafts (ui/resourceUri). An upstream that swapped the page after the
// tool was trusted would change what people see and what it may do. (The
// page's address, not its content: that is a resource, read anew and
// decided by the result policy.)
var pinnedMeta = []string{"ui", "ui/resourceUri"}

// Digest is the digest of a tool definition (the JSON text of one entry of
// a tools/list result): "sha256:" and the hex SHA-256 of its pinned
// members, re-encoded canonically (object keys sorted, no insignificant
// space), so that spelling the same definition differently (key order,
// escapes, spacing) keeps its digest. A member named like a pinned one in
// another case ("Title") counts too, under its own name: runners that
// decode JSON without regard to case (Go's encoding/json) read it as the
// pinned member, so adding one is a change of the definition. The pinned
// members of _meta count as a _meta object of their own, present only
// when one of them is, so that the digest of a definition without them is
// what versions that pinned no _meta computed.
func Digest(raw []byte) string { return digestOf(raw, true) }

// digestWithoutMeta is Digest as versions that pinned no member of _meta
// computed it: a pin they recorded is migrated (see store.load).
func digestWithoutMeta(raw []byte) string { return digestOf(raw, false) }

func digestOf(raw []byte, withMeta bool) string {
	b := []byte{'{'}
	gjson.ParseBytes(raw).ForEach(func(k, v gjson.Result) bool {
		key := k.String()
		switch {
		case pinned(key, pinnedMembers):
			b = appendMember(b, key, []byte(v.Raw))
		case withMeta && v.IsObject() && (key == "_meta" || mcpmsg.SameFold(key, "_meta")):
			meta := []byte{'{'}
			v.ForEach(func(k, v gjson.Result) bool {
				if key := k.String(); pinned(key, pinnedMeta) {
					meta = appendMember(meta, key, []byte(v.Raw))
				}
				return true
			})
			if len(meta) > 1 {
				b = appendMember(b, key, append(meta, '}'))
			}
		}
		return true
	})
	sum := sha256.Sum256(approval.Canonical(append(b, '}')))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// appendMember appends "key":v to the members of the object b opens.
func appendMember(b []byte, key string, v []byte) []byte {
	if len(b) > 1 {
		b = append(b, ',')
	}
	b = mcpmsg.AppendQuote(b, key)
	b = append(b, ':')
	return append(b, v...)
}

// pinned reports whether key is one of members, in any case.
func pinned(key string, members []string) bool {
	for _, m := range members {
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
