# The result policy of the integration tests: redact one secret, and check
# that the result stage sees rewritten arguments.
package toolgate.result

default decision := {"action": "allow"}

decision := {"action": "allow", "result": object.union(input.result, {"content": redacted})} if {
	some item in input.result.content
	contains(item.text, "SECRET-VALUE")
	redacted := [object.union(c, {"text": replace(c.text, "SECRET-VALUE", "[REDACTED]")}) | some c in input.result.content]
}

# The result stage sees the arguments that went upstream: after the
# request policy pinned pinned_echo's project, a result about any other
# project would be withheld.
decision := {"action": "deny", "reason": "the result stage saw arguments the request policy had rewritten"} if {
	input.tool.name == "pinned_echo"
	input.arguments.project != "sandbox"
}
