package gateway

import "testing"

func TestProvisionStepChecksThePipelineOrder(t *testing.T) {
	for name, c := range map[string]struct {
		steps []Step
		bad   int // index of the first step refused; -1 for none
	}{
		"the documented order":       {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy}, -1},
		"two branches of proxies":    {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy, StepProxy}, -1},
		"two routes":                 {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy, StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy}, -1},
		"nothing before the proxy":   {[]Step{StepProxy}, 0},
		"no registry":                {[]Step{StepSession, StepPolicy}, 1},
		"result policy after proxy":  {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepProxy, StepResultPolicy}, 4},
		"a route without a session":  {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy, StepRegistry, StepProxy}, 6},
		"federation":                 {[]Step{StepSession, StepFederation, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy}, -1},
		"federation after registry":  {[]Step{StepSession, StepRegistry, StepFederation, StepProxy}, 2},
		"federation without session": {[]Step{StepFederation, StepRegistry}, 0},
		// A proxy relays only what the policies judge, with the caller's
		// credential: a route missing either policy or the credential
		// step is refused, not run wide open.
		"no request policy":             {[]Step{StepSession, StepRegistry, StepCredentials, StepResultPolicy, StepProxy}, 4},
		"no result policy":              {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepProxy}, 4},
		"no credentials":                {[]Step{StepSession, StepRegistry, StepPolicy, StepResultPolicy, StepProxy}, 4},
		"only session, registry, proxy": {[]Step{StepSession, StepRegistry, StepProxy}, 2},
		"steps of the route before":     {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy, StepSession, StepRegistry, StepProxy}, 8},
	} {
		a := &App{pipeline: new(pipelineTrail)}
		bad := -1
		for i, s := range c.steps {
			if err := a.ProvisionStep(s); err != nil {
				bad = i
				break
			}
		}
		if bad != c.bad {
			t.Errorf("%s: refused step %d, want %d", name, bad, c.bad)
		}
	}
}
