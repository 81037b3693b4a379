package gateway

import (
	"fmt"
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
}

// ProvisionStep records that a pipeline handler is being provisioned and
// checks its place, so that a handler-order mistake fails `caddy validate`
// and startup instead of answering 500 at request time: every step comes
// after toolgate_session; toolgate_federation comes before
// toolgate_registry; toolgate_policy, toolgate_credentials,
// toolgate_result_policy and toolgate_proxy come after toolgate_registry;
// and nothing but another toolgate_proxy (in another branch of the route)
// comes after toolgate_proxy, which never hands the request on.
func (a *App) ProvisionStep(step Step) error {
	t := a.pipeline
	if t == nil {
		return fmt.Errorf("%s: the toolgate app is not provisioned", step)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if step == StepSession {
		t.steps = []Step{step}
		return nil
	}
	var registry, proxy bool
	for _, s := range t.steps {
		registry = registry || s == StepRegistry
		proxy = proxy || s == StepProxy
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
	}
	t.steps = append(t.steps, step)
	return nil
}
