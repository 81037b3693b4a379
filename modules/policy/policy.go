// Package policy holds the two policy steps of the pipeline:
// toolgate_policy (step 3) asks OPA/Rego whether a runner's message may go
// upstream — allow, deny or ask, optionally rewriting tools/call arguments —
// and hides tools/list entries the caller could never call;
// toolgate_result_policy (step 5) lets Rego allow, deny, replace or
// withhold everything the upstream sends before the runner sees it: the
// result of every request (a task's deferred tool result as its call's),
// errors, notifications and server→client requests, each on its channel
// (channels.go).
//
// A policy is a .rego file (with data.json/data.yaml beside it) or a
// directory of them, compiled once, shared across config reloads, and
// recompiled when its files change. Every decision that is not a
// well-formed allow, deny or ask — undefined, wrong shape, several values,
// an error, or over the deadline — is a deny. See policies/README.md for the
// contract.
package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/keys"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/approval"
	"github.com/toolgate/toolgate/internal/notice"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Config is what both policy steps are configured with.
type Config struct {
	// Source is the policy: a .rego file (data.json or data.yaml in the
	// same directory is loaded with it), a directory whose top-level .rego
	// files (not *_test.rego) and data files are loaded, together with those
	// of its subdirectory site (a site's own rules and settings, kept apart
	// from the shipped ones), or the https URL of an OPA bundle (.tar.gz;
	// http only to a loopback address), polled with If-None-Match, at most
	// 64 MiB downloaded and uncompressed. The data files of a directory are
	// merged at the root of data, objects key by key; a value set in two
	// files is a load error. Until a bundle is first fetched every decision
	// denies; a bundle is fetched again until it first loads. The policy's
	// revision is the SHA-256 of its files or bundle (after the bundle
	// manifest's revision: "<revision>@<digest>").
	Source string `json:"source"`

	// Query is the rule that holds the decision. Default
	// data.toolgate.request.decision for toolgate_policy and
	// data.toolgate.result.decision for toolgate_result_policy.
	Query string `json:"query,omitempty"`

	// Timeout is the evaluation deadline; a slower evaluation denies.
	// Default 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// ReloadInterval is how often the source is checked for changes. A
	// change takes effect without a restart or config reload — a change to
	// files once two checks in a row have read the same content, so that
	// files caught half-written are never in force; a broken
	// change is logged (with its file and line) and counted in
	// toolgate_policy_load_failures_total, and the last good policy stays.
	// Default 2s for files, 30s for bundles; a negative value turns
	// watching off.
	ReloadInterval caddy.Duration `json:"reload_interval,omitempty"`

	// LogPayloads adds the arguments (request stage) or the result (result
	// stage) to each audit entry. Off by default: payloads may hold
	// personal data and secrets. When on, the policy may define
	// data.toolgate.log.mask, a set of JSON pointers such as
	// "/arguments/password" or "/result/structuredContent/token", evaluated
	// with the same input; those values are logged as "[masked]".
	LogPayloads bool `json:"log_payloads,omitempty"`

	// ApprovalWait (toolgate_policy only) holds a call that needs an
	// approval open for up to this long, when the runner accepts an SSE
	// answer: the runner is told on the stream where the approval is
	// decided (a log message, and a progress notification when the call
	// has a progress token), and the call goes on the moment it is
	// approved — or ends with the denial, or, when the wait is over, with
	// the pending answer it would have had at once. Off by default; at
	// most 1h.
	ApprovalWait caddy.Duration `json:"approval_wait,omitempty"`

	// LogInput adds to each audit entry the whole policy input the gateway
	// built (under "input"), so policy authors see exactly what their rules
	// read, and can replay it with toolgate policy eval. Off by default, for
	// the same reasons as LogPayloads, and masked the same way: every
	// pointer of data.toolgate.log.mask (pointers into the input, such as
	// "/arguments/password") is logged as "[masked]"; the session id is
	// logged as its reference (as the audit entry's session field).
	LogInput bool `json:"log_input,omitempty"`

	// Evaluator is what evaluates the decision rule: "plan" (the default)
	// runs the plan OPA's planner makes of it when the policy is loaded —
	// the same rules and built-ins, several times faster than OPA's
	// evaluator —, falling back to OPA's evaluator (with a warning in the
	// log) for a policy whose plan uses what it cannot run; "topdown"
	// always uses OPA's evaluator.
	Evaluator string `json:"evaluator,omitempty"`

	// VerificationKey (bundle sources only) is a file holding the PEM
	// public key (or, for the HS algorithms, the shared secret) that signs
	// the bundle: a bundle is loaded only if its .signatures.json verifies
	// with it and covers every file (OPA's bundle signing, as `opa build
	// --signing-key` makes it); an unsigned or altered bundle is a load
	// failure. Without it, a bundle is trusted as served over https.
	VerificationKey string `json:"verification_key,omitempty"`
	// VerificationAlgorithm is the signature's algorithm: RS256 (the
	// default), RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512,
	// HS256, HS384 or HS512.
	VerificationAlgorithm string `json:"verification_algorithm,omitempty"`

	stage     string
	engine    *engine
	poolKey   string
	app       *gateway.App
	approvals *approval.Manager // nil without a cipher: asks cannot be approved
	notices   *notice.Board
	audit     *zap.Logger
	logger    *zap.Logger
}

