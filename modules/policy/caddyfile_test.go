package policy

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfileEvaluator(t *testing.T) {
	for _, tc := range []struct {
		input, want, err string
	}{
		{"toolgate_policy policies", "", ""},
		{"toolgate_policy policies {\n evaluator topdown\n}", evaluatorTopdown, ""},
		{"toolgate_result_policy policies {\n evaluator plan\n}", evaluatorPlan, ""},
		{"toolgate_policy policies {\n evaluator fast\n}", "", `invalid evaluator "fast" (plan or topdown)`},
		{"toolgate_policy policies {\n evaluator\n}", "", "evaluator takes one value"},
		// An unknown option is named as such, whatever follows it.
		{"toolgate_policy policies {\n lg_input\n}", "", `unknown option "lg_input" (known: source,`},
		{"toolgate_policy policies {\n evaluatr plan\n}", "", `unknown option "evaluatr"`},
	} {
		var c Config
		err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.input, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.input, err)
		case tc.err == "" && c.Evaluator != tc.want:
			t.Errorf("%q: evaluator %q, want %q", tc.input, c.Evaluator, tc.want)
		}
	}
	// JSON configs are checked too.
	c := Config{stage: stageRequest, Evaluator: "fast"}
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), `evaluator must be plan or topdown, not "fast"`) {
		t.Errorf("validate: %v", err)
	}
}

func TestUnmarshalCaddyfileVerificationKey(t *testing.T) {
	for _, tc := range []struct {
		input, key, alg, err string
	}{
		{"toolgate_policy https://b.example/t.tar.gz {\n verification_key /etc/k.pem\n}", "/etc/k.pem", "", ""},
		{"toolgate_policy https://b.example/t.tar.gz {\n verification_key /etc/k.pem ES256\n}", "/etc/k.pem", "ES256", ""},
		{"toolgate_policy https://b.example/t.tar.gz {\n verification_key\n}", "", "", "takes a public key file"},
		{"toolgate_policy https://b.example/t.tar.gz {\n verification_key a b c\n}", "", "", "takes a public key file"},
	} {
		var c Config
		err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.input, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.input, err)
		case tc.err == "" && (c.VerificationKey != tc.key || c.VerificationAlgorithm != tc.alg):
			t.Errorf("%q: %q %q", tc.input, c.VerificationKey, c.VerificationAlgorithm)
		}
	}
}
