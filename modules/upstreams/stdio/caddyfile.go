package stdio

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/modules/gateway"
)

// ParseServiceOption reads one of the transport's options in a service
// block (see Transport for the syntax); it reports false for any other
// option.
func (t *Transport) ParseServiceOption(d *caddyfile.Dispenser) (bool, error) {
	opt := d.Val()
	switch opt {
	case "command", "env", "working_dir", "run_as", "per_user", "credential_env",
		"idle_timeout", "stop_timeout", "max_processes", "limits":
	default:
		return false, nil
	}
	if opt != "env" && t.given(opt) {
		return true, d.Errf("%s given twice", opt)
	}
	switch opt {
	case "command":
		if t.Command = d.RemainingArgs(); len(t.Command) == 0 {
			return true, d.Errf("command: want <program> [<args...>]")
		}
	case "env":
		args := d.RemainingArgs()
		if len(args) != 2 {
			return true, d.Errf("env: want <NAME> <value>")
		}
		if _, dup := t.Env[args[0]]; dup {
			return true, d.Errf("env %s given twice", args[0])
		}
		if t.Env == nil {
			t.Env = map[string]string{}
		}
		t.Env[args[0]] = args[1]
	case "working_dir":
		return true, caddyopt.String(d, &t.WorkingDir)
	case "run_as":
		return true, caddyopt.String(d, &t.RunAs)
	case "per_user":
		t.PerUser = true
		return true, caddyopt.NoArgs(d)
	case "credential_env":
		return true, caddyopt.String(d, &t.CredentialEnv)
	case "idle_timeout":
		var v string
		if err := caddyopt.String(d, &v); err != nil {
			return true, err
		}
		if v == "off" {
			t.IdleTimeout = -1
			return true, nil
		}
		dur, err := caddy.ParseDuration(v)
		if err != nil || dur <= 0 {
			return true, d.Errf("idle_timeout: %q is neither a positive duration nor off", v)
		}
		t.IdleTimeout = caddy.Duration(dur)
	case "stop_timeout":
		return true, caddyopt.Duration(d, &t.StopTimeout)
	case "max_processes":
		n, err := positive(d)
		t.MaxProcesses = n
		return true, err
	case "limits":
		return true, t.parseLimits(d)
	}
	return true, nil
}

// given reports whether opt was set already.
func (t *Transport) given(opt string) bool {
	switch opt {
	case "command":
		return len(t.Command) > 0
	case "working_dir":
		return t.WorkingDir != ""
	case "run_as":
		return t.RunAs != ""
	case "per_user":
		return t.PerUser
	case "credential_env":
		return t.CredentialEnv != ""
	case "idle_timeout":
		return t.IdleTimeout != 0
	case "stop_timeout":
		return t.StopTimeout != 0
	case "max_processes":
		return t.MaxProcesses != 0
	case "limits":
		return t.Limits != nil
	}
	return false
}

func (t *Transport) parseLimits(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	t.Limits = new(Limits)
	return caddyopt.Block(d, "limits", func(name string) error {
		switch name {
		case "memory":
			var v string
			if err := caddyopt.String(d, &v); err != nil {
				return err
			}
			n, err := humanize.ParseBytes(v)
			if err != nil || n == 0 || n > 1<<50 {
				return d.Errf("limits memory: invalid size %q (use e.g. 512MiB)", v)
			}
			t.Limits.Memory = int64(n)
		case "open_files":
			n, err := positive(d)
			t.Limits.OpenFiles = n
			return err
		case "processes":
			n, err := positive(d)
			t.Limits.Processes = n
			return err
		default:
			return caddyopt.Unknown(d, "limits")
		}
		return nil
	})
}

func positive(d *caddyfile.Dispenser) (int, error) {
	name := d.Val()
	var v string
	if err := caddyopt.String(d, &v); err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, d.Errf("%s: %q is not a positive integer", name, v)
	}
	return n, nil
}

// Interface guards
var _ gateway.ServiceOptionParser = (*Transport)(nil)
