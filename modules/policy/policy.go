// Package policy holds the two policy steps of the pipeline:
// toolgate_policy (step 3) asks OPA/Rego whether a runner's message may go
// upstream — allow, deny or ask, optionally rewriting tools/call arguments —
// and hides tools/list entries the caller could never call;
// toolgate_result_policy (step 5) lets Rego allow, deny, replace or
// withhold a tools/call result before the runner sees it.
//
// A policy is a .rego file (with data.json/data.yaml beside it) or a
// directory of them, compiled once, shared across config reloads, and
// recompiled when its files change. Every decision that is not a
// well-formed allow, deny or ask — undefined, wrong shape, several values,
// an error, or over the deadline — is a deny. See policies/README.md for the
// contract.
package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/modules/gateway"
)

// Config is what both policy steps are configured with.
type Config struct {
	// Source is the policy: a .rego file (data.json or data.yaml in the
	// same directory is loaded with it) or a directory whose top-level
	// .rego files (not *_test.rego) and data files are loaded.
	Source string `json:"source"`

	// Query is the rule that holds the decision. Default
	// data.toolgate.request.decision for toolgate_policy and
	// data.toolgate.result.decision for toolgate_result_policy.
	Query string `json:"query,omitempty"`

	// Timeout is the evaluation deadline; a slower evaluation denies.
	// Default 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// ReloadInterval is how often the policy files are checked for changes.
	// A change takes effect without a restart or config reload; a broken
	// change is logged and the last good policy stays. Default 2s; a
	// negative value turns watching off.
	ReloadInterval caddy.Duration `json:"reload_interval,omitempty"`

	stage   string
	engine  *engine
	poolKey string
	audit   *zap.Logger
	logger  *zap.Logger
}

const (
	defaultTimeout        = 100 * time.Millisecond
	defaultReloadInterval = 2 * time.Second
)

// enginePool shares compiled policies across config reloads.
var enginePool = caddy.NewUsagePool()

func (c *Config) provision(ctx caddy.Context, stage, defaultQuery string) error {
	c.logger = ctx.Logger()
	c.stage = stage
	c.audit = caddy.Log().Named("toolgate.audit")
	if c.Source == "" {
		return fmt.Errorf("%s: a policy source (a .rego file or a directory) is required", stage)
	}
	if c.Query == "" {
		c.Query = defaultQuery
	}
	if c.Timeout == 0 {
		c.Timeout = caddy.Duration(defaultTimeout)
	}
	if c.ReloadInterval == 0 {
		c.ReloadInterval = caddy.Duration(defaultReloadInterval)
	}
	if err := policyMetrics.register(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	source, err := filepath.Abs(c.Source)
	if err != nil {
		return err
	}
	interval := time.Duration(c.ReloadInterval)
	if interval < 0 {
		interval = 0
	}
	c.poolKey = fmt.Sprintf("%s\x00%s\x00%s\x00%d", stage, source, c.Query, interval)
	v, _, err := enginePool.LoadOrNew(c.poolKey, func() (caddy.Destructor, error) {
		return newEngine(source, c.Query, stage, interval, c.logger, policyMetrics)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", stage, err)
	}
	c.engine = v.(*engine)
	return nil
}

func (c *Config) validate() error {
	if c.Timeout < 0 {
		return fmt.Errorf("%s: timeout must be positive", c.stage)
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

// newDecision turns an outcome into the call's decision, counts it and
// writes the audit entry.
func (c *Config) newDecision(call *gateway.Call, o outcome, stage string, subject []byte) *gateway.Decision {
	d := &gateway.Decision{ID: gateway.NewID(), Action: o.Action, Reason: o.Reason}
	policyMetrics.decisions.WithLabelValues(stage, call.Service.ID, o.Action).Inc()
	policyMetrics.duration.WithLabelValues(stage).Observe(o.Duration.Seconds())
	if ce := c.audit.Check(zap.InfoLevel, "policy decision"); ce != nil {
		sum := sha256.Sum256(subject)
		fields := []zap.Field{
			zap.String("decision_id", d.ID),
			zap.String("revision", o.Revision),
			zap.String("stage", stage),
			zap.String("user", call.Caller.User),
			zap.String("session", sessionRef(call.Session.ID)),
			zap.String("service", call.Service.ID),
			zap.String("method", call.Method),
			zap.String("tool", call.Message.Name),
			zap.String("action", o.Action),
			zap.String("reason", o.Reason),
			zap.String(subjectField(stage), hex.EncodeToString(sum[:])),
			zap.Duration("duration", o.Duration),
		}
		if o.Failure != "" {
			fields = append(fields, zap.String("failure", o.Failure))
		}
		ce.Write(fields...)
	}
	return d
}

// sessionRef identifies a session in the audit log without revealing its id:
// the first 16 hex digits of the id's SHA-256.
func sessionRef(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:8])
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
