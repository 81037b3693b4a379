# METADATA
# title: toolgate default request policy
# description: |
#   Decides every message a runner sends through the gateway (and, with
#   input.listing == true, whether a tool is shown in a tools/list answer).
#   Methods other than tools/call are allowed. A tools/call needs human
#   approval (ask) unless the tool is read-only (input.tool.annotations: the
#   registry's declaration, else the upstream's hints, else MCP's defaults).
#   Destructive tools (by MCP's defaults, every tool not marked otherwise)
#   are denied unless the caller is in an admin group, and then they still
#   need approval. A service in read-only mode denies every tool that the
#   registry does not declare read-only: there, the upstream's word is not
#   enough.
#
#   Extend it from another file in this package by adding to the `deny` and
#   `ask` sets or to the `argument_overrides` object; see policies/README.md.
package toolgate.request

# METADATA
# title: Request decision
# description: |
#   The object the gateway acts on: {"action": "allow"|"deny"|"ask",
#   "reason": string} plus, when a rule rewrote arguments of a tools/call,
#   "arguments" (the complete replacement). Any deny reason wins over any ask
#   reason; allow needs neither.
# entrypoint: true
decision := {"action": "allow", "reason": "the tool is marked read-only (annotations.readOnlyHint); allowed"} if {
	# The commonest decision first, spelled out so that it needs no helper
	# rule: a read-only tools/call that no rule denies, asks about or
	# rewrites. (The reason is allow_reason's for this case. Like the other
	# spelled-out branch, it applies only when no argument is overridden, so
	# a rewrite that fails still leaves the decision undefined.)
	input.tool.annotations.readOnlyHint == true
	not input.tool.annotations.destructiveHint == true
	input.method == "tools/call"
	count(deny) == 0
	count(ask) == 0
	count(argument_overrides) == 0
} else := {"action": "deny", "reason": concat("; ", deny)} if {
	count(deny) > 0
} else := object.union({"action": "ask", "reason": concat("; ", ask)}, rewrite) if {
	count(ask) > 0
} else := {"action": "allow", "reason": "not a tool call; allowed by default"} if {
	# The next commonest, spelled out too.
	input.method != "tools/call"
	count(argument_overrides) == 0
} else := object.union({"action": "allow", "reason": allow_reason}, rewrite)

# This package runs on every message a runner sends, so its rules are
# written for OPA's evaluator: each rule a decision consults costs about a
# microsecond and a few hundred bytes even when it holds a constant, so the
# default rules below look at input and data directly, put the test that
# fails most often first, and leave the helpers (tool_name, service_id,
# read_only_tool, …) to the paths that deny or ask. OPA's rule index skips
# rules whose equality tests on input (input.method == "tools/call",
# input.tool.annotations.destructiveHint == true) fail without evaluating
# them, so such tests are nearly free.

# deny holds one human-readable reason per rule that forbids this message.
# Add your own rules with `deny contains msg if { ... }`.
deny contains "toolgate cannot tell which method this message calls (input.method is missing), so it is denied" if {
	not input.method
}

deny contains msg if {
	data.toolgate.settings.services[input.service.id].read_only == true
	input.method == "tools/call"
	not declared_read_only
	msg := sprintf(
		"service %q is in read-only mode and tool %q is not declared read-only in its registry entry (tool %s read_only), so it cannot be called; use a read-only tool of this service instead",
		[service_id, tool_name, tool_name],
	)
}

deny contains msg if {
	input.tool.annotations.destructiveHint == true
	input.method == "tools/call"
	not is_admin
	msg := sprintf(
		"tool %q on service %q may be destructive (annotations.destructiveHint, %s) and only members of %v may run it, with approval; ask one of them or use a non-destructive tool",
		[tool_name, service_id, hint_origin, admin_groups],
	)
}

