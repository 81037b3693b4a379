package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// engine is a compiled policy and the watcher that recompiles it when its
// files change. Engines are shared across config reloads through a
// caddy.UsagePool keyed by their configuration, so an unchanged policy is
// not recompiled by a reload.
type engine struct {
	source   string // a .rego file or a directory
	query    string
	interval time.Duration
	logger   *zap.Logger
	metrics  *metrics
	stage    string

	current     atomic.Pointer[compiled]
	fingerprint string
	stop        chan struct{}
}

// compiled is one successfully prepared version of the policy.
type compiled struct {
	query    rego.PreparedEvalQuery
	revision string // first 12 hex digits of the SHA-256 of the policy files
}

func newEngine(source, query, stage string, interval time.Duration, logger *zap.Logger, m *metrics) (*engine, error) {
	e := &engine{source: source, query: query, stage: stage, interval: interval, logger: logger, metrics: m, stop: make(chan struct{})}
	files, fp, err := e.files()
	if err != nil {
		return nil, err
	}
	c, err := e.compile(files)
	if err != nil {
		return nil, err
	}
	e.current.Store(c)
	e.fingerprint = fp
	if interval > 0 {
		go e.watch()
	}
	return e, nil
}

// Destruct stops the watcher (caddy.Destructor).
func (e *engine) Destruct() error {
	close(e.stop)
	return nil
}

// Revision identifies the policy version in use.
func (e *engine) Revision() string { return e.current.Load().revision }

// watch polls the policy files and recompiles when they change. A policy
// that fails to compile is logged with its file and line, counted in the
// load-failure metric, and the last good version stays in force.
func (e *engine) watch() {
	t := time.NewTicker(e.interval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		files, fp, err := e.files()
		if err == nil && fp == e.fingerprint {
			continue
		}
		if err == nil {
			var c *compiled
			if c, err = e.compile(files); err == nil {
				old := e.current.Swap(c)
				e.fingerprint = fp
				e.logger.Info("policy reloaded", zap.String("stage", e.stage), zap.String("source", e.source),
					zap.String("old_revision", old.revision), zap.String("revision", c.revision))
				continue
			}
		}
		e.fingerprint = fp // report a broken version once, not every poll
		e.metrics.loadFailures.WithLabelValues(e.stage).Inc()
		e.logger.Error("policy reload failed; keeping the last good policy", zap.String("stage", e.stage),
			zap.String("source", e.source), zap.String("revision", e.Revision()), zap.Error(err))
	}
}

// files lists the policy's files: a directory's top-level .rego files
// (not _test.rego) and data.json/data.yaml, or one .rego file and the data
// files beside it. The fingerprint changes when any of them does.
func (e *engine) files() (paths []string, fingerprint string, err error) {
	info, err := os.Stat(e.source)
	if err != nil {
		return nil, "", fmt.Errorf("policy %s: %w", e.source, err)
	}
	dir := e.source
	if !info.IsDir() {
		dir = filepath.Dir(e.source)
		paths = append(paths, e.source)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, "", fmt.Errorf("policy %s: %w", e.source, err)
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

func (e *engine) compile(paths []string) (*compiled, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("policy %s: no .rego files", e.source)
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
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.Base(p), len(data))
		h.Write(data)
	}
	compiler := ast.NewCompiler()
	compiler.Compile(result.ParsedModules())
	if compiler.Failed() {
		return nil, compiler.Errors
	}
	ref, err := ast.ParseRef(e.query)
	if err != nil {
		return nil, fmt.Errorf("query %q: %v", e.query, err)
	}
	if len(compiler.GetRulesExact(ref)) == 0 {
		return nil, fmt.Errorf("policy %s defines no rule %s", e.source, e.query)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pq, err := rego.New(
		rego.Query(e.query),
		rego.Compiler(compiler),
		rego.Store(inmem.NewFromObject(result.Documents)),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, err
	}
	return &compiled{query: pq, revision: hex.EncodeToString(h.Sum(nil))[:12]}, nil
}

// Why a decision is a deny without the policy saying so.
const (
	failUndefined = "undefined"
	failMultiple  = "multiple_results"
	failMalformed = "malformed"
	failError     = "error"
	failTimeout   = "timeout"
)

// outcome is a policy decision as the gateway applies it.
type outcome struct {
	Action    string
	Reason    string
	Arguments map[string]any // request stage: replacement arguments, or nil
	Result    map[string]any // result stage: replacement result, or nil
	// Failure says why the decision is a deny the policy did not make
	// (one of the fail* constants); "" when the policy decided.
	Failure  string
	Revision string
	Duration time.Duration
}

// decide evaluates the policy on input. It never fails: anything but a
// well-formed decision is a deny, with Failure saying why.
func (e *engine) decide(ctx context.Context, input ast.Value, timeout time.Duration, replaceKey string) outcome {
	c := e.current.Load()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	rs, err := c.query.Eval(ctx, rego.EvalParsedInput(input))
	timedOut := ctx.Err() != nil
	cancel()
	o := outcome{Revision: c.revision, Duration: time.Since(start)}
	switch {
	case err != nil && (timedOut || errors.Is(err, context.DeadlineExceeded)):
		return o.deny(failTimeout, "the policy took longer than its deadline")
	case err != nil:
		e.logger.Warn("policy evaluation failed", zap.String("stage", e.stage), zap.String("revision", c.revision), zap.Error(err))
		return o.deny(failError, "the policy failed to evaluate")
	case len(rs) == 0 || len(rs[0].Expressions) == 0:
		return o.deny(failUndefined, "the policy made no decision")
	case len(rs) > 1 || len(rs[0].Expressions) > 1:
		return o.deny(failMultiple, "the policy made several decisions")
	}
	d, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return o.deny(failMalformed, "the policy decision is not an object")
	}
	for k, v := range d {
		switch k {
		case "action":
			o.Action, _ = v.(string)
		case "reason":
			if o.Reason, ok = v.(string); !ok {
				return o.deny(failMalformed, "the policy decision's reason is not a string")
			}
		case replaceKey:
			obj, isObj := v.(map[string]any)
			if !isObj {
				return o.deny(failMalformed, "the policy decision's "+replaceKey+" is not an object")
			}
			if replaceKey == "arguments" {
				o.Arguments = obj
			} else {
				o.Result = obj
			}
		default:
			return o.deny(failMalformed, "the policy decision has an unknown field "+k)
		}
	}
	switch o.Action {
	case gateway.ActionAllow, gateway.ActionDeny, gateway.ActionAsk:
		return o
	}
	return o.deny(failMalformed, "the policy decision's action is not allow, deny or ask")
}

func (o outcome) deny(failure, reason string) outcome {
	o.Action, o.Reason, o.Failure = gateway.ActionDeny, reason, failure
	o.Arguments, o.Result = nil, nil
	return o
}
