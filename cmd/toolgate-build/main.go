// Command toolgate-build builds a custom toolgate binary with extra Caddy
// plugins, from the manifest xcaddy.json, with xcaddy's Go package. It is
// what `make xcaddy` runs.
//
// The manifest:
//
//	{
//		"caddy_version": "v2.11.9",
//		"output": "bin/toolgate-custom",
//		"plugins": [
//			{"module": "github.com/toolgate/toolgate", "replace": "."},
//			{"module": "github.com/example/caddy-storage-plugin", "version": "v1.2.3"}
//		]
//	}
//
// A plugin with "replace" is taken from that directory (relative to the
// manifest) instead of the module proxy: toolgate's own modules come from
// the working tree this way.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/xcaddy"
)

// manifest is the content of xcaddy.json.
type manifest struct {
	CaddyVersion string   `json:"caddy_version"`
	Output       string   `json:"output"`
	Plugins      []plugin `json:"plugins"`
}

type plugin struct {
	Module  string `json:"module"`
	Version string `json:"version,omitempty"`
	Replace string `json:"replace,omitempty"`
}

func main() {
	path := flag.String("manifest", "xcaddy.json", "the build manifest")
	output := flag.String("o", "", "the output binary (default: the manifest's output)")
	flag.Parse()
	if err := run(*path, *output); err != nil {
		fmt.Fprintln(os.Stderr, "toolgate-build:", err)
		os.Exit(1)
	}
}

func run(path, output string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var m manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	if m.CaddyVersion == "" {
		return fmt.Errorf("%s: caddy_version is required", path)
	}
	if output == "" {
		output = m.Output
	}
	if output == "" {
		return fmt.Errorf("%s: give an output path (\"output\" or -o)", path)
	}
	base := filepath.Dir(path)
	b := xcaddy.Builder{
		Compile:      xcaddy.Compile{Cgo: os.Getenv("CGO_ENABLED") == "1"},
		CaddyVersion: m.CaddyVersion,
		TimeoutGet:   10 * time.Minute,
		TimeoutBuild: 20 * time.Minute,
	}
	for _, p := range m.Plugins {
		if p.Module == "" {
			return fmt.Errorf("%s: a plugin has no module", path)
		}
		version := p.Version
		if p.Replace != "" {
			dir, err := filepath.Abs(filepath.Join(base, p.Replace))
			if err != nil {
				return err
			}
			b.Replacements = append(b.Replacements, xcaddy.NewReplace(p.Module, dir))
			// A module taken from a directory has no published version; the
			// zero pseudo-version makes `go get` use the replacement
			// without asking the module proxy.
			version = "v0.0.0-00010101000000-000000000000"
		}
		b.Plugins = append(b.Plugins, xcaddy.Dependency{PackagePath: p.Module, Version: version})
	}
	log.Printf("building %s: Caddy %s with %d plugins", output, m.CaddyVersion, len(m.Plugins))
	return b.Build(context.Background(), output)
}
