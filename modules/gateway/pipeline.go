package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sync"
)

// Step is one handler of the MCP pipeline.
type Step uint8

// The pipeline's steps.
const (
	StepSession Step = iota + 1
	StepFederation
	StepRegistry
	StepPolicy
	StepCredentials
	StepResultPolicy
	StepProxy
)

var stepNames = map[Step]string{
	StepSession: "toolgate_session", StepFederation: "toolgate_federation", StepRegistry: "toolgate_registry", StepPolicy: "toolgate_policy",
	StepCredentials: "toolgate_credentials", StepResultPolicy: "toolgate_result_policy", StepProxy: "toolgate_proxy",
}

func (s Step) String() string { return stepNames[s] }

// pipelineTrail is the pipeline steps of one configuration in the order
// Caddy provisions them, which is the order of the handlers in each route
// (a route's handlers, and a subroute's, are provisioned one after the
// other, in order).
type pipelineTrail struct {
	mu    sync.Mutex
	steps []Step
	route *Route // of the steps since the last toolgate_session
}

// Route is what the pipeline steps of one route share: set while they are
// provisioned, read while they serve.
type Route struct {
	// openingGates are the decisions of the route's toolgate_policy
	// handlers on the initialize toolgate sends an upstream of an earlier
	// revision to open a stateless request's implied MCP session.
	openingGates []func(ctx context.Context, call *Call, params []byte) error
}

// AddOpeningGate adds a toolgate_policy's decision on the initialize that
// opens an implied MCP session (see DecideOpening).
func (r *Route) AddOpeningGate(gate func(ctx context.Context, call *Call, params []byte) error) {
	r.openingGates = append(r.openingGates, gate)
}

// HasOpeningGates reports whether the route has a toolgate_policy.
func (r *Route) HasOpeningGates() bool { return len(r.openingGates) > 0 }

// DecideOpening decides the initialize, with params as they will be sent,
// that opens call's implied MCP session (Stateless.Gate) under every
// toolgate_policy of the route — each may have a matcher, which cannot be
// evaluated before its step runs, and the session is opened before — and
// returns the first refusal (an *OpeningRefused), or nil.
func (r *Route) DecideOpening(ctx context.Context, call *Call, params []byte) error {
	for _, gate := range r.openingGates {
		if err := gate(ctx, call, params); err != nil {
			return err
		}
	}
	return nil
}

// OpeningRefused is the error of opening an implied MCP session whose
// initialize the request policy did not allow: nothing was sent.
type OpeningRefused struct {
	Decision *Decision
	Reason   string
}

func (e *OpeningRefused) Error() string { return "denied by policy: " + e.Reason }

// Answer refuses the runner's request whose implied MCP session could not
// be opened, as the refused initialize a runner of an earlier revision
// would have got.
func (e *OpeningRefused) Answer(w http.ResponseWriter, call *Call) {
	call.Fail(w, http.StatusForbidden, CodePolicyDenied,
		"denied by policy: the initialize toolgate sends the upstream for your client: "+e.Reason,
		map[string]any{"decision_id": e.Decision.ID})
}

// ProvisioningRoute is the route whose steps are being provisioned (the
// last toolgate_session's): a step keeps it in Provision, after
// ProvisionStep, to share what the route's other steps set.
func (a *App) ProvisioningRoute() *Route {
	t := a.pipeline
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.route == nil {
		t.route = new(Route)
	}
	return t.route
}

// ProvisionStep records that a pipeline handler is being provisioned and
// checks its place, so that a handler-order mistake fails `caddy validate`
// and startup instead of answering 500 at request time: every step comes
// after toolgate_session; toolgate_federation comes before
// toolgate_registry; toolgate_policy, toolgate_credentials,
// toolgate_result_policy and toolgate_proxy come after toolgate_registry;
// nothing but another toolgate_proxy (in another branch of the route)
// comes after toolgate_proxy, which never hands the request on; and
// toolgate_proxy comes after toolgate_policy, toolgate_credentials and
// toolgate_result_policy, so that no route relays calls no policy judges
// (the proxy also refuses, at request time, a message no toolgate_policy
// decided: one whose matcher let it by).
func (a *App) ProvisionStep(step Step) error {
	t := a.pipeline
	if t == nil {
		return fmt.Errorf("%s: the toolgate app is not provisioned", step)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if step == StepSession {
		t.steps, t.route = []Step{step}, new(Route)
		return nil
	}
	var registry, proxy bool
	have := map[Step]bool{}
	for _, s := range t.steps {
		registry = registry || s == StepRegistry
		proxy = proxy || s == StepProxy
		have[s] = true
	}
	switch {
	case len(t.steps) == 0:
		return fmt.Errorf("%s must come after toolgate_session in the same route", step)
	case proxy && step != StepProxy:
		return fmt.Errorf("%s comes after toolgate_proxy, which ends the request, so it would never run: put it before toolgate_proxy", step)
	case step == StepFederation && registry:
		return fmt.Errorf("%s must come before toolgate_registry in the same route", step)
	case !registry && step != StepRegistry && step != StepFederation:
		return fmt.Errorf("%s must come after toolgate_registry in the same route", step)
	case step == StepProxy && !(have[StepPolicy] && have[StepCredentials] && have[StepResultPolicy]):
		return fmt.Errorf("%s must come after toolgate_policy, toolgate_credentials and toolgate_result_policy in the same route: without them calls would reach the upstream unjudged, or without their credential", step)
	}
	t.steps = append(t.steps, step)
	return nil
}
