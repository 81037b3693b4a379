package policy

// Adversarial review of the policy source and reload boundary
// (source.go: fileSource and bundleSource; engine.go: loading, polling,
// keeping the last good revision) and of how the policy's revision is
// used (approvals decided under one revision are re-judged when it
// changes; audit entries carry it).
//
// Findings (fixed; each test failed before its fix):
//   TestSourceAdvBundleRevisionIgnoresContent
//   TestSourceAdvFileRevisionHashesOtherBytesThanLoaded
//   TestSourceAdvBundleTarHeaderSizeCrashesTheProcess
//   TestSourceAdvBundleDecompressionIsUnbounded
//   TestSourceAdvBundleURLSecretsReachLogs
//   TestSourceAdvBundleURLSecretsReachPolicyEval
//   TestSourceAdvBundle304WithoutETagIsSilent
//   TestSourceAdvSameSizeSameMtimeEditIsNeverLoaded
//   TestSourceAdvHalfWrittenAtABoundaryLoads
// Holds (these pass): the rest of the file.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/logtest"
	"github.com/toolgate/toolgate/modules/gateway"
)

// advTarGz writes a bundle (.tar.gz) with the given files, in order.
func advTarGz(t *testing.T, files ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// advPoll runs two polls of e's watcher: a change is in force after them
// even if the watcher waits for files to be still for one interval (see
// TestSourceAdvHalfWrittenAtABoundaryLoads).
func advPoll(t *testing.T, e *engine) {
	t.Helper()
	for range 2 {
		if err := e.reload(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// advBundleEngine is an engine on the bundle at url, not watching (the
// tests call reload or reloadAndReport themselves), logging to logs.
func advBundleEngine(t *testing.T, url, stage string) (*engine, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	e, err := newEngine(newSource(url), requestQuery, stage, evaluatorPlan, 0, zap.New(core), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Destruct() })
	return e, logs
}

// Attack (fixed): the bundle server changes the bundle's policy (here: a call it
// allowed now asks for approval, scope once only) but keeps the
// .manifest revision. toolgate loads the new policy yet keeps the same
// revision, so everything keyed on "the policy changed" misses the change:
// an approval given under the old policy for scope tool still covers
// calls (CoversUnder returned true at once when the revisions were equal), a
// held call that is approved continues without being judged again
// (hold.go), a withheld result is released without the new result policy
// (approve.go), and audit entries attribute decisions of two different
// policies to one revision. The file source's revision changes with the
// content (TestSourceAdvFileRevisionFollowsContent).
// Fixed: the revision is the manifest's followed by the download's digest ("release-7@1f656e2c30d8").
func TestSourceAdvBundleRevisionIgnoresContent(t *testing.T) {
	policies := []string{
		// v1: ask, with scope tool offered.
		"package toolgate.request\n\ndecision := {\"action\": \"ask\", \"reason\": \"v1\", \"approval\": {\"scopes\": [\"once\", \"session\", \"tool\"]}}\n",
		// v2: the security team narrows it: scope once only.
		"package toolgate.request\n\ndecision := {\"action\": \"ask\", \"reason\": \"v2\", \"approval\": {\"scopes\": [\"once\"]}}\n",
	}
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bundleBytes(t, policies[served.Load()], "release-7"))
	}))
	defer srv.Close()
	e, _ := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-revision")
	ctx := context.Background()
	if err := e.reload(ctx); err != nil {
		t.Fatal(err)
	}
	o1 := e.decide(ctx, someInput, time.Minute, "arguments")
	if o1.Reason != "v1" {
		t.Fatalf("first decision %+v", o1)
	}
	// Alice approves her call for scope tool under v1.
	granted := &approval.Approval{Requester: "alice", RequesterMayApprove: true, DecidedBy: "alice",
		Scope: approval.ScopeTool, Revision: o1.Revision, CreatedAt: time.Now()}

	served.Store(1)
	if err := e.reload(ctx); err != nil {
		t.Fatal(err)
	}
	o2 := e.decide(ctx, someInput, time.Minute, "arguments")
	if o2.Reason != "v2" {
		t.Fatalf("the new bundle was not loaded: %+v", o2)
	}
	spec, err := approval.ParseSpec(o2.Approval)
	if err != nil {
		t.Fatal(err)
	}
	if o2.Revision == o1.Revision {
		t.Errorf("the bundle's policy changed (%q → %q) but its revision stayed %q: the revision is the manifest's alone", o1.Reason, o2.Reason, o2.Revision)
	}
	if granted.Covers(spec) {
		t.Errorf("an approval for scope tool given under v1 still covers calls under v2, which offers only once (revision %q unchanged)", o2.Revision)
	}
}

