package policy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "policy",
		Short: "Evaluates toolgate's policies as the gateway does",
		Long: `
Commands for policy authors. toolgate policy eval evaluates a policy input
(the JSON document the gateway builds for a runner's message, or for what
an upstream sends on one of the result stage's channels;
log_input in the policy directive writes it to the audit log) with the
policy the gateway would use: loaded from the same source (with its site/
rules and settings, checked the same way) and read the same way (a
decision that is undefined, malformed or over the deadline is a deny).
`,
		CobraFunc: func(cmd *cobra.Command) {
			eval := &cobra.Command{
				Use:   "eval --input <file> (--config <file> [--adapter <name>] | --policy <source> [--verification-key <file>]) [--stage request|result]",
				Short: "Prints the decision the gateway would make for a policy input",
				Long: `
Evaluates a policy input and prints the decision as the gateway reads it:
{"action", "reason", "arguments" or "result", "failure", "error", "revision"}.

--input is a JSON file (- for stdin): the input as log_input logs it, or one
you wrote. --config (with --adapter, as for toolgate run) names the
configuration whose toolgate_policy and toolgate_result_policy sources are
used (a bundle is verified with its verification_key, as by the gateway);
relative paths there are relative to the current directory, as for the
gateway. --policy names a source directly instead, with --verification-key
(and --verification-algorithm) for a signed bundle. --stage is request or
result; by default result when the input holds a result, else request.

Exits with status 0 after allow, 3 after deny or ask, and 1 when the input
or the policy cannot be read.
`,
				RunE: func(cmd *cobra.Command, _ []string) error {
					cmd.SilenceUsage = true
					allowed, err := cmdPolicyEval(caddycmd.Flags{FlagSet: cmd.Flags()}, os.Stdout)
					if err == nil && !allowed {
						os.Exit(3)
					}
					return err
				},
			}
			eval.Flags().StringP("input", "i", "", "the policy input, a JSON file (- for stdin)")
			eval.Flags().StringP("config", "c", "", "the configuration file (as for toolgate run)")
			eval.Flags().StringP("adapter", "a", "", "the configuration's adapter (as for toolgate run)")
			eval.Flags().StringP("policy", "p", "", "a policy source (a .rego file, a directory or a bundle URL) instead of --config")
			eval.Flags().String("stage", "", "request or result (default: result when the input holds a result)")
			eval.Flags().String("verification-key", "", "with --policy naming a signed bundle: the public key file that signs it (as verification_key)")
			eval.Flags().String("verification-algorithm", "", "the signature's algorithm (as for verification_key; default RS256)")
			cmd.AddCommand(eval)
		},
	})
}

// evalOutput is what toolgate policy eval prints.
type evalOutput struct {
	Stage     string         `json:"stage"`
	Source    string         `json:"source"`
	Revision  string         `json:"revision,omitempty"`
	Action    string         `json:"action"`
	Reason    string         `json:"reason,omitempty"`
	Arguments map[string]any `json:"arguments,omitempty"`
	Result    any            `json:"result,omitempty"`
	// Failure says why the decision is a deny the policy did not make.
	Failure string `json:"failure,omitempty"`
	// Error is the evaluation's error, when it failed (failure "error").
	Error string `json:"error,omitempty"`
}

// cmdPolicyEval runs toolgate policy eval, writing the decision to w; it
// reports whether the decision is an allow.
func cmdPolicyEval(fl caddycmd.Flags, w io.Writer) (allowed bool, err error) {
	policy := Config{Source: fl.String("policy"), VerificationKey: fl.String("verification-key"), VerificationAlgorithm: fl.String("verification-algorithm")}
	out, err := policyEval(fl.String("input"), fl.String("config"), fl.String("adapter"), policy, fl.String("stage"), os.Stdin)
	if err != nil {
		return false, err
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return false, err
	}
	return out.Action == "allow", nil
}

