package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

func keysCheck(t *testing.T, args, tool string) error {
	t.Helper()
	return checkArgumentKeys(keysTerms(t, args, tool))
}

// keysTerms is args and tool as the check gets them.
func keysTerms(tb testing.TB, args, tool string) (*ast.Term, *ast.Term) {
	tb.Helper()
	a, err := jsonTerm([]byte(args))
	if err != nil {
		tb.Fatal(err)
	}
	d, err := jsonTerm([]byte(tool))
	if err != nil {
		tb.Fatal(err)
	}
	return a, d
}

// Attack (fixed): a key its own level does not declare passed when it is spelled
// like a property declared anywhere else in the schema (keyChecker.anywhere,
// keys.go:55-73), even where the level's own properties — behind a $ref, as
// mcp-go's (invopop/jsonschema) and pydantic's schemas put every nested
// struct — declare it in another case. A Go upstream decoding with
// encoding/json fills Target.Path from "path"; the policy reads
// input.params.arguments.dest.path, and a rule about dest.Path (the field
// the tool uses) never sees the value. Here a copy tool declares "path"
// (the source) at the top and "Path" (a struct field without a json tag)
// in the $ref'd target: {"dest":{"path":"/etc/cron.d/x"}} is accepted.
// keys.go's stated contract: keys that fold onto "a property the tool's
// inputSchema declares without being spelled like it" are refused; README:
// "what the policy inspects is exactly what the upstream reads". Fixed:
// the properties of each place are gathered through $ref and anyOf, and a
// key is checked against its own place's only.
func TestKeysAttackSpelledLikeAnotherPlacesPropertyBehindRef(t *testing.T) {
	tool := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"path":{"type":"string"},"dest":{"$ref":"#/$defs/Target"}},` +
		`"$defs":{"Target":{"type":"object","properties":{"Path":{"type":"string"},"Overwrite":{"type":"boolean"}}}}}}`
	// Control: a variant spelled like no declared name is refused.
	if err := keysCheck(t, `{"path":"/tmp/a","dest":{"PATH":"/etc/cron.d/x"}}`, tool); err == nil {
		t.Fatal("control: dest.PATH was accepted")
	}
	if err := keysCheck(t, `{"path":"/tmp/a","dest":{"path":"/etc/cron.d/x"}}`, tool); err == nil {
		t.Errorf("dest.path accepted: the $ref'd Target declares Path, which encoding/json fills from it, while the policy reads dest.path")
	} else {
		t.Logf("refused: %v", err)
	}
	// Same through anyOf (pydantic's Optional[Model]).
	tool2 := `{"name":"copy","inputSchema":{"type":"object","properties":{` +
		`"path":{"type":"string"},"dest":{"anyOf":[{"type":"object","properties":{"Path":{"type":"string"}}},{"type":"null"}]}}}}`
	if err := keysCheck(t, `{"path":"/tmp/a","dest":{"path":"/etc/cron.d/x"}}`, tool2); err == nil {
		t.Errorf("dest.path accepted under anyOf, where the object declares Path")
	}
}

// Attack (fixed; a regression): free-form maps — an environment, headers, labels:
// additionalProperties of plain strings, which no decoder maps onto struct
// fields — are checked against every property name the schema declares
// anywhere. A run tool declaring "path" and "user" refuses
// {"env":{"PATH":…,"USER":…}}, the most ordinary environment there is
// ("arguments.env.PATH is not a parameter of the tool, but it differs from
// the parameter \"path\" only in letter case"). A Go SDK server's
// map[string]string argument gives exactly this schema. The refusal buys
// nothing: the upstream decodes the map's keys as they are. Fixed: a place
// whose schema declares no properties has keys of its own.
func TestKeysAttackEnvironmentMapKeysRefused(t *testing.T) {
	tool := `{"name":"run","inputSchema":{"type":"object","properties":{` +
		`"path":{"type":"string"},"user":{"type":"string"},` +
		`"env":{"type":"object","additionalProperties":{"type":"string"}},` +
		`"headers":{"type":"object","additionalProperties":{"type":"string"}}}}}`
	for _, args := range []string{
		`{"path":"/srv/app","user":"app","env":{"PATH":"/usr/local/bin:/usr/bin","HOME":"/home/app","USER":"app"}}`,
		`{"path":"/srv/app","headers":{"Path":"/v1","User":"x"}}`,
	} {
		if err := keysCheck(t, args, tool); err != nil {
			t.Errorf("refused an ordinary call: %v: %s", err, args)
		}
	}
}

// Attack (fixed; performance): the schema-wide check this file's first
// test replaced kept every declaration of a name and walked the list for
// each key: a schema declaring "a" in n places and "A" once, and arguments
// holding m objects {"A":1} where the schema declares nothing, cost n×m
// string comparisons per call (n = m = 120,000, a 4 MB tools/list entry and
// 0.96 MB of arguments, took 99 s of CPU). Fixed: each place of the schema
// is gathered once per call, bounded by maxSchemas; the call is accepted
// (BenchmarkKeysLargeSchema measures it).
func TestKeysLargeSchemaAndArguments(t *testing.T) {
	for _, last := range []string{"b", "A"} {
		a, d := keysLarge(t, last)
		if err := checkArgumentKeys(a, d); err != nil {
			t.Errorf("last %q: %v", last, err)
		}
	}
}

func BenchmarkKeysLargeSchema(b *testing.B) {
	a, d := keysLarge(b, "A")
	for b.Loop() {
		if err := checkArgumentKeys(a, d); err != nil {
			b.Fatal(err)
		}
	}
}

// keysLarge is a schema declaring "a" in 30,000 places and last once, and
// arguments of 30,000 objects {"A":1} in an array whose items the schema
// does not describe.
func keysLarge(tb testing.TB, last string) (args, tool *ast.Term) {
	const n = 30000
	var schema strings.Builder
	schema.WriteString(`{"name":"t","inputSchema":{"type":"object","properties":{"list":{"type":"array"}},"$defs":{`)
	for i := range n {
		fmt.Fprintf(&schema, `"d%d":{"properties":{"a":{}}},`, i)
	}
	schema.WriteString(`"last":{"properties":{"` + last + `":{}}}}}}`)
	a, err := jsonTerm([]byte(`{"list":[` + strings.TrimSuffix(strings.Repeat(`{"A":1},`, n), ",") + `]}`))
	if err != nil {
		tb.Fatal(err)
	}
	d, err := jsonTerm([]byte(schema.String()))
	if err != nil {
		tb.Fatal(err)
	}
	return a, d
}

// BenchmarkKeysSmallCall is the check of an ordinary call: three scalar
// arguments and one small object, against a schema of plain properties.
func BenchmarkKeysSmallCall(b *testing.B) {
	a, err := jsonTerm([]byte(`{"ticket_id":"T-1","visibility":"private","comment":"looks good","filter":{"env":"prod"}}`))
	if err != nil {
		b.Fatal(err)
	}
	d, err := jsonTerm([]byte(`{"name":"update_ticket","inputSchema":{"type":"object","properties":{` +
		`"ticket_id":{"type":"string"},"visibility":{"type":"string"},"comment":{"type":"string"},` +
		`"filter":{"type":"object","properties":{"env":{"type":"string"}}}},"required":["ticket_id"]}}`))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := checkArgumentKeys(a, d); err != nil {
			b.Fatal(err)
		}
	}
}
