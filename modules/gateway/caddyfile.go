package gateway

import (
	"encoding/json"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/dustin/go-humanize"

	"github.com/toolgate/toolgate/internal/caddyopt"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("toolgate", parseGlobalOption)
}

func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		d.Next() // so that the error names the second block's line
		return nil, d.Err("the toolgate global option may appear only once")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "toolgate", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from the toolgate global option:
//
//	toolgate {
//		public_url   <url>
//		state_secret <secret> [<previous secret>...]
//		storage <module> { … }
//		cipher  <module> { … }
//		session_header <name>
//		session_ttl    <duration>
//		max_sessions_per_user <n>
//		mcp_session_idle_timeout <duration>
//		mcp_session_sweep_interval <duration>
//		max_mcp_sessions            <n>
//		max_mcp_sessions_per_caller <n>
//		max_streams            <n>
//		max_streams_per_caller <n>
//		max_request_bytes_in_flight            <size>
//		max_request_bytes_in_flight_per_caller <size>
//		cache_ttl      <duration>
//		allowed_origins <origin...>
//		max_request_size  <size>
//		max_response_size <size>
//		max_json_depth    <n>
//		max_request_values <n>
//		max_response_values <n>
//		auth {
//			api_key  <sha256:hex> <user> [<group>...]
//			api_keys <file>
//			jwt {
//				issuer       <iss>
//				audience     <aud...>
//				jwks_url     <url>
//				key_file     <file>
//				user_claim   <claim>
//				groups_claim <claim>
//				leeway       <duration>
//			}
//			scopes    <scope...>
//			anonymous <user>
//		}
//		service <id> {
//			title         <text>
//			url           <url>
//			allow_http
//			tools         <name...>
//			tool          <name> read_only|additive|destructive
//			pin           <name> sha256:<hex>
//			allowed_users <user...>
//			timeout       <duration>
//			dial_timeout  <duration>
//			response_header_timeout <duration>
//			resume_attempts  <n>
//			max_resume_delay <duration>
//			sse_keepalive    <duration> | off
//			auth none | bearer | header <name> <value> | oauth {
//				authorization_url <url>
//				token_url         <url>
//				revocation_url    <url>
//				client_id         <id>
//				client_secret     <secret>
//				scopes            <scope...>
//				resource          <uri>
//				refresh_skew      <duration>
//				login_hint
//			}
//			transport http | sse | stdio
//			# stdio: a program toolgate runs (see the stdio module)
//			command        <program> [<args...>]
//			env            <NAME> <value>
//			working_dir    <dir>
//			run_as         <user>
//			per_user
//			credential_env <NAME>
//			idle_timeout   <duration> | off
//			stop_timeout   <duration>
//			max_processes  <n>
//			limits {
//				memory     <size>
//				open_files <n>
//				processes  <n>
//			}
//		}
//	}
//
// Every option may appear once per block, except service, api_key,
// key_file, jwt, tool and pin (once per tool name) and env (once per
// name). transport sse reaches a 2024-11-05 HTTP+SSE server at url; the
// stdio options (command implies transport stdio) run a program instead of
// reaching a url.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "toolgate"
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt != "service" && seen[opt] {
			return d.Errf("toolgate: %s given twice", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "public_url":
			err = caddyopt.String(d, &a.PublicURL)
		case "state_secret":
			secrets := d.RemainingArgs()
			if len(secrets) == 0 {
				return d.ArgErr()
			}
			a.StateSecret, a.PreviousStateSecrets = secrets[0], secrets[1:]
		case "session_header":
			err = caddyopt.String(d, &a.SessionHeader)
		case "session_ttl":
			err = caddyopt.Duration(d, &a.SessionTTL)
		case "mcp_session_idle_timeout":
			err = caddyopt.Duration(d, &a.MCPSessionIdleTimeout)
		case "mcp_session_sweep_interval":
			err = caddyopt.Duration(d, &a.MCPSessionSweepInterval)
		case "max_mcp_sessions":
			err = positiveInt(d, &a.MaxMCPSessions)
		case "max_mcp_sessions_per_caller":
			err = positiveInt(d, &a.MaxMCPSessionsPerCaller)
		case "max_streams":
			err = positiveInt(d, &a.MaxStreams)
		case "max_streams_per_caller":
			err = positiveInt(d, &a.MaxStreamsPerCaller)
		case "cache_ttl":
			err = caddyopt.Duration(d, &a.CacheTTL)
		case "allowed_origins":
			a.AllowedOrigins = d.RemainingArgs()
			if len(a.AllowedOrigins) == 0 {
				err = d.ArgErr()
			}
		case "max_request_size":
			err = sizeArg(d, &a.MaxRequestBytes)
		case "max_request_bytes_in_flight":
			err = sizeArg(d, &a.MaxRequestBytesInFlight)
		case "max_request_bytes_in_flight_per_caller":
			err = sizeArg(d, &a.MaxRequestBytesInFlightPerCaller)
		case "max_response_size":
			err = sizeArg(d, &a.MaxResponseBytes)
		case "max_sessions_per_user":
			err = positiveInt(d, &a.MaxSessionsPerUser)
		case "max_json_depth":
			err = positiveInt(d, &a.MaxJSONDepth)
		case "max_request_values":
			err = positiveInt(d, &a.MaxRequestValues)
		case "max_response_values":
			err = positiveInt(d, &a.MaxResponseValues)
		case "storage":
			err = guestModule(d, "caddy.storage", "module", (*[]byte)(&a.StorageRaw))
		case "cipher":
			err = guestModule(d, "toolgate.ciphers", "cipher", (*[]byte)(&a.CipherRaw))
		case "auth":
			a.Auth = new(AuthConfig)
			err = a.Auth.unmarshalCaddyfile(d)
		case "service":
			s := new(Service)
			if err = s.unmarshalCaddyfile(d); err == nil {
				for _, other := range a.Services {
					if other.ID == s.ID {
						return d.Errf("service %q defined twice", s.ID)
					}
				}
				a.Services = append(a.Services, s)
			}
		default:
			o, ok := registeredOption(opt)
			if !ok {
				return d.Errf("toolgate: unknown option %q", opt)
			}
			var v any
			if v, err = o.parse(d); err == nil {
				if a.Extensions == nil {
					a.Extensions = map[string]json.RawMessage{}
				}
				a.Extensions[opt] = caddyconfig.JSON(v, nil)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (a *AuthConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		switch opt {
		case "api_key":
			args := d.RemainingArgs()
			if len(args) < 2 {
				return d.Errf("auth api_key: want <sha256:hex> <user> [<group>...]")
			}
			a.APIKeys = append(a.APIKeys, APIKey{Hash: args[0], User: args[1], Groups: args[2:]})
		case "scopes":
			if seen[opt] {
				return d.Errf("auth: %s given twice", opt)
			}
			if a.Scopes = d.RemainingArgs(); len(a.Scopes) == 0 {
				return d.ArgErr()
			}
		case "api_keys":
			if seen[opt] {
				return d.Errf("auth: %s given twice", opt)
			}
			if err := caddyopt.String(d, &a.APIKeysFile); err != nil {
				return err
			}
		case "anonymous":
			if seen[opt] {
				return d.Errf("auth: %s given twice", opt)
			}
			if err := caddyopt.String(d, &a.Anonymous); err != nil {
				return err
			}
		case "jwt":
			j := new(JWTIssuer)
			if err := j.unmarshalCaddyfile(d); err != nil {
				return err
			}
			a.JWT = append(a.JWT, j)
		default:
			return d.Errf("auth: unknown option %q", opt)
		}
		seen[opt] = true
	}
	return nil
}

func (j *JWTIssuer) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt != "key_file" && seen[opt] {
			return d.Errf("auth jwt: %s given twice", opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "issuer":
			err = caddyopt.String(d, &j.Issuer)
		case "audience":
			if j.Audience = d.RemainingArgs(); len(j.Audience) == 0 {
				err = d.ArgErr()
			}
		case "jwks_url":
			err = caddyopt.String(d, &j.JWKSURL)
		case "key_file":
			var f string
			if err = caddyopt.String(d, &f); err == nil {
				j.KeyFiles = append(j.KeyFiles, f)
			}
		case "user_claim":
			err = caddyopt.String(d, &j.UserClaim)
		case "groups_claim":
			err = caddyopt.String(d, &j.GroupsClaim)
		case "leeway":
			err = caddyopt.Duration(d, &j.Leeway)
		default:
			return d.Errf("auth jwt: unknown option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("service: want an id, as in: service tracker { … }")
	}
	s.ID = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	var transport serviceTransport
	defer func() { s.TransportRaw = transport.raw() }()
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if handled, err := transport.parse(d, s.ID); err != nil {
			return err
		} else if handled {
			continue
		}
		if opt != "tool" && opt != "pin" && seen[opt] {
			return d.Errf("service %q: %s given twice", s.ID, opt)
		}
		seen[opt] = true
		var err error
		switch opt {
		case "tool":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("service %q: tool: want <name> read_only|additive|destructive", s.ID)
			}
			if _, dup := s.ToolEffects[args[0]]; dup {
				return d.Errf("service %q: tool %s declared twice", s.ID, args[0])
			}
			if s.ToolEffects == nil {
				s.ToolEffects = map[string]string{}
			}
			s.ToolEffects[args[0]] = args[1]
		case "pin":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("service %q: pin: want <name> sha256:<hex>", s.ID)
			}
			if _, dup := s.Pins[args[0]]; dup {
				return d.Errf("service %q: pin %s given twice", s.ID, args[0])
			}
			if s.Pins == nil {
				s.Pins = map[string]string{}
			}
			s.Pins[args[0]] = args[1]
		case "title":
			err = caddyopt.String(d, &s.Title)
		case "url":
			err = caddyopt.String(d, &s.URL)
		case "allow_http":
			if d.NextArg() {
				return d.ArgErr()
			}
			s.AllowHTTP = true
		case "tools":
			if s.Tools = d.RemainingArgs(); len(s.Tools) == 0 {
				err = d.Errf("service %q: tools: list at least one tool", s.ID)
			}
		case "allowed_users":
			if s.AllowedUsers = d.RemainingArgs(); len(s.AllowedUsers) == 0 {
				err = d.ArgErr()
			}
		case "timeout":
			err = caddyopt.Duration(d, &s.Timeout)
		case "dial_timeout":
			err = caddyopt.Duration(d, &s.DialTimeout)
		case "response_header_timeout":
			err = caddyopt.Duration(d, &s.ResponseHeaderTimeout)
		case "resume_attempts":
			err = positiveInt(d, &s.ResumeAttempts)
		case "max_resume_delay":
			err = caddyopt.Duration(d, &s.MaxResumeDelay)
		case "sse_keepalive":
			var v string
			if err = caddyopt.String(d, &v); err == nil {
				if v == "off" {
					s.SSEKeepAlive = -1
				} else if dur, perr := caddy.ParseDuration(v); perr != nil || dur <= 0 {
					err = d.Errf("service %q: sse_keepalive: %q is neither a positive duration nor off", s.ID, v)
				} else {
					s.SSEKeepAlive = caddy.Duration(dur)
				}
			}
		case "auth":
			s.Auth = new(UpstreamAuth)
			err = s.Auth.unmarshalCaddyfile(d, s.ID)
		default:
			return d.Errf("service %q: unknown option %q", s.ID, opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (u *UpstreamAuth) unmarshalCaddyfile(d *caddyfile.Dispenser, service string) error {
	if !d.NextArg() {
		return d.Errf("service %q: auth: want none, bearer, header <name> <value> or oauth { … }", service)
	}
	u.Kind = d.Val()
	switch u.Kind {
	case AuthNone, AuthBearer:
		if d.NextArg() {
			return d.ArgErr()
		}
	case AuthHeader:
		args := d.RemainingArgs()
		if len(args) != 2 {
			return d.Errf("service %q: auth header: want <name> <value>", service)
		}
		u.Header, u.Value = args[0], args[1]
	case AuthOAuth:
		if d.NextArg() {
			return d.ArgErr()
		}
		o := new(OAuthClient)
		u.OAuth = o
		seen := map[string]bool{}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			opt := d.Val()
			if seen[opt] {
				return d.Errf("service %q: auth oauth: %s given twice", service, opt)
			}
			seen[opt] = true
			var err error
			switch opt {
			case "authorization_url":
				err = caddyopt.String(d, &o.AuthorizationURL)
			case "token_url":
				err = caddyopt.String(d, &o.TokenURL)
			case "revocation_url":
				err = caddyopt.String(d, &o.RevocationURL)
			case "client_id":
				err = caddyopt.String(d, &o.ClientID)
			case "client_secret":
				err = caddyopt.String(d, &o.ClientSecret)
			case "scopes":
				if o.Scopes = d.RemainingArgs(); len(o.Scopes) == 0 {
					err = d.ArgErr()
				}
			case "resource":
				err = caddyopt.String(d, &o.Resource)
			case "refresh_skew":
				err = caddyopt.Duration(d, &o.RefreshSkew)
			case "login_hint":
				if d.NextArg() {
					return d.ArgErr()
				}
				o.LoginHint = true
			default:
				return d.Errf("service %q: auth oauth: unknown option %q", service, opt)
			}
			if err != nil {
				return err
			}
		}
	default:
		return d.Errf("service %q: auth: unknown kind %q (use none, bearer, header or oauth)", service, u.Kind)
	}
	return nil
}

// positiveInt reads the current option's one argument, a positive integer.
func positiveInt(d *caddyfile.Dispenser, dst *int) error {
	name := d.Val()
	var s string
	if err := caddyopt.String(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return d.Errf("%s: %q is not a positive integer", name, s)
	}
	*dst = n
	return nil
}

func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	opt := d.Val()
	var s string
	if err := caddyopt.String(d, &s); err != nil {
		return err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n == 0 || n > 1<<40 {
		return d.Errf("%s: invalid size %q (use e.g. 4MiB)", opt, s)
	}
	*dst = int64(n)
	return nil
}

// guestModule reads `<option> <module name> { … }` into raw, the JSON of
// the named module in namespace with its name under inlineKey.
func guestModule(d *caddyfile.Dispenser, namespace, inlineKey string, raw *[]byte) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	mod, err := caddyfile.UnmarshalModule(d, namespace+"."+name)
	if err != nil {
		return err
	}
	*raw = caddyconfig.JSONModuleObject(mod, inlineKey, name, nil)
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*App)(nil)