// policyEval evaluates the input in inputFile (stdin for "-") with the
// policy named by policy (its source, and the key verifying a bundle) or,
// without a source, by the configuration in configFile.
func policyEval(inputFile, configFile, adapter string, policy Config, stage string, stdin io.Reader) (*evalOutput, error) {
	if inputFile == "" {
		return nil, errors.New("--input is required: the policy input as JSON (- for stdin)")
	}
	var raw []byte
	var err error
	if inputFile == "-" {
		raw, err = io.ReadAll(stdin)
	} else {
		raw, err = os.ReadFile(inputFile)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the input: %w", err)
	}
	input, err := jsonTerm(raw)
	if err != nil {
		return nil, fmt.Errorf("the input is not JSON: %w", err)
	}
	if stage == "" {
		stage = stageRequest
		if obj, ok := input.Value.(ast.Object); ok && obj.Get(keyResult) != nil {
			stage = stageResult
		}
	}
	var query, replaceKey string
	switch stage {
	case stageRequest:
		query, replaceKey = "data.toolgate.request.decision", "arguments"
	case stageResult:
		query, replaceKey = "data.toolgate.result.decision", "result"
	default:
		return nil, fmt.Errorf("--stage %q: use request or result", stage)
	}
	switch {
	case policy.Source == "" && configFile == "":
		return nil, errors.New("name the policy: --config <file> (the gateway's configuration) or --policy <source>")
	case policy.Source == "" && policy.VerificationKey != "":
		return nil, errors.New("--verification-key goes with --policy: with --config, the configuration's verification_key is used")
	case policy.Source == "":
		if policy, err = configuredPolicy(configFile, adapter, stage, query); err != nil {
			return nil, err
		}
		query = policy.Query
	}
	src := newSource(policy.Source)
	// A bundle the gateway would refuse (unsigned, or not signed with its
	// verification_key) is refused here too: a decision printed from it
	// would be one the gateway never makes.
	verify, _, err := policy.verification(src.remote())
	if err != nil {
		return nil, err
	}
	if b, ok := src.(*bundleSource); ok {
		b.verify = verify
	}
	e, err := newEngine(src, query, stage, evaluatorPlan, 0, zap.NewNop(), policyMetrics)
	if err != nil {
		return nil, fmt.Errorf("loading the policy: %w", err)
	}
	if e.source.remote() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.reload(ctx); err != nil {
			return nil, fmt.Errorf("loading the policy: %w", err)
		}
	}
	o := e.decide(context.Background(), input.Value, time.Minute, replaceKey)
	out := &evalOutput{Stage: stage, Source: e.source.String(), Revision: o.Revision, Action: o.Action, Reason: o.Reason, Arguments: o.Arguments, Failure: o.Failure}
	if o.evalErr != nil {
		out.Error = o.evalErr.Error()
		if !e.source.remote() {
			// The plan's errors name no rule; OPA's evaluator says where.
			if te, err := newEngine(newSource(policy.Source), query, stage, evaluatorTopdown, 0, zap.NewNop(), policyMetrics); err == nil {
				if o := te.decide(context.Background(), input.Value, time.Minute, replaceKey); o.evalErr != nil {
					out.Error = o.evalErr.Error()
				}
			}
		}
	}
	if o.Result != nil {
		if out.Result, err = ast.JSON(o.Result.Value); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// configuredPolicy finds the source, query and verification key of the
// stage's policy directive in a configuration: every toolgate_policy
// (request) or toolgate_result_policy (result) handler must name the same
// ones.
func configuredPolicy(configFile, adapter, stage, query string) (Config, error) {
	cfg, _, _, err := caddycmd.LoadConfig(configFile, adapter)
	if err != nil {
		return Config{}, err
	}
	var doc any
	if err := json.Unmarshal(cfg, &doc); err != nil {
		return Config{}, err
	}
	handler := "toolgate_policy"
	if stage == stageResult {
		handler = "toolgate_result_policy"
	}
	var all []Config
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["handler"] == handler {
				f := Config{Query: query}
				f.Source, _ = x["source"].(string)
				if q, ok := x["query"].(string); ok && q != "" {
					f.Query = q
				}
				f.VerificationKey, _ = x["verification_key"].(string)
				f.VerificationAlgorithm, _ = x["verification_algorithm"].(string)
				all = append(all, f)
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(doc)
	name := func(c Config) string {
		return c.Source + "\x00" + c.Query + "\x00" + c.VerificationKey + "\x00" + c.VerificationAlgorithm
	}
	slices.SortFunc(all, func(a, b Config) int { return cmp.Compare(name(a), name(b)) })
	all = slices.CompactFunc(all, func(a, b Config) bool { return name(a) == name(b) })
	switch {
	case len(all) == 0:
		return Config{}, fmt.Errorf("%s has no %s directive", configFile, handler)
	case len(all) > 1:
		names := make([]string, len(all))
		for i, f := range all {
			names[i] = newSource(f.Source).String() + " " + f.Query
			if f.VerificationKey != "" {
				names[i] += " verified with " + f.VerificationKey
			}
		}
		return Config{}, fmt.Errorf("%s has %s directives with different policies (%s); name one with --policy", configFile, handler, strings.Join(names, ", "))
	}
	return all[0], nil
}
