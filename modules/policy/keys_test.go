package policy

import (
	"strings"
	"testing"
)

// combinatorTool declares properties through anyOf, $ref, additionalProperties
// and prefixItems.
const combinatorTool = `{"name":"publish","inputSchema":{"type":"object","properties":{` +
	`"options":{"anyOf":[{"type":"object","properties":{"visibility":{"type":"string"}}},{"type":"null"}]},` +
	`"ref":{"$ref":"#/$defs/ref"},` +
	`"map":{"type":"object","additionalProperties":{"type":"object","properties":{"level":{"type":"integer"}}}},` +
	`"tuple":{"type":"array","prefixItems":[{"type":"object","properties":{"depth":{"type":"integer"}}}]}},` +
	`"$defs":{"ref":{"type":"object","properties":{"mode":{"type":"string"}}}}}}`

func TestCheckArgumentKeys(t *testing.T) {
	tool := `{"name":"update_ticket","inputSchema":{"type":"object","properties":{` +
		`"ticket_id":{"type":"string"},"visibility":{"type":"string"},` +
		`"filter":{"type":"object","properties":{"env":{"type":"string"}}},` +
		`"labels":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}}}}}`
	for _, c := range []struct {
		args, tool, refused string // refused: a part of the error, "" when accepted
	}{
		{`{"ticket_id":"T-1","visibility":"private"}`, tool, ""},
		{`{}`, tool, ""},
		{`{"extra":1,"Other":2}`, tool, ""}, // undeclared and not folding onto anything
		{`{"TICKET_ID":"SECRET-1"}`, tool, `arguments.TICKET_ID is not a parameter of the tool, but it differs from the parameter "ticket_id"`},
		{`{"viſibility":"public"}`, tool, `"visibility"`}, // U+017F LATIN SMALL LETTER LONG S
		{`{"ticKet_id":"x"}`, tool, `"ticket_id"`},        // U+212A KELVIN SIGN
		{`{"filter":{"ENV":"prod"}}`, tool, "arguments.filter.ENV"},
		{`{"labels":[{"name":"a"},{"Name":"b"}]}`, tool, "arguments.labels[1].Name"},
		{`{"visibility":"private","viſibility":"public"}`, tool, "differ only in letter case"},
		{`{"a":{"b":1,"B":2}}`, `{"name":"t"}`, `arguments.a has the keys`},
		{`{"TICKET_ID":"x"}`, `{"name":"t"}`, ""}, // no definition: nothing declared to fold onto
		// Properties declared through schema keywords other than
		// properties and items: checked against every name the schema
		// declares.
		{`{"options":{"Visibility":"public"}}`, combinatorTool, "arguments.options.Visibility"},
		{`{"ref":{"Mode":"x"}}`, combinatorTool, "arguments.ref.Mode"},
		{`{"map":{"k":{"LEVEL":1}}}`, combinatorTool, "arguments.map.k.LEVEL"},
		{`{"tuple":[{"Depth":1}]}`, combinatorTool, "arguments.tuple[0].Depth"},
		{`{"Options":{}}`, combinatorTool, `"options"`},
		{`{"options":{"visibility":"public"},"ref":{"mode":"x"},"map":{"k":{"level":1}},"tuple":[{"depth":1}]}`, combinatorTool, ""},
		{`{"map":{"Anything":1,"mode":2}}`, combinatorTool, ""}, // spelled like a declared name, or like none
	} {
		args, err := jsonTerm([]byte(c.args))
		if err != nil {
			t.Fatal(err)
		}
		def, err := jsonTerm([]byte(c.tool))
		if err != nil {
			t.Fatal(err)
		}
		err = checkArgumentKeys(args, def)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", c.args, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s: error %v, want one containing %q", c.args, err, c.refused)
		}
	}
}
