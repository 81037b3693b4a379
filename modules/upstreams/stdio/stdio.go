// Package stdio is the upstream transport toolgate.upstreams.stdio: toolgate
// runs an MCP server program itself and speaks MCP to it over its stdin and
// stdout (newline-delimited JSON-RPC), so that a local program — `npx …`,
// `uvx …`, a binary — sits behind the same policy, credential and result
// pipeline as a remote server.
//
// A program is a shared, long-lived thing that runners must not be able to
// steer: it runs in a process group of its own, with only the environment
// its service lists, optionally under an unprivileged user and with
// resource limits; what it writes is bounded; it is restarted with backoff
// when it exits and stopped when idle, on reload and on shutdown, leaving
// no process behind. One process serves every runner of its service (one
// MCP session, which toolgate shares through mcpbridge), or, with per_user,
// one process per user, which gets that user's credential and no one
// else's.
package stdio

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/caddyopt"
	"github.com/toolgate/toolgate/modules/gateway"
)

func init() {
	caddy.RegisterModule(Transport{})
}

// Transport runs a service's MCP server as a program. Its options go in the
// service block of the toolgate global option:
//
//	service files {
//		command     npx -y @modelcontextprotocol/server-filesystem /srv/files
//		env         HOME /var/lib/toolgate/files
//		env         NPM_CONFIG_CACHE /var/cache/toolgate/npm
//		working_dir /srv/files
//		run_as      mcp
//		per_user
//		credential_env GITHUB_TOKEN
//		idle_timeout 10m
//		stop_timeout 5s
//		max_processes 100
//		limits {
//			memory     512MiB
//			open_files 256
//			processes  64
//		}
//		tools read_text_file list_directory
//	}
//
// command implies transport stdio; such a service has no url. Each option
// may appear once, except env (once per name).
type Transport struct {
	// Command is the program and its arguments, as in `command npx -y
	// @modelcontextprotocol/server-everything`. A program named without a
	// slash is looked up in the PATH the program itself gets (see Env).
	// Placeholders such as {env.HOME} are expanded when the config loads.
	// Required.
	Command []string `json:"command"`

	// Env is the program's whole environment: toolgate's own is never
	// inherited. PATH defaults to /usr/local/bin:/usr/bin:/bin; nothing
	// else is set unless listed here (or named by CredentialEnv).
	// Placeholders in values, such as {env.API_KEY}, are expanded when the
	// config loads. Caddyfile: env <NAME> <value>, once per name.
	Env map[string]string `json:"env,omitempty"`

	// WorkingDir is the program's working directory, an absolute path.
	// Default: the root directory.
	WorkingDir string `json:"working_dir,omitempty"`

	// RunAs runs the program as this user (a name or a numeric uid), with
	// the user's primary and supplementary groups; toolgate must run as
	// root to use it. Default: toolgate's own user.
	RunAs string `json:"run_as,omitempty"`

	// PerUser runs one process per user of the service instead of one for
	// all: a user's runners share their process, and no one else's
	// requests reach it.
	PerUser bool `json:"per_user,omitempty"`

	// CredentialEnv names the environment variable through which the
	// program gets the caller's upstream credential, the one the service's
	// auth provides: the token of a bearer or oauth connection (without
	// "Bearer "), or the value of auth header. A personal credential
	// (bearer, oauth) needs PerUser, so that a process only ever holds its
	// own user's. When the credential changes (an OAuth token refreshed),
	// new requests go to a new process that has the new one, and the old
	// process stops once its requests in progress are answered. When the
	// user disconnects the service (or the provider refuses their grant),
	// their process stops then: on other replicas as the change is
	// announced, with a storage that announces changes.
	CredentialEnv string `json:"credential_env,omitempty"`

	// IdleTimeout stops a process that had no request in progress and no
	// open stream for this long; the next request starts it again.
	// Default 10m; a negative value (Caddyfile: off) never stops it.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`

	// StopTimeout is how long a stopping program has to exit after its
	// stdin is closed and its process group gets SIGTERM, before the group
	// gets SIGKILL. Default 5s.
	StopTimeout caddy.Duration `json:"stop_timeout,omitempty"`

	// MaxProcesses bounds the processes of a per_user service. A user who
	// would need one more gets a retryable error, unless an idle process
	// can be stopped for them. Default 100.
	MaxProcesses int `json:"max_processes,omitempty"`

	// Limits are resource limits set on the process when it starts
	// (Linux), which its children inherit.
	Limits *Limits `json:"limits,omitempty"`

	service string
	key     string
	rt      *runtime
	logger  *zap.Logger
}

