package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Upstreams that do not speak Streamable HTTP — a program toolgate runs
// and speaks to over stdio, a server of the 2024-11-05 HTTP+SSE transport —
// are reached through guest modules in the toolgate.upstreams namespace. The
// proxy does not know them apart: it sends such a service's requests
// through the module as it would send them over the network.

// UpstreamsNamespace is the namespace of upstream transport modules.
const UpstreamsNamespace = "toolgate.upstreams"

// UpstreamTransport carries the MCP exchange of a service whose upstream
// does not speak Streamable HTTP. toolgate_proxy hands it the Streamable
// HTTP requests it would send over the network (the caller is
// UpstreamUser of the request's context, the caller's credential is in its
// header), and it answers them as a Streamable HTTP server would.
type UpstreamTransport interface {
	http.RoundTripper

	// UsesURL reports whether the service's url names the upstream.
	UsesURL() bool

	// Attach binds the transport to its service, once the app is
	// provisioned. It checks the options that depend on the rest of the
	// service block, and does no I/O.
	Attach(app *App, svc *Service) error
}

// UpstreamNamer is implemented by upstream transport modules whose upstream
// is named by more than the service's url (a program's command, its
// environment, the user it runs as). UpstreamName returns what names it,
// placeholders expanded, and nothing that only tunes how it is reached
// (timeouts, limits): it goes into Service.Endpoint, and a reload that
// changes it ends the service's MCP sessions.
type UpstreamNamer interface {
	UpstreamName() string
}

// ServiceOptionParser is implemented by upstream transport modules that
// take options in the service block (command, env, … for stdio).
type ServiceOptionParser interface {
	// ParseServiceOption reads the option the dispenser is on (d.Val() is
	// its name) and reports true, or reports false, reading nothing, when
	// the option is not one of its own.
	ParseServiceOption(d *caddyfile.Dispenser) (bool, error)
}

type upstreamUserKey struct{}

// WithUpstreamUser returns ctx naming the caller an upstream request is
// made for.
func WithUpstreamUser(ctx context.Context, user string) context.Context {
	return context.WithValue(ctx, upstreamUserKey{}, user)
}

// UpstreamUser returns the caller an upstream request is made for, "" when
// none was named.
func UpstreamUser(ctx context.Context) string {
	u, _ := ctx.Value(upstreamUserKey{}).(string)
	return u
}

type upstreamSessionKey struct{}

// WithUpstreamSession returns ctx naming the MCP session an upstream
// request is made for, by its name in storage.
func WithUpstreamSession(ctx context.Context, ref string) context.Context {
	return context.WithValue(ctx, upstreamSessionKey{}, ref)
}

// UpstreamSession returns the storage name of the MCP session an upstream
// request is made for, "" when none was named. A transport that keeps
// upstream sessions in this process (a program, a legacy SSE stream) names
// a session it opens for it the same on every replica, so that the
// session's stored upstream id is one any replica can continue (each with
// a session of its own) rather than one each replica replaces.
func UpstreamSession(ctx context.Context) string {
	ref, _ := ctx.Value(upstreamSessionKey{}).(string)
	return ref
}

// UpstreamTransport is what reaches svc's upstream: the shared HTTP
// transport, or the service's transport module. Callers make one round
// trip with it, so redirects are never followed.
func (a *App) UpstreamTransport(svc *Service) http.RoundTripper {
	if svc.transport != nil {
		return svc.transport
	}
	return a.httpClient.Transport
}

// Transport returns the name of the service's upstream transport module
// ("stdio", "sse"), or "" for Streamable HTTP.
func (s *Service) Transport() string { return s.transportName }

// attachTransport loads the service's transport module, if it names one.
func (s *Service) attachTransport(ctx caddy.Context, a *App) error {
	if s.TransportRaw == nil {
		return nil
	}
	mod, err := ctx.LoadModule(s, "TransportRaw")
	if err != nil {
		return fmt.Errorf("service %q: transport: %v", s.ID, err)
	}
	t, ok := mod.(UpstreamTransport)
	if !ok {
		return fmt.Errorf("service %q: transport: module %T is not an upstream transport", s.ID, mod)
	}
	s.transport, s.transportName = t, caddy.GetModuleName(mod)
	if err := t.Attach(a, s); err != nil {
		return fmt.Errorf("service %q: %v", s.ID, err)
	}
	name := s.transportName
	if n, ok := t.(UpstreamNamer); ok {
		name += "\x00" + n.UpstreamName()
	}
	s.endpoint = endpointOf(s.URL, name)
	return nil
}

// serviceTransport collects the service block's transport options while
// it is parsed: `transport <name>`, and the options a transport module
// claims (command, say, makes the service a stdio one).
type serviceTransport struct {
	name   string
	module caddy.Module
	given  bool // `transport` was given
}

// parse handles the option the dispenser is on, reporting false when
// neither `transport` nor any transport's own option.
func (t *serviceTransport) parse(d *caddyfile.Dispenser, service string) (bool, error) {
	if d.Val() == "transport" {
		if t.given {
			return true, d.Errf("service %q: transport given twice", service)
		}
		t.given = true
		var name string
		if !d.NextArg() {
			return true, d.ArgErr()
		}
		name = d.Val()
		if d.NextArg() {
			return true, d.ArgErr()
		}
		if name == "http" {
			if t.name != "" {
				return true, d.Errf("service %q: transport http, but its options are %s's", service, t.name)
			}
			return true, nil
		}
		if t.name != "" && t.name != name {
			return true, d.Errf("service %q: transport %s, but its options are %s's", service, name, t.name)
		}
		return true, t.choose(d, service, name)
	}
	if p, ok := t.module.(ServiceOptionParser); ok {
		if handled, err := p.ParseServiceOption(d); handled || err != nil {
			return true, serviceErr(service, err)
		}
	}
	opt := d.Val()
	for _, info := range caddy.GetModules(UpstreamsNamespace) {
		mod := info.New()
		p, ok := mod.(ServiceOptionParser)
		if !ok {
			continue
		}
		handled, err := p.ParseServiceOption(d)
		switch {
		case (handled || err != nil) && t.module != nil:
			return true, d.Errf("service %q: %s is an option of transport %s, not %s", service, opt, info.ID.Name(), t.name)
		case handled || err != nil:
			t.name, t.module = info.ID.Name(), mod
			return true, serviceErr(service, err)
		}
	}
	return false, nil
}

// serviceErr names the service in a transport module's error.
func serviceErr(service string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("service %q: %w", service, err)
}

func (t *serviceTransport) choose(d *caddyfile.Dispenser, service, name string) error {
	if t.module != nil {
		return nil
	}
	info, err := caddy.GetModule(UpstreamsNamespace + "." + name)
	if err != nil {
		var known []string
		for _, m := range caddy.GetModules(UpstreamsNamespace) {
			known = append(known, m.ID.Name())
		}
		slices.Sort(known)
		return d.Errf("service %q: unknown transport %q (use http, %s)", service, name, strings.Join(known, ", "))
	}
	t.name, t.module = name, info.New()
	return nil
}

// raw is the JSON of the chosen transport module, nil for Streamable HTTP.
func (t *serviceTransport) raw() []byte {
	if t.module == nil {
		return nil
	}
	return caddyconfig.JSONModuleObject(t.module, "kind", t.name, nil)
}
