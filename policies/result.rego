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
decision := {"action": "allow"} if {
	# The commonest decision first: nothing to clean, deny or ask about.
	count(looks) == 0
	count(deny) == 0
	count(ask) == 0
} else := {"action": "deny", "reason": concat("; ", deny)} if {
	count(deny) > 0
} else := with_result({"action": "ask", "reason": concat("; ", ask)}) if {
	count(ask) > 0
} else := with_result({"action": "allow"})

# This package runs on every tools/call result, which may be megabytes of
# text or thousands of strings, so it visits only the strings that may need
# cleaning (`looks`, from the gateway's quick pass in input.scan), and of a
# long text only the part it keeps.

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
	some path, _ in looks
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

# secret_markers holds, for each built-in kind, pieces of text of which every
# match of its pattern contains one. Substring tests are much cheaper than
# regular expressions: a pattern is only run on text holding one of its
# markers, and the gateway's quick pass (input.scan) lists only strings
# holding one. Keep them in step with secret_patterns (a test checks every
# built-in kind against them).
secret_markers := {
	"aws_access_key_id": ["AKIA", "ASIA"],
	"bearer_token": ["Bearer", "bearer", "BEARER"],
	"github_token": ["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"],
	"jwt": ["eyJ"],
	"pem_private_key": ["PRIVATE KEY"],
	"slack_token": ["xox"],
}

# redact_patterns holds your own kinds, from settings.redact_patterns or from
# rules like `redact_patterns["kind"] := `regex``. A kind named like a
# built-in one replaces it.
redact_patterns[kind] := pattern if {
	some kind, pattern in data.toolgate.settings.redact_patterns
}

patterns := object.union(secret_patterns, redact_patterns)

# invisible_ranges: the characters removed from inspected strings, as
# [first, last] code points (hexadecimal): zero-width, bidirectional-override,
# invisible-operator, isolate, BOM and tag characters. The gateway's quick
# pass looks for them too.
invisible_ranges := [
	["200B", "200F"],
	["202A", "202E"],
	["2060", "2064"],
	["2066", "2069"],
	["FEFF", "FEFF"],
	["E0000", "E007F"],
]

# invisible_pattern matches one of them:
# [\x{200B}-\x{200F}\x{202A}-\x{202E}…\x{E0000}-\x{E007F}].
invisible_pattern := concat("", ["[", concat("", [sprintf(`\x{%s}-\x{%s}`, r) | some r in invisible_ranges]), "]"])

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

# scan describes the inspected strings the policy has to look at: those
# longer than scan.threshold bytes, and those that hold an invisible
# character or may hold a secret (see the README). It is the gateway's quick
# pass, input.scan, when that is usable: made with a threshold at most the
# limit, and with no site patterns (which have no markers, so every string
# must be matched). Otherwise (for instance under opa test or opa eval) it is
# computed here, the same way, over every inspected string.
scan := input.scan if {
	count(redact_patterns) == 0
	input.scan.threshold <= max_result_bytes
} else := {"threshold": 0, "strings": [scan_entry(path, s) | some path, s in scanned]}

scan_entry(path, s) := {
	"path": path,
	"bytes": n,
	"ascii": n == count(s),
	"invisible": regex.match(invisible_pattern, s),
	"markers": any_marker(s),
} if {
	n := byte_len(s)
}

any_marker(s) if {
	some markers in secret_markers
	some marker in markers
	contains(s, marker)
}

default any_marker(_) := false

# looks maps the path of every inspected string that may need cleaning to
# what the scan says about it.
looks[e.path] := e if {
	some e in scan.strings
	needs_look(e)
}

needs_look(e) if e.invisible

needs_look(e) if e.markers

needs_look(e) if e.bytes > max_result_bytes

needs_look(_) if count(redact_patterns) > 0

# has_marker: some inspected string may hold a secret of a built-in kind.
has_marker if {
	some e in scan.strings
	e.markers
}

