# METADATA
# title: toolgate default result policy
# description: |
#   Inspects every tools/call result before the runner sees it. Text content,
#   the text of embedded resources and every string inside structuredContent
#   are cleaned: invisible and bidirectional Unicode control characters are
#   removed, secrets of well-known shapes are replaced by
#   [REDACTED:<kind>], and text over max_result_bytes is truncated. A result
#   that needed no change is allowed as is, so the gateway can pass its raw
#   bytes through.
#
#   Extend it from another file in this package by adding to the `deny` and
#   `ask` sets or to the `redact_patterns` object; see policies/README.md.
package toolgate.result

# METADATA
# title: Result decision
# description: |
#   {"action": "allow"} when nothing needs changing; {"action": "allow",
#   "reason": ..., "result": ...} with the cleaned result (every other field
#   kept) when something was changed; deny or ask (with a reason) when a rule
#   in `deny` or `ask` says so. An ask carries the cleaned result too, so the
#   approved answer is the cleaned one.
# entrypoint: true
decision := {"action": "deny", "reason": concat("; ", deny)} if {
	count(deny) > 0
} else := with_result({"action": "ask", "reason": concat("; ", ask)}) if {
	count(ask) > 0
} else := with_result({"action": "allow"})

# deny holds one reason per rule that withholds the result and turns it into
# an error for the runner. Add your own with `deny contains msg if { ... }`.
deny contains msg if {
	content := input.result.content
	not is_array(content)
	msg := "the upstream result is malformed (content is not an array), so toolgate cannot inspect it; the result was withheld"
}

deny contains msg if {
	some i, item in input.result.content
	item.type in {"text", "resource"}
	not scannable(item)
	msg := sprintf("the upstream result is malformed (content[%d] has type %q but no text toolgate can inspect); the result was withheld", [i, item.type])
}

deny contains msg if {
	some kind, pattern in redact_patterns
	not regex.is_valid(pattern)
	msg := sprintf("the policy's redact pattern %q is not a valid regular expression, so toolgate cannot inspect results; the result was withheld", [kind])
}

deny contains "toolgate could not clean this result, so it was withheld" if {
	some path, _ in suspects
	not attempted[path]
}

# ask holds one reason per rule that withholds the result until a human
# approves it. Add your own with `ask contains msg if { ... }`.
ask contains msg if {
	data.toolgate.settings.services[input.service.id].review_results == true
	msg := sprintf("results of service %q are reviewed by a human before the runner sees them (settings.services[%q].review_results); wait for the approval", [service_id, service_id])
}

# secret_patterns maps each built-in kind to an RE2 regular expression; every
# match in an inspected string is replaced by [REDACTED:<kind>].
secret_patterns := {
	"aws_access_key_id": `\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`,
	"bearer_token": `\b(?:[Bb]earer|BEARER)\s+[A-Za-z0-9\-._~+/]{16,}=*`,
	"github_token": `\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b`,
	"jwt": `\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*`,
	# A BEGIN line without its END line (a key cut off upstream) is redacted
	# to the end of the text.
	"pem_private_key": `-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)`,
	"slack_token": `\bxox(?:[a-z]|e\.xox[a-z])-[A-Za-z0-9-]{10,}`,
}

# redact_patterns holds your own kinds, from settings.redact_patterns or from
# rules like `redact_patterns["kind"] := `regex``. A kind named like a
# built-in one replaces it.
redact_patterns[kind] := pattern if {
	some kind, pattern in data.toolgate.settings.redact_patterns
}

patterns := object.union(secret_patterns, redact_patterns)

# Zero-width, bidirectional-override, invisible-operator, isolate, BOM and tag
# characters.
invisible_pattern := `[\x{200B}-\x{200F}\x{202A}-\x{202E}\x{2060}-\x{2064}\x{2066}-\x{2069}\x{FEFF}\x{E0000}-\x{E007F}]`