# ask holds one reason per rule that needs a human to approve the message.
# Add your own rules with `ask contains msg if { ... }`.
ask contains msg if {
	input.tool.annotations.destructiveHint == true
	input.method == "tools/call"
	is_admin
	msg := sprintf(
		"tool %q on service %q may be destructive (annotations.destructiveHint, %s); as an administrator you may run it once a human approves this call",
		[tool_name, service_id, hint_origin],
	)
}

ask contains msg if {
	input.method == "tools/call"
	not input.tool.annotations.readOnlyHint == true # with the next line: not read_only_tool
	not input.tool.annotations.destructiveHint == true
	not approval_waived
	msg := sprintf(
		"tool %q on service %q is not marked read-only (annotations.readOnlyHint is not true), so a human must approve this call; wait for the approval or use a read-only tool",
		# tool_name and service_id, inlined: this rule fires on every call
		# of a tool that is not read-only.
		[object.get(input, ["tool", "name"], ""), object.get(input, ["service", "id"], "")],
	)
}

# argument_overrides maps argument names of a tools/call to the values sent
# upstream instead of what the runner sent; the runner's other arguments are
# kept. By default it holds the service's pin_arguments for this tool. Add your
# own with `argument_overrides["name"] := value if { ... }`. Two rules giving
# one name different values is an evaluation error, so the call is denied.
argument_overrides[name] := value if {
	some name, value in data.toolgate.settings.services[input.service.id].pin_arguments[input.tool.name]
	input.method == "tools/call"
}

# rewrite is what decision adds to allow and ask: the complete rewritten
# arguments when some argument is overridden, else nothing. Never during
# listing, which has no arguments. Should the rewrite fail (arguments that are
# not an object), rewrite and so the decision are undefined: a deny, never
# the unrewritten call.
rewrite := {} if {
	count(argument_overrides) == 0
} else := {} if {
	input.listing == true
} else := {"arguments": args} if {
	sent := object.get(input, "arguments", {})
	args := object.union(object.remove(sent, argument_overrides), argument_overrides)
}

# allow_reason: fixed texts, as allowed messages pass on unseen by the agent
# (the audit log records method, service and tool anyway).
allow_reason := "not a tool call; allowed by default" if {
	input.method != "tools/call"
} else := "the tool is marked read-only (annotations.readOnlyHint); allowed" if {
	read_only_tool
} else := "the tool may run without approval on this service (allow_without_approval); allowed" if {
	approval_waived
} else := "allowed by policy"

# Helpers, also for your own rules.

is_tool_call if input.method == "tools/call"

tool_name := object.get(input, ["tool", "name"], "")

service_id := object.get(input, ["service", "id"], "")

# read_only_tool: the tool's annotations say readOnlyHint: true and not
# also destructiveHint: true (a tool claiming both counts as destructive).
# input.tool.annotations are the registry's declaration when there is one,
# else the upstream's hints with MCP's defaults; a tool the gateway has no
# definition for is not read-only unless the registry says so.
read_only_tool if {
	input.tool.annotations.readOnlyHint == true
	not input.tool.annotations.destructiveHint == true
}

# declared_read_only: the registry (the administrator), not the upstream,
# says the tool is read-only.
declared_read_only if {
	input.tool.annotations_source == "registry"
	input.tool.annotations.readOnlyHint == true
}

# hint_origin says where the tool's readOnlyHint and destructiveHint come
# from, for reasons.
hint_origin := "as declared in the registry" if {
	input.tool.annotations_source == "registry"
} else := "as the upstream marks it" if {
	input.tool.annotations_source == "upstream"
	is_boolean(input.tool.upstream_annotations.destructiveHint)
} else := "by MCP's default for a tool that is not marked read-only or non-destructive"

approval_waived if input.tool.name in data.toolgate.settings.services[input.service.id].allow_without_approval

# admin_groups: the service's own list if it has one, else the global list,
# else ["admins"].
admin_groups := groups if {
	groups := data.toolgate.settings.services[input.service.id].admin_groups
} else := groups if {
	groups := data.toolgate.settings.admin_groups
} else := ["admins"]

is_admin if {
	some group in input.caller.groups
	group in admin_groups
}
