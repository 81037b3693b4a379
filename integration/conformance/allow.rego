# The conformance run's policy: the suite checks the protocol, not policy,
# so every message and every result is allowed.
package toolgate

request.decision := {"action": "allow", "reason": "conformance run"}

result.decision := {"action": "allow", "reason": "conformance run"}