// Limits are a program's resource limits (setrlimit).
type Limits struct {
	// Memory bounds the process's data memory in bytes: heap and private
	// writable mappings (RLIMIT_DATA). Caddyfile: a size such as 512MiB.
	Memory int64 `json:"memory,omitempty"`

	// OpenFiles bounds its open file descriptors (RLIMIT_NOFILE).
	OpenFiles int `json:"open_files,omitempty"`

	// Processes bounds the processes and threads of the user it runs as
	// (RLIMIT_NPROC; counted per user, so meant for run_as, and not
	// enforced for root).
	Processes int `json:"processes,omitempty"`
}

// Defaults.
const (
	defaultPath         = "/usr/local/bin:/usr/bin:/bin"
	defaultIdleTimeout  = 10 * time.Minute
	defaultStopTimeout  = 5 * time.Second
	defaultMaxProcesses = 100
)

// CaddyModule returns the Caddy module information.
func (Transport) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  gateway.UpstreamsNamespace + ".stdio",
		New: func() caddy.Module { return new(Transport) },
	}
}

// Provision expands placeholders and applies defaults. It starts nothing:
// a program starts when its first request comes.
func (t *Transport) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	t.expand(caddy.NewReplacer())
	if t.IdleTimeout == 0 {
		t.IdleTimeout = caddy.Duration(defaultIdleTimeout)
	}
	if t.StopTimeout == 0 {
		t.StopTimeout = caddy.Duration(defaultStopTimeout)
	}
	if t.MaxProcesses == 0 {
		t.MaxProcesses = defaultMaxProcesses
	}
	return nil
}

// expand replaces the placeholders of the command, its environment and
// its working directory.
func (t *Transport) expand(repl *caddy.Replacer) {
	for i, a := range t.Command {
		t.Command[i] = repl.ReplaceKnown(a, "")
	}
	for k, v := range t.Env {
		// Often a token the program needs: it would start without one, or
		// with the placeholder's text, and fail in its own words, or
		// quietly act as nobody.
		if ph := caddyopt.EmptyPlaceholder(repl, v); ph != "" {
			t.logger.Warn("a variable of the program's environment is empty once placeholders are replaced: is the gateway's own variable set?",
				zap.String("env", k), zap.String("placeholder", ph))
		}
		if ph := caddyopt.MisspeltPlaceholder(repl, v); ph != "" {
			t.logger.Warn("a variable of the program's environment holds a placeholder Caddy does not know, which the program gets as text: check its spelling, as in {env.NAME}",
				zap.String("env", k), zap.String("placeholder", ph))
		}
		t.Env[k] = repl.ReplaceKnown(v, "")
	}
	t.WorkingDir = repl.ReplaceKnown(t.WorkingDir, "")
}

// UpstreamName names the program (gateway.UpstreamNamer): its command,
// environment, working directory, user, whether each user gets their own,
// and how it gets the caller's credential; not the options that tune its
// processes.
func (t *Transport) UpstreamName() string {
	b, _ := json.Marshal(struct {
		Command       []string
		Env           map[string]string
		WorkingDir    string
		RunAs         string
		PerUser       bool
		CredentialEnv string
	}{t.Command, t.Env, t.WorkingDir, t.RunAs, t.PerUser, t.CredentialEnv})
	return string(b)
}

// Validate checks what does not depend on the rest of the service block.
func (t *Transport) Validate() error {
	if len(t.Command) == 0 || t.Command[0] == "" {
		return fmt.Errorf("command: required: the program to run and its arguments")
	}
	for _, name := range slices.Sorted(maps.Keys(t.Env)) {
		if !validEnvName(name) {
			return fmt.Errorf("env: %q is not a valid variable name (letters, digits and '_', not starting with a digit)", name)
		}
		if strings.IndexByte(t.Env[name], 0) >= 0 {
			return fmt.Errorf("env %s: the value holds a NUL byte", name)
		}
	}
	if t.CredentialEnv != "" && !validEnvName(t.CredentialEnv) {
		return fmt.Errorf("credential_env: %q is not a valid variable name", t.CredentialEnv)
	}
	if _, dup := t.Env[t.CredentialEnv]; dup && t.CredentialEnv != "" {
		return fmt.Errorf("credential_env %s: env sets that variable too", t.CredentialEnv)
	}
	if t.WorkingDir != "" {
		if !filepath.IsAbs(t.WorkingDir) {
			return fmt.Errorf("working_dir: %q must be an absolute path", t.WorkingDir)
		}
		if fi, err := os.Stat(t.WorkingDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("working_dir: %q is not a directory", t.WorkingDir)
		}
	}
	if t.StopTimeout < 0 {
		return fmt.Errorf("stop_timeout: must be positive")
	}
	if t.MaxProcesses < 0 {
		return fmt.Errorf("max_processes: must be positive")
	}
	if l := t.Limits; l != nil && (l.Memory < 0 || l.OpenFiles < 0 || l.Processes < 0) {
		return fmt.Errorf("limits: must be positive")
	}
	if _, err := lookPath(t.Command[0], t.path()); err != nil {
		return fmt.Errorf("command: %v", err)
	}
	if t.RunAs != "" {
		if _, err := lookupUser(t.RunAs); err != nil {
			return fmt.Errorf("run_as: %v", err)
		}
	}
	return nil
}

