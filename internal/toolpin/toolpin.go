// Package toolpin protects runners against rug pulls: an upstream that shows
// a harmless tool, gets it approved and trusted, then changes what the tool
// says it does (its description, its schema, its annotations) to steer the
// model. toolgate pins each tool's definition per service — the digest of
// its name, title, description, input and output schema and annotations,
// and of the MCP Apps interface its _meta names — the first time it sees it, or takes the digest from the registry (pin
// <tool> sha256:…). A definition that differs from the pin is hidden from
// tools/list and its calls are refused with a reason that says so; the
// change is audited with both digests and kept for an administrator, who
// reads the new definition and accepts it (GET /v1/tool-pins, POST
// /v1/tool-pins/accept); a tool the registry pins changes only with its
// pin line.
//
// Pins live in the gateway's storage, shared by replicas, and are read
// through a cache of cache_ttl. The policy sees a tool's digest and whether
// the registry pins it (input.tool.digest, input.tool.pinned).
package toolpin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	gateway.RegisterOption(option, parseOption)
}

// option is the toolgate global option that configures pinning.
const option = "tool_pins"

// Config is the tool_pins option:
//
//	tool_pins off
//	tool_pins {
//		admin_groups <group>...
//	}
type Config struct {
	// Off turns pinning off: definitions may change freely.
	Off bool `json:"off,omitempty"`
	// AdminGroups are the groups whose members may list pins and accept
	// changed definitions. Default admins (as the console's admin_groups).
	AdminGroups []string `json:"admin_groups,omitempty"`
}

func parseOption(d *caddyfile.Dispenser) (*Config, error) {
	cfg := new(Config)
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return nil, d.Errf("tool_pins: want off, or a block")
		}
		cfg.Off = true
		return cfg, nil
	}
	err := caddyopt.Block(d, "tool_pins", func(name string) error {
		switch name {
		case "admin_groups":
			if cfg.AdminGroups = d.RemainingArgs(); len(cfg.AdminGroups) == 0 {
				return d.ArgErr()
			}
			return nil
		}
		return caddyopt.Unknown(d, "tool_pins")
	})
	return cfg, err
}

// defaultAdminGroup may accept changes when admin_groups is not set.
const defaultAdminGroup = "admins"

// Pins checks tool definitions against their pins, for one config.
type Pins struct {
	cfg     Config
	store   *store
	digests digests
	audit   *zap.Logger
	logger  *zap.Logger
}

