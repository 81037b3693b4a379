package stdio

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// spec is everything that shapes a service's processes, fixed when the
// config loads.
type spec struct {
	Service      string
	Command      []string
	Env          []string // NAME=value, sorted; PATH included
	Path         string   // the PATH programs are looked up in
	Dir          string
	RunAs        string
	PerUser      bool
	CredEnv      string
	CredHeader   string // the request header the caller's credential comes in
	Idle         time.Duration
	Stop         time.Duration
	MaxProcs     int
	Limits       Limits
	StartTimeout time.Duration
	MaxMessage   int64
	Depth        int
	Values       int // JSON values of one message at most

	user    *runUser
	secrets []string // env values that must not reach the log
}

func (t *Transport) spec(svc *gateway.Service, header string) (*spec, error) {
	s := &spec{Service: svc.ID, Command: slices.Clone(t.Command), Path: t.path(), Dir: t.WorkingDir,
		RunAs: t.RunAs, PerUser: t.PerUser, CredEnv: t.CredentialEnv, Idle: time.Duration(t.IdleTimeout),
		Stop: time.Duration(t.StopTimeout), MaxProcs: t.MaxProcesses, StartTimeout: time.Duration(svc.Timeout)}
	if t.CredentialEnv != "" {
		s.CredHeader = header
	}
	if t.Limits != nil {
		s.Limits = *t.Limits
	}
	if s.Dir == "" {
		s.Dir = "/"
	}
	env := maps.Clone(t.Env)
	if env == nil {
		env = map[string]string{}
	}
	if _, ok := env["PATH"]; !ok {
		env["PATH"] = defaultPath
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		s.Env = append(s.Env, k+"="+env[k])
		if v := env[k]; k != "PATH" && len(v) >= minSecretLen {
			s.secrets = append(s.secrets, v)
			s.secrets = append(s.secrets, secretLines(v)...)
		}
	}
	if t.RunAs != "" {
		u, err := lookupUser(t.RunAs)
		if err != nil {
			return nil, err
		}
		s.user = u
	}
	return s, nil
}

// secretLines are the lines of a value of several lines (a PEM key, a
// JSON document) that are a secret's length: the program's output is
// logged line by line, so the value printed as it is never appears whole
// in one line, and each of its lines is redacted on its own.
func secretLines(v string) []string {
	if !strings.ContainsAny(v, "\r\n") {
		return nil
	}
	var out []string
	for line := range strings.FieldsFuncSeq(v, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if line = strings.TrimSpace(line); len(line) >= minSecretLen {
			out = append(out, line)
		}
	}
	return out
}

// minSecretLen is the shortest env value redacted from the program's
// output in the log: shorter ones (a port, a flag) would blank out
// unrelated text.
const minSecretLen = 8

// key identifies the spec: equal specs share processes across reloads.
func (s *spec) key() string {
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return "stdio/" + s.Service + "/" + hex.EncodeToString(sum[:16])
}

// credential returns the value the program gets in CredEnv from the
// caller's credential header: a bearer token without its scheme.
func (s *spec) credential(value string) string {
	if s.CredEnv == "" {
		return ""
	}
	if strings.EqualFold(s.CredHeader, "Authorization") {
		if scheme, token, ok := strings.Cut(value, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return token
		}
	}
	return value
}

// initializeParams are what toolgate offers a program it initializes: the
// capabilities toolgate can relay to some runner (sampling and elicitation;
// each request goes only to a runner that declared it), and no roots.
func initializeParams() []byte {
	b := []byte(`{"protocolVersion":`)
	b = mcpmsg.AppendQuote(b, gateway.LatestProtocolVersion)
	return append(b, `,"capabilities":{"sampling":{},"elicitation":{"form":{},"url":{}}},"clientInfo":{"name":"toolgate","version":"1"}}`...)
}
