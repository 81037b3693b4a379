package gateway

import "testing"

func TestProvisionStepChecksThePipelineOrder(t *testing.T) {
	for name, c := range map[string]struct {
		steps []Step
		bad   int // index of the first step refused; -1 for none
	}{
		"the documented order":       {[]Step{StepSession, StepRegistry, StepPolicy, StepCredentials, StepResultPolicy, StepProxy}, -1},
		"two branches of proxies":    {[]Step{StepSession, StepRegistry, StepProxy, StepProxy}, -1},
		"two routes":                 {[]Step{StepSession, StepRegistry, StepProxy, StepSession, StepRegistry, StepProxy}, -1},
		"nothing before the proxy":   {[]Step{StepProxy}, 0},
		"no registry":                {[]Step{StepSession, StepPolicy}, 1},
		"result policy after proxy":  {[]Step{StepSession, StepRegistry, StepProxy, StepResultPolicy}, 3},
		"a route without a session":  {[]Step{StepSession, StepRegistry, StepProxy, StepRegistry, StepProxy}, 3},
		"federation":                 {[]Step{StepSession, StepFederation, StepRegistry, StepPolicy, StepProxy}, -1},
		"federation after registry":  {[]Step{StepSession, StepRegistry, StepFederation, StepProxy}, 2},
		"federation without session": {[]Step{StepFederation, StepRegistry}, 0},
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
