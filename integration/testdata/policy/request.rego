# The request policy of the integration tests: allow everything except the
# cases each test needs.
package toolgate.request

default decision := {"action": "allow"}

decision := {"action": "deny", "reason": "forbidden_tool is forbidden in tests"} if {
	input.method == "tools/call"
	input.tool.name == "forbidden_tool"
}

decision := {"action": "ask", "reason": "gated_tool is not marked read-only"} if {
	input.method == "tools/call"
	not input.tool.annotations.readOnlyHint
}

decision := {"action": "allow", "arguments": object.union(input.arguments, {"project": "sandbox"})} if {
	input.method == "tools/call"
	input.tool.name == "pinned_echo"
}

decision := {"action": "deny", "reason": "test://secret is off limits"} if {
	input.method == "resources/read"
	input.params.uri == "test://secret"
}

# Answers of runners that initialize; the rounds of stateless runners
# (2026-07-28), whose input responses are decided as answers too, are the
# tests of what those answers do upstream.
decision := {"action": "deny", "reason": "answers to elicitation/create are denied in tests"} if {
	input.method == "elicitation/create"
	input.request.protocol_version != "2026-07-28"
}
