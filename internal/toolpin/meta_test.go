package toolpin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// appTool is a tool with an MCP Apps interface; its _meta also carries a
// member a pin leaves free.
const appTool = `{"name":"dashboard","description":"Shows the dashboard.","inputSchema":{"type":"object"},` +
	`"_meta":{"ui":{"resourceUri":"ui://dash/view.html","visibility":["model","app"]},"build":"1"}}`

// A pin covers the interface a host renders for a tool and who may call
// it (_meta.ui, and the flat ui/resourceUri of the extension's drafts),
// in any case; the rest of _meta stays free, and a definition without
// them keeps the digest versions that pinned no _meta gave it.
func TestDigestCoversTheMCPAppsInterface(t *testing.T) {
	base := Digest([]byte(appTool))
	same := []string{
		strings.Replace(appTool, `"build":"1"`, `"build":"2"`, 1),
		strings.Replace(appTool, `,"build":"1"`, ``, 1),
		`{"_meta":{"build":"9","ui":{"visibility":["model","app"],"resourceUri":"ui://dash/view.html"}},"inputSchema":{"type":"object"},"description":"Shows the dashboard.","name":"dashboard"}`,
	}
	for _, raw := range same {
		if d := Digest([]byte(raw)); d != base {
			t.Errorf("%s: digest %s, want %s", raw, d, base)
		}
	}
	other := []string{
		strings.Replace(appTool, "ui://dash/view.html", "ui://dash/collect.html", 1),
		strings.Replace(appTool, `["model","app"]`, `["app"]`, 1),
		strings.Replace(appTool, `"_meta":{"ui":{"resourceUri":"ui://dash/view.html","visibility":["model","app"]},`, `"_meta":{`, 1),
		strings.Replace(appTool, `"build":"1"`, `"ui/resourceUri":"ui://dash/collect.html"`, 1),
		strings.Replace(appTool, `"build":"1"`, `"UI":{"resourceUri":"ui://dash/collect.html"}`, 1),
		strings.Replace(appTool, `"inputSchema":{"type":"object"}`, `"inputSchema":{"type":"object"},"_Meta":{"ui":{"resourceUri":"ui://dash/collect.html"}}`, 1),
	}
	seen := map[string]string{base: "base"}
	for _, raw := range other {
		d := Digest([]byte(raw))
		if prev, dup := seen[d]; dup {
			t.Errorf("%s: digest %s, the same as %s", raw, d, prev)
		}
		seen[d] = raw
	}
	plain := `{"name":"t","description":"Reads.","inputSchema":{"type":"object"},"_meta":{"build":"1"}}`
	for _, raw := range []string{plain, strings.Replace(plain, `{"build":"1"}`, `"ui://x"`, 1), appTool} {
		want := Digest([]byte(raw)) == digestWithoutMeta([]byte(raw))
		if hasUI := strings.Contains(raw, `"ui"`); want == hasUI {
			t.Errorf("%s: the digest with _meta's pinned members equals the one without: %v", raw, want)
		}
	}
}

// A pin recorded by a version that pinned no _meta covers the interface of
// the definition it kept from then on: that definition passes, one whose
// interface was swapped is a change.
func TestPinOfAnEarlierVersionCoversTheKeptDefinitionsInterface(t *testing.T) {
	ctx := context.Background()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	svc := &gateway.Service{ID: "svc"}
	old := Record{Service: "svc", Tool: "dashboard", Digest: digestWithoutMeta([]byte(appTool)),
		Since: time.Now().UTC().Add(-time.Hour), Definition: json.RawMessage(appTool)}
	data, _ := json.Marshal(old)
	if err := storage.Store(ctx, keyOf("svc", "dashboard").storageKey(), data); err != nil {
		t.Fatal(err)
	}
	p := &Pins{store: newStore(storage, time.Minute), audit: zap.NewNop(), logger: zap.NewNop()}
	if v, err := p.Check(ctx, svc, "alice", "dashboard", []byte(appTool)); err != nil || !v.OK {
		t.Fatalf("the kept definition after the upgrade: %+v %v", v, err)
	}
	swapped := strings.Replace(appTool, "ui://dash/view.html", "ui://dash/collect.html", 1)
	v, err := p.CheckCall(ctx, svc, "alice", "dashboard", []byte(swapped), time.Now())
	if err != nil || v.OK || v.Pinned != Digest([]byte(appTool)) || v.Digest != Digest([]byte(swapped)) || v.WithoutMeta {
		t.Fatalf("the interface swapped after the upgrade: %+v %v", v, err)
	}
	rec, err := p.store.get(ctx, "svc", "dashboard")
	if err != nil || rec == nil || rec.Changed == nil || rec.Changed.Digest != v.Digest {
		t.Fatalf("the swap is not recorded as a change: %+v %v", rec, err)
	}
}

// A pin without the definition it was made of (a pin line written for an
// earlier version) cannot say what interface it meant: the definition is
// refused, and the reason says so and names the digest to pin.
func TestPinLineOfAnEarlierVersionNamesTheDigestToPin(t *testing.T) {
	ctx := context.Background()
	legacy := digestWithoutMeta([]byte(appTool))
	svc := &gateway.Service{ID: "svc", Pins: map[string]string{"dashboard": legacy}}
	p := &Pins{store: newStore(&certmagic.FileStorage{Path: t.TempDir()}, time.Minute), audit: zap.NewNop(), logger: zap.NewNop()}
	v, err := p.Check(ctx, svc, "alice", "dashboard", []byte(appTool))
	if err != nil || v.OK || !v.WithoutMeta || !v.Registry {
		t.Fatalf("a pin line of the digest without _meta: %+v %v", v, err)
	}
	reason := v.Reason("svc", "dashboard")
	for _, want := range []string{"without its MCP Apps interface", Digest([]byte(appTool)), legacy, "changes its pin in the service's configuration"} {
		if !strings.Contains(reason, want) {
			t.Errorf("reason %q lacks %q", reason, want)
		}
	}
	plain := `{"name":"t","description":"Reads.","inputSchema":{"type":"object"}}`
	svc.Pins["t"] = Digest([]byte(plain))
	if v, err := p.Check(ctx, svc, "alice", "t", []byte(plain)); err != nil || !v.OK {
		t.Fatalf("a pin line of a tool without an interface: %+v %v", v, err)
	}
}
