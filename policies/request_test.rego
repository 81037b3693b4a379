package toolgate.request_test

import data.toolgate.request

# A tools/call as the gateway builds it; tests change the parts they need.
base := {
	"caller": {"user": "alice@example.com", "groups": ["eng"], "claims": {}},
	"session": {"id": "sess-1", "services": ["tracker"]},
	"service": {"id": "tracker", "auth": "oauth", "tools": ["whoami", "read_ticket", "update_ticket", "delete_ticket"]},
	"method": "tools/call",
	"tool": {
		"name": "read_ticket",
		"title": "Read a ticket",
		"description": "Returns one ticket.",
		"annotations": {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": false, "openWorldHint": true},
		"annotations_source": "upstream",
		"upstream_annotations": {"readOnlyHint": true},
		"inputSchema": {"type": "object", "properties": {"ticket_id": {"type": "string"}}},
	},
	"arguments": {"ticket_id": "TEST-123"},
	"listing": false,
	"request": {"remote_ip": "127.0.0.1", "protocol_version": "2025-11-25"},
	"time": "2026-11-29T12:00:00Z",
}

call(tool) := object.union(object.remove(base, ["tool"]), {"tool": tool})

as_admin(inp) := object.union(inp, {"caller": {"groups": ["eng", "admins"]}})

listed(inp) := object.union(object.remove(inp, ["arguments"]), {"listing": true})

# Tools as the gateway gives them: annotations resolved (the registry's
# declaration, else the upstream's hints, else MCP's defaults), where they
# came from, and what the upstream sent (see the README).
seen(name, read_only, destructive, source, upstream) := object.union(
	{
		"name": name,
		"annotations": {"readOnlyHint": read_only, "destructiveHint": destructive, "idempotentHint": false, "openWorldHint": true},
		"annotations_source": source,
	},
	{"upstream_annotations": upstream | upstream != null},
)

read_tool := seen("read_ticket", true, false, "upstream", {"readOnlyHint": true})

# Marked as changing things without destroying them.
write_tool := seen("update_ticket", false, false, "upstream", {"readOnlyHint": false, "destructiveHint": false})

drop_tool := seen("delete_ticket", false, true, "upstream", {"destructiveHint": true})

# No annotations at all: by MCP's defaults, not read-only and destructive.
unmarked_tool := seen("update_ticket", false, true, "default", null)

# The registry declares it (tool read_ticket read_only).
declared_read_tool := seen("read_ticket", true, false, "registry", {"readOnlyHint": true})

settings := {
	"admin_groups": ["admins"],
	"max_result_bytes": 65536,
	"services": {},
}

with_service(id, conf) := object.union(settings, {"services": {id: conf}})

# --- methods other than tools/call

test_other_methods_allowed if {
	every method in ["initialize", "ping", "tools/list", "resources/list", "resources/read", "prompts/get", "notifications/initialized"] {
		inp := object.union(object.remove(base, ["tool", "arguments"]), {"method": method, "params": {"uri": "file:///x"}})
		d := request.decision with input as inp
		d.action == "allow"
		d.reason == "not a tool call; allowed by default"
		not d.arguments
	}
}

test_other_methods_allowed_in_read_only_service if {
	inp := object.union(object.remove(base, ["tool", "arguments"]), {"method": "resources/read", "params": {"uri": "file:///x"}})
	d := request.decision with input as inp with data.toolgate.settings as with_service("tracker", {"read_only": true})
	d.action == "allow"
}

test_missing_method_denied if {
	d := request.decision with input as object.remove(base, ["method"])
	d.action == "deny"
	contains(d.reason, "input.method is missing")
}

# --- readOnlyHint

test_read_only_tool_allowed if {
	d := request.decision with input as call(read_tool)
	d == {"action": "allow", "reason": "the tool is marked read-only (annotations.readOnlyHint); allowed"}
}

test_unmarked_tool_asks if {
	d := request.decision with input as call(write_tool)
	d.action == "ask"
	contains(d.reason, `tool "update_ticket" on service "tracker" is not marked read-only`)
	contains(d.reason, "human must approve")
}

test_unmarked_tool_is_destructive_by_default if {
	# No annotations, or no definition at all (the gateway has not seen
	# one): MCP's defaults make the tool destructive, so only admins may run
	# it, with approval.
	d := request.decision with input as call(unmarked_tool)
	d.action == "deny"
	contains(d.reason, "by MCP's default")
	a := request.decision with input as as_admin(call(unmarked_tool))
	a.action == "ask"
}

test_tool_without_name_asks if {
	d := request.decision with input as call(object.remove(write_tool, ["name"]))
	d.action == "ask"
	contains(d.reason, `tool ""`)
}

test_registry_declaration_beats_the_upstream if {
	# The upstream says read-only; the administrator declared it destructive.
	lying := seen("delete_all_tickets", false, true, "registry", {"readOnlyHint": true})
	d := request.decision with input as call(lying)
	d.action == "deny"
	contains(d.reason, "as declared in the registry")
}

# --- destructiveHint and admin groups

test_destructive_denied_for_non_admin if {
	d := request.decision with input as call(drop_tool)
	d.action == "deny"
	contains(d.reason, `tool "delete_ticket" on service "tracker" may be destructive (annotations.destructiveHint, as the upstream marks it)`)
	contains(d.reason, `["admins"]`)
}

test_destructive_asks_for_admin if {
	d := request.decision with input as as_admin(call(drop_tool))
	d.action == "ask"
	contains(d.reason, "as an administrator")
	not contains(d.reason, "not marked read-only") # one reason, not two
}

test_destructive_and_read_only_is_destructive if {
	# Contradictory hints fail closed: the destructive hint wins.
	tool := seen("delete_ticket", true, true, "upstream", {"readOnlyHint": true, "destructiveHint": true})
	d := request.decision with input as call(tool)
	d.action == "deny"
	a := request.decision with input as as_admin(call(tool))
	a.action == "ask"
}

test_global_admin_groups_setting if {
	conf := object.union(settings, {"admin_groups": ["sre", "secops"]})
	sre := object.union(call(drop_tool), {"caller": {"groups": ["secops"]}})
	d := request.decision with input as sre with data.toolgate.settings as conf
	d.action == "ask"
	n := request.decision with input as as_admin(call(drop_tool)) with data.toolgate.settings as conf
	n.action == "deny"
	contains(n.reason, `["sre", "secops"]`)
}

test_admin_groups_default_without_settings if {
	d := request.decision with input as as_admin(call(drop_tool)) with data.toolgate.settings as {}
	d.action == "ask"
	n := request.decision with input as call(drop_tool) with data.toolgate.settings as {}
	n.action == "deny"
}

test_service_admin_groups_override if {
	conf := with_service("tracker", {"admin_groups": ["tracker-admins"]})

	# Global admins are not admins of this service...
	d := request.decision with input as as_admin(call(drop_tool)) with data.toolgate.settings as conf
	d.action == "deny"
	contains(d.reason, `["tracker-admins"]`)

	# ...its own admins are,
	own := object.union(call(drop_tool), {"caller": {"groups": ["tracker-admins"]}})
	o := request.decision with input as own with data.toolgate.settings as conf
	o.action == "ask"

	# and other services keep the global list.
	other := object.union(as_admin(call(drop_tool)), {"service": {"id": "wiki"}})
	w := request.decision with input as other with data.toolgate.settings as conf
	w.action == "ask"
}

test_caller_without_groups_is_not_admin if {
	d := request.decision with input as object.union(call(drop_tool), {"caller": {"user": "bot"}})
	d.action == "deny"
}

# --- per-service read-only mode

test_read_only_service_denies_unmarked_tools if {
	conf := with_service("tracker", {"read_only": true})
	every tool in [write_tool, unmarked_tool] {
		d := request.decision with input as as_admin(call(tool)) with data.toolgate.settings as conf
		d.action == "deny"
		contains(d.reason, `service "tracker" is in read-only mode`)
	}
}

test_read_only_service_allows_declared_read_only_tools if {
	d := request.decision with input as call(declared_read_tool) with data.toolgate.settings as with_service("tracker", {"read_only": true})
	d.action == "allow"
}

test_read_only_service_needs_the_registry if {
	# An upstream that marks a tool read-only is not believed in read-only
	# mode: delete_all_tickets marked readOnlyHint by its upstream does not run.
	lying := seen("delete_all_tickets", true, false, "upstream", {"readOnlyHint": true})
	d := request.decision with input as as_admin(call(lying)) with data.toolgate.settings as with_service("tracker", {"read_only": true})
	d.action == "deny"
	contains(d.reason, "not declared read-only in its registry entry (tool delete_all_tickets read_only)")
}

test_read_only_service_denies_destructive_for_admin if {
	d := request.decision with input as as_admin(call(drop_tool)) with data.toolgate.settings as with_service("tracker", {"read_only": true})
	d.action == "deny"
}

test_read_only_must_be_true if {
	d := request.decision with input as call(write_tool) with data.toolgate.settings as with_service("tracker", {"read_only": "yes"})
	d.action == "ask"
}

test_read_only_is_per_service if {
	d := request.decision with input as call(write_tool) with data.toolgate.settings as with_service("wiki", {"read_only": true})
	d.action == "ask"
}

test_all_deny_reasons_reported if {
	# Non-admin, destructive, read-only service: both reasons, joined.
	d := request.decision with input as call(drop_tool) with data.toolgate.settings as with_service("tracker", {"read_only": true})
	d.action == "deny"
	contains(d.reason, "read-only mode")
	contains(d.reason, "may be destructive")
	contains(d.reason, "; ")
}

# --- allow_without_approval

test_allow_without_approval if {
	d := request.decision with input as call(write_tool) with data.toolgate.settings as with_service("tracker", {"allow_without_approval": ["update_ticket"]})
	d.action == "allow"
	contains(d.reason, "allow_without_approval")
}

test_allow_without_approval_lists_only_named_tools if {
	d := request.decision with input as call(write_tool) with data.toolgate.settings as with_service("tracker", {"allow_without_approval": ["whoami"]})
	d.action == "ask"
}

test_allow_without_approval_keeps_destructive_rule if {
	conf := with_service("tracker", {"allow_without_approval": ["delete_ticket"]})
	d := request.decision with input as call(drop_tool) with data.toolgate.settings as conf
	d.action == "deny"
	a := request.decision with input as as_admin(call(drop_tool)) with data.toolgate.settings as conf
	a.action == "ask"
}

test_allow_without_approval_keeps_read_only_mode if {
	conf := with_service("tracker", {"read_only": true, "allow_without_approval": ["update_ticket"]})
	d := request.decision with input as call(write_tool) with data.toolgate.settings as conf
	d.action == "deny"
}

# --- pin_arguments (argument rewrites)

pins := with_service("tracker", {"pin_arguments": {
	"update_ticket": {"project": "SEC", "labels": ["audited"]},
	"read_ticket": {"project": "SEC"},
}})

test_pin_arguments_rewrite_ask if {
	inp := object.union(call(write_tool), {"arguments": {"ticket_id": "TEST-1", "project": "OTHER", "labels": {"a": 1}}})
	d := request.decision with input as inp with data.toolgate.settings as pins
	d.action == "ask"
	d.arguments == {"ticket_id": "TEST-1", "project": "SEC", "labels": ["audited"]}
}

test_pin_arguments_rewrite_allow if {
	d := request.decision with input as call(read_tool) with data.toolgate.settings as pins
	d.action == "allow"
	d.arguments == {"ticket_id": "TEST-123", "project": "SEC"}
}

test_pin_arguments_added_when_absent if {
	d := request.decision with input as object.remove(call(read_tool), ["arguments"]) with data.toolgate.settings as pins
	d.arguments == {"project": "SEC"}
}

test_pin_arguments_only_for_named_tool if {
	d := request.decision with input as call(object.union(read_tool, {"name": "whoami"})) with data.toolgate.settings as pins
	d.action == "allow"
	not d.arguments
}

test_pin_arguments_not_on_deny if {
	conf := with_service("tracker", {"pin_arguments": {"delete_ticket": {"project": "SEC"}}})
	d := request.decision with input as call(drop_tool) with data.toolgate.settings as conf
	d.action == "deny"
	not d.arguments
}

test_no_arguments_key_without_rewrite if {
	d := request.decision with input as call(write_tool)
	object.keys(d) == {"action", "reason"}
}

test_custom_override_composes if {
	d := request.decision with input as call(read_tool) with request.argument_overrides as {"limit": 10}
	d.arguments == {"ticket_id": "TEST-123", "limit": 10}
}

# --- listing (tools/list filtering: deny hides, ask and allow show)

test_listing_read_only_visible if {
	d := request.decision with input as listed(call(read_tool))
	d.action == "allow"
}

test_listing_unmarked_visible_as_ask if {
	d := request.decision with input as listed(call(write_tool))
	d.action == "ask"
}

test_listing_destructive_hidden_from_non_admin if {
	d := request.decision with input as listed(call(drop_tool))
	d.action == "deny"
	a := request.decision with input as listed(as_admin(call(drop_tool)))
	a.action == "ask"
}

test_listing_read_only_service_hides_unmarked if {
	conf := with_service("tracker", {"read_only": true})
	d := request.decision with input as listed(call(write_tool)) with data.toolgate.settings as conf
	d.action == "deny"
	r := request.decision with input as listed(call(declared_read_tool)) with data.toolgate.settings as conf
	r.action == "allow"
}

test_listing_never_carries_arguments if {
	d := request.decision with input as listed(call(read_tool)) with data.toolgate.settings as pins
	d.action == "allow"
	not d.arguments
}

# --- composition with site rules

test_site_deny_beats_allow_and_ask if {
	d := request.decision with input as call(read_tool) with request.deny as {"blocked by site rule"}
	d == {"action": "deny", "reason": "blocked by site rule"}
	a := request.decision with input as call(write_tool) with request.deny as {"blocked by site rule"}
	a.action == "deny"
}

test_site_ask_beats_allow if {
	d := request.decision with input as call(read_tool) with request.ask as {"b second", "a first"}
	d == {"action": "ask", "reason": "a first; b second"}
}

test_decision_is_always_one_object if {
	every inp in [call(read_tool), call(write_tool), call(drop_tool), listed(call(drop_tool)), object.remove(base, ["method"])] {
		d := request.decision with input as inp
		d.action in {"allow", "deny", "ask"}
		is_string(d.reason)
		d.reason != ""
	}
}

test_defaults_without_settings if {
	# The shipped directory holds no settings (a site keeps its own in
	# site/): the rules' defaults apply.
	not data.toolgate.settings
	request.admin_groups == ["admins"] with input as base
}

test_other_methods_with_site_overrides if {
	# Overrides apply whatever the method; the reason stays the same.
	inp := object.union(object.remove(base, ["tool", "arguments"]), {"method": "prompts/get", "params": {"name": "p"}})
	d := request.decision with input as inp with request.argument_overrides as {"x": 1}
	d == {"action": "allow", "reason": "not a tool call; allowed by default", "arguments": {"x": 1}}
}

test_fallback_allow_reason if {
	# Only reachable when the ask rules are edited away; still a valid decision.
	d := request.decision with input as call(write_tool) with request.ask as set()
	d == {"action": "allow", "reason": "allowed by policy"}
}

test_failed_rewrite_is_undefined if {
	# Arguments that are not an object cannot be rewritten: no decision (a
	# deny), never the call with the runner's arguments.
	inp := object.union(call(read_tool), {"arguments": ["TEST-1"]})
	not request.decision with input as inp with data.toolgate.settings as pins
	d := request.decision with input as inp
	d.action == "allow"
}

test_helpers if {
	request.is_tool_call with input as call(read_tool)
	not request.is_tool_call with input as object.union(base, {"method": "ping"})
	request.tool_name == "read_ticket" with input as call(read_tool)
	request.tool_name == "" with input as object.remove(base, ["tool"])
	request.service_id == "tracker" with input as base
	request.service_id == "" with input as object.remove(base, ["service"])
	request.read_only_tool with input as call(read_tool)
	not request.read_only_tool with input as call(write_tool)
}
