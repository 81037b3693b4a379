package mcp2026

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpmsg"
	"github.com/toolgate/toolgate/modules/gateway"
)

// Runtime is what stateless requests share within one configuration: the
// MCP sessions toolgate implies for them, how toolgate_proxy opens one
// (Opener), the sealer of toolgate's own requestStates, and what each
// service's upstream said about itself.
type Runtime struct {
	app    *gateway.App
	sealer *sealer

	mu       sync.Mutex
	implied  map[string]implied
	opener   Opener
	discover map[string]Discovery // by service and caller (discoveryKey)

	holds   holds
	eras    eras
	answers answers
	listens listens
}

// An Opener prepares an implied MCP session for use, once: it learns which
// revision the upstream speaks, initializes an upstream session for an
// upstream that needs one, and lists the upstream's tools for the policy.
// It is toolgate_proxy's.
type Opener func(ctx context.Context, call *gateway.Call) error

// Discovery is what toolgate learned of a service's upstream when it last
// opened a session with it: whether it speaks the stateless revision, and
// its capabilities, identity and instructions, from which toolgate answers
// a runner's server/discover.
type Discovery struct {
	Stateless    bool
	Capabilities []byte // JSON text
	ServerInfo   []byte // JSON text, nil when unknown
	Instructions []byte // JSON text of a string, nil when none
	TTLMs        []byte // JSON text, nil when none
	CacheScope   []byte // JSON text, nil when none
}

// processSecret keys requestStates when the configuration has no
// state_secret: they then hold only within this process.
var processSecret = func() []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}()