// UsesURL reports false: the program is the upstream.
func (*Transport) UsesURL() bool { return false }

// Attach checks the options against the service's auth and binds the
// transport to the service's processes, which outlive a config reload that
// keeps the service's options as they were.
func (t *Transport) Attach(app *gateway.App, svc *gateway.Service) error {
	if err := supported(); err != nil {
		return err
	}
	kind := svc.Auth.Kind
	if t.CredentialEnv != "" {
		switch {
		case kind == gateway.AuthNone:
			return fmt.Errorf("credential_env %s: the service has no credential to hand over; set auth bearer, oauth or header", t.CredentialEnv)
		case (kind == gateway.AuthBearer || kind == gateway.AuthOAuth) && !t.PerUser:
			return fmt.Errorf("credential_env %s: auth %s credentials are personal; add per_user so that a process only holds its own user's", t.CredentialEnv, kind)
		}
	}
	header := "Authorization"
	if kind == gateway.AuthHeader {
		header = svc.Auth.Header
	}
	spec, err := t.spec(svc, header)
	if err != nil {
		return err
	}
	spec.MaxMessage, spec.Depth, spec.Values = app.MaxResponseBytes, app.MaxJSONDepth, app.MaxResponseValues
	t.service, t.key = svc.ID, spec.key()
	v, _, err := runtimes.LoadOrNew(t.key, func() (caddy.Destructor, error) {
		return newRuntime(spec, t.logger), nil
	})
	if err != nil {
		return err
	}
	t.rt = v.(*runtime)
	// The runtime outlives reloads: a config gives it its logger and idle
	// time when it starts (not when it is provisioned, perhaps to be
	// refused), and takes them back if its load is abandoned.
	app.OnStart(func() { app.OnStop(t.rt.use(t.logger, time.Duration(app.MCPSessionIdleTimeout))) })
	if t.PerUser && t.CredentialEnv != "" && svc.PerUserCredentials() {
		// A process holds its user's credential in its environment: when
		// they disconnect, it stops then, not at its idle timeout.
		rt := t.rt
		app.OnConnectionGone(func(key string) { rt.connectionGone(app, svc, key) })
	}
	return nil
}

// RoundTrip answers toolgate_proxy's request (gateway.UpstreamTransport).
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.rt.bridge.RoundTrip(r)
}

// Cleanup releases the service's processes; they stop unless the next
// config runs the service unchanged.
func (t *Transport) Cleanup() error {
	if t.rt != nil {
		_, _ = runtimes.Delete(t.key)
	}
	return nil
}

// runtimes holds the processes of each service across config reloads,
// keyed by everything that shapes them.
var runtimes = caddy.NewUsagePool()

// path is the PATH the program gets.
func (t *Transport) path() string {
	if p, ok := t.Env["PATH"]; ok {
		return p
	}
	return defaultPath
}

func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// lookPath finds a program the way the program's own environment would:
// in path when its name has no slash.
func lookPath(prog, path string) (string, error) {
	if strings.Contains(prog, "/") {
		if !filepath.IsAbs(prog) {
			return "", fmt.Errorf("%q: give a program's absolute path, or a name to look up in PATH", prog)
		}
		if err := executable(prog); err != nil {
			return "", fmt.Errorf("%q: %v", prog, err)
		}
		return prog, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, prog)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("program %q not found in PATH %s (set env PATH, or give its absolute path)", prog, path)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("is a directory")
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("is not executable")
	}
	return nil
}

// runUser is the user and groups a program runs as.
type runUser struct {
	uid, gid uint32
	groups   []uint32
}

func lookupUser(name string) (*runUser, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, numErr := strconv.Atoi(name); numErr == nil {
			u, err = user.LookupId(name)
		}
		if err != nil {
			return nil, fmt.Errorf("no user %q on this system", name)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q has no numeric uid and gid", name)
	}
	ru := &runUser{uid: uint32(uid), gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				ru.groups = append(ru.groups, uint32(n))
			}
		}
	}
	if euid := os.Geteuid(); euid != 0 && uint32(euid) != ru.uid {
		return nil, fmt.Errorf("running programs as %q needs toolgate to run as root", name)
	}
	return ru, nil
}

// Interface guards
var (
	_ caddy.Provisioner         = (*Transport)(nil)
	_ caddy.Validator           = (*Transport)(nil)
	_ caddy.CleanerUpper        = (*Transport)(nil)
	_ gateway.UpstreamTransport = (*Transport)(nil)
)