// For returns the pins of app's config, made on first use. Handlers call
// it in Provision.
func For(app *gateway.App) (*Pins, error) {
	v, err := app.Shared(option, func() (any, error) {
		p := &Pins{audit: caddy.Log().Named("toolgate.audit"), logger: app.Logger().Named("tool_pins"),
			store: newStore(app.Storage(), time.Duration(app.CacheTTL))}
		if raw := app.Extension(option); raw != nil {
			if err := json.Unmarshal(raw, &p.cfg); err != nil {
				return nil, fmt.Errorf("tool_pins: %v", err)
			}
		}
		if len(p.cfg.AdminGroups) == 0 {
			p.cfg.AdminGroups = []string{defaultAdminGroup}
		}
		app.OnStart(func() {
			if err := p.store.watch.Follow(app.Done(), p.logger); err != nil {
				p.logger.Warn("pin changes through other replicas are seen after cache_ttl", zap.Error(err))
			}
		})
		return p, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Pins), nil
}

// Verdict is what the pin says of a definition.
type Verdict struct {
	OK     bool
	Digest string // the definition's
	Pinned string // the pinned digest, when it differs
	// Registry reports that the registry pins the tool.
	Registry bool
	// Relist reports a call refused until the caller lists the tools
	// again (see check).
	Relist bool
	// Stale (with Relist) reports that the definition the session listed
	// is one an acceptance replaced (Digest is the listed one's).
	Stale bool
	// WithoutMeta reports that the pin is the digest of this very
	// definition as versions that pinned no member of _meta computed it
	// (a pin line written then, or a record that kept no definition):
	// what differs is only that the pin says nothing of its MCP Apps
	// interface.
	WithoutMeta bool
}

// Reason says why a definition that differs is refused, and what to do.
func (v Verdict) Reason(service, tool string) string {
	if v.Stale {
		return fmt.Sprintf("the definition of tool %s of service %s that this session listed (%s) was replaced since by an administrator's acceptance (%s); list the tools again (tools/list)",
			tool, service, v.Digest, v.Pinned)
	}
	if v.Relist {
		return fmt.Sprintf("a changed definition of tool %s of service %s (%s) was seen since this session listed its tools; list them again (tools/list): the tool stays callable for those it still shows its pinned definition (%s)",
			tool, service, v.Digest, v.Pinned)
	}
	fix := "an administrator accepts the change (GET /v1/tool-pins shows it, POST /v1/tool-pins/accept accepts it)"
	if v.Registry {
		fix = "an administrator changes its pin in the service's configuration"
	}
	if v.WithoutMeta {
		return fmt.Sprintf("the pin of tool %s of service %s (%s) is the digest of this definition without its MCP Apps interface (_meta.ui), which pins cover since; it stays hidden and refused until %s (this definition's digest is %s)",
			tool, service, v.Pinned, fix, v.Digest)
	}
	return fmt.Sprintf("the definition of tool %s of service %s changed since it was pinned (pinned %s, now %s); it stays hidden and refused until %s",
		tool, service, v.Pinned, v.Digest, fix)
}

// Check checks svc's tool name, defined by raw (the tool object as the
// upstream listed it to a runner), against its pin. A tool seen for the
// first time is pinned now; a definition that differs is recorded (once
// per digest) and audited; the pinned definition seen again ends a
// change that was waiting (the upstream went back). Off, everything
// passes.
func (p *Pins) Check(ctx context.Context, svc *gateway.Service, user, name string, raw []byte) (Verdict, error) {
	return p.check(ctx, svc, user, name, raw, false, time.Time{})
}

// CheckCall checks the definition of a tool about to be called, raw (from
// the MCP session's catalog), against its pin: it must be the pinned one,
// and no other definition may be waiting for an administrator — the
// upstream showed a runner another one since toolgate listed its tools.
// A tool never seen is pinned now. listed is when the session's catalog
// was listed at the earliest (the session's start).
func (p *Pins) CheckCall(ctx context.Context, svc *gateway.Service, user, name string, raw []byte, listed time.Time) (Verdict, error) {
	return p.check(ctx, svc, user, name, raw, true, listed)
}

// check is Check, or CheckCall for a call: they differ only on the pinned
// definition while another waits for an administrator.
//
// A service with per-user credentials (auth bearer, oauth) shows each
// caller (user) the upstream's definitions for that caller's account:
// another definition seen through one caller's connection says nothing of
// what the upstream shows the others, and their listings of the pinned
// definition do not withdraw the change. But it may be a rug pull for
// everyone that a caller's session, listed before it, does not show yet:
// while a change waits, a caller calls the pinned definition once a
// listing of theirs since the change showed it to them (Change.ShownTo,
// kept with the change so that every replica knows it), and is told to
// list the tools again until then.
func (p *Pins) check(ctx context.Context, svc *gateway.Service, user, name string, raw []byte, call bool, listed time.Time) (Verdict, error) {
	if p.cfg.Off {
		return Verdict{OK: true}, nil
	}
	digest := p.digests.of(raw)
	pinned, rec, err := p.pinned(ctx, svc, name)
	if pin := svc.Pin(name); err == nil && pin != "" && (rec == nil || rec.Registry != pin && !rec.acceptedAfter(svc.Loaded())) {
		// The registry's pin line is new, or names another digest than
		// when the tool was last checked (a reload changed it), and no
		// acceptance came after this configuration was loaded (else it is
		// an older one, still running on this replica during a rolling
		// reload, and the record's pin is the newer: see pinned): what
		// it replaced is stale, as after an acceptance through the API,
		// whatever this check is of.
		rec, err = p.registryPinMoved(ctx, svc, name, pin)
		pinned = effectivePin(svc, name, rec)
	}
	switch {
	case err != nil:
		return Verdict{}, err
	case pinned == "":
		return p.firstSight(ctx, svc.ID, name, digest, raw)
	case digest != pinned && call && rec != nil && rec.replaced(digest) && listed.Before(rec.Since) &&
		(rec.Changed == nil || rec.Changed.Digest != digest): // (a change recorded from a listing is refused as one, below)
		// The session's catalog holds a definition an administrator's
		// acceptance replaced, and may have been listed before the
		// acceptance (the session is older): it may say nothing of what
		// the upstream shows now. Recorded as a change, it would hide and
		// refuse the accepted definition to everyone. The caller lists
		// again, and a definition the upstream still shows is recorded by
		// that listing. (A session started since listed what the upstream
		// shows: the upstream went back, a change recorded below.)
		return Verdict{Digest: digest, Pinned: pinned, Relist: true, Stale: true}, nil
	case digest != pinned:
		v := Verdict{Digest: digest, Pinned: pinned, Registry: svc.Pin(name) != "", WithoutMeta: digestWithoutMeta(raw) == pinned}
		if rec != nil && rec.Changed != nil && svc.PerUserCredentials() {
			// This caller's account shows another definition now: what
			// their listing showed before no longer counts.
			p.notShownTo(ctx, svc.ID, name, rec.Changed.Digest, listerOf(user))
		}
		return v, p.changed(ctx, svc.ID, name, v, raw)
	case rec != nil && rec.Changed != nil && svc.PerUserCredentials():
		who := listerOf(user)
		switch {
		case rec.Changed.shownTo(who):
		case !call:
			p.shownTo(ctx, svc.ID, name, rec.Changed.Digest, who) // this caller's account shows the pinned definition now
		default:
			shown, err := p.shownAfresh(ctx, svc.ID, name, rec.Changed.Digest, who)
			if err != nil || !shown {
				return Verdict{Digest: rec.Changed.Digest, Pinned: pinned, Registry: svc.Pin(name) != "", Relist: true}, err
			}
		}
	case rec != nil && rec.Changed != nil && call:
		return Verdict{Digest: rec.Changed.Digest, Pinned: pinned, Registry: svc.Pin(name) != ""}, nil
	case rec != nil && rec.Changed != nil:
		return Verdict{OK: true, Digest: digest}, p.reverted(ctx, svc.ID, name, digest, rec.Changed.Digest)
	}
	return Verdict{OK: true, Digest: digest}, nil
}

// pinned is the digest svc's tool is pinned to ("" for none yet): the
// registry's pin, else the stored one; and the stored record, if any.
func (p *Pins) pinned(ctx context.Context, svc *gateway.Service, name string) (string, *Record, error) {
	rec, err := p.store.get(ctx, svc.ID, name)
	if err != nil {
		return "", nil, err
	}
	return effectivePin(svc, name, rec), rec, nil
}

// effectivePin is the digest svc's tool is pinned to, rec its record:
// the registry's pin line, else the record's digest ("" for none yet). A
// pin line of a configuration older than the record's acceptance (on a
// replica not reloaded yet) gives way to the record's: the replica
// follows the newer acceptance rather than record it as a change.
func effectivePin(svc *gateway.Service, name string, rec *Record) string {
	if pin := svc.Pin(name); pin != "" && (rec == nil || rec.Registry == pin || !rec.acceptedAfter(svc.Loaded())) {
		return pin
	}
	if rec == nil {
		return ""
	}
	return rec.Digest
}

// shownTo records that the caller who (see listerOf) was shown the pinned
// definition of service's tool while change waited. It is kept with the
// change, in the storage, for every replica; a failure to store it is
// logged, and the caller is told to list again on the next call.
func (p *Pins) shownTo(ctx context.Context, service, tool, change, who string) {
	_, err := p.store.update(ctx, service, tool, func(cur *Record) *Record {
		if cur == nil || cur.Changed == nil || cur.Changed.Digest != change || cur.Changed.shownTo(who) {
			return nil
		}
		next, c := *cur, *cur.Changed
		if len(c.ShownTo) >= maxShownTo {
			c.ShownTo = nil // they list again
		}
		c.ShownTo = append(slices.Clip(c.ShownTo), who)
		next.Changed = &c
		return &next
	})
	if err != nil {
		p.logger.Warn("cannot record that a caller's listing shows a tool's pinned definition; they are told to list again before calling it",
			zap.String("service", service), zap.Error(err))
	}
}

// notShownTo drops who from the callers shown the pinned definition of
// service's tool while change waits: their account shows another
// definition now. The record is read afresh first (a listing through
// another replica may have added who), and locked only to drop them. A
// failure to store it is logged; the caller's next listing tries again.
func (p *Pins) notShownTo(ctx context.Context, service, tool, change, who string) {
	if shown, err := p.shownAfresh(ctx, service, tool, change, who); err == nil && !shown {
		return
	}
	_, err := p.store.update(ctx, service, tool, func(cur *Record) *Record {
		if cur == nil || cur.Changed == nil || cur.Changed.Digest != change || !cur.Changed.shownTo(who) {
			return nil
		}
		next, c := *cur, *cur.Changed
		c.ShownTo = slices.DeleteFunc(slices.Clone(c.ShownTo), func(s string) bool { return s == who })
		next.Changed = &c
		return &next
	})
	if err != nil {
		p.logger.Warn("cannot record that a caller's account shows another definition of a tool",
			zap.String("service", service), zap.Error(err))
	}
}

// shownAfresh reports, from the storage rather than the cache, whether who
// was shown the pinned definition of service's tool while change waited:
// a listing through another replica is known before its announcement
// arrives here.
func (p *Pins) shownAfresh(ctx context.Context, service, tool, change, who string) (bool, error) {
	rec, err := p.store.load(ctx, keyOf(service, tool).storageKey())
	if err != nil || rec == nil || rec.Changed == nil {
		return false, err
	}
	return rec.Changed.Digest == change && rec.Changed.shownTo(who), nil
}

// reverted ends the waiting change of service's tool with digest change
// (the upstream showed the pinned definition, digest, again, on a service
// whose callers all see the same), unless another replaced it meanwhile,
// and audits it.
func (p *Pins) reverted(ctx context.Context, service, tool, digest, change string) error {
	var gone *Change
	_, err := p.store.update(ctx, service, tool, func(cur *Record) *Record {
		if cur == nil || cur.Changed == nil || cur.Changed.Digest != change {
			return nil
		}
		next := *cur
		gone, next.Changed = cur.Changed, nil
		return &next
	})
	if gone != nil {
		p.event("reverted", service, tool, zap.String("digest", digest), zap.String("withdrawn_digest", gone.Digest))
	}
	return err
}

// registryPinMoved records that the registry's pin line of svc's tool
// names pin now, another digest than when toolgate last saw it
// (Record.Registry): the pin line is new, or a reload changed it — unless
// the record was accepted since this configuration was loaded. As an
// acceptance through the API does, it keeps the digest replaced
// (Record.Replaced) and when (Since: when this configuration was loaded):
// a session listed before holds it, and its calls are told to list again
// rather than record it as a change (see check). A waiting change that
// pin names ends: the administrator accepted it there; one it does not
// name stays, and who was shown the pinned definition since it was seen
// no longer counts (they were shown the replaced one). Once the pin line
// is removed, the tool stays pinned to the digest it named. It returns
// the record as stored.
func (p *Pins) registryPinMoved(ctx context.Context, svc *gateway.Service, tool, pin string) (*Record, error) {
	loaded := svc.Loaded()
	since := loaded
	if now := time.Now().UTC(); since.IsZero() || since.After(now) {
		since = now
	}
	var gone *Change
	rec, err := p.store.update(ctx, svc.ID, tool, func(cur *Record) *Record {
		switch {
		case cur == nil:
			return &Record{Service: svc.ID, Tool: tool, Digest: pin, Registry: pin, Since: since}
		case cur.Registry == pin, cur.acceptedAfter(loaded):
			return nil
		}
		next := *cur
		old := cur.Registry // the pin line before
		if old == "" {
			old = cur.Digest // pinned at first sight or through the API
		}
		if old == "" && len(cur.Definition) > 0 {
			// A record of a version that kept no registry pin: the
			// definition it kept is the one that was pinned.
			old = p.digests.of(cur.Definition)
		}
		if old == "" {
			old = unknownReplaced // nor a definition: any digest
		}
		if old != pin {
			next.Replaced = append(slices.DeleteFunc(slices.Clone(cur.Replaced), func(d string) bool { return d == old }), old)
			next.Replaced = next.Replaced[max(0, len(next.Replaced)-maxReplaced):]
			next.Since, next.AcceptedBy, next.Definition = since, "", nil
			if cur.Changed != nil && cur.Changed.Digest != pin && len(cur.Changed.ShownTo) > 0 {
				c := *cur.Changed
				c.ShownTo = nil
				next.Changed = &c
			}
		}
		next.Digest, next.Registry = pin, pin
		if cur.Changed != nil && cur.Changed.Digest == pin {
			gone, next.Changed, next.Definition = cur.Changed, nil, cur.Changed.Definition
		}
		return &next
	})
	if gone != nil {
		p.event("registry_pinned", svc.ID, tool, zap.String("digest", pin), zap.String("withdrawn_digest", gone.Digest))
	}
	return rec, err
}

// firstSight pins a definition seen for the first time, unless another
// call (on any replica) pinned one meanwhile.
func (p *Pins) firstSight(ctx context.Context, service, tool, digest string, raw []byte) (Verdict, error) {
	stored := false
	rec, err := p.store.update(ctx, service, tool, func(cur *Record) *Record {
		if cur != nil {
			// Pinned already; or a record of an earlier version whose pin
			// line was removed (it kept no digest): what the upstream
			// shows is a change, hidden until an administrator accepts
			// it.
			return nil
		}
		stored = true
		return &Record{Service: service, Tool: tool, Digest: digest, Since: time.Now().UTC(), Definition: slices.Clone(raw)}
	})
	if err != nil {
		return Verdict{}, err
	}
	if stored {
		p.event("pinned", service, tool, zap.String("digest", digest))
	}
	if rec.Digest == digest {
		return Verdict{OK: true, Digest: digest}, nil
	}
	v := Verdict{Digest: digest, Pinned: rec.Digest, WithoutMeta: digestWithoutMeta(raw) == rec.Digest}
	return v, p.changed(ctx, service, tool, v, raw)
}

// changed records a definition that differs from the pin for the
// administrators, and audits it, unless it was recorded already.
func (p *Pins) changed(ctx context.Context, service, tool string, v Verdict, raw []byte) error {
	if rec, err := p.store.get(ctx, service, tool); err == nil && rec != nil && rec.Changed != nil && rec.Changed.Digest == v.Digest {
		return nil
	}
	recorded := false
	_, err := p.store.update(ctx, service, tool, func(cur *Record) *Record {
		if cur != nil && cur.Changed != nil && cur.Changed.Digest == v.Digest {
			return nil
		}
		next := &Record{Service: service, Tool: tool, Since: time.Now().UTC()}
		if v.Registry {
			next.Digest, next.Registry = v.Pinned, v.Pinned
		}
		if cur != nil {
			// A pin line's digest is kept by registryPinMoved, not here:
			// this replica's configuration may be older than the record.
			c := *cur
			next = &c
		}
		next.Changed = &Change{Digest: v.Digest, SeenAt: time.Now().UTC(), Definition: json.RawMessage(slices.Clone(raw))}
		recorded = true
		return next
	})
	if recorded {
		p.event("changed", service, tool, zap.String("pinned_digest", v.Pinned), zap.String("digest", v.Digest),
			zap.Bool("registry_pin", v.Registry))
	}
	return err
}

// Errors of Accept.
var (
	ErrNotAdmin     = errors.New("only members of the tool_pins admin_groups may accept changed tool definitions")
	ErrNoChange     = errors.New("no changed definition of this tool is waiting")
	ErrOtherDigest  = errors.New("the changed definition waiting is not the one given: read it again (GET /v1/tool-pins) and accept its digest")
	ErrRegistryPin  = errors.New("the registry pins this tool: change its pin line in the service's configuration instead")
	ErrUnknownTool  = errors.New("no such service or tool on its allowlist")
	ErrPinningIsOff = errors.New("tool pinning is off (tool_pins off)")
)

// IsAdmin reports whether caller may list pins and accept changes.
func (p *Pins) IsAdmin(caller *gateway.Caller) bool {
	for _, g := range caller.Groups {
		if slices.Contains(p.cfg.AdminGroups, g) {
			return true
		}
	}
	return false
}

// Accept makes the changed definition of svc's tool with digest the
// pinned one: the tool is visible and callable again with it. digest must
// be the waiting change's, so that what an administrator read is what is
// accepted.
func (p *Pins) Accept(ctx context.Context, caller *gateway.Caller, svc *gateway.Service, tool, digest string) (*Record, error) {
	switch {
	case p.cfg.Off:
		return nil, ErrPinningIsOff
	case !p.IsAdmin(caller):
		return nil, ErrNotAdmin
	case svc == nil || !svc.AllowsTool(tool):
		return nil, ErrUnknownTool
	case svc.Pin(tool) != "":
		return nil, ErrRegistryPin
	}
	var refusal error
	rec, err := p.store.update(ctx, svc.ID, tool, func(cur *Record) *Record {
		switch {
		case cur == nil || cur.Changed == nil:
			refusal = ErrNoChange
			return nil
		case cur.Changed.Digest != digest:
			refusal = ErrOtherDigest
			return nil
		}
		replaced := cur.Replaced
		if cur.Digest != "" {
			replaced = append(slices.Clone(replaced), cur.Digest)
			replaced = replaced[max(0, len(replaced)-maxReplaced):]
		}
		return &Record{Service: svc.ID, Tool: tool, Digest: digest, Since: time.Now().UTC(), AcceptedBy: caller.User,
			Definition: cur.Changed.Definition, Replaced: replaced}
	})
	if err != nil {
		return nil, err
	}
	if refusal != nil {
		return nil, refusal
	}
	p.event("accepted", svc.ID, tool, zap.String("digest", digest), zap.String("by", caller.User))
	return rec, nil
}

// List returns every pin record, for an administrator.
func (p *Pins) List(ctx context.Context, caller *gateway.Caller) ([]*Record, error) {
	if !p.IsAdmin(caller) {
		return nil, ErrNotAdmin
	}
	return p.store.list(ctx)
}

// FilterList is a result hook for tools/list: it hides the tools whose
// definition differs from their pin, and pins the ones seen for the first
// time. A tool whose pin cannot be read (storage unavailable) is hidden
// too.
func (p *Pins) FilterList(ctx context.Context, call *gateway.Call, result []byte) (gateway.Result, error) {
	if p.cfg.Off {
		return nil, nil
	}
	var failed error
	out := gateway.FilterTools(result, func(tool gjson.Result) bool {
		v, err := p.Check(ctx, call.Service, call.Caller.User, tool.Get("name").String(), []byte(tool.Raw))
		if err != nil {
			failed = err
			return false
		}
		return v.OK
	})
	if failed != nil {
		p.logger.Warn("hid tools whose pins could not be checked", zap.String("service", call.Service.ID), zap.Error(failed))
	}
	return gateway.Whole(out), nil
}

// AllowCall checks the definition of the tool a tools/call names against
// its pin. It answers the runner itself and returns false when the call
// must not go on: a tool result with isError and the reason for a changed
// definition, a retryable error when the pin cannot be read. A call whose
// tool toolgate could not list (the upstream left it out of its listings)
// is left to the policy (input.tool_known), unless a changed definition of
// the tool waits for an administrator: an upstream that hides a tool it
// changed still serves no call of it.
func (p *Pins) AllowCall(w http.ResponseWriter, r *http.Request, call *gateway.Call) bool {
	if p.cfg.Off {
		return true
	}
	def := call.ToolDefinition()
	var v Verdict
	var err error
	if def == nil {
		v, err = p.checkUnlisted(r.Context(), call.Service, call.Message.Name)
	} else {
		var listed time.Time
		if call.MCPSession != nil {
			listed = call.MCPSession.Created
		}
		v, err = p.CheckCall(r.Context(), call.Service, call.Caller.User, call.Message.Name, def.Raw, listed)
	}
	switch {
	case err != nil:
		p.logger.Warn("cannot check a tool's pin", zap.String("service", call.Service.ID), zap.Error(err))
		gateway.AuditRefused(call, gateway.StepRegistry, "the tool's pin could not be read")
		call.Unavailable(w, "toolgate could not read the tool's pin; try again")
		return false
	case !v.OK:
		why := v.Reason(call.Service.ID, call.Message.Name)
		gateway.AuditRefused(call, gateway.StepRegistry, why)
		gateway.WriteRPC(w, http.StatusOK, gateway.RPCResult(call.Message.ID, gateway.ToolError(why, nil)))
		return false
	}
	return true
}

// checkUnlisted is CheckCall for a tool the session's catalog does not
// define: refused while a changed definition waits, else left to the
// policy.
func (p *Pins) checkUnlisted(ctx context.Context, svc *gateway.Service, name string) (Verdict, error) {
	pinned, rec, err := p.pinned(ctx, svc, name)
	if err != nil {
		return Verdict{}, err
	}
	if rec != nil && rec.Changed != nil {
		return Verdict{Digest: rec.Changed.Digest, Pinned: pinned, Registry: svc.Pin(name) != ""}, nil
	}
	return Verdict{OK: true}, nil
}

func (p *Pins) event(what, service, tool string, fields ...zap.Field) {
	if ce := p.audit.Check(zap.InfoLevel, "tool_pin"); ce != nil {
		ce.Write(append([]zap.Field{zap.String("event", what), zap.String("service", service), zap.String("tool", tool)}, fields...)...)
	}
}
