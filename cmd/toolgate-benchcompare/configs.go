package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/template"
)

// The two proxies run the same binary (toolgate is a full Caddy) with
// these Caddyfiles. Both have Caddy's admin endpoint on a loopback port:
// the harness reads the Go runtime's memory statistics from /debug/vars
// and profiles from /debug/pprof/ there. Neither has an access log;
// toolgate writes its audit log (one entry per policy decision) to its
// output file, as a deployment would, unless -audit-log=false; with
// -console it also serves the console, as the README's deployment does,
// and keeps its activity record of every decision in its storage.

// proxyConfig is what both Caddyfiles are filled in with.
type proxyConfig struct {
	Port      int               // the site's port
	AdminPort int               // the admin endpoint's port
	Dir       string            // this proxy's data directory
	Upstreams map[string]string // upstream kind ("sse", "json") → its base URL
	// toolgate only
	APIKeyHash  string // sha256:<hex> of the caller's API key
	Policies    string // the policy directory
	MaxSessions int    // max_mcp_sessions and max_mcp_sessions_per_caller
	Caller      string // the API key's user
	NoAuditLog  bool   // exclude toolgate.audit from the logs
	Console     bool   // serve the console, whose activity record keeps every decision
	// Credential: each service carries a bearer token (auth header), which
	// toolgate attaches to the upstream requests and looks for in every
	// answer (see modules/mcpproxy/redact.go); the upstream ignores it.
	Credential bool
}

// plainCaddyfile is a plain Caddy reverse_proxy: /<kind>/... goes to the
// upstream of that kind unchanged (the upstream serves MCP on every path).
var plainCaddyfile = template.Must(template.New("caddy").Parse(`{
	admin 127.0.0.1:{{.AdminPort}}
	auto_https off
	persist_config off
	storage file_system {{.Dir}}/caddy
}

http://127.0.0.1:{{.Port}} {
{{- range $kind, $url := .Upstreams}}
	reverse_proxy /{{$kind}}/* {{$url}}
{{- end}}
}
`))

// toolgateCaddyfile is toolgate with one service per upstream kind (named
// after it), an API-key caller, and the pipeline of the README. (The policy
// path is absolute, so it goes in a block: a directive's first argument
// that starts with a slash would be read as a path matcher.)
var toolgateCaddyfile = template.Must(template.New("toolgate").Parse(`{
	admin 127.0.0.1:{{.AdminPort}}
	auto_https off
	persist_config off
	storage file_system {{.Dir}}/caddy
{{- if .NoAuditLog}}
	log default {
		exclude toolgate.audit
	}
{{- end}}
	toolgate {
		public_url http://127.0.0.1:{{.Port}}
		storage file_system {{.Dir}}/toolgate
		max_mcp_sessions {{.MaxSessions}}
		max_mcp_sessions_per_caller {{.MaxSessions}}
		auth {
			api_key {{.APIKeyHash}} {{.Caller}}
		}
{{- range $kind, $url := .Upstreams}}
		service {{$kind}} {
			url {{$url}}/mcp
			allow_http
			tools echo big
			auth {{if $.Credential}}header Authorization "Bearer gho_16C7e42F292c6912E7710c838347Ae178B4a"{{else}}none{{end}}
		}
{{- end}}
	}
}

http://127.0.0.1:{{.Port}} {
	route /v1/mcp/* {
		toolgate_session
		toolgate_registry
		toolgate_policy {
			source {{.Policies}}
		}
		toolgate_credentials
		toolgate_result_policy {
			source {{.Policies}}
		}
		toolgate_proxy
	}
	toolgate_api
{{- if .Console}}
	toolgate_console {
		api_key_login
	}
{{- end}}
}
`))

// writeCaddyfile fills tmpl with cfg into dir/Caddyfile.
func writeCaddyfile(tmpl *template.Template, cfg proxyConfig) (string, error) {
	var b bytes.Buffer
	if err := tmpl.Execute(&b, cfg); err != nil {
		return "", err
	}
	path := filepath.Join(cfg.Dir, "Caddyfile")
	return path, os.WriteFile(path, b.Bytes(), 0o600)
}

// apiKeyHash is how toolgate's auth block names an API key.
func apiKeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// preparePolicies copies the default policies from src into dst: the
// .rego files that are not tests, of the directory and of its site/
// subdirectory, and site/'s data, with one change to it: each benchmark
// service gets max_result_bytes of maxResult (in site/data.json), so that
// the default result policy lets the large result through unchanged, as
// the plain proxy does, instead of truncating it to the default 64 KiB.
// Everything else the policies decide stays the default.
func preparePolicies(src, dst string, services []string, maxResult int) error {
	copied := 0
	for _, sub := range []string{".", "site"} {
		if err := os.MkdirAll(filepath.Join(dst, sub), 0o755); err != nil {
			return err
		}
		entries, err := os.ReadDir(filepath.Join(src, sub))
		if err != nil {
			if sub == "site" && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("policies: %v", err)
		}
		for _, e := range entries {
			name := e.Name()
			if name == "data.yaml" || name == "data.yml" {
				return fmt.Errorf("policies: %s/%s: the harness sets max_result_bytes in a data.json only", sub, name)
			}
			if e.IsDir() || !strings.HasSuffix(name, ".rego") || strings.HasSuffix(name, "_test.rego") {
				continue
			}
			data, err := os.ReadFile(filepath.Join(src, sub, name))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dst, sub, name), data, 0o644); err != nil {
				return err
			}
			copied++
		}
	}
	if copied == 0 {
		return fmt.Errorf("policies: no .rego file in %s", src)
	}
	raw, err := os.ReadFile(filepath.Join(src, "site", "data.json"))
	if errors.Is(err, fs.ErrNotExist) {
		raw, err = []byte(`{}`), nil
	}
	if err != nil {
		return fmt.Errorf("policies: %v", err)
	}
	data, err := withMaxResultBytes(raw, services, maxResult)
	if err != nil {
		return fmt.Errorf("policies: %s/site/data.json: %v", src, err)
	}
	return os.WriteFile(filepath.Join(dst, "site", "data.json"), data, 0o644)
}

// withMaxResultBytes sets toolgate.settings.services.<id>.max_result_bytes
// in a policy data document, keeping every other value.
func withMaxResultBytes(raw []byte, services []string, n int) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	settings, ok := object(object(doc, "toolgate"), "settings").(map[string]any)
	if !ok {
		return nil, fmt.Errorf("toolgate.settings is not an object")
	}
	svcs, ok := object(settings, "services").(map[string]any)
	if !ok {
		return nil, fmt.Errorf("toolgate.settings.services is not an object")
	}
	for _, id := range services {
		svc, ok := object(svcs, id).(map[string]any)
		if !ok {
			return nil, fmt.Errorf("toolgate.settings.services.%s is not an object", id)
		}
		svc["max_result_bytes"] = n
	}
	return json.MarshalIndent(doc, "", "  ")
}

// object returns m[key], creating an empty object there when it is
// missing; m not being an object yields nil.
func object(m any, key string) any {
	obj, ok := m.(map[string]any)
	if !ok {
		return nil
	}
	if v, ok := obj[key]; ok {
		return v
	}
	v := map[string]any{}
	obj[key] = v
	return v
}