# attempted maps the path of every string in looks to what cleaning made of
# it. A string that cannot be cleaned (a builtin failing on it) is denied
# above rather than passed on.
attempted[path] := clean(e) if some path, e in looks

# cleaned holds the strings that changed.
cleaned[path] := c if {
	some path, c in attempted
	c.text != object.get(input.result, path, null)
}

# clean(e) is the string the scan entry e is about, cleaned, and what was
# done to it.
clean(e) := {"text": out, "kinds": set(), "stripped": false, "truncated": true} if {
	# The commonest case, a long plain text, needs nothing but the cut.
	e.ascii
	not e.invisible
	not e.markers
	count(redact_patterns) == 0
	limit := max_result_bytes
	e.bytes > limit
	out := concat("", [first_chars_at(e.path, limit), truncation_note(e.bytes - limit, limit)])
} else := {"text": out, "kinds": kinds, "stripped": stripped, "truncated": truncated} if {
	s := object.get(input.result, e.path, null)
	is_string(s)
	limit := max_result_bytes
	head := first_chars_at(e.path, limit + scan_margin)
	precut := head != s
	plain := strip(head, e.invisible)
	stripped := plain != head
	found := {[m, kind] |
		some kind in kinds_in(plain, e.markers)
		some m in regex.find_n(patterns[kind], plain, -1)
	}
	kinds := {kind | some [_, kind] in found}
	redacted := redact(plain, found)
	ascii := still_ascii(e, found)
	truncated := must_truncate(e.bytes, limit, precut, redacted, ascii)
	out := truncate(redacted, e.bytes, limit, truncated, ascii)
}

# still_ascii: the cleaned text is ASCII, as the text was and nothing was
# redacted (a kind of your own may have any name).
still_ascii(e, found) if {
	e.ascii
	count(found) == 0
}

default still_ascii(_, _) := false

# first_chars(s, n) is substring(s, 0, n), but reads only the first n
# characters of s where substring reads all of it first: sprintf's precision
# stops after n characters (up to a million; beyond, substring it is).
first_chars(s, n) := sprintf("%.*s", [n, s]) if {
	n <= 1000000
} else := substring(s, 0, n)

# first_chars_at(path, n) is first_chars of the inspected string at path.
# (OPA remembers every function call by its arguments, which costs a pass
# over them: a text of a megabyte is better not passed to a function.)
first_chars_at(path, n) := sprintf("%.*s", [n, object.get(input.result, path, null)]) if {
	n <= 1000000
} else := substring(object.get(input.result, path, null), 0, n)

strip(s, true) := regex.replace(s, invisible_pattern, "")

strip(s, false) := s

# kinds_in(t, markers): the kinds whose pattern may match in t: your own
# kinds always, the built-in ones when t holds one of their markers (which
# it does not when the scan found none: markers false).
kinds_in(_, false) := object.keys(redact_patterns)

kinds_in(t, true) := {kind |
	some kind, markers in secret_markers
	some marker in markers
	contains(t, marker)
} | object.keys(redact_patterns)

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
must_truncate(size, limit, precut, t, ascii) := false if {
	size <= limit
} else if {
	precut
} else if {
	bytes_of(t, ascii) > limit
} else := false

truncate(t, _, _, false, _) := t

truncate(t, size, limit, true, ascii) := concat("", [cut_bytes(t, limit, ascii), truncation_note(size - limit, limit)])

truncation_note(over, limit) := concat("", [
	"\n[truncated by toolgate: ", format_int(over, 10),
	" bytes over the limit of ", format_int(limit, 10), " bytes]",
])

# byte_len: the length of s in UTF-8 bytes (count counts characters).
byte_len(s) := count(hex.encode(s)) / 2

# bytes_of(t, ascii): byte_len(t), without the copy when t is ASCII.
bytes_of(t, true) := count(t)

bytes_of(t, false) := byte_len(t)

# cut_bytes(t, n, ascii): the longest prefix of t that is at most n bytes and
# does not end inside a multi-byte character.
cut_bytes(t, n, true) := substring(t, 0, n)

cut_bytes(t, n, false) := head if {
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
