package policy

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"

	"github.com/toolgate/toolgate/internal/caddyopt"
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
	if scheme, _, ok := strings.Cut(s, "://"); ok && (strings.EqualFold(scheme, "http") || strings.EqualFold(scheme, "https")) {
		return &bundleSource{url: s, client: &http.Client{
			Timeout:       time.Minute,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
	}
	return &fileSource{path: s}
}

// checkSource refuses a source toolgate cannot load safely, before it is
// used: a URL of a scheme other than https (http only to a loopback
// address: on any other network path, whoever can answer in the server's
// place writes the policy), or a file path that is a URL of another
// scheme. Its errors never repeat the URL's userinfo or query.
func checkSource(s string) error {
	scheme, _, isURL := strings.Cut(s, "://")
	switch {
	case !isURL || strings.ContainsAny(scheme, "/\\"):
		return nil // a file path
	case strings.EqualFold(scheme, "https"):
		return nil
	case strings.EqualFold(scheme, "http"):
		u, err := url.Parse(s)
		if err != nil {
			return fmt.Errorf("policy source %s: %v", redactedURL(s), caddyopt.URLError(err))
		}
		if !caddyopt.LoopbackHost(u.Hostname()) {
			return fmt.Errorf("policy source %s: a bundle URL must be https:// (http:// only to a loopback address: anyone on the network path could serve the policy)", redactedURL(s))
		}
		return nil
	}
	return fmt.Errorf("policy source %s: a bundle URL must be https:// (or http:// to a loopback address); a local policy is a file or directory path", redactedURL(s))
}

// redactedURL is a bundle URL as toolgate quotes it in logs and errors:
// without its userinfo and its query, where bundle servers take
// credentials.
func redactedURL(s string) string {
	s = caddyopt.RedactURL(s)
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		return s[:i] + "?xxxxx"
	}
	return s
}

// fileSource is a .rego file (with data.json/data.yaml beside it) or a
// directory: its top-level .rego files, not *_test.rego, and data files,
// and the same of its subdirectory site (siteDir), where a site keeps its
// own rules and settings apart from the shipped ones. The data files are
// merged (objects key by key, at any depth; a value set in two files is a
// load error).
type fileSource struct {
	path     string
	revision string // of the files last loaded
	seen     string // of the files as the last poll read them
}

func (f *fileSource) String() string { return f.path }
func (f *fileSource) remote() bool   { return false }

func (f *fileSource) load(context.Context) (*version, error) {
	paths, err := f.files()
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("policy %s: no .rego files", f.path)
	}
	// Each file is read once: the revision is the hash of the very bytes
	// compiled, and a change is seen whatever it keeps (size, modification
	// time: rsync -a, cp -p and images with fixed times keep both).
	read := make(readFiles, len(paths))
	h := sha256.New()
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", f.path, err)
		}
		read[p] = data
		name := filepath.Base(p)
		if filepath.Base(filepath.Dir(p)) == siteDir {
			name = siteDir + "/" + name
		}
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(data))
		h.Write(data)
	}
	revision := hex.EncodeToString(h.Sum(nil))[:12]
	switch {
	case revision == f.revision:
		return nil, nil
	case f.revision != "" && revision != f.seen:
		// Changed since the last poll: loaded once it is seen unchanged
		// on the next, so that files caught half-written (cut between two
		// rules, which still compiles) are never in force.
		f.seen = revision
		return nil, nil
	}
	f.revision, f.seen = revision, revision
	result, err := loader.NewFileLoader().WithFS(read).WithRegoVersion(ast.RegoV1).All(paths)
	if err != nil {
		return nil, err
	}
	return &version{modules: result.ParsedModules(), data: result.Documents, revision: revision}, nil
}

// readFiles is a policy's files as read once, by path, served to OPA's
// loader as a file system (io/fs), so that it parses what was hashed.
type readFiles map[string][]byte