// Holds: the file source's revision changes with the content of every
// file it loads, a data file's too, and with a site/ directory appearing.
func TestSourceAdvFileRevisionFollowsContent(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": data.a}\n")
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"a": "allow"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _ := testEngine(t, dir, 0)
	ctx := context.Background()
	seen := map[string]bool{e.Revision(): true}
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"a": "deny"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	advPoll(t, e)
	if o := e.decide(ctx, someInput, time.Minute, "arguments"); o.Action != gateway.ActionDeny || seen[o.Revision] {
		t.Fatalf("after a data change: %+v (revisions seen %v)", o, seen)
	}
	seen[e.Revision()] = true
	if err := os.Mkdir(filepath.Join(dir, siteDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, siteDir, "extra.rego"), []byte("package toolgate.extra\n\nx := 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	advPoll(t, e)
	if seen[e.Revision()] {
		t.Fatalf("a site/ directory appearing kept the revision %s", e.Revision())
	}
}

// Attack (fixed): a policy file is replaced while it is being loaded. fileSource
// reads every file twice: once through OPA's loader (what is compiled) and
// once more for the revision's hash. When the file changes between the
// two reads (a rename by a deploy; here a FIFO stands in for it so that
// the test is deterministic: its first reader gets {"a": "allow"}, its
// second {"a": "deny"}), the policy that runs is the old content under the
// new content's revision. The next poll loads the new content with the
// same revision: the policy changed from allow to deny without its
// revision changing, so approvals and held calls are not judged again, and
// audit entries name a revision whose files decide otherwise.
// Fixed: each file is read once; OPA's loader parses those bytes (readFiles), which the revision hashes.
func TestSourceAdvFileRevisionHashesOtherBytesThanLoaded(t *testing.T) {
	const rego = "package toolgate.request\n\ndecision := {\"action\": data.a}\n"
	dir := t.TempDir()
	writePolicy(t, dir, rego)
	fifo := filepath.Join(dir, "data.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	t.Cleanup(func() { // a writer still waiting for a reader is let go
		if f, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			time.Sleep(10 * time.Millisecond)
			_ = f.Close()
		}
	})
	go func() {
		for _, s := range []string{`{"a": "allow"}`, `{"a": "deny"}`} {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			_, _ = f.WriteString(s)
			_ = f.Close()
			time.Sleep(100 * time.Millisecond) // the reader sees the end of this content
		}
	}()
	e, _ := testEngine(t, dir, 0)
	got := e.decide(context.Background(), someInput, time.Minute, "arguments")

	// The same files, at rest, with the content the revision was hashed from.
	other := t.TempDir()
	writePolicy(t, other, rego)
	if err := os.WriteFile(filepath.Join(other, "data.json"), []byte(`{"a": "deny"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e2, _ := testEngine(t, other, 0)
	want := e2.decide(context.Background(), someInput, time.Minute, "arguments")
	if got.Revision == want.Revision && got.Action != want.Action {
		t.Errorf("revision %s decides %s as loaded, but the files with that revision decide %s: the revision was hashed from bytes other than those compiled",
			got.Revision, got.Action, want.Action)
	}
}

// Attack (fixed): a bundle server (or anyone on the path of an http:// bundle URL)
// serves a 145-byte bundle whose tar header claims a 64 TiB file. OPA's
// tarball loader allocates a buffer of the claimed size before reading
// (bytes.NewBuffer(make([]byte, 0, header.Size))), since toolgate sets no
// size limit on the loader: the Go runtime dies with "fatal error: runtime:
// out of memory", which no recover catches: the whole gateway exits, from
// the watcher goroutine, and again at every restart (a bundle is first
// fetched when the app starts), for every route it serves. Run in a child
// process (this test binary) so that the crash is observed, not suffered.
// Fixed: OPA's tarball loader is given a size limit (maxBundleBytes), which it checks against each header before allocating.
func TestSourceAdvBundleTarHeaderSizeCrashesTheProcess(t *testing.T) {
	if os.Getenv("TOOLGATE_SOURCE_ADV_CHILD") == "tar-header" {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		_ = tw.WriteHeader(&tar.Header{Name: "/pad.bin", Mode: 0o644, Size: 1 << 46, Typeflag: tar.TypeReg})
		_ = tw.Flush()
		_ = gz.Close()
		bomb := buf.Bytes()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(bomb) }))
		defer srv.Close()
		e, logs := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-tar-header")
		e.reloadAndReport() // what the watcher runs
		fmt.Printf("SURVIVED a %d-byte bundle; logged: %d entries\n", len(bomb), logs.Len())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSourceAdvBundleTarHeaderSizeCrashesTheProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TOOLGATE_SOURCE_ADV_CHILD=tar-header")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("SURVIVED")) {
		first := string(out)
		if i := strings.Index(first, "fatal error"); i >= 0 {
			first = first[i:]
		} else if i := strings.Index(first, "panic"); i >= 0 {
			first = first[i:]
		}
		if i := strings.IndexByte(first, '\n'); i >= 0 {
			first = first[:i]
		}
		t.Errorf("loading a bundle whose tar header claims 64 TiB killed the process (%v): %s", err, first)
	}
}

// Attack (fixed): a bundle server serves a small download that decompresses to far
// more than maxBundleBytes (64 MiB, the bound on "a downloaded bundle"):
// here a ~150 KB .tar.gz holding three 40 MiB files that the bundle does
// not even use. Only the compressed size is bounded; OPA's tarball loader
// reads every regular file into memory, each up to OPA's default 1 GiB and
// with no bound on their number or total, so a few megabytes on the wire
// hold gigabytes in the gateway's memory at every change of the bundle.
// Fixed: a bundle that expands past maxBundleBytes is refused (checkExpanded reads no more than that of it).
func TestSourceAdvBundleDecompressionIsUnbounded(t *testing.T) {
	const fileSize, files = 40 << 20, 3
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	policy := "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n"
	if err := tw.WriteHeader(&tar.Header{Name: "/policy.rego", Mode: 0o644, Size: int64(len(policy)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte(policy))
	zeros := make([]byte, 1<<20)
	for i := range files {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("/pad%d.bin", i), Mode: 0o644, Size: fileSize, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		for range fileSize / len(zeros) {
			_, _ = tw.Write(zeros)
		}
	}
	_ = tw.Close()
	_ = gz.Close()
	bomb := buf.Bytes()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(bomb) }))
	defer srv.Close()
	e, _ := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-bomb")

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := e.reload(context.Background())
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	if err == nil {
		t.Errorf("a %d-byte download expanding to %d MiB was loaded (%d MiB allocated reading it); want it refused past %d MiB uncompressed",
			len(bomb), files*fileSize>>20, allocated>>20, maxBundleBytes>>20)
	}
}

// Attack (fixed): the bundle URL carries credentials, as bundle servers commonly
// need (https://user:password@host/… or ?access_token=…). bundleSource's
// String is the URL as configured, and the engine logs it as "source" on
// every failed load ("policy load failed; keeping the last good policy",
// every 30 s while the server is down) and every reload, and the error of a
// failed fetch quotes the URL again (net/http strips the password there,
// not the query): the password and the token reach the log files.
// Fixed: bundleSource.String hides the URL's userinfo and query, and a fetch error no longer quotes the URL.
func TestSourceAdvBundleURLSecretsReachLogs(t *testing.T) {
	const password, token = "hunter2-bundle-pass", "tok-bundle-s3cret"
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			_, _ = w.Write(bundleBytes(t, "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n", "r1"))
		default:
			_, _ = w.Write(bundleBytes(t, "package toolgate.request\n\ndecision := {\"action\": \"deny\"}\n", "r2"))
		}
	}))
	url := strings.Replace(srv.URL, "http://", "http://toolgate:"+password+"@", 1) + "/bundle.tar.gz?access_token=" + token
	e, logs := advBundleEngine(t, url, "adv-secrets")
	for range 3 {
		e.reloadAndReport()
	}
	if !strings.HasPrefix(e.Revision(), "r2@") {
		t.Fatalf("revision %q after three loads", e.Revision())
	}
	// The server goes away: net/http's error quotes the URL (without its
	// password, with its query) in the logged error as well.
	srv.Close()
	e.reloadAndReport()
	if leaked := logtest.Leaked(t, logs, password, token); len(leaked) > 0 {
		t.Errorf("the bundle URL's password or token reached %d log lines:\n%s", len(leaked), strings.Join(leaked, "\n"))
	}
}

// Attack (fixed): the same URL reaches what toolgate policy eval prints (its
// "source" member, which policy authors paste into tickets) and the error
// it returns when the bundle lacks the decision rule ("policy <URL>
// (revision …) defines no rule …"; the watcher logs that error too), and
// the error listing a configuration's differing policy sources.
// Fixed: toolgate policy eval prints and lists sources as bundleSource.String names them.
func TestSourceAdvBundleURLSecretsReachPolicyEval(t *testing.T) {
	const password, token = "hunter2-eval-pass", "tok-eval-s3cret"
	module := "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bundleBytes(t, module, "r1"))
	}))
	defer srv.Close()
	url := strings.Replace(srv.URL, "http://", "http://toolgate:"+password+"@", 1) + "/bundle.tar.gz?access_token=" + token
	input := filepath.Join(t.TempDir(), "input.json")
	if err := os.WriteFile(input, []byte(`{"method": "tools/call", "arguments": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := policyEval(input, "", "", Config{Source: url}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.Source, password) || strings.Contains(out.Source, token) {
		t.Errorf("toolgate policy eval prints the source %q", out.Source)
	}
	// Two toolgate_policy directives naming different sources: the error
	// lists them.
	caddyfile := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(caddyfile, []byte(":8080 {\n\troute {\n\t\ttoolgate_policy {\n\t\t\tsource "+url+
		"\n\t\t}\n\t}\n}\n:8081 {\n\troute {\n\t\ttoolgate_policy {\n\t\t\tsource /elsewhere\n\t\t}\n\t}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := policyEval(input, caddyfile, "caddyfile", Config{}, "", nil); err == nil || !strings.Contains(err.Error(), "different policies") {
		t.Fatalf("two policies: %v", err)
	} else if strings.Contains(err.Error(), password) || strings.Contains(err.Error(), token) {
		t.Errorf("the error about two policies repeats the URL's secrets: %v", err)
	}
	module = "package toolgate.other\n\nx := 1\n"
	_, err = policyEval(input, "", "", Config{Source: url}, "", nil)
	if err == nil {
		t.Fatal("a bundle without the decision rule loaded")
	}
	if strings.Contains(err.Error(), password) || strings.Contains(err.Error(), token) {
		t.Errorf("the load error repeats the URL's secrets: %v", err)
	}
}

// Attack (fixed): the bundle server answers 304 Not Modified to toolgate's very
// first request, which sent no If-None-Match. bundleSource takes it for
// "unchanged" and returns no version and no error: the policy never loads,
// every decision is a not_loaded deny, and nothing says why — no
// "policy load failed" log line, no toolgate_policy_load_failures_total.
// toolgate policy eval prints a deny instead of an error.
// Fixed: a 304 to a request without If-None-Match is a load failure (logged, counted), and policy eval fails.
func TestSourceAdvBundle304WithoutETagIsSilent(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusNotModified)
	}))
	defer srv.Close()
	const stage = "adv-304"
	e, logs := advBundleEngine(t, srv.URL+"/bundle.tar.gz", stage)
	failures := testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues(stage))
	e.reloadAndReport()
	e.reloadAndReport()
	if calls.Load() != 2 || e.Revision() != "" {
		t.Fatalf("%d requests, revision %q", calls.Load(), e.Revision())
	}
	if testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues(stage)) == failures && logs.FilterMessageSnippet("load failed").Len() == 0 {
		t.Errorf("two loads answered 304 to an unconditional request left no policy loaded, and neither a failure logged nor counted: %v", logs.All())
	}
	input := filepath.Join(t.TempDir(), "input.json")
	if err := os.WriteFile(input, []byte(`{"method": "tools/call", "arguments": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := policyEval(input, "", "", Config{Source: srv.URL + "/bundle.tar.gz"}, "", nil); err == nil {
		t.Errorf("toolgate policy eval on a bundle never received: %+v, want an error", out)
	}
}

// Attack (fixed): a policy file is changed to content of the same size and its
// modification time is kept (rsync -t/-a, cp -p, tar x, reproducible
// images whose files all carry SOURCE_DATE_EPOCH or mtime 1): the
// fingerprint is names, sizes and modification times, so the watcher never
// sees the change. The gateway keeps deciding with the old policy for good
// (a config reload reuses the pooled engine), while `toolgate policy eval`
// on the same directory decides with the new one.
// Fixed: changes are found by the files' content, not their sizes and times.
func TestSourceAdvSameSizeSameMtimeEditIsNeverLoaded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "request.rego")
	allow := "package toolgate.request\n\ndecision := {\"action\": \"allow\", \"reason\": \"xx\"}\n"
	deny := "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"xxx\"}\n"
	if len(allow) != len(deny) {
		t.Fatal("the two policies must be of one size")
	}
	if err := os.WriteFile(path, []byte(allow), 0o644); err != nil {
		t.Fatal(err)
	}
	epoch := time.Unix(1, 0)
	if err := os.Chtimes(path, epoch, epoch); err != nil {
		t.Fatal(err)
	}
	e, _ := testEngine(t, dir, 0)
	ctx := context.Background()
	if o := e.decide(ctx, someInput, time.Minute, "arguments"); o.Action != gateway.ActionAllow {
		t.Fatalf("first decision %+v", o)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(deny), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, epoch, epoch); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	advPoll(t, e)
	fresh, _ := testEngine(t, dir, 0)
	got, want := e.decide(ctx, someInput, time.Minute, "arguments"), fresh.decide(ctx, someInput, time.Minute, "arguments")
	if got.Action != want.Action || got.Revision != want.Revision {
		t.Errorf("after the edit the gateway decides %s (revision %s); the files on disk decide %s (revision %s)",
			got.Action, got.Revision, want.Action, want.Revision)
	}
}

// Holds: a redirect from the bundle server is not followed (the
// redirect's target is never fetched) and the load fails visibly.
func TestSourceAdvBundleRedirectIsNotFollowed(t *testing.T) {
	var hit atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit.Add(1)
		_, _ = w.Write(bundleBytes(t, "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n", "evil"))
	}))
	defer target.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/bundle.tar.gz", http.StatusFound)
	}))
	defer srv.Close()
	e, _ := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-redirect")
	if err := e.reload(context.Background()); err == nil || hit.Load() != 0 || e.Revision() != "" {
		t.Fatalf("err %v, target fetched %d times, revision %q", err, hit.Load(), e.Revision())
	}
}

// Holds: an ETag that changes with every answer while the bytes stay the
// same does not reload or recompile the policy (the download's digest is
// compared), and the revision stays.
func TestSourceAdvBundleChangingETagSameContent(t *testing.T) {
	var n atomic.Int32
	body := bundleBytes(t, "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n", "")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", fmt.Sprintf(`"%d"`, n.Add(1)))
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	e, logs := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-etag")
	e.reloadAndReport()
	first, c := e.Revision(), e.current.Load()
	e.reloadAndReport()
	e.reloadAndReport()
	if e.Revision() != first || e.current.Load() != c || logs.FilterMessage("policy reloaded").Len() != 0 || n.Load() != 3 {
		t.Fatalf("revision %q → %q, recompiled %v, logs %v", first, e.Revision(), e.current.Load() != c, logs.All())
	}
}

// Holds: a body that trickles forever is cut at the load's deadline (the
// watcher gives each load a minute; the client has a minute as well).
func TestSourceAdvBundleSlowBodyIsCut(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := w.Write([]byte{0x1f}); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}))
	defer srv.Close()
	e, _ := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-slow")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := e.reload(ctx)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("a trickling body: err %v after %v", err, time.Since(start))
	}
	srv.CloseClientConnections()
}

// Holds: a download over maxBundleBytes is refused without being kept.
func TestSourceAdvBundleOversizedDownload(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.CopyN(w, zeroReader{}, maxBundleBytes+1024)
	}))
	defer srv.Close()
	e, _ := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-big")
	if err := e.reload(context.Background()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("err = %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Holds: tar names that climb out of the bundle ("../../…") write nothing
// anywhere (the bundle is read in memory: the name is only the module's
// label), and a later bundle whose manifest roots do not hold toolgate's
// packages is refused by OPA: the last good policy stays, and the failure
// is logged and counted.
func TestSourceAdvBundleTraversalNamesAndForeignRoots(t *testing.T) {
	const escaped = "toolgate-source-adv-traversal.rego"
	climbing := advTarGz(t,
		[2]string{"/.manifest", `{"revision": "climbing"}`},
		[2]string{"/../../" + escaped, "package toolgate.request\n\ndecision := {\"action\": \"allow\", \"reason\": \"climbing\"}\n"})
	foreign := advTarGz(t,
		[2]string{"/.manifest", `{"revision": "foreign", "roots": ["other"]}`},
		[2]string{"/request.rego", "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"foreign\"}\n"})
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			_, _ = w.Write(climbing)
			return
		}
		_, _ = w.Write(foreign)
	}))
	defer srv.Close()
	const stage = "adv-roots"
	e, logs := advBundleEngine(t, srv.URL+"/bundle.tar.gz", stage)
	e.reloadAndReport()
	wd, _ := os.Getwd()
	for _, p := range []string{filepath.Join(wd, "..", "..", escaped), filepath.Join(os.TempDir(), escaped)} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("a file appeared at %s", p)
		}
	}
	failures := testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues(stage))
	e.reloadAndReport()
	o := e.decide(context.Background(), someInput, time.Minute, "arguments")
	if o.Reason != "climbing" || !strings.HasPrefix(e.Revision(), "climbing@") || testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues(stage)) != failures+1 ||
		logs.FilterMessageSnippet("keeping the last good policy").Len() != 1 {
		t.Fatalf("decision %+v, revision %q, logs %v", o, e.Revision(), logs.All())
	}
}

// Holds: data nested 5,000 deep loads and decides (no stack exhaustion in
// the store, the plan or the settings check).
func TestSourceAdvBundleDeepData(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000)
	body := advTarGz(t,
		[2]string{"/policy.rego", "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n"},
		[2]string{"/deep/data.json", deep})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(body) }))
	defer srv.Close()
	e, _ := advBundleEngine(t, srv.URL+"/bundle.tar.gz", "adv-deep")
	if err := e.reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if o := e.decide(context.Background(), someInput, time.Minute, "arguments"); o.Action != gateway.ActionAllow {
		t.Fatalf("decision %+v", o)
	}
}

// Holds: a data file cannot stand in for the decision rule: data at
// toolgate.request.decision next to the rule is ignored by both
// evaluators (the rule decides), and without the rule the policy does not
// load.
func TestSourceAdvDataCannotShadowTheDecision(t *testing.T) {
	for _, evaluator := range []string{evaluatorPlan, evaluatorTopdown} {
		dir := t.TempDir()
		writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"deny\", \"reason\": \"rule\"}\n")
		if err := os.MkdirAll(filepath.Join(dir, siteDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, siteDir, "data.json"), []byte(`{"toolgate": {"request": {"decision": {"action": "allow", "reason": "data"}}}}`), 0o644); err != nil {
			t.Fatal(err)
		}
		e, _ := testEngineWith(t, dir, 0, evaluator)
		if o := e.decide(context.Background(), someInput, time.Minute, "arguments"); o.Action != gateway.ActionDeny || o.Reason != "rule" {
			t.Errorf("%s: decision %+v, want the rule's", evaluator, o)
		}
		writePolicy(t, dir, "package toolgate.other\n\nx := 1\n")
		if _, err := newEngine(newSource(dir), requestQuery, "test", evaluator, 0, zap.NewNop(), policyMetrics); err == nil {
			t.Errorf("%s: data alone stood in for the decision rule", evaluator)
		}
	}
}

// Holds: a reload to a policy that compiles but lacks the decision rule,
// or whose decision is not an object, never replaces a working policy
// silently: the first is refused (logged, counted, last good kept), the
// second loads and denies every call as malformed.
func TestSourceAdvReloadWithoutTheRuleOrWithANonObject(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"allow\", \"reason\": \"good\"}\n")
	core, logs := observer.New(zap.InfoLevel)
	const stage = "adv-norule"
	e, err := newEngine(newSource(dir), requestQuery, stage, evaluatorPlan, 0, zap.New(core), policyMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Destruct()
	ctx := context.Background()
	failures := testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues(stage))
	writePolicy(t, dir, "package toolgate.request\n\ndecisions := {\"action\": \"allow\"}\n")
	e.reloadAndReport() // a change is loaded once two polls have seen it
	e.reloadAndReport()
	if o := e.decide(ctx, someInput, time.Minute, "arguments"); o.Reason != "good" ||
		testutil.ToFloat64(policyMetrics.loadFailures.WithLabelValues(stage)) != failures+1 ||
		logs.FilterMessageSnippet("keeping the last good policy").Len() != 1 {
		t.Fatalf("after a policy without the rule: %+v, logs %v", o, logs.All())
	}
	writePolicy(t, dir, "package toolgate.request\n\ndecision := [\"allow\"]\n")
	e.reloadAndReport()
	e.reloadAndReport()
	if o := e.decide(ctx, someInput, time.Minute, "arguments"); o.Action != gateway.ActionDeny || o.Failure == "" {
		t.Fatalf("a decision that is not an object: %+v", o)
	}
}

// Holds: a symbolic link named like a policy file that points at a
// directory (of drafts, or outside the policy) is not loaded as a
// directory tree (which would bring in its *_test.rego files and deeper
// directories): the policy fails to load and says so.
func TestSourceAdvSymlinkedDirectoryNamedRego(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "package toolgate.request\n\ndecision := {\"action\": \"allow\"}\n")
	drafts := t.TempDir()
	if err := os.WriteFile(filepath.Join(drafts, "draft.rego"), []byte("package toolgate.request\n\ndraft := true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(drafts, filepath.Join(dir, "drafts.rego")); err != nil {
		t.Skip("no symbolic links here:", err)
	}
	e, err := newEngine(newSource(dir), requestQuery, "test", evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err == nil {
		t.Fatalf("a directory linked as drafts.rego loaded (revision %s)", e.Revision())
	}
	t.Log(err)
}

// Attack (fixed): a policy or data file is written in place (truncated, then
// written in more than one write: an editor saving in place, scp, rsync
// --inplace, a slow network file system) and the watcher polls between
// two writes. A cut inside a rule or a value is refused and the last good
// policy stays (integration TestPolicyAttackHoldsHalfWrittenReloadKeepsLastGood),
// but a cut between two rules of a .rego file, or between two entries of
// a data.yaml, is a valid, smaller policy: it loads, with a new revision,
// and the rules and settings after the cut are off until the next poll
// (2 s by default), e.g. the second of two deny rules, or read_only for
// the second of two services. The watcher loads a changed state at once;
// it never waits for the files to be still.
// Fixed: a change to files is loaded once two polls in a row read the same content.
func TestSourceAdvHalfWrittenAtABoundaryLoads(t *testing.T) {
	const request = `package toolgate.request

decision := {"action": "deny", "reason": concat("; ", deny)} if count(deny) > 0
else := {"action": "allow"}

deny contains "read-only" if data.toolgate.settings.services[input.service.id].read_only == true
`
	const extra = "package toolgate.request\n\n" +
		"deny contains \"no deletes\" if input.tool.name == \"delete_everything\"\n\n" +
		"deny contains \"no exports\" if input.tool.name == \"export_all\"\n"
	const settings = "toolgate:\n  settings:\n    services:\n      tracker:\n        read_only: true\n      billing:\n        read_only: true\n"
	call := func(service, tool string) *ast.Term {
		return ast.MustParseTerm(fmt.Sprintf(`{"method": "tools/call", "service": {"id": %q}, "tool": {"name": %q}, "arguments": {}}`, service, tool))
	}
	for _, tc := range []struct {
		name, file, cut string
		input           *ast.Term
	}{
		{"between two rules", "site/extra.rego", extra[:strings.Index(extra, "deny contains \"no exports\"")], call("other", "export_all")},
		{"between two services", "site/data.yaml", settings[:strings.Index(settings, "      billing:")], call("billing", "write")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, text := range map[string]string{"request.rego": request, "site/extra.rego": extra, "site/data.yaml": settings} {
				path := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			e, _ := testEngine(t, dir, 0)
			ctx := context.Background()
			if o := e.decide(ctx, tc.input.Value, time.Minute, "arguments"); o.Action != gateway.ActionDeny {
				t.Fatalf("before the edit: %+v", o)
			}
			good := e.Revision()
			// The file as the watcher finds it between two writes.
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.cut), 0o644); err != nil {
				t.Fatal(err)
			}
			_ = e.reload(ctx)
			if o := e.decide(ctx, tc.input.Value, time.Minute, "arguments"); o.Action != gateway.ActionDeny {
				t.Errorf("%s cut %s was loaded at once (revision %s → %s): %+v", tc.file, tc.name, good, o.Revision, o)
			}
		})
	}
}
