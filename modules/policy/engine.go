package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	opametrics "github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/regoplan"
	"github.com/toolgate/toolgate/modules/gateway"
)

// engine is a compiled policy and the watcher that recompiles it when its
// source changes. Engines are shared across config reloads through a
// caddy.UsagePool keyed by their configuration, so an unchanged policy is
// not recompiled by a reload.
type engine struct {
	source    source
	query     string
	evaluator string // evaluatorPlan or evaluatorTopdown
	interval  time.Duration
	log       atomic.Pointer[zap.Logger]
	services  atomic.Pointer[serviceIDs] // the registry's, of the config that started the engine last
	metrics   *metrics
	stage     string

	current   atomic.Pointer[compiled]
	startOnce sync.Once
	stop      chan struct{}
}

// compiled is one successfully prepared version of the policy.
type compiled struct {
	// query is OPA's prepared query, which decisions run when there is no
	// program; nil when there is one. It holds OPA's compiler and with it
	// the policy's syntax trees, small objects full of pointers that the
	// garbage collector would mark on every cycle for nothing: with the
	// default policies toolgate's heap after start is 7.0 MiB in 42,000
	// objects without them, 11.5 MiB in 144,000 with them (see README,
	// "Performance").
	query *rego.PreparedEvalQuery
	// program is the query's plan, which decisions run when there is one
	// (see package regoplan); data is what it reads as data.
	program  *regoplan.Program
	data     *ast.Term
	planNote string // why there is no program
	// services are the service ids the settings name
	// (data.toolgate.settings.services), checked against the registry.
	services []string
	scanNote string // why the policy gets no result scan though it has the settings
	// mask is data.toolgate.log.mask, when the policy defines it (it
	// keeps the compiler too).
	mask     *rego.PreparedEvalQuery
	scanner  *scanner // the result scan's settings, when the policy has them
	revision string
}

