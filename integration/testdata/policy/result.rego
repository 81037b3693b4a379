# The result policy of the integration tests: redact one secret.
package toolgate.result

default decision := {"action": "allow"}

decision := {"action": "allow", "result": object.union(input.result, {"content": redacted})} if {
	some item in input.result.content
	contains(item.text, "SECRET-VALUE")
	redacted := [object.union(c, {"text": replace(c.text, "SECRET-VALUE", "[REDACTED]")}) | some c in input.result.content]
}
