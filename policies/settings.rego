# METADATA
# title: toolgate settings check
# description: |
#   Checks data.toolgate.settings (data.json, data.yaml) when the gateway
#   loads the policies: a setting of the wrong type would otherwise switch
#   a protection off without a word (max_result_bytes: "2000" is not a
#   number, so nothing would be cut). The gateway refuses to load a policy
#   directory while `errors` holds anything, naming each key; a running
#   gateway keeps its last good policy.
#
#   Settings of your own: add their kind to `setting_kinds` (or
#   `service_setting_kinds`) from another file of this package, or keep them
#   under a top-level key of your own outside data.toolgate.
package toolgate.config

# settings is data.toolgate.settings, or nothing when there is no data file.
settings := s if {
	s := data.toolgate.settings
} else := {}

# setting_kinds maps every setting to the kind of value it takes (see
# valid); service_setting_kinds the same for settings.services.<id>.
setting_kinds["admin_groups"] := "names"

setting_kinds["max_result_bytes"] := "bytes"

setting_kinds["max_listing_bytes"] := "bytes"

setting_kinds["redact_patterns"] := "patterns"

setting_kinds["services"] := "object"

service_setting_kinds["read_only"] := "flag"

service_setting_kinds["admin_groups"] := "names"

service_setting_kinds["allow_without_approval"] := "names"

service_setting_kinds["pin_arguments"] := "pins"

service_setting_kinds["max_result_bytes"] := "bytes"

service_setting_kinds["max_listing_bytes"] := "bytes"

setting_kinds["max_listing_bytes"] := "bytes"

service_setting_kinds["review_results"] := "flag"

# services is settings.services when it is an object.
services := s if {
	s := settings.services
	is_object(s)
} else := {}

# kind_text says what each kind of value must be.
kind_text := {
	"flag": "true or false (a JSON boolean)",
	"bytes": "a whole number of bytes of at least 1 (a JSON number such as 65536)",
	"names": "an array of non-empty strings",
	"patterns": `an object of RE2 regular expressions ({"kind": "regex"}), each valid`,
	"pins": `an object of tools, each an object of arguments ({"tool": {"argument": value}})`,
	"object": "an object",
}

# errors holds one message per setting that is wrong, naming its key.
errors contains "settings: must be an object" if not is_object(settings)

errors contains msg if {
	is_object(settings)
	some key, _ in settings
	not setting_kinds[key]
	msg := sprintf("settings.%s: unknown setting (known: %s)", [key, concat(", ", sort(object.keys(setting_kinds)))])
}

errors contains msg if {
	is_object(settings)
	some key, value in settings
	kind := setting_kinds[key]
	not valid(kind, value)
	msg := sprintf("settings.%s: %s is not %s", [key, json.marshal(value), kind_text[kind]])
}

errors contains msg if {
	some id, service in services
	not is_object(service)
	msg := sprintf("settings.services.%s: %s is not an object of settings", [id, json.marshal(service)])
}

errors contains msg if {
	some id, service in services
	some key, _ in service
	not service_setting_kinds[key]
	msg := sprintf("settings.services.%s.%s: unknown setting (known: %s)", [id, key, concat(", ", sort(object.keys(service_setting_kinds)))])
}

errors contains msg if {
	some id, service in services
	some key, value in service
	kind := service_setting_kinds[key]
	not valid(kind, value)
	msg := sprintf("settings.services.%s.%s: %s is not %s", [id, key, json.marshal(value), kind_text[kind]])
}

valid("flag", v) if is_boolean(v)

valid("bytes", v) if {
	is_number(v)
	v == round(v)
	v >= 1
}

valid("names", v) if {
	is_array(v)
	every x in v {
		is_string(x)
		x != ""
	}
}

valid("patterns", v) if {
	is_object(v)
	every _, p in v {
		is_string(p)
		regex.is_valid(p)
	}
}

valid("pins", v) if {
	is_object(v)
	every _, args in v {
		is_object(args)
	}
}

valid("object", v) if is_object(v)