// For returns the runtime of app's configuration.
func For(app *gateway.App) (*Runtime, error) {
	v, err := app.Shared("mcp2026", func() (any, error) {
		secrets := [][]byte{processSecret}
		if app.StateSecret != "" {
			secrets = [][]byte{[]byte(app.StateSecret)}
			for _, p := range app.PreviousStateSecrets {
				secrets = append(secrets, []byte(p))
			}
		}
		s, err := newSealer(secrets...)
		if err != nil {
			return nil, err
		}
		rt := &Runtime{app: app, sealer: s, implied: map[string]implied{}, discover: map[string]Discovery{}}
		app.OnStart(func() { go rt.housekeeping() })
		app.OnStop(rt.releaseAll)
		return rt, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Runtime), nil
}

// SetOpener installs toolgate_proxy's way of opening implied sessions.
func (rt *Runtime) SetOpener(o Opener) {
	rt.mu.Lock()
	rt.opener = o
	rt.mu.Unlock()
}

// Open opens call's implied MCP session if it is not open yet. Without an
// opener (no toolgate_proxy in the configuration) it does nothing.
func (rt *Runtime) Open(ctx context.Context, call *gateway.Call) error {
	rt.mu.Lock()
	o := rt.opener
	rt.mu.Unlock()
	if o == nil {
		return nil
	}
	return o(ctx, call)
}

// maxImplied bounds the index of implied sessions; closed ones are swept
// from it when it is full.
const maxImplied = 1 << 16

// implied is an implied MCP session, and the caller's connection it was
// implied for (gateway.Connection.Grant), unless that could not be read
// (known false).
type implied struct {
	ms    *gateway.MCPSession
	grant string
	known bool
}

// Session returns the MCP session implied for a stateless request of call
// (caller, toolgate session, service, the capabilities and clientInfo it
// declared, and the client's address),
// creating it when there is none or the last one ended. Creating one counts
// against the MCP session limits like an initialize. Implied sessions are
// this replica's own (a stateless request carries all another replica
// needs), so none is stored.
//
// The session is also the caller's connection's to the service: once they
// connect again or store another personal token, the next request gets a
// new session, and the one of the old connection is ended (its upstream
// session where that sends the old one's id with no other credential: see
// mcpsession.Sessions.Retire), so that nothing the upstream said
// through the old connection — its discovery, tools, upstream session,
// listens — is served through the new, and rotated tokens do not pile up
// sessions against the limits.
func (rt *Runtime) Session(ctx context.Context, call *gateway.Call, svc *gateway.Service) (*gateway.MCPSession, error) {
	// The declared identity and the client's address are part of the key
	// as the capabilities are: each opens its own upstream session, whose
	// initialize the request policy decides (a rule on clientInfo or on
	// request.remote_ip holds for every request).
	h := sha256.New()
	h.Write(call.Stateless.Capabilities)
	h.Write([]byte{0})
	h.Write(call.Stateless.ClientInfo)
	h.Write([]byte{0})
	h.Write([]byte(call.RemoteIP))
	key := call.Caller.User + "\x00" + call.Session.ID + "\x00" + svc.ID + "\x00" + hex.EncodeToString(h.Sum(nil))
	grant, gerr := rt.app.GrantFor(ctx, svc, call.Caller.User, false) // unreadable: the credentials step reports it
	rt.mu.Lock()
	defer rt.mu.Unlock()
	cur, ok := rt.implied[key]
	if ok && !cur.ms.Closed() {
		keep := cur.grant == grant
		switch {
		case gerr != nil:
			// A connection that cannot be read now is no new one: the
			// session, and its listens, go on.
			keep = true
		case !cur.known:
			// Implied while the connection could not be read: it is the
			// one read now, unless its upstream session was opened
			// through another.
			if up := cur.ms.Upstream().Grant; up == "" || up == grant {
				cur.grant, cur.known, keep = grant, true, true
				rt.implied[key] = cur
			}
		}
		if keep {
			cur.ms.Touch()
			return cur.ms, nil
		}
		rt.app.MCPSessions().Retire(cur.ms)
	}
	if len(rt.implied) >= maxImplied {
		for k, im := range rt.implied {
			if im.ms.Closed() {
				delete(rt.implied, k)
			}
		}
	}
	ms, err := rt.app.MCPSessions().CreateLocal(ctx, call.Caller.User, call.Session.ID, call.Session.ExpiresAt, svc.ID)
	if err != nil {
		return nil, err
	}
	rt.implied[key] = implied{ms: ms, grant: grant, known: gerr == nil}
	return ms, nil
}

// SetDiscovery records what the call's service's upstream said about
// itself to the call's caller. It is kept per caller: an upstream may
// answer each caller with their own credential, and what it told one is
// not another's to read.
func (rt *Runtime) SetDiscovery(call *gateway.Call, d Discovery) {
	rt.mu.Lock()
	rt.discover[discoveryKey(call)] = d
	rt.mu.Unlock()
}

// Discovery returns what the call's service's upstream last said about
// itself to the call's caller.
func (rt *Runtime) Discovery(call *gateway.Call) (Discovery, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	d, ok := rt.discover[discoveryKey(call)]
	return d, ok
}

func discoveryKey(call *gateway.Call) string { return call.Service.ID + "\n" + call.Caller.User }

// Seal seals st, valid for ttl.
func (rt *Runtime) Seal(st State, ttl time.Duration) (string, error) {
	st.Expires = time.Now().Add(ttl).Unix()
	return rt.sealer.Seal(st)
}

// Redeem verifies a requestState toolgate sealed (text is its decoded
// string) against the call it comes back with, and uses it up: a state
// opens one retry, on one replica. A state that only stands for an
// upstream's (Relay) is not used up: the upstream decides what its own
// state opens, and each retry's answers are decided again.
func (rt *Runtime) Redeem(ctx context.Context, text string, want State) (State, error) {
	st, err := rt.sealer.Open(text, time.Now())
	if err != nil {
		return st, err
	}
	if err := st.Matches(want); err != nil {
		return st, err
	}
	if st.Relayed && st.Approval == "" && st.Held == "" {
		return st, nil
	}
	if err := consume(ctx, rt.app.Storage(), st); err != nil {
		if errors.Is(err, ErrStateReplayed) {
			return st, err
		}
		return st, fmt.Errorf("%w: checking a requestState: %v", gateway.ErrStorageUnavailable, err)
	}
	return st, nil
}

// ArgsDigest is the hex SHA-256 of arguments as they would go upstream.
func ArgsDigest(args []byte) string {
	if args == nil {
		args = []byte("{}")
	}
	sum := sha256.Sum256(args)
	return hex.EncodeToString(sum[:])
}

// OwnInput is the key of toolgate's own input request in inputRequests
// (and of its answer in inputResponses).
const OwnInput = "io.toolgate/approval"

// ownInputPrefix starts the keys toolgate reserves for its own input
// requests.
const ownInputPrefix = "io.toolgate/"

// ReservedInput reports whether an input_required result names an input
// request with a key toolgate reserves: from an upstream, that is one
// posing as toolgate's own (an approval round), and is refused.
func ReservedInput(result []byte) bool {
	reserved := false
	gjson.GetBytes(result, "inputRequests").ForEach(func(k, _ gjson.Result) bool {
		key := k.String()
		// In any case: a client that matches keys without regard to case
		// would take "IO.Toolgate/approval" for toolgate's own.
		reserved = len(key) >= len(ownInputPrefix) && strings.EqualFold(key[:len(ownInputPrefix)], ownInputPrefix)
		return !reserved
	})
	return reserved
}

// WithoutOwnState returns the body of a retried request without
// toolgate's requestState and toolgate's input response, for the upstream.
func WithoutOwnState(body, params []byte) []byte {
	return mcpmsg.ReplaceMember(body, "params", withoutOwnInput(mcpmsg.RemoveMember(params, "requestState")))
}

// withoutOwnInput returns params without toolgate's input response (and
// without inputResponses when nothing else is left in it).
func withoutOwnInput(params []byte) []byte {
	ir := mcpmsg.MemberOf(params, "inputResponses")
	if ir == nil || ir[0] != '{' {
		return params
	}
	rest := mcpmsg.RemoveMember(ir, OwnInput)
	if isEmptyObject(rest) {
		return mcpmsg.RemoveMember(params, "inputResponses")
	}
	return mcpmsg.ReplaceMember(params, "inputResponses", rest)
}

// WithoutRetry returns params without what a retry of a multi round-trip
// request adds (inputResponses, requestState; in any case, as an
// upstream's decoder may read them): the revision's members, which only
// toolgate may send to an upstream that initializes (to the exchange it
// holds) and a runner of an earlier revision sends no upstream (toolgate
// answers the input requests of an upstream of 2026-07-28 for it).
// Otherwise a runner's own answers would reach the upstream as answers to
// input requests never asked through toolgate, nor decided as answers.
func WithoutRetry(params []byte) []byte {
	return mcpmsg.RemoveMemberFold(mcpmsg.RemoveMemberFold(params, "inputResponses"), "requestState")
}

// CallParams are the params that identify a request other than a
// tools/call, for its approvals and the requestStates toolgate seals, as
// a tools/call's arguments identify it: its params without _meta (the
// request's metadata, which a retry may renew) and without what a retry
// of a multi round-trip request adds (inputResponses, requestState). A
// retry is then found to be the call its person approved, and a held
// round's retry the call it continues.
func CallParams(params []byte) []byte {
	p := params
	for _, k := range []string{"_meta", "inputResponses", "requestState"} {
		p = mcpmsg.RemoveMember(p, k)
	}
	return p
}

func isEmptyObject(b []byte) bool {
	n := 0
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			n++
		}
	}
	return n == 2
}

// sweepInterval is how often the records of used requestStates are swept.
const sweepInterval = 5 * time.Minute

// housekeeping sweeps the records of used requestStates that expired,
// until the app stops.
func (rt *Runtime) housekeeping() {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	for {
		select {
		case <-rt.app.Done():
			return
		case <-t.C:
			if n, err := rt.Sweep(context.Background()); err != nil {
				rt.app.Logger().Warn("sweeping used requestStates", zap.Error(err))
			} else if n > 0 {
				rt.app.Logger().Debug("removed used requestStates", zap.Int("count", n))
			}
		}
	}
}

// Sweep deletes the records of used requestStates that expired: the
// record of a use is needed only while the state would still open a retry.
func (rt *Runtime) Sweep(ctx context.Context) (int, error) {
	return sweepUsed(ctx, rt.app.Storage(), time.Now())
}
