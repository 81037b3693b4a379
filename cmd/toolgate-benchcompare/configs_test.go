package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"
)

// The benchmark's policies are the default ones: every non-test .rego file
// of policies/ byte for byte, and a site/data.json that sets only
// max_result_bytes for the benchmark's services.
func TestPreparePolicies(t *testing.T) {
	src := filepath.Join("..", "..", "policies")
	dst := t.TempDir()
	if err := preparePolicies(src, dst, []string{"sse", "json"}, 2<<20); err != nil {
		t.Fatal(err)
	}
	shipped, _ := filepath.Glob(filepath.Join(src, "*.rego"))
	var want []string
	for _, p := range shipped {
		if !strings.HasSuffix(p, "_test.rego") {
			want = append(want, filepath.Base(p))
		}
	}
	entries, _ := os.ReadDir(dst)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if all := slices.Sorted(slices.Values(append(slices.Clone(want), "site"))); !slices.Equal(names, all) || len(want) < 2 {
		t.Fatalf("copied %q, want %q", names, all)
	}
	for _, name := range want {
		a, _ := os.ReadFile(filepath.Join(src, name))
		b, _ := os.ReadFile(filepath.Join(dst, name))
		if string(a) != string(b) {
			t.Errorf("%s differs from the default", name)
		}
	}
	var got struct {
		Toolgate map[string]struct {
			Services map[string]map[string]any
		}
	}
	raw, _ := os.ReadFile(filepath.Join(dst, "site", "data.json"))
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Toolgate) != 1 || len(got.Toolgate["settings"].Services) != 2 {
		t.Fatalf("site/data.json holds more than the services' max_result_bytes: %s", raw)
	}
	for _, id := range []string{"sse", "json"} {
		svc := got.Toolgate["settings"].Services[id]
		if svc["max_result_bytes"] != float64(2<<20) || len(svc) != 1 {
			t.Errorf("service %s: %v", id, svc)
		}
	}
}

func TestWithMaxResultBytesKeepsServiceSettings(t *testing.T) {
	out, err := withMaxResultBytes([]byte(`{"toolgate":{"settings":{"services":{"sse":{"read_only":true}}}}}`), []string{"sse"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Toolgate struct {
			Settings struct {
				Services map[string]map[string]any
			}
		}
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if svc := doc.Toolgate.Settings.Services["sse"]; svc["read_only"] != true || svc["max_result_bytes"] != float64(10) {
		t.Fatalf("service sse: %v", svc)
	}
	for _, bad := range []string{`{"toolgate":{"settings":[]}}`, `{"toolgate":{"settings":{"services":{"sse":1}}}}`, `[`} {
		if _, err := withMaxResultBytes([]byte(bad), []string{"sse"}, 10); err == nil {
			t.Errorf("no error for %s", bad)
		}
	}
}

func TestCaddyfiles(t *testing.T) {
	cfg := proxyConfig{Port: 8000, AdminPort: 8001, Dir: "/data", APIKeyHash: apiKeyHash("k"), Caller: "c@example.test",
		Policies: "/data/policies", MaxSessions: 11000,
		Upstreams: map[string]string{"sse": "http://127.0.0.1:9000", "json": "http://127.0.0.1:9001"}}
	render := func(tmpl *template.Template, cfg proxyConfig) string {
		cfg.Dir = t.TempDir()
		path, err := writeCaddyfile(tmpl, cfg)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(path)
		return string(data)
	}
	plain := render(plainCaddyfile, cfg)
	for _, want := range []string{"admin 127.0.0.1:8001", "reverse_proxy /sse/* http://127.0.0.1:9000", "reverse_proxy /json/* http://127.0.0.1:9001"} {
		if !strings.Contains(plain, want) {
			t.Errorf("plain Caddyfile lacks %q:\n%s", want, plain)
		}
	}
	if strings.Contains(plain, "toolgate") {
		t.Errorf("plain Caddyfile mentions toolgate:\n%s", plain)
	}
	gw := render(toolgateCaddyfile, cfg)
	for _, want := range []string{"admin 127.0.0.1:8001", "url http://127.0.0.1:9000/mcp", "api_key " + apiKeyHash("k") + " c@example.test",
		"max_mcp_sessions 11000", "toolgate_policy {\n\t\t\tsource /data/policies\n\t\t}"} {
		if !strings.Contains(gw, want) {
			t.Errorf("toolgate Caddyfile lacks %q:\n%s", want, gw)
		}
	}
	if strings.Contains(gw, "exclude toolgate.audit") {
		t.Errorf("the audit log is excluded by default:\n%s", gw)
	}
	cfg.NoAuditLog = true
	if gw := render(toolgateCaddyfile, cfg); !strings.Contains(gw, "exclude toolgate.audit") {
		t.Errorf("NoAuditLog does not exclude the audit log:\n%s", gw)
	}
	if !strings.Contains(gw, "auth none") || strings.Contains(gw, "Bearer") {
		t.Errorf("a service carries a credential without Credential:\n%s", gw)
	}
	cfg.Credential = true
	if gw := render(toolgateCaddyfile, cfg); strings.Count(gw, `auth header Authorization "Bearer gho_`) != 2 {
		t.Errorf("Credential does not give each service a credential:\n%s", gw)
	}
	cfg.Credential = false
	if strings.Contains(gw, "toolgate_console") {
		t.Errorf("the console is served by default:\n%s", gw)
	}
	cfg.Console = true
	if gw := render(toolgateCaddyfile, cfg); !strings.Contains(gw, "toolgate_console {\n\t\tapi_key_login\n\t}") {
		t.Errorf("Console does not serve the console:\n%s", gw)
	}
}