# suspect_pattern matches wherever an invisible character or any pattern does.
# Each site pattern is wrapped so that its flags stay its own.
suspect_pattern := concat("|", array.concat([invisible_pattern], [concat("", ["(?:", p, ")"]) | some p in patterns]))

# max_result_bytes: the service's own limit if it has one, else the global
# one, else 65536. It applies to each inspected string on its own.
max_result_bytes := n if {
	n := data.toolgate.settings.services[input.service.id].max_result_bytes
} else := n if {
	n := data.toolgate.settings.max_result_bytes
} else := 65536

# Only this many characters beyond the limit are cleaned; the rest of an
# oversized text is cut off anyway. The margin keeps a secret that straddles
# the limit from being cut in half before it is recognised.
scan_margin := 16384

service_id := object.get(input, ["service", "id"], "")

# scanned maps the JSON path of every inspected string in input.result to the
# string.
scanned[path] := s if {
	some i, item in input.result.content
	item.type == "text"
	s := item.text
	is_string(s)
	path := ["content", i, "text"]
}

scanned[path] := s if {
	some i, item in input.result.content
	item.type == "resource"
	s := item.resource.text
	is_string(s)
	path := ["content", i, "resource", "text"]
}

scanned[path] := s if {
	walk(input.result.structuredContent, [p, s])
	is_string(s)
	path := array.concat(["structuredContent"], p)
}

scannable(item) if is_string(item.text)

scannable(item) if is_string(item.resource.text)

scannable(item) if {
	item.type == "resource"
	is_string(item.resource.blob)
}

# texts: every inspected string as received, minus invisible characters. Use
# it in your own rules (keyword checks cannot be dodged with zero-width
# characters).
texts contains regex.replace(s, invisible_pattern, "") if some s in scanned

# cleaned maps the path of every inspected string to what the runner gets
# instead and what was done to it. Only strings that changed are listed.
cleaned[path] := c if {
	some path, c in attempted
	c.text != scanned[path]
}

# suspects: the inspected strings that may need cleaning, and attempted what
# cleaning made of them. A suspect that cannot be cleaned (a builtin failing
# on it) is denied above rather than passed on.
suspects[path] := s if {
	not all_clean
	some path, s in scanned
	suspect(s)
}

attempted[path] := clean(s) if some path, s in suspects

# all_clean: one cheap test over the whole result shows that no inspected
# string can need cleaning, which is the common case, without visiting each
# one. quick_view holds every inspected string (those in structuredContent
# JSON-encoded, which escapes none of the markers and never shortens a
# string), so a string over the limit makes quick_view over it, and a string
# holding a secret of a built-in kind or an invisible character makes
# quick_view hold a marker. Site patterns have no markers, so with any of them
# every string is tested on its own.
all_clean if {
	count(redact_patterns) == 0
	count(quick_view) * 4 <= max_result_bytes # UTF-8 has at most 4 bytes per character
	not has_marker
}

quick_view := concat("\n", array.concat(
	[t | some item in input.result.content; t := item.text; is_string(t)],
	array.concat(
		[t | some item in input.result.content; t := item.resource.text; is_string(t)],
		[j | j := json.marshal(input.result.structuredContent)],
	),
))

# has_marker: quick_view holds a piece of text that every match of a built-in
# secret pattern contains, or an invisible character. Plain substring tests
# are much faster than regular expressions. Keep the markers in step with
# secret_patterns (a test checks every built-in kind against them).
has_marker if {
	some marker in secret_markers
	contains(quick_view, marker)
}

has_marker if {
	some prefix in invisible_prefixes
	contains(quick_view, prefix)
	regex.match(invisible_pattern, quick_view)
}

secret_markers := ["AKIA", "ASIA", "earer", "EARER", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "eyJ", "PRIVATE KEY", "xox"]

# The first two UTF-8 bytes of every character invisible_pattern matches:
# U+2000-U+207F, U+FEC0-U+FEFF and U+E0000-U+E0FFF. Plain ASCII text has none
# of them, so the regular expression runs only on text that might need it.
invisible_prefixes := [hex.decode("e280"), hex.decode("e281"), hex.decode("efbb"), hex.decode("f3a0")]

