# The request policy of the approval tests: gated_tool asks, in the ways the
# text of its call names.
package toolgate.request

default decision := {"action": "allow"}

text := object.get(input, ["arguments", "text"], "")

decision := {"action": "ask", "reason": "gated_tool needs an approval"} if {
	input.method == "tools/call"
	input.tool.name == "gated_tool"
	not special
}

decision := {
	"action": "ask", "reason": "four eyes: an admin decides",
	"approval": {"approvers": {"groups": ["admins"]}, "requester_may_approve": false},
} if {
	input.tool.name == "gated_tool"
	startswith(text, "four-eyes")
}

decision := {"action": "ask", "reason": "the tool scope is offered", "approval": {"scopes": ["once", "session", "tool"]}} if {
	input.tool.name == "gated_tool"
	startswith(text, "tool-scope")
}

decision := {"action": "ask", "reason": "a short approval", "approval": {"ttl": "1s"}} if {
	input.tool.name == "gated_tool"
	startswith(text, "short")
}

decision := {"action": "ask", "reason": "a malformed approval", "approval": {"ttl": "48h"}} if {
	input.tool.name == "gated_tool"
	startswith(text, "malformed")
}

decision := {"action": "ask", "reason": "approve it yourself", "approval": {"in_band": true}} if {
	input.tool.name == "gated_tool"
	startswith(text, "in-band")
}

special if startswith(text, "four-eyes")

special if startswith(text, "in-band")

special if startswith(text, "tool-scope")

special if startswith(text, "short")

special if startswith(text, "malformed")
