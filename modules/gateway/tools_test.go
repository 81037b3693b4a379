package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func keepNames(names ...string) func(gjson.Result) bool {
	return func(tool gjson.Result) bool {
		for _, n := range names {
			if tool.Get("name").String() == n {
				return true
			}
		}
		return false
	}
}

func TestFilterTools(t *testing.T) {
	// Tool definitions with unusual but valid formatting, escapes and
	// unknown fields: what is kept must be the same bytes.
	whoami := `{"name":"whoami","description":"Who am I?\n\u00e9","inputSchema":{"type":"object"},"x-vendor":[1,2]}`
	read := `{ "name" : "read_ticket" , "annotations" : { "readOnlyHint" : true } ,"inputSchema":{"type":"object","properties":{"id":{"type":"string"}}}}`
	del := `{"name":"delete_ticket","inputSchema":{"type":"object"}}`
	tests := []struct {
		name   string
		result string
		keep   func(gjson.Result) bool
		want   string // "" means FilterTools returns nil
	}{
		{
			name:   "removes one, keeps the rest and every other member",
			result: `{"tools":[` + whoami + `,` + del + `,` + read + `],"nextCursor":"c2","_meta":{"k":"v"},"unknown":{"deep":[true]}}`,
			keep:   keepNames("whoami", "read_ticket"),
			want:   `{"tools":[` + whoami + `,` + read + `],"nextCursor":"c2","_meta":{"k":"v"},"unknown":{"deep":[true]}}`,
		},
		{
			name:   "tools not first, whitespace around the array kept",
			result: "{\"_meta\":{}, \"tools\" : [ " + del + " , " + whoami + " ] ,\n\"nextCursor\":null}",
			keep:   keepNames("whoami"),
			want:   "{\"_meta\":{}, \"tools\" : [" + whoami + "] ,\n\"nextCursor\":null}",
		},
		{
			name:   "removes every tool",
			result: `{"tools":[` + del + `],"nextCursor":"x"}`,
			keep:   keepNames(),
			want:   `{"tools":[],"nextCursor":"x"}`,
		},
		{
			name:   "removes the first and the last",
			result: `{"tools":[` + del + `,` + read + `,` + del + `]}`,
			keep:   keepNames("read_ticket"),
			want:   `{"tools":[` + read + `]}`,
		},
		{
			name:   "nothing removed",
			result: `{"tools":[` + whoami + `,` + read + `],"nextCursor":"c"}`,
			keep:   keepNames("whoami", "read_ticket"),
		},
		{"empty tools", `{"tools":[]}`, keepNames(), ""},
		{"no tools member", `{"nextCursor":"c"}`, keepNames(), ""},
		{"tools not an array", `{"tools":{"name":"x"}}`, keepNames(), ""},
		{"tools null", `{"tools":null}`, keepNames(), ""},
		{"nested tools member only", `{"_meta":{"tools":[` + del + `]}}`, keepNames(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			result := []byte(tt.result)
			orig := string(result)
			got := FilterTools(result, tt.keep)
			if string(result) != orig {
				t.Errorf("FilterTools modified its input")
			}
			if tt.want == "" {
				if got != nil {
					t.Errorf("FilterTools = %s, want nil", got)
				}
				return
			}
			if string(got) != tt.want {
				t.Errorf("FilterTools =\n%s\nwant\n%s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("result is not valid JSON: %s", got)
			}
		})
	}
}

func TestFilterToolsSeesEachToolOnce(t *testing.T) {
	var seen []string
	FilterTools([]byte(`{"tools":[{"name":"a"},{"name":"b"},{"name":"c"}]}`), func(tool gjson.Result) bool {
		seen = append(seen, tool.Get("name").String())
		return true
	})
	if strings.Join(seen, ",") != "a,b,c" {
		t.Errorf("keep saw %v, want a,b,c in order", seen)
	}
}
