package caddyfile_test

// Golden Caddyfile adapt tests, in the manner of Caddy's
// caddytest/integration/caddyfile_adapt: each testdata/adapt/*.caddyfiletest
// holds a Caddyfile, a line of ten dashes, and what adapting it gives —
// either the JSON config, or a line "error: <text>" for a Caddyfile that must
// fail to adapt with an error containing <text>.
//
// After an intended change, rewrite the expectations and review the diff:
//
//	go test ./caddyfile/ -run TestAdapt -update

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/toolgate/toolgate"
)

var update = flag.Bool("update", false, "rewrite the expected output of the golden adapt tests")

const separator = "----------"

// adapt runs the caddyfile adapter and returns the config indented with tabs.
func adapt(t *testing.T, filename string, caddyfile []byte) (string, []caddyconfig.Warning, error) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("the caddyfile adapter is not registered")
	}
	out, warnings, err := adapter.Adapt(caddyfile, map[string]any{"filename": filename})
	if err != nil {
		return "", warnings, err
	}
	return indent(t, out), warnings, nil
}

func indent(t *testing.T, js []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(js), "", "\t"); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, js)
	}
	return buf.String()
}

// normalize re-indents JSON so that expectations may be written with any
// layout; other text is trimmed.
func normalize(t *testing.T, s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") {
		return indent(t, []byte(s))
	}
	return s
}

func TestAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "adapt", "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata/adapt/*.caddyfiletest files")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddyfiletest"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, expected, ok := strings.Cut(string(data), "\n"+separator+"\n")
			if !ok {
				t.Fatalf("%s: no %q line between the Caddyfile and the expectation", file, separator)
			}
			got, warnings, err := adapt(t, file, []byte(caddyfile+"\n"))
			for _, w := range warnings {
				t.Logf("warning: %s:%d: %s: %s", file, w.Line, w.Directive, w.Message)
			}
			result := got
			if err != nil {
				result = "error: " + err.Error()
			}

			if *update {
				if err := os.WriteFile(file, []byte(caddyfile+"\n"+separator+"\n"+result+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}

			want := normalize(t, expected)
			if wantErr, isErr := strings.CutPrefix(want, "error: "); isErr {
				if err == nil {
					t.Fatalf("adapted, but an error containing %q was expected:\n%s", wantErr, got)
				}
				if !strings.Contains(err.Error(), wantErr) {
					t.Fatalf("error %q\ndoes not contain %q", err, wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			if got != want {
				t.Errorf("adapted config differs (run with -update to accept):\n%s", diff(want, got))
			}
		})
	}
}

// The quick-start Caddyfile is adapted from where it lives, so the golden
// JSON follows the real file.
func TestAdaptDemo(t *testing.T) {
	src := "demo.Caddyfile"
	golden := filepath.Join("testdata", "adapt", "demo.json")
	caddyfile, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	got, warnings, err := adapt(t, src, caddyfile)
	if err != nil {
		t.Fatalf("adapting %s: %v", src, err)
	}
	// The demo is aligned by hand, which `caddy fmt` undoes, so Caddy warns
	// that it is not formatted when it starts. Shown, not failed, until the
	// file is reformatted.
	for _, w := range warnings {
		t.Logf("warning: %s:%d: %s: %s", src, w.Line, w.Directive, w.Message)
	}
	if *update {
		if err := os.WriteFile(golden, []byte(got+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if w := normalize(t, string(want)); got != w {
		t.Errorf("%s adapts differently from %s (run with -update to accept):\n%s", src, golden, diff(w, got))
	}

	// What the demo must keep, whatever else changes in it: the six steps
	// in pipeline order, a real cipher (there is no plaintext storage), and
	// plain-http upstreams only with an explicit allow_http.
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
				} `json:"servers"`
			} `json:"http"`
			Toolgate struct {
				Cipher   map[string]any `json:"cipher"`
				Services []struct {
					ID        string `json:"id"`
					URL       string `json:"url"`
					AllowHTTP bool   `json:"allow_http"`
				} `json:"services"`
			} `json:"toolgate"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(got), &cfg); err != nil {
		t.Fatal(err)
	}
	tg := cfg.Apps.Toolgate
	if tg.Cipher["cipher"] == nil {
		t.Errorf("demo has no cipher: %v", tg.Cipher)
	}
	if len(tg.Services) == 0 {
		t.Error("demo defines no service")
	}
	for _, s := range tg.Services {
		if strings.HasPrefix(s.URL, "http:") && !s.AllowHTTP {
			t.Errorf("demo service %s is plain http without allow_http", s.ID)
		}
	}
	// Its API keys and secrets are public: it must be reachable from this
	// machine only. A site address names a host but binds every interface
	// unless told otherwise.
	if len(cfg.Apps.HTTP.Servers) == 0 {
		t.Error("demo has no HTTP server")
	}
	for name, srv := range cfg.Apps.HTTP.Servers {
		if len(srv.Listen) == 0 {
			t.Errorf("demo server %s has no listen address", name)
		}
		for _, addr := range srv.Listen {
			if !strings.HasPrefix(strings.TrimPrefix(addr, "tcp/"), "127.0.0.1:") {
				t.Errorf("demo server %s listens on %q, want loopback only", name, addr)
			}
		}
	}
	order := []string{"toolgate_session", "toolgate_registry", "toolgate_policy", "toolgate_credentials", "toolgate_result_policy", "toolgate_proxy"}
	last := -1
	for _, name := range order {
		i := strings.Index(got, `"handler": "`+name+`"`)
		if i < 0 || i < last {
			t.Errorf("handler %s missing or out of pipeline order", name)
		}
		last = i
	}
}

// diff shows the first differing line with some context.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			from := max(0, i-3)
			var b strings.Builder
			for j := from; j < i; j++ {
				b.WriteString("  " + w[j] + "\n")
			}
			b.WriteString("- " + wl + "\n+ " + gl + "\n")
			return b.String()
		}
	}
	return ""
}

// The README's "Running several replicas" shows a replica's and the load
// balancer's Caddyfile; testdata/adapt/replica and balancer adapt them, so
// they must stay what the README shows.
func TestReadmeReplicaCaddyfiles(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Running several replicas\n")
	if !ok {
		t.Fatal(`the README has no section "Running several replicas"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for rest := section; ; {
		var block string
		if _, rest, ok = strings.Cut(rest, "```caddyfile\n"); !ok {
			break
		}
		block, rest, _ = strings.Cut(rest, "```")
		blocks = append(blocks, block)
	}
	for i, name := range []string{"replica", "balancer"} {
		data, err := os.ReadFile(filepath.Join("testdata", "adapt", name+".caddyfiletest"))
		if err != nil {
			t.Fatal(err)
		}
		caddyfile, _, _ := strings.Cut(string(data), "\n"+separator+"\n")
		_, caddyfile, _ = strings.Cut(caddyfile, "\n") // the comment line naming the README
		if i >= len(blocks) || strings.TrimSpace(blocks[i]) != strings.TrimSpace(caddyfile) {
			t.Errorf("testdata/adapt/%s.caddyfiletest is not the README's Caddyfile number %d of the section", name, i+1)
		}
	}
}