// newEngine prepares a policy. A local source is compiled now, so `caddy
// validate` reports a broken policy; a remote bundle is first fetched when
// the engine starts.
func newEngine(src source, query, stage, evaluator string, interval time.Duration, logger *zap.Logger, m *metrics) (*engine, error) {
	e := &engine{source: src, query: query, stage: stage, evaluator: evaluator, interval: interval, metrics: m, stop: make(chan struct{})}
	e.log.Store(logger)
	if !src.remote() {
		if err := e.reload(context.Background()); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// logger is the logger of the config that started the engine last.
func (e *engine) logger() *zap.Logger { return e.log.Load() }

// setLogger makes the engine log through logger from now on, and returns
// a function that gives the engine back the logger it had, unless another
// was set since (for a config whose load is abandoned after it started).
func (e *engine) setLogger(logger *zap.Logger) (restore func()) {
	prev := e.log.Swap(logger)
	return func() {
		if prev != nil {
			e.log.CompareAndSwap(logger, prev)
		}
	}
}

// serviceIDs reports whether the registry has a service of an id.
type serviceIDs func(id string) bool

// setServices makes the engine check the services its settings name
// against has from now on (checkServices), as setLogger.
func (e *engine) setServices(has serviceIDs) (restore func()) {
	p := &has
	prev := e.services.Swap(p)
	return func() {
		if prev != nil {
			e.services.CompareAndSwap(p, prev)
		}
	}
}

// checkServices warns of settings for a service the registry does not
// have (a misspelled id): they apply to nothing, and a protection meant
// for the service, read_only say, is not in force. Not an error: the
// registry and the policies change apart (a reload may remove a service
// its settings outlive).
func (e *engine) checkServices() {
	c, has := e.current.Load(), e.services.Load()
	if c == nil || has == nil {
		return
	}
	for _, id := range c.services {
		if !(*has)(id) {
			e.logger().Warn("the policy's settings name a service the registry does not have: they apply to nothing", zap.String("stage", e.stage),
				zap.Stringer("source", e.source), zap.String("revision", c.revision), zap.String("setting", "settings.services."+id))
		}
	}
}

// settingsServices are the keys of data.toolgate.settings.services.
func settingsServices(data map[string]any) []string {
	tg, _ := data["toolgate"].(map[string]any)
	settings, _ := tg["settings"].(map[string]any)
	services, _ := settings["services"].(map[string]any)
	ids := make([]string, 0, len(services))
	for id := range services {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// start begins watching the source (and fetches a remote bundle). It runs
// from the toolgate app's Start, never from Provision; calling it again
// (after a config reload) does nothing.
func (e *engine) start() {
	e.startOnce.Do(func() {
		if e.interval > 0 || e.source.remote() {
			go e.watch()
		}
	})
}

// Destruct stops the watcher (caddy.Destructor).
func (e *engine) Destruct() error {
	close(e.stop)
	return nil
}

// Revision identifies the policy version in use ("" before the first load).
func (e *engine) Revision() string {
	if c := e.current.Load(); c != nil {
		return c.revision
	}
	return ""
}

// firstLoadRetryMax bounds the wait between attempts at a bundle's first
// load.
const firstLoadRetryMax = 30 * time.Second

// watch polls the source and recompiles when it changes. A version that
// fails to load or compile is logged with its file and line, counted in the
// load-failure metric, and the last good version stays in force.
//
// A bundle is fetched at once, and until it first loads, again and again
// (1 s apart, doubling up to 30 s) even with reload_interval off, which
// stops looking for changes, not the first load: with no policy every
// call is denied, and a configuration reload keeps this engine.
func (e *engine) watch() {
	if e.source.remote() {
		for wait := time.Second; ; wait = min(2*wait, firstLoadRetryMax) {
			if e.reloadAndReport(); e.current.Load() != nil {
				break
			}
			select {
			case <-e.stop:
				return
			case <-time.After(wait):
			}
		}
	}
	if e.interval <= 0 {
		return
	}
	t := time.NewTicker(e.interval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.reloadAndReport()
		}
	}
}

func (e *engine) reloadAndReport() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.reload(ctx); err != nil {
		e.metrics.loadFailures.WithLabelValues(e.stage).Inc()
		e.logger().Error("policy load failed; keeping the last good policy", zap.String("stage", e.stage),
			zap.Stringer("source", e.source), zap.String("revision", e.Revision()), zap.Error(err))
	}
}

// checkFiles loads and compiles the engine's policy files as they are now,
// apart from the engine, which goes on with what it has. A bundle (fetched
// over the network, which provisioning does not do) is not checked.
func (e *engine) checkFiles() error {
	f, ok := e.source.(*fileSource)
	if !ok {
		return nil
	}
	v, err := (&fileSource{path: f.path}).load(context.Background())
	if err != nil {
		return err
	}
	_, err = e.compile(v)
	return err
}

// reload loads the source and swaps in the new version if it changed.
func (e *engine) reload(ctx context.Context) error {
	v, err := e.source.load(ctx)
	if err != nil || v == nil {
		return err
	}
	c, err := e.compile(v)
	if err != nil {
		return err
	}
	old := e.current.Swap(c)
	if old != nil {
		e.logger().Info("policy reloaded", zap.String("stage", e.stage), zap.Stringer("source", e.source),
			zap.String("old_revision", old.revision), zap.String("revision", c.revision))
	}
	e.checkServices()
	if c.planNote != "" && (old == nil || old.planNote != c.planNote) {
		e.logger().Warn("the policy runs on OPA's evaluator (slower): its plan cannot be run", zap.String("stage", e.stage),
			zap.Stringer("source", e.source), zap.String("revision", c.revision), zap.String("why", c.planNote))
	}
	if c.scanNote != "" && (old == nil || old.scanNote != c.scanNote) {
		e.logger().Warn("the result policy reads every string of a result (slower): it gets no result scan", zap.String("stage", e.stage),
			zap.Stringer("source", e.source), zap.String("revision", c.revision), zap.String("why", c.scanNote))
	}
	return nil
}

// compiling serializes compilations in the process: OPA's type checker
// writes type objects that two compilations at once share (a config
// reload's engines compiling while the running ones reload a changed
// policy raced there). Compilations are rare: at start, reload and change.
var compiling sync.Mutex

func (e *engine) compile(v *version) (*compiled, error) {
	compiling.Lock()
	defer compiling.Unlock()
	compiler := ast.NewCompiler()
	compiler.Compile(v.modules)
	if compiler.Failed() {
		return nil, compiler.Errors
	}
	ref, err := ast.ParseRef(e.query)
	if err != nil {
		return nil, fmt.Errorf("query %q: %v", e.query, err)
	}
	if len(compiler.GetRulesExact(ref)) == 0 {
		return nil, fmt.Errorf("policy %s (revision %s) defines no rule %s", e.source, v.revision, e.query)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The data documents are kept as AST values, so an evaluation reads
	// settings without converting them, and decisions come back as AST
	// (decide reads them as they are).
	store := inmem.NewFromObjectWithOpts(v.data, inmem.OptReturnASTValuesOnRead(true))
	// Prepared even when the plan will run the decisions (it is dropped
	// then): a policy loads only if OPA's own evaluator accepts it too,
	// whichever evaluator runs it.
	pq, err := rego.New(rego.Query(e.query), rego.Compiler(compiler), rego.Store(store),
		rego.GenerateJSON(keepAST)).PrepareForEval(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkSettings(ctx, compiler, store); err != nil {
		return nil, fmt.Errorf("policy %s (revision %s): %w", e.source, v.revision, err)
	}
	c := &compiled{revision: v.revision, services: settingsServices(v.data)}
	if e.evaluator != evaluatorTopdown {
		c.program, c.data, c.planNote = planned(ctx, compiler, e.query, v.data)
	}
	if c.program == nil {
		c.query = &pq
	}
	if c.scanner, c.scanNote, err = loadScanner(ctx, compiler, store, e.query); err != nil {
		return nil, err
	}
	if len(compiler.GetRulesExact(ast.MustParseRef(maskQuery))) > 0 {
		mq, err := rego.New(rego.Query(maskQuery), rego.Compiler(compiler), rego.Store(store)).PrepareForEval(ctx)
		if err != nil {
			return nil, err
		}
		c.mask = &mq
	}
	return c, nil
}

// settingsErrorsQuery names the rule that checks the policy's data: a set
// of messages, each naming a setting that is wrong (policies/settings.rego).
const settingsErrorsQuery = "data.toolgate.config.errors"

// checkSettings refuses a policy whose settings check finds errors, so that
// a wrongly typed setting is a load error naming it rather than a
// protection silently switched off. A policy without the rule is not
// checked.
func checkSettings(ctx context.Context, compiler *ast.Compiler, store storage.Store) error {
	v, err := evalConstant(ctx, compiler, store, settingsErrorsQuery)
	if err != nil || v == nil {
		return err
	}
	list, ok := v.([]any)
	if !ok {
		return fmt.Errorf("%s must be a set of messages", settingsErrorsQuery)
	}
	var msgs []string
	for _, m := range list {
		msgs = append(msgs, fmt.Sprint(m))
	}
	if len(msgs) == 0 {
		return nil
	}
	slices.Sort(msgs)
	return fmt.Errorf("invalid settings: %s", strings.Join(msgs, "; "))
}

// evalConstant evaluates a rule that does not depend on input; nil when it
// is undefined.
func evalConstant(ctx context.Context, compiler *ast.Compiler, store storage.Store, query string) (any, error) {
	if len(compiler.GetRulesExact(ast.MustParseRef(query))) == 0 {
		return nil, nil
	}
	rs, err := rego.New(rego.Query(query), rego.Compiler(compiler), rego.Store(store)).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", query, err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return nil, nil
	}
	return rs[0].Expressions[0].Value, nil
}

// Why a decision is a deny without the policy saying so.
const (
	failUndefined = "undefined"
	failMultiple  = "multiple_results"
	failMalformed = "malformed"
	failError     = "error"
	failTimeout   = "timeout"
	failNotLoaded = "not_loaded"
	// failAmbiguous: toolgate refused a tools/call whose argument names
	// fold onto one another or a parameter spelled otherwise, before the
	// policy ran (checkArgumentKeys).
	failAmbiguous = "ambiguous_arguments"
)

// keepAST makes a prepared query return its results as AST terms.
func keepAST(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }

// noMetrics is what evaluations record their metrics in: nothing (the
// gateway measures the evaluation as a whole).
var noMetrics = opametrics.NoOp()

// outcome is a policy decision as the gateway applies it.
type outcome struct {
	Action    string
	Reason    string
	Arguments map[string]any // request stage: replacement arguments, or nil
	argsTerm  *ast.Term      // the same, as the policy gave them
	Result    *ast.Term      // result stage: replacement result (an object), or nil
	Approval  []byte         // ask: the decision's approval object (JSON), or nil
	// Failure says why the decision is a deny the policy did not make
	// (one of the fail* constants); "" when the policy decided.
	Failure  string
	Revision string
	Duration time.Duration
	recalled bool // the plan recalled the value of an earlier evaluation
	// evalErr is the evaluation's error, when Failure is failError.
	evalErr error
	// upstream is the rewritten arguments' JSON text, which go upstream in
	// place of the runner's, for the audit entry; nil without a rewrite.
	upstream []byte
}

// decide evaluates the policy on input. It never fails: anything but a
// well-formed decision is a deny, with Failure saying why. replaceKey is
// the field of the decision that rewrites the payload: "arguments" (the
// request stage) or "result".
func (e *engine) decide(ctx context.Context, input ast.Value, timeout time.Duration, replaceKey string) outcome {
	return e.decideWith(ctx, e.current.Load(), input, timeout, replaceKey)
}

// decideWith is decide with the policy version c (nil: not loaded yet),
// for an input built for that version.
func (e *engine) decideWith(ctx context.Context, c *compiled, input ast.Value, timeout time.Duration, replaceKey string) outcome {
	if c == nil {
		return outcome{}.deny(failNotLoaded, "the policy has not been loaded yet")
	}
	start := time.Now()
	ev, err := c.evaluateBy(ctx, input, start.Add(timeout))
	t, n := ev.value, ev.n
	o := outcome{Revision: c.revision, Duration: time.Since(start), recalled: ev.recalled}
	switch {
	case err != nil && (ev.timedOut || errors.Is(err, context.DeadlineExceeded)):
		return o.deny(failTimeout, "the policy took longer than its deadline")
	case err != nil:
		e.logger().Warn("policy evaluation failed (toolgate policy eval, given the input log_input logs, names the rule and its line)",
			zap.String("stage", e.stage), zap.String("revision", c.revision), zap.Error(err))
		o.evalErr = err
		return o.deny(failError, "the policy failed to evaluate")
	case n == 0:
		return o.deny(failUndefined, "the policy made no decision")
	case n > 1:
		return o.deny(failMultiple, "the policy made several decisions")
	}
	if t == nil {
		return o.deny(failMalformed, "the policy decision is not an object")
	}
	d, ok := t.Value.(ast.Object)
	switch t.Value.(type) {
	case ast.Set, *ast.Array:
		// `decision contains …` (a multi-value rule) gave a collection.
		return o.deny(failMultiple, "the policy made several decisions (decision is a collection)")
	}
	if !ok {
		return o.deny(failMalformed, "the policy decision is not an object")
	}
	if malformed := o.read(d, replaceKey); malformed != "" {
		return o.deny(failMalformed, malformed)
	}
	switch o.Action { // the constants, not the input's memory
	case gateway.ActionAllow:
		o.Action = gateway.ActionAllow
	case gateway.ActionDeny:
		o.Action = gateway.ActionDeny
	case gateway.ActionAsk:
		o.Action = gateway.ActionAsk
		return o
	default:
		return o.deny(failMalformed, "the policy decision's action is not allow, deny or ask")
	}
	if o.Approval != nil {
		return o.deny(failMalformed, "the policy decision has an approval object but does not ask")
	}
	return o
}

// The fields of a decision.
var (
	keyApproval = ast.StringTerm("approval")
	keyReason   = ast.StringTerm("reason")
)

// read takes the fields of the decision d into o (replaceKey names the
// field with the rewritten payload: arguments or result); what is wrong
// with them if something is. (Looked up by name, not iterated with a
// callback, so that o stays on the stack.)
func (o *outcome) read(d ast.Object, replaceKey string) (malformed string) {
	replace := keyResult
	if replaceKey == "arguments" {
		replace = keyArguments
	}
	found := 0
	if v := d.Get(keyAction); v != nil {
		found++
		if s, ok := v.Value.(ast.String); ok {
			o.Action = string(s)
		}
	}
	if v := d.Get(keyApproval); v != nil {
		found++
		if _, ok := v.Value.(ast.Object); !ok {
			return "the policy decision's approval is not an object"
		}
		o.Approval = []byte(v.String())
	}
	if v := d.Get(keyReason); v != nil {
		found++
		s, ok := v.Value.(ast.String)
		if !ok {
			return "the policy decision's reason is not a string"
		}
		o.Reason = strings.Clone(string(s)) // the input's memory may be reused (see resultTerms)
	}
	if v := d.Get(replace); v != nil {
		found++
		if m := o.readReplaced(v, replaceKey); m != "" {
			return m
		}
	}
	if found != d.Len() {
		return unknownField(d, replace)
	}
	return ""
}

// readReplaced takes the decision's rewritten payload v (its field
// replaceKey) into o.
func (o *outcome) readReplaced(v *ast.Term, replaceKey string) (malformed string) {
	obj, ok := v.Value.(ast.Object)
	if !ok {
		return "the policy decision's " + replaceKey + " is not an object"
	}
	if replaceKey != "arguments" {
		o.Result = v
		return ""
	}
	args, err := ast.JSON(obj)
	if err != nil {
		return "the policy decision's arguments cannot be written as JSON"
	}
	o.Arguments, _ = args.(map[string]any)
	o.argsTerm = v
	return ""
}

// unknownField says which field of the decision d is none of those read.
func unknownField(d ast.Object, replace *ast.Term) string {
	var name string
	d.Until(func(k, _ *ast.Term) bool {
		switch {
		case k.Equal(keyAction), k.Equal(keyApproval), k.Equal(keyReason), k.Equal(replace):
			return false
		}
		name = k.String()
		return true
	})
	return "the policy decision has an unknown field " + name
}

func (o outcome) deny(failure, reason string) outcome {
	o.Action, o.Reason, o.Failure = gateway.ActionDeny, reason, failure
	o.Arguments, o.argsTerm, o.Result, o.Approval, o.upstream = nil, nil, nil, nil, nil
	return o
}