# suspect: s may need cleaning. One cheap test per string keeps clean (the
# expensive part) for the few strings that may be too long or hold a secret
# or an invisible character.
suspect(s) if {
	count(s) * 4 > max_result_bytes # UTF-8 has at most 4 bytes per character
} else := regex.match(suspect_pattern, s)

clean(s) := {"text": out, "kinds": kinds, "stripped": stripped, "truncated": truncated} if {
	limit := max_result_bytes
	size := size_hint(s, limit)
	precut := count(s) > (limit + scan_margin)
	head := prefix(s, precut, limit + scan_margin)
	plain := regex.replace(head, invisible_pattern, "")
	stripped := plain != head
	found := {[m, kind] |
		some kind, pattern in patterns
		some m in regex.find_n(pattern, plain, -1)
	}
	kinds := {kind | some [_, kind] in found}
	redacted := redact(plain, found)
	truncated := must_truncate(size, limit, precut, redacted)
	out := truncate(redacted, limit, truncated, size - limit)
}

# size_hint: the UTF-8 size of s in bytes when it may be over limit, else 0
# (cheap: a text of n characters has at most 4n bytes).
size_hint(s, limit) := 0 if {
	count(s) * 4 <= limit
} else := byte_len(s)

prefix(s, true, n) := substring(s, 0, n)

prefix(s, false, _) := s

redact(s, found) := s if {
	count(found) == 0
} else := strings.replace_n(replacements, s) if {
	# A string matched under several kinds is labelled with the first kind.
	replacements := {m: sprintf("[REDACTED:%s]", [kind]) |
		some [m, _] in found
		kind := min({k | some pair in found; pair[0] == m; k := pair[1]})
	}
}

# must_truncate: the text as received is over the limit and its cleaned form
# still is, or only its head was cleaned.
must_truncate(size, limit, precut, t) := false if {
	size <= limit
} else if {
	precut
} else if {
	byte_len(t) > limit
} else := false

truncate(t, _, false, _) := t

truncate(t, limit, true, over) := sprintf("%s\n[truncated by toolgate: %d bytes over the limit of %d bytes]", [cut_bytes(t, limit), over, limit])

# byte_len: the length of s in UTF-8 bytes (count counts characters).
byte_len(s) := count(hex.encode(s)) / 2

# cut_bytes: the longest prefix of t that is at most n bytes and does not end
# inside a multi-byte character.
cut_bytes(t, n) := head if {
	head := substring(t, 0, n)
	byte_len(head) <= n
} else := hex.decode(substring(h, 0, 2 * k)) if {
	h := hex.encode(substring(t, 0, n))
	k := max({j |
		some back in [0, 1, 2, 3]
		j := n - back
		not substring(h, 2 * j, 1) in {"8", "9", "a", "b"} # not a UTF-8 continuation byte
	})
}

changes contains sprintf("redacted %s", [concat(", ", kinds)]) if {
	kinds := {kind | some c in cleaned; some kind in c.kinds}
	count(kinds) > 0
}

changes contains "removed invisible or bidirectional Unicode control characters" if {
	some c in cleaned
	c.stripped
}

changes contains sprintf("truncated text over the limit of %d bytes", [max_result_bytes]) if {
	some c in cleaned
	c.truncated
}

# with_result adds the cleaned result to decision d, and what was done to its
# reason, when some inspected string changed; otherwise d goes out as it is.
# Without else on purpose: should the patch fail, the decision is undefined
# (a deny), never the unchanged result.
with_result(d) := d if count(cleaned) == 0

with_result(d) := object.union(d, {"reason": reason, "result": result}) if {
	count(cleaned) > 0
	patches := [{"op": "replace", "path": path, "value": c.text} | some path, c in cleaned]
	result := json.patch(input.result, patches)
	done := concat("", ["toolgate changed the result: ", concat("; ", changes)])
	reason := concat("; ", array.concat([r | r := d.reason], [done]))
}
