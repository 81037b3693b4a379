package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"
)

// source is where a policy comes from: local files, or an OPA bundle
// served over HTTP.
type source interface {
	// load returns the policy when it changed since the last load, or
	// nil when it did not. A version that then fails to compile is not
	// loaded again until the source changes once more.
	load(ctx context.Context) (*version, error)
	// remote reports whether loading needs the network.
	remote() bool
	String() string
}

// version is one state of a policy source.
type version struct {
	modules  map[string]*ast.Module
	data     map[string]any
	revision string
}

func newSource(s string) source {
	if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") {
		return &bundleSource{url: s, client: &http.Client{
			Timeout:       time.Minute,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
	}
	return &fileSource{path: s}
}

// fileSource is a .rego file (with data.json/data.yaml beside it) or a
// directory: its top-level .rego files, not *_test.rego, and data files,
// and the same of its subdirectory site (siteDir), where a site keeps its
// own rules and settings apart from the shipped ones. The data files are
// merged (objects key by key, at any depth; a value set in two files is a
// load error).
type fileSource struct {
	path        string
	fingerprint string // of the files' names, sizes and modification times
}

func (f *fileSource) String() string { return f.path }
func (f *fileSource) remote() bool   { return false }

func (f *fileSource) load(context.Context) (*version, error) {
	paths, fp, err := f.files()
	if err != nil {
		return nil, err
	}
	if fp == f.fingerprint {
		return nil, nil
	}
	f.fingerprint = fp
	if len(paths) == 0 {
		return nil, fmt.Errorf("policy %s: no .rego files", f.path)
	}
	result, err := loader.NewFileLoader().WithRegoVersion(ast.RegoV1).All(paths)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		name := filepath.Base(p)
		if filepath.Base(filepath.Dir(p)) == siteDir {
			name = siteDir + "/" + name
		}
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(data))
		h.Write(data)
	}
	return &version{modules: result.ParsedModules(), data: result.Documents, revision: hex.EncodeToString(h.Sum(nil))[:12]}, nil
}

// files lists the policy's files; the fingerprint changes when any of them
// does.
func (f *fileSource) files() (paths []string, fingerprint string, err error) {
	info, err := os.Stat(f.path)
	if err != nil {
		return nil, "", fmt.Errorf("policy %s: %w", f.path, err)
	}
	dir := f.path
	if !info.IsDir() {
		dir = filepath.Dir(f.path)
		paths = append(paths, f.path)
	}
	dirs := []string{dir}
	if info.IsDir() {
		if st, err := os.Stat(filepath.Join(dir, siteDir)); err == nil && st.IsDir() {
			dirs = append(dirs, filepath.Join(dir, siteDir))
		}
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, "", fmt.Errorf("policy %s: %w", f.path, err)
		}
		for _, ent := range entries {
			name := ent.Name()
			if ent.IsDir() {
				continue
			}
			isData := name == "data.json" || name == "data.yaml" || name == "data.yml"
			isPolicy := info.IsDir() && strings.HasSuffix(name, ".rego") && !strings.HasSuffix(name, "_test.rego")
			if isData || isPolicy {
				paths = append(paths, filepath.Join(dir, name))
			}
		}
	}
	slices.Sort(paths)
	h := sha256.New()
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", p, st.Size(), st.ModTime().UnixNano())
	}
	return paths, hex.EncodeToString(h.Sum(nil)), nil
}

// siteDir is the subdirectory of a policy directory that is loaded with it.
const siteDir = "site"

// maxBundleBytes bounds a downloaded bundle.
const maxBundleBytes = 64 << 20

// bundleSource is an OPA bundle (a .tar.gz with .rego files, data.json and
// an optional .manifest) served over HTTP, polled with If-None-Match. Its
// revision is the manifest's revision, else the SHA-256 of the download.
type bundleSource struct {
	url    string
	client *http.Client
	etag   string
	digest string
}

func (b *bundleSource) String() string { return b.url }
func (b *bundleSource) remote() bool   { return true }

func (b *bundleSource) load(ctx context.Context) (*version, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url, nil)
	if err != nil {
		return nil, err
	}
	if b.etag != "" {
		req.Header.Set("If-None-Match", b.etag)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching the policy bundle: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		return nil, nil
	case http.StatusOK:
	default:
		return nil, fmt.Errorf("fetching the policy bundle: HTTP %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBundleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fetching the policy bundle: %w", err)
	}
	if len(body) > maxBundleBytes {
		return nil, fmt.Errorf("the policy bundle is larger than %d bytes", maxBundleBytes)
	}
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	b.etag = resp.Header.Get("ETag")
	if digest == b.digest {
		return nil, nil
	}
	b.digest = digest
	bun, err := bundle.NewReader(bytes.NewReader(body)).WithRegoVersion(ast.RegoV1).Read()
	if err != nil {
		return nil, fmt.Errorf("reading the policy bundle: %w", err)
	}
	v := &version{modules: make(map[string]*ast.Module, len(bun.Modules)), data: bun.Data, revision: bun.Manifest.Revision}
	for _, m := range bun.Modules {
		v.modules[m.Path] = m.Parsed
	}
	if v.revision == "" {
		v.revision = digest[:12]
	}
	if v.data == nil {
		v.data = map[string]any{}
	}
	return v, nil
}