func (r readFiles) Open(name string) (fs.File, error) {
	data, ok := r[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &readFile{Reader: bytes.NewReader(data), info: readInfo{name: filepath.Base(name), size: int64(len(data))}}, nil
}

func (r readFiles) ReadFile(name string) ([]byte, error) {
	data, ok := r[name]
	if !ok {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return data, nil
}

func (r readFiles) Stat(name string) (fs.FileInfo, error) {
	data, ok := r[name]
	if !ok {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
	}
	return readInfo{name: filepath.Base(name), size: int64(len(data))}, nil
}

type readFile struct {
	*bytes.Reader
	info readInfo
}

func (f *readFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *readFile) Close() error               { return nil }

type readInfo struct {
	name string
	size int64
}

func (i readInfo) Name() string       { return i.name }
func (i readInfo) Size() int64        { return i.size }
func (i readInfo) Mode() fs.FileMode  { return 0o444 }
func (i readInfo) ModTime() time.Time { return time.Time{} }
func (i readInfo) IsDir() bool        { return false }
func (i readInfo) Sys() any           { return nil }

// files lists the policy's files.
func (f *fileSource) files() (paths []string, err error) {
	info, err := os.Stat(f.path)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", f.path, err)
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
			return nil, fmt.Errorf("policy %s: %w", f.path, err)
		}
		for _, ent := range entries {
			name := ent.Name()
			if ent.IsDir() || strings.HasPrefix(name, ".") {
				// Hidden names are no policy's: an editor's lock file
				// (.#request.rego, a dangling link while the file is
				// edited), macOS's ._request.rego.
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
	return paths, nil
}

// siteDir is the subdirectory of a policy directory that is loaded with it.
const siteDir = "site"

// maxBundleBytes bounds a bundle, downloaded and uncompressed alike (a
// small download may expand a thousandfold).
const maxBundleBytes = 64 << 20

// bundleSource is an OPA bundle (a .tar.gz with .rego files, data.json and
// an optional .manifest) served over HTTP, polled with If-None-Match. Its
// revision is the SHA-256 of the download, after the manifest's revision
// when it has one ("<manifest revision>@<digest>"): a bundle whose policy
// changes under an unchanged manifest revision is another revision all
// the same, so that approvals given under the old one are judged again.
type bundleSource struct {
	url    string
	client *http.Client
	verify *bundle.VerificationConfig // nil: signatures are not required
	etag   string
	digest string
}

func (b *bundleSource) String() string { return redactedURL(b.url) }
func (b *bundleSource) remote() bool   { return true }

func (b *bundleSource) load(ctx context.Context) (*version, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url, nil)
	if err != nil {
		return nil, fmt.Errorf("policy source %s: %v", b, caddyopt.URLError(err))
	}
	if b.etag != "" {
		req.Header.Set("If-None-Match", b.etag)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		// net/http's error quotes the URL with its query, where a bundle
		// server may take a token.
		return nil, fmt.Errorf("fetching the policy bundle: %w", caddyopt.URLError(err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		if b.etag == "" {
			return nil, errors.New("fetching the policy bundle: the server answered 304 Not Modified to a request that named no version (no If-None-Match); it must send the bundle")
		}
		return nil, nil
	case http.StatusOK:
	default:
		return nil, fmt.Errorf("fetching the policy bundle: HTTP %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBundleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fetching the policy bundle: %w", caddyopt.URLError(err))
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
	if err := checkExpanded(body); err != nil {
		return nil, err
	}
	// The size limit also bounds each file's buffer, which OPA's loader
	// allocates at the size its tar header claims, before reading it.
	loader := bundle.NewTarballLoaderWithBaseURL(bytes.NewReader(body), "").WithSizeLimitBytes(maxBundleBytes)
	reader := bundle.NewCustomReader(loader).WithSizeLimitBytes(maxBundleBytes).WithRegoVersion(ast.RegoV1)
	if b.verify != nil {
		reader = reader.WithBundleVerificationConfig(b.verify)
	}
	bun, err := reader.Read()
	if err != nil {
		return nil, fmt.Errorf("reading the policy bundle: %w", err)
	}
	v := &version{modules: make(map[string]*ast.Module, len(bun.Modules)), data: bun.Data, revision: digest[:12]}
	for _, m := range bun.Modules {
		v.modules[m.Path] = m.Parsed
	}
	if bun.Manifest.Revision != "" {
		v.revision = bun.Manifest.Revision + "@" + v.revision
	}
	if v.data == nil {
		v.data = map[string]any{}
	}
	return v, nil
}

// checkExpanded refuses a bundle (.tar.gz) that expands past
// maxBundleBytes, reading no more than that of it.
func checkExpanded(body []byte) error {
	gz, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("reading the policy bundle: %w", err)
	}
	n, err := io.Copy(io.Discard, io.LimitReader(gz, maxBundleBytes+1))
	switch {
	case n > maxBundleBytes:
		return fmt.Errorf("the policy bundle expands to more than %d bytes", maxBundleBytes)
	case err != nil:
		return fmt.Errorf("reading the policy bundle: %w", err)
	}
	return nil
}
