# The result policy of the approval tests: an echo of "review-me" is
# withheld until a person approves it.
package toolgate.result

default decision := {"action": "allow"}

decision := {"action": "ask", "reason": "this result is reviewed"} if {
	input.tool.name == "echo"
	some item in input.result.content
	contains(item.text, "review-me")
}
