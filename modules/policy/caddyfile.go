package policy

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("toolgate_policy", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(RequestHandler)
		err := m.UnmarshalCaddyfile(h.Dispenser)
		return m, err
	})
	httpcaddyfile.RegisterHandlerDirective("toolgate_result_policy", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(ResultHandler)
		err := m.UnmarshalCaddyfile(h.Dispenser)
		return m, err
	})
}

// UnmarshalCaddyfile reads either policy directive:
//
//	toolgate_policy [<source>] {
//		source          <file, directory or bundle URL>
//		query           <rule reference>
//		timeout         <duration>
//		reload_interval <duration>|off
//		log_payloads
//		approval_wait   <duration>
//		log_input
//		evaluator       plan|topdown
//		verification_key <public key file> [<algorithm>]
//	}
//
// toolgate_result_policy takes the same form, without approval_wait. The source is given once,
// inline or as the source option; an absolute path must use the option (or
// a matcher before it), because Caddy reads a first argument starting with
// '/' as a path matcher.
func (c *Config) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	directive := d.Val()
	if d.NextArg() {
		c.Source = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("%s: %s given twice", directive, opt)
		}
		seen[opt] = true
		if opt == "log_payloads" || opt == "log_input" {
			if d.NextArg() {
				return d.ArgErr()
			}
			if opt == "log_input" {
				c.LogInput = true
			} else {
				c.LogPayloads = true
			}
			continue
		}
		if opt == "verification_key" {
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.Errf("%s: verification_key takes a public key file and, optionally, its algorithm (default %s)", directive, defaultVerificationAlgorithm)
			}
			c.VerificationKey = args[0]
			if len(args) == 2 {
				c.VerificationAlgorithm = args[1]
			}
			continue
		}
		switch opt {
		case "source", "query", "timeout", "approval_wait", "evaluator", "reload_interval":
		default:
			return d.Errf("%s: unknown option %q (known: source, query, timeout, approval_wait, evaluator, reload_interval, verification_key, log_input, log_payloads)", directive, opt)
		}
		if !d.NextArg() {
			return d.Errf("%s: %s takes one value", directive, opt)
		}
		val := d.Val()
		if d.NextArg() {
			return d.Errf("%s: %s takes one value", directive, opt)
		}
		switch opt {
		case "source":
			if c.Source != "" {
				return d.Errf("%s: the source is given twice", directive)
			}
			c.Source = val
		case "query":
			c.Query = val
		case "timeout":
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 {
				return d.Errf("%s: invalid timeout %q", directive, val)
			}
			c.Timeout = caddy.Duration(dur)
		case "approval_wait":
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 || dur > maxApprovalWait {
				return d.Errf("%s: invalid approval_wait %q (a duration up to %s)", directive, val, maxApprovalWait)
			}
			if directive != "toolgate_policy" {
				return d.Errf("%s: approval_wait belongs to toolgate_policy", directive)
			}
			c.ApprovalWait = caddy.Duration(dur)
		case "evaluator":
			if val != evaluatorPlan && val != evaluatorTopdown {
				return d.Errf("%s: invalid evaluator %q (%s or %s)", directive, val, evaluatorPlan, evaluatorTopdown)
			}
			c.Evaluator = val
		case "reload_interval":
			if val == "off" {
				c.ReloadInterval = -1
				continue
			}
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 {
				return d.Errf("%s: invalid reload_interval %q (a duration, or off)", directive, val)
			}
			c.ReloadInterval = caddy.Duration(dur)
		default:
			return d.Errf("%s: unknown option %q", directive, opt)
		}
	}
	if c.Source == "" {
		return d.Errf("%s: want a policy file or directory, as in: %s policies (Caddy reads a first argument starting with / as a request matcher: give an absolute path as `source <path>` inside the block)", directive, directive)
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*RequestHandler)(nil)
	_ caddyfile.Unmarshaler = (*ResultHandler)(nil)
)