const (
	defaultTimeout        = 100 * time.Millisecond
	defaultReloadInterval = 2 * time.Second
	defaultBundleInterval = 30 * time.Second
)

// enginePool shares compiled policies across config reloads.
var enginePool = caddy.NewUsagePool()

func (c *Config) provision(ctx caddy.Context, stage, defaultQuery string) error {
	c.logger = ctx.Logger()
	c.stage = stage
	c.audit = caddy.Log().Named("toolgate.audit")
	app, err := gateway.AppFor(ctx)
	if err != nil {
		return err
	}
	step := gateway.StepPolicy
	if stage == stageResult {
		step = gateway.StepResultPolicy
	}
	if err := app.ProvisionStep(step); err != nil {
		return err
	}
	if c.Source == "" {
		return fmt.Errorf("%s: a policy source (a .rego file or a directory) is required", stage)
	}
	if c.Query == "" {
		c.Query = defaultQuery
	}
	if c.Timeout == 0 {
		c.Timeout = caddy.Duration(defaultTimeout)
	}
	if err := policyMetrics.register(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	if err := checkSource(c.Source); err != nil {
		return fmt.Errorf("%s: %w", stage, err)
	}
	location := c.Source
	remote := newSource(location).remote()
	if !remote {
		abs, err := filepath.Abs(location)
		if err != nil {
			return err
		}
		location = abs
	}
	interval := time.Duration(c.ReloadInterval)
	switch {
	case interval < 0:
		interval = 0
	case interval == 0 && remote:
		interval = defaultBundleInterval
	case interval == 0:
		interval = defaultReloadInterval
	}
	if c.Evaluator == "" {
		c.Evaluator = evaluatorPlan
	}
	if err := c.validate(); err != nil {
		return err // before a policy is compiled for nothing
	}
	verify, keyDigest, err := c.verification(remote)
	if err != nil {
		return fmt.Errorf("%s: %w", stage, err)
	}
	c.poolKey = fmt.Sprintf("%s\x00%s\x00%s\x00%d\x00%s\x00%s", stage, location, c.Query, interval, c.Evaluator, keyDigest)
	v, running, err := enginePool.LoadOrNew(c.poolKey, func() (caddy.Destructor, error) {
		src := newSource(location)
		if b, ok := src.(*bundleSource); ok {
			b.verify = verify
		}
		return newEngine(src, c.Query, stage, c.Evaluator, interval, c.logger, policyMetrics)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", stage, err)
	}
	c.engine = v.(*engine)
	if running {
		// A reload keeps the running engine, which follows its files on
		// its own and keeps the last good policy when a change does not
		// load. The reload is refused when the files as they are now do
		// not load, as `toolgate validate` and a restart would refuse
		// them: told nothing, an operator would learn it at the next
		// restart, which fails.
		if err := c.engine.checkFiles(); err != nil {
			return fmt.Errorf("%s: the policy files as they are now do not load (the running policy stays the last one that did): %w", stage, err)
		}
	}
	// Watching (and fetching a bundle) starts with the toolgate app, so
	// that `caddy validate` does no network I/O and starts nothing. A
	// shared engine logs through the logger of the config that runs now:
	// after a reload that changes log outputs, its messages go to the new
	// ones.
	c.app = app
	if c.app.Cipher() != nil {
		if c.approvals, err = approval.For(ctx, c.app); err != nil {
			return err
		}
		c.notices = notice.For(c.app) // in Provision: it follows other replicas from the app's start
	}
	logger := c.logger
	c.app.OnStart(func() {
		c.app.OnStop(c.engine.setLogger(logger))
		registry := c.app.Registry()
		c.app.OnStop(c.engine.setServices(func(id string) bool { return registry.Lookup(id) != nil }))
		c.engine.checkServices()
		c.engine.start()
	})
	return nil
}

// defaultVerificationAlgorithm is a bundle signature's algorithm when
// verification_key names none (OPA's default).
const defaultVerificationAlgorithm = "RS256"

// verification reads verification_key: what verifies the bundle's
// signature (nil without the option), and a digest of the key, which
// tells pooled engines of different keys apart.
func (c *Config) verification(remote bool) (*bundle.VerificationConfig, string, error) {
	if c.VerificationKey == "" {
		return nil, "", nil
	}
	if !remote {
		return nil, "", errors.New("verification_key verifies bundles: the policy source is a local file or directory")
	}
	key, err := os.ReadFile(c.VerificationKey)
	if err != nil {
		return nil, "", fmt.Errorf("verification_key: %w", err)
	}
	alg := c.VerificationAlgorithm
	if alg == "" {
		alg = defaultVerificationAlgorithm
	}
	if !keys.IsSupportedAlgorithm(alg) {
		return nil, "", fmt.Errorf("verification_key: unknown algorithm %q (RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, HS256, HS384 or HS512)", alg)
	}
	if !strings.HasPrefix(alg, "HS") {
		if block, _ := pem.Decode(key); block == nil {
			return nil, "", fmt.Errorf("verification_key: %s holds no PEM public key", c.VerificationKey)
		}
	}
	const id = "toolgate" // the one key verifies whatever key id a signature names
	vc := bundle.NewVerificationConfig(map[string]*bundle.KeyConfig{id: {Key: string(key), Algorithm: alg}}, id, "", nil)
	sum := sha256.Sum256(append([]byte(alg+"\x00"), key...))
	return vc, hex.EncodeToString(sum[:]), nil
}

func (c *Config) validate() error {
	if c.Timeout < 0 {
		return fmt.Errorf("%s: timeout must be positive", c.stage)
	}
	if c.Evaluator != evaluatorPlan && c.Evaluator != evaluatorTopdown {
		return fmt.Errorf("%s: evaluator must be %s or %s, not %q", c.stage, evaluatorPlan, evaluatorTopdown, c.Evaluator)
	}
	switch {
	case c.ApprovalWait != 0 && c.stage == stageResult:
		return fmt.Errorf("%s: approval_wait belongs to toolgate_policy (a withheld result is not held open)", c.stage)
	case c.ApprovalWait < 0 || time.Duration(c.ApprovalWait) > maxApprovalWait:
		return fmt.Errorf("%s: approval_wait must be between 0 (off) and %s", c.stage, maxApprovalWait)
	}
	return nil
}

func (c *Config) cleanup() error {
	if c.engine != nil {
		_, err := enginePool.Delete(c.poolKey)
		return err
	}
	return nil
}

// digest returns the SHA-256 of subject for its audit entry (nil when no
// audit entry is written). A large subject (a tool result) is hashed on
// another goroutine, started now, so that the hash (about half a
// millisecond per megabyte) overlaps the policy evaluation instead of
// following it. The returned function must be called at most once.
func (c *Config) digest(subject []byte) func() [sha256.Size]byte {
	if !c.audit.Core().Enabled(zap.InfoLevel) {
		return nil
	}
	if len(subject) < asyncDigestMin {
		return func() [sha256.Size]byte { return sha256.Sum256(subject) }
	}
	ch := make(chan [sha256.Size]byte, 1)
	go func() { ch <- sha256.Sum256(subject) }()
	return func() [sha256.Size]byte { return <-ch }
}

// asyncDigestMin is the size from which digest hashes on another goroutine.
const asyncDigestMin = 64 << 10

// newDecision turns an outcome into the call's decision, counts it and
// writes the audit entry. sum, when not nil, is subject's digest.
func (c *Config) newDecision(ctx context.Context, call *gateway.Call, o *outcome, stage string, subject []byte, sum func() [sha256.Size]byte, input ast.Value) *gateway.Decision {
	return c.newDecisionWithID(ctx, gateway.NewID(), call, o, stage, subject, sum, input, "")
}

// reasonUnsearched stands for a decision's reason that could not be
// searched for the caller's credential (EachCallSecret failed).
const reasonUnsearched = "the policy's reason is not shown: toolgate could not read the caller's credential to look for it there"

// newDecisionWithID is newDecision for a decision whose id was drawn
// before (the result stage writes it into the result it returns), on the
// result stage's channel ("" for the request stage).
func (c *Config) newDecisionWithID(ctx context.Context, id string, call *gateway.Call, o *outcome, stage string, subject []byte, sum func() [sha256.Size]byte, input ast.Value, channel string) *gateway.Decision {
	// The reason is the policy's text, which it may have made of the
	// upstream's: joined from pieces, the credential the upstream wrote
	// back split so that no search of its message found it is whole. It is
	// taken out of o itself, whose reason the caller goes on to give the
	// runner, an approval or a refusal.
	redact := func(secret string) bool {
		if strings.Contains(o.Reason, secret) {
			o.Reason = strings.ReplaceAll(o.Reason, secret, gateway.CredentialRedaction)
		}
		return true
	}
	if c.app == nil {
		call.Credential.EachSecret(redact)
	} else if err := c.app.EachCallSecret(call, redact); err != nil && o.Reason != "" {
		o.Reason = reasonUnsearched // it may hold a token toolgate could not read to look for
	}
	d := &gateway.Decision{ID: id, Action: o.Action, Reason: o.Reason}
	policyMetrics.decided(stage, call.Service.ID, o.Action, o.Duration, o.recalled)
	tool := call.Message.Name
	if stage == stageListing {
		tool = gjson.ParseBytes(subject).String() // the hidden tool, whose name is the subject
	}
	if c.app != nil {
		c.app.RecordDecision(gateway.DecisionRecord{Time: time.Now().UTC(), User: call.Caller.User, Service: call.Service.ID,
			Method: call.Method, Tool: tool, Stage: stage, Channel: channel, Action: o.Action, Reason: o.Reason,
			DecisionID: d.ID, Revision: o.Revision})
	}
	if ce := c.audit.Check(zap.InfoLevel, "policy decision"); ce != nil {
		if sum == nil {
			sum = c.digest(subject)
		}
		sum := sum()
		fp := auditFields.Get().(*[]zap.Field)
		fields := append((*fp)[:0],
			zap.String("decision_id", d.ID),
			zap.String("revision", o.Revision),
			zap.String("stage", stage),
			zap.String("user", call.Caller.User),
			zap.String("session", sessionRefs.get(call.Session, func(s *gateway.Session) string { return sessionRef(s.ID) })),
			zap.String("service", call.Service.ID),
			zap.String("method", call.Method),
			zap.String("tool", tool),
			zap.String("action", o.Action),
			zap.String("reason", o.Reason),
			zap.String(subjectField(stage), hex.EncodeToString(sum[:])),
			zap.Duration("duration", o.Duration),
		)
		if channel != "" {
			fields = append(fields, zap.String("channel", channel))
		}
		if o.Failure != "" {
			fields = append(fields, zap.String("failure", o.Failure))
		}
		if c.LogPayloads && stage != stageListing {
			fields = append(fields, zap.Any(payloadField(stage), c.engine.maskedPayload(ctx, input, stage, subject)))
		}
		if o.upstream != nil {
			// The policy rewrote the arguments: what went upstream.
			up := sha256.Sum256(o.upstream)
			fields = append(fields, zap.String("upstream_arguments_sha256", hex.EncodeToString(up[:])))
			if c.LogPayloads {
				fields = append(fields, zap.Any("upstream_arguments", c.engine.maskedPayload(ctx, withArguments(input, o.argsTerm), stage, o.upstream)))
			}
		}
		if c.LogInput && input != nil {
			fields = append(fields, zap.Any("input", c.engine.maskedInput(ctx, input)))
		}
		ce.Write(fields...)
		clear(fields) // the pool keeps no payload alive
		*fp = fields[:0]
		auditFields.Put(fp)
	}
	return d
}

// auditFields holds the field lists of audit entries between entries: two
// per call, each a kilobyte. zap's cores encode an entry's fields during
// Write and keep none of them (those that keep fields, like zaptest's
// observer, copy them), so a list can serve the next entry once written.
var auditFields = sync.Pool{New: func() any {
	fields := make([]zap.Field, 0, 16) // room for every field of an entry
	return &fields
}}

// sessionRefs holds each session's sessionRef for as long as the session
// lives (see weakCache): two audit entries per call would hash its id.
var sessionRefs weakCache[gateway.Session, string]

// sessionRef identifies a session in the audit log without revealing its
// id (gateway.AuditSessionRef).
func sessionRef(id string) string { return gateway.AuditSessionRef(id) }

func payloadField(stage string) string {
	if stage == stageResult {
		return "result"
	}
	return "arguments"
}

func subjectField(stage string) string {
	if stage == stageResult {
		return "result_sha256"
	}
	return "arguments_sha256"
}

const (
	stageRequest = "request"
	stageListing = "listing"
	stageResult  = "result"
)
