# METADATA
# title: toolgate default result policy
# description: |
#   Inspects everything an upstream sends toward the runner before the
#   runner sees it, on every channel (input.channel): results (tools/call
#   results and a task's deferred ones, tool listings, resource contents,
#   prompt messages, completions, …), task states, error objects,
#   notifications and server→client requests. Every string and every object
#   key of the payload (input.result) is inspected, and the decoded bytes of
#   embedded resource blobs: invisible and bidirectional Unicode control
#   characters are removed, secrets of well-known shapes are replaced by
#   [REDACTED:<kind>] (in a tool result also when a secret is split across
#   two text items), and a payload whose text is over its limit
#   (max_result_bytes, max_listing_bytes for listings) is cut to fit. A tool
#   result with content items of unknown type or without content is
#   withheld, and so is a blob that toolgate cannot read as a runner may
#   (text not in UTF-8 or behind a UTF-16 byte-order mark, a mimeType that
#   is not a string or is spelled in another case). A payload that
#   needed no change is allowed as is, so the gateway passes the upstream's
#   text on (adding only the decision id to a tool result).
#
#   Extend it from another file in this package by adding to the `deny` and
#   `ask` sets or to the `redact_patterns` object; see policies/README.md.
package toolgate.result

import data.toolgate.text

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
	# The commonest decision first, from the gateway's scan alone: nothing
	# to clean, cut, deny or ask about.
	untouched
	count(deny) == 0
	count(ask) == 0
} else := {"action": "deny", "reason": concat("; ", reasons)} if {
	reasons := cannot_inspect | deny
	count(reasons) > 0
} else := with_result({"action": "ask", "reason": concat("; ", ask)}) if {
	count(ask) > 0
} else := with_result({"action": "allow"})

# This package runs on every tools/call result, which may be megabytes of
# text or thousands of strings, so it visits only the strings that may need
# cleaning (`looks`, from the gateway's quick pass in input.scan), and of a
# long text only the part it keeps. Most results need nothing: for them
# the gateway's scan says so (input.scan.clean) and only `untouched`, `deny`
# and `ask` are evaluated.

# untouched: the gateway's scan says the payload is well formed and
# nothing in it needs cleaning, no pattern of yours has to be matched, and
# its text is within its limit. (Without input.scan, as under opa test, the
# long way decides the same for such a payload.) The limit is written out
# for the commonest payloads, which are not listings: this is the path of
# nearly every tool result, where every rule consulted costs.
untouched if {
	input.scan.clean == true
	count(redact_patterns) == 0
	input.scan.bytes <= max_result_bytes
	long_blob <= max_result_bytes # else clean blobs of text may be over it
	not input.method in {"tools/list", "prompts/list", "resources/list", "resources/templates/list"}
}

untouched if {
	input.scan.clean == true
	count(redact_patterns) == 0
	listing_result
	input.scan.bytes <= max_listing_bytes
}

# deny holds one reason per rule of yours that withholds the result and
# turns it into an error for the runner. Add your own with
# `deny contains msg if { ... }`. (This rule only names the set: it holds
# nothing.)
deny contains msg if some msg in set()

# cannot_inspect holds the reasons why toolgate cannot inspect or clean
# this result safely, so it is withheld (like deny, which holds your own
# reasons).
cannot_inspect contains msg if {
	tool_result
	not is_array(object.get(input, ["result", "content"], null))
	msg := "the upstream result has no content array, so toolgate cannot inspect it; the result was withheld"
}

# The content types of MCP (2025-11-25). Anything else may be shown to the
# model in ways toolgate cannot foresee, so it is withheld.
content_types := {"text", "image", "audio", "resource_link", "resource"}

cannot_inspect contains msg if {
	tool_result
	some i, item in input.result.content
	not known_type(item)
	msg := sprintf("the upstream result holds content[%d], which is not a content item of a type toolgate inspects (%s); the result was withheld", [i, concat(", ", sort(content_types))])
}

cannot_inspect contains msg if {
	tool_result
	some i, item in input.result.content
	known_type(item)
	not well_formed(item)
	msg := sprintf("the upstream result is malformed (content[%d] has type %q but not the fields toolgate inspects, or a blob that is not base64); the result was withheld", [i, item.type])
}

known_type(item) if item.type in content_types

# well_formed_for_channel: a tool result's content is well formed; any
# payload's blobs are base64.
well_formed_for_channel if {
	tool_result
	well_formed_content
}

well_formed_for_channel if {
	not tool_result
	every _, b in blob_strings {
		base64.is_valid(b)
	}
}

# well_formed_content: content is an array of items of known types, each
# with the fields toolgate inspects (the gateway's scan checks the same
# for input.scan.clean).
well_formed_content if {
	is_array(input.result.content)
	every item in input.result.content {
		well_formed(item)
	}
}

well_formed(item) if {
	item.type == "text"
	is_string(item.text)
}

well_formed(item) if {
	item.type in {"image", "audio"}
	is_string(item.data)
}

well_formed(item) if {
	item.type == "resource_link"
	is_string(item.uri)
}

# An embedded resource has a text or a blob; a blob, even next to a text,
# must be base64 that toolgate can decode and inspect (runners decode it
# leniently, so anything else could hide a secret).
well_formed(item) if {
	item.type == "resource"
	is_string(item.resource.text)
	valid_blob(item.resource)
}

well_formed(item) if {
	item.type == "resource"
	is_string(item.resource.blob)
	valid_blob(item.resource)
}

valid_blob(res) if not is_string(object.get(res, "blob", null))

valid_blob(res) if base64.is_valid(res.blob)

cannot_inspect contains msg if {
	some kind, pattern in redact_patterns
	not regex.is_valid(pattern)
	msg := sprintf("the policy's redact pattern %q is not a valid regular expression, so toolgate cannot inspect results; the result was withheld", [kind])
}

cannot_inspect contains "toolgate could not clean this result, so it was withheld" if {
	some id, _ in looks
	not attempted[id]
}

cannot_inspect contains "toolgate could not clean this result, so it was withheld" if {
	some path, _ in blob_looks
	not blob_attempted[path]
}

cannot_inspect contains msg if {
	some path, blob in blob_strings
	not base64.is_valid(blob)
	not tool_result # a tool result's content items are checked above
	msg := sprintf("the upstream's %s holds a blob at %s that is not base64 toolgate can decode, so toolgate cannot inspect it; it was withheld", [channel, place(path)])
}

cannot_inspect contains msg if {
	over_budget
	not cap
	msg := sprintf("the %s is over the limit of %d bytes even without its texts (its keys and structure alone are too large), so it was withheld; ask for less", [noun, max_bytes])
}

# Two keys of one object that cleaning gives the same name. The reason
# names the object by its place (see place), never by the keys: they are
# the upstream's text as received, which may hold a secret or invisible
# characters, and the reason reaches the runner.
cannot_inspect contains msg if {
	some parent, names in renamed_keys
	some name in names
	count([1 | some n in names; n == name]) > 1
	msg := collision_reason(parent)
}

cannot_inspect contains msg if {
	some parent, names in renamed_keys
	some name in names
	kept_key(parent, name)
	msg := collision_reason(parent)
}

collision_reason(parent) := sprintf("toolgate would have to give two keys of the object at %s the same name after cleaning them, so the %s was withheld", [place(parent), noun])

# place(path): where path is in the payload, for a reason, written without
# text the upstream chose: array indexes, and the member names of MCP's in
# place_members, as they are; any other key as <key>. (A reason reaches the
# runner as it is, and an upstream's key may hold a secret or invisible
# characters.)
place([]) := "the top level"

place(path) := concat("", [place_step(i, step) | some i, step in path]) if count(path) > 0

place_step(_, step) := sprintf("[%d]", [step]) if is_number(step)

place_step(0, step) := member_name(step) if is_string(step)

place_step(i, step) := concat("", [".", member_name(step)]) if {
	i > 0
	is_string(step)
}

member_name(step) := step if step in place_members

else := "<key>"

place_members := {
	"content", "structuredContent", "contents", "messages", "resource", "blob", "data", "text", "type",
	"uri", "mimeType", "inputRequests", "params", "_meta", "tools", "prompts", "resources",
	"resourceTemplates", "inputSchema", "outputSchema", "properties", "annotations", "task",
}

# ask holds one reason per rule that withholds the result until a human
# approves it. Add your own with `ask contains msg if { ... }`.
ask contains msg if {
	data.toolgate.settings.services[input.service.id].review_results == true
	tool_result
	msg := sprintf("results of service %q are reviewed by a human before the runner sees them (settings.services[%q].review_results); wait for the approval", [service_id, service_id])
}

# --- what is inspected

# channel says what input.result is (see the README): "result", "task",
# "error", "notification" or "server_request". An input without it (one
# written by hand) is taken for a tools/call result.
channel := object.get(input, "channel", "result")

# tool_result: input.result is a CallToolResult: the result of a tools/call,
# or a task's deferred one (tasks/result, whose input is the task's call).
# An input_required result is one only when it has content anyway: a runner
# that does not know resultType reads that content as the answer.
tool_result if {
	channel == "result"
	object.get(input, "method", "tools/call") == "tools/call"
	not input_required
}

tool_result if {
	channel == "result"
	object.get(input, "method", "tools/call") == "tools/call"
	input_required
	"content" in object.keys(input.result)
}

# input_required: a result of the stateless revision (2026-07-28) that asks
# the runner things (inputRequests) instead of answering, whatever the
# method. Its input requests are inspected like server→client requests; what
# else it holds is inspected as the method's result (a runner of an earlier
# revision ignores resultType).
input_required if {
	channel == "result"
	input.result.resultType == "input_required"
}

# listing: input.result is a list of definitions.
listing_methods := {"tools/list", "prompts/list", "resources/list", "resources/templates/list"}

listing_result if {
	channel == "result"
	input.method in listing_methods
}

# noun names what is inspected, in reasons and notes.
noun := "result" if tool_result

else := "upstream message"

# scanned maps the JSON path of every inspected string in input.result to
# the string: every string anywhere in the result except the base64 data of
# images and audio (binary) and resource blobs (inspected decoded, below).
scanned[path] := s if {
	walk(input.result, [path, s])
	is_string(s)
	not opaque(path)
}

opaque(path) if opaque_paths[path]

opaque(path) if blob_strings[path]

# block_paths maps the path of every MCP content block of the payload to
# the block: the content items of a tool result, the content of prompt
# messages (prompts/get) and of sampling messages (sampling_blocks), and
# the content of the tool_result blocks of sampling messages (whose
# content is an array of blocks, embedded resources among them). The
# gateway's scan has the same table.
block_paths[["content", i]] := b if {
	tool_result
	some i, b in input.result.content
}

block_paths[["messages", i, "content"]] := b if {
	channel == "result"
	input.method == "prompts/get"
	some i, m in input.result.messages
	b := m.content
	is_object(b)
}

block_paths[p] := b if some p, b in sampling_blocks

block_paths[array.concat(p, ["content", k])] := c if {
	some p, b in sampling_blocks
	b.type == "tool_result"
	is_array(b.content)
	some k, c in b.content
}

# sampling_blocks maps the path of every block of a sampling message to
# the block: of sampling/createMessage (one block or an array of them),
# and of the sampling requests of an input_required result.
sampling_blocks[["messages", i, "content"]] := b if {
	channel == "server_request"
	input.method == "sampling/createMessage"
	some i, m in input.result.messages
	b := m.content
	is_object(b)
}

sampling_blocks[["messages", i, "content", j]] := b if {
	channel == "server_request"
	input.method == "sampling/createMessage"
	some i, m in input.result.messages
	is_array(m.content)
	some j, b in m.content
}

sampling_blocks[["inputRequests", k, "params", "messages", i, "content"]] := b if {
	some k, ms in sampling_inputs
	some i, m in ms
	b := m.content
	is_object(b)
}

sampling_blocks[["inputRequests", k, "params", "messages", i, "content", j]] := b if {
	some k, ms in sampling_inputs
	some i, m in ms
	is_array(m.content)
	some j, b in m.content
}

# sampling_inputs maps the key of every sampling request of an
# input_required result to its messages.
sampling_inputs[k] := r.params.messages if {
	input_required
	some k, r in input.result.inputRequests
	r.method == "sampling/createMessage"
	is_array(r.params.messages)
}

# opaque_paths: the base64 data of image and audio blocks, which is binary.
opaque_paths contains array.concat(p, ["data"]) if {
	some p, b in block_paths
	b.type in {"image", "audio"}
	is_string(b.data)
}

# blob_strings maps the path of every resource blob to it: the blob of an
# embedded resource block, and of the contents of resources/read. A blob
# is inspected decoded (below), not as text.
blob_strings[array.concat(p, ["resource", "blob"])] := b.resource.blob if {
	some p, b in block_paths
	b.type == "resource"
	is_string(b.resource.blob)
}

blob_strings[["contents", i, "blob"]] := c.blob if {
	channel == "result"
	input.method == "resources/read"
	some i, c in input.result.contents
	is_string(c.blob)
}

# scanned_keys maps the path of every object member in input.result to its
# key, which is inspected too.
scanned_keys[path] := k if {
	walk(input.result, [p, v])
	is_object(v)
	some k, _ in v
	path := array.concat(p, [k])
}

# texts: every inspected string and key as received, minus invisible
# characters. Use it in your own rules (keyword checks cannot be dodged with
# zero-width characters).
texts contains text.clean(s) if some s in scanned

texts contains text.clean(k) if some k in scanned_keys

# --- secrets

# secret_patterns maps each built-in kind to an RE2 regular expression.
# Each has exactly one capturing group, first: the part of a match that is
# kept (a word boundary, or a field name such as "AccountKey="); the rest of
# the match is replaced by [REDACTED:<kind>]. A word boundary here (bounded)
# is the start of the text, a character that is not a letter, digit or '_',
# or the tail of an escape (\n, \u0022, %3D), so that "token\nghp_…" or
# "key%3DAKIA…" in text that holds escaped text still counts.
bounded := `(^|[^0-9A-Za-z_]|\\[a-z]|\\u[0-9A-Fa-f]{4}|\\x[0-9A-Fa-f]{2}|%[0-9A-Fa-f]{2})`

secret_patterns := {
	# A BEGIN line without its END line (a key cut off upstream) is redacted
	# to the end of the text; an END line without its BEGIN line (the rest
	# of a key cut off) from the start of the text.
	"pem_private_key": `()(?:-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:[\s\S]*?-----END[A-Z0-9 ]*PRIVATE KEY-----|[\s\S]*)|\A(?:[A-Za-z0-9+/= \t\r\n]|\\[nrt])*-----END[A-Z0-9 ]*PRIVATE KEY-----)`,
	"pgp_private_key": `()-----BEGIN PGP PRIVATE KEY BLOCK-----(?:[\s\S]*?-----END PGP PRIVATE KEY BLOCK-----|[\s\S]*)`,
	"ssh2_private_key": `()---- BEGIN SSH2 [A-Z ]*PRIVATE KEY ----(?:[\s\S]*?---- END SSH2 [A-Z ]*PRIVATE KEY ----|[\s\S]*)`,
	"putty_private_key": `()PuTTY-User-Key-File-[0-9]+:(?:[\s\S]*?Private-MAC:[ \t]*[0-9A-Fa-f]+|[\s\S]*)`,
	# A PEM private key, base64-encoded once more (Kubernetes secrets, env
	# files): "-----BEGIN" and "PRIVATE KEY" in base64.
	"private_key_base64": `()LS0tLS1CRUdJTi[A-Za-z0-9+/]{0,40}?(?:IFBSSVZBVEUgS0VZ|BQUklWQVRFIEtFW|UFJJVkFURSBLRV)[A-Za-z0-9+/=]*(?:(?:\r?\n|\\n)[A-Za-z0-9+/=]{16,})*`,
	"oauth_token": `((?:\\?["'])?(?i:access_token|refresh_token|id_token|client_secret)(?:\\?["'])?[ \t]{0,64}[:=][ \t]{0,64}(?:\\?["'])?)[A-Za-z0-9\-._~+/%]{8,}=*`,
	"slack_webhook": `()https?://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/\-]+`,
	"azure_storage_key": `((?i:AccountKey|SharedAccessKey)[ \t]{0,64}=[ \t]{0,64})[A-Za-z0-9+/]{20,}={0,2}`,
	"azure_sas_signature": `((?:^|[?&;\s"'])sig=)[A-Za-z0-9%+/]{16,}={0,2}`,
	"basic_auth": `((?i:authorization)\\?["']?[ \t]{0,64}[:=][ \t]{0,64}\\?["']?)(?i:basic)[ \t]{1,64}[A-Za-z0-9+/]{4,}={0,2}`,
	"bearer_token": concat("", [bounded, `(?i:bearer)\s{1,64}[A-Za-z0-9\-._~+/]{16,}=*`]),
	"aws_secret_access_key": `((?i:(?:aws_?)?secret[_-]?access[_-]?key)\\?["']?[ \t]{0,64}[:=][ \t]{0,64}\\?["']?)[A-Za-z0-9/+]{40}[A-Za-z0-9/+=]*`,
	"aws_access_key_id": concat("", [bounded, `(?:AKIA|ASIA)[A-Z0-9]{16}\b`]),
	"github_token": concat("", [bounded, `(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b`]),
	"slack_token": concat("", [bounded, `(?:xox(?:[a-z]|e\.xox[a-z])-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,})`]),
	"stripe_key": concat("", [bounded, `(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}`]),
	"gcp_api_key": concat("", [bounded, `AIza[0-9A-Za-z_\-]{35}`]),
	"jwt": concat("", [bounded, `eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*`]),
}

# secret_kinds is the order in which kinds are tried where several could
# match at the same place: kinds that span more text first.
secret_kinds := [
	"pem_private_key", "pgp_private_key", "ssh2_private_key", "putty_private_key",
	"private_key_base64", "oauth_token", "slack_webhook", "azure_storage_key",
	"azure_sas_signature", "basic_auth", "bearer_token", "aws_secret_access_key",
	"aws_access_key_id", "github_token", "slack_token", "stripe_key", "gcp_api_key", "jwt",
]

# secret_markers holds, for each built-in kind, pieces of text of which every
# match of its pattern contains one: a marker written in lower case is
# compared ignoring case, in the text as folded(s) writes it (for patterns
# that match in any case), any other exactly (see holds_marker). Substring
# tests are much cheaper than regular expressions: a pattern is only run on
# text holding one of its markers, and the gateway's quick pass (input.scan)
# lists only strings holding one. Keep them in step with secret_patterns
# (secrets_test.rego checks every shape of its corpus against them).
secret_markers := {
	"pem_private_key": ["PRIVATE KEY"],
	"pgp_private_key": ["PRIVATE KEY"],
	"ssh2_private_key": ["PRIVATE KEY"],
	"putty_private_key": ["PuTTY-User-Key-File"],
	"private_key_base64": ["LS0tLS1CRUdJTi"],
	"oauth_token": ["access_token", "refresh_token", "id_token", "client_secret"],
	"slack_webhook": ["hooks.slack.com"],
	"azure_storage_key": ["accountkey", "sharedaccesskey"],
	"azure_sas_signature": ["sig="],
	"basic_auth": ["authorization"],
	"bearer_token": ["bearer"],
	"aws_secret_access_key": ["accesskey", "access_key", "access-key"],
	"aws_access_key_id": ["AKIA", "ASIA"],
	"github_token": ["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"],
	"slack_token": ["xox", "xapp-"],
	"stripe_key": ["sk_live_", "rk_live_", "sk_test_", "rk_test_"],
	"gcp_api_key": ["AIza"],
	"jwt": ["eyJ"],
}

# redact_patterns holds your own kinds, from settings.redact_patterns or from
# rules like `redact_patterns["kind"] := `regex``. A kind named like a
# built-in one replaces it. Your patterns are used as written: the whole
# match is replaced.
redact_patterns[kind] := pattern if {
	some kind, pattern in data.toolgate.settings.redact_patterns
}

# kind_order: the built-in kinds your own do not replace, then yours.
builtin_kinds := [k | some k in secret_kinds; not redact_patterns[k]]

site_kinds := sort(object.keys(redact_patterns))

# invisible_ranges: the characters removed from every inspected string (see
# text.rego). The gateway's quick pass looks for them too.
invisible_ranges := text.invisible_ranges

# --- limits

# max_result_bytes: the service's own limit if it has one, else the global
# one, else 65536. It bounds the text of the whole result: the UTF-8 bytes
# of every inspected string and key together.
max_result_bytes := n if {
	n := data.toolgate.settings.services[input.service.id].max_result_bytes
} else := n if {
	n := data.toolgate.settings.max_result_bytes
} else := 65536

# max_listing_bytes: the same for listings (tools/list, prompts/list,
# resources/list, resources/templates/list), which hold every definition
# of a server; default 1048576.
max_listing_bytes := n if {
	n := data.toolgate.settings.services[input.service.id].max_listing_bytes
} else := n if {
	n := data.toolgate.settings.max_listing_bytes
} else := 1048576

# max_bytes is the limit of this payload: max_listing_bytes for a listing,
# else max_result_bytes.
max_bytes := max_listing_bytes if listing_result

else := max_result_bytes

# Only this many characters beyond a string's cut are cleaned; the rest of
# an oversized text is cut off anyway. The margin keeps a secret that
# straddles the cut from being cut in half before it is recognised.
scan_margin := 16384

# A secret split across two text items is looked for in a window of this
# many characters on each side of the seam, stretched on each side through
# the run of token characters (token_chars) that goes on beyond it, by at
# most seam_stretch more: a token of up to 5 KiB split anywhere (10 KiB
# split near its middle) is seen whole. (The gateway's scan, modules/policy, takes the same windows; a
# longer stretch costs the regular expressions of seam_secrets more than
# it finds.)
seam_window := 1024

seam_stretch := 4096

# seam_left(t): the last seam_window characters of t, with the token run
# that goes on before them.
seam_left(t) := concat("", [run, last_chars(t, seam_window)]) if {
	count(t) > seam_window
	stretched := last_chars(t, seam_window + seam_stretch)
	before := substring(stretched, 0, count(stretched) - seam_window)
	run := substring(before, count(trim_right(before, token_cutset)), -1)
} else := t

# seam_right(t): the first seam_window characters of t, with the token run
# that goes on after them.
seam_right(t) := concat("", [first_chars(t, seam_window), run]) if {
	count(t) > seam_window
	after := substring(first_chars(t, seam_window + seam_stretch), seam_window, -1)
	run := substring(after, 0, count(after) - count(trim_left(after, token_cutset)))
} else := t

service_id := object.get(input, ["service", "id"], "")

# --- the scan

# scan describes the inspected strings and keys the policy has to look at
# (see the README): those longer than scan.threshold bytes, those that hold
# an invisible character or may hold a secret, plus the total size of the
# result's text and the seams between text items that may hide a secret.
# It is the gateway's quick pass, input.scan, when that is usable (no site
# patterns, which have no markers; and every string the budget cuts is
# listed); otherwise (for instance under opa test or opa eval) it is
# computed here, the same way, over everything.
scan := input.scan if {
	count(redact_patterns) == 0
	is_number(input.scan.threshold)
	is_number(input.scan.bytes)
	is_number(input.scan.key_bytes)
	lists_every_cut(input.scan)
} else := own_scan

lists_every_cut(sc) if sc.bytes <= max_bytes

lists_every_cut(sc) if sc.key_bytes > max_bytes

lists_every_cut(sc) if cap_of(sc) >= sc.threshold

own_scan := {
	"clean": clean_of(entries, listed_seams),
	"threshold": 0,
	"bytes": sum([e.bytes | some e in entries]),
	"key_bytes": sum([e.bytes | some e in entries; e.key]),
	"strings": entries,
	"seams": listed_seams,
} if {
	entries := array.concat(
		[scan_entry(path, s, false) | some path, s in scanned],
		[scan_entry(path, k, true) | some path, k in scanned_keys],
	)
	listed_seams := [pair | some pair in seams; seam_looks(pair)]
}

# clean_of: the scan's verdict that the result is well formed and nothing in
# it needs cleaning (whatever its size): no string or key holds an invisible
# character or a marker, no seam and no blob may hide a secret.
clean_of(entries, listed_seams) if {
	well_formed_for_channel
	every e in entries {
		not e.invisible
		not e.markers
	}
	count(listed_seams) == 0
	count(marked_blobs) == 0
	count(unreadable_blobs) == 0
	blob_text_bytes <= long_blob
}

default clean_of(_, _) := false

scan_entry(path, s, key) := {
	"path": path,
	"key": key,
	"bytes": n,
	"ascii": n == count(s),
	"invisible": text.has_invisible(s),
	"markers": any_marker(s),
} if {
	n := byte_len(s)
}

any_marker(s) if {
	some markers in secret_markers
	some marker in markers
	holds_marker(s, folded(s), marker)
}

# folded(s): s in lower case, with the long s (U+017F) written s. A pattern
# that matches in any case (RE2's (?i)) matches the long s as s and the
# Kelvin sign (U+212A) as k; lower() writes the Kelvin sign k (and the
# dotted capital I, U+0130, i), but keeps the long s. The gateway's scan
# folds the same three characters.
folded(s) := replace(lower(s), "\u017f", "s")

# holds_marker(s, ls, marker): s (whose folded form is ls) holds marker: a
# marker written in lower case ignoring case (a pattern matching its field
# names in any case), any other exactly.
holds_marker(_, ls, marker) if {
	marker == lower(marker)
	contains(ls, marker)
}

holds_marker(s, _, marker) if {
	marker != lower(marker)
	contains(s, marker)
}

# marker_positions(s, ls, marker): where marker occurs in s, in characters.
marker_positions(_, ls, marker) := indexof_n(ls, marker) if marker == lower(marker)

marker_positions(s, _, marker) := indexof_n(s, marker) if marker != lower(marker)

default any_marker(_) := false

# seams: the pairs of consecutive text items of a tool result (indexes into
# content).
text_items := [i | tool_result; some i, item in input.result.content; item.type == "text"; is_string(item.text)]

seams contains [text_items[k - 1], text_items[k]] if some k in numbers.range(1, count(text_items) - 1)

# seam_looks: the window around a seam holds a marker or an invisible
# character.
seam_looks([a, b]) if {
	w := seam_text(a, b)
	any_marker(w)
}

# An invisible character anywhere in either item: the windows are
# stretched on the text as it is, where one such character ends a token
# run that the cleaned text continues.
seam_looks([a, _]) if text.has_invisible(input.result.content[a].text)

seam_looks([_, b]) if text.has_invisible(input.result.content[b].text)

seam_text(a, b) := concat("", [seam_left(input.result.content[a].text), seam_right(input.result.content[b].text)])

# looks maps [path, key] of every inspected string or key that may need
# cleaning to what the scan says about it.
looks[[e.path, e.key]] := e if {
	some e in scan.strings
	needs_look(e)
}

looks[[path, false]] := e if {
	some i in {i | seam_index(i)}
	path := ["content", i, "text"]
	not listed_look(path)
	s := input.result.content[i].text
	e := scan_entry(path, s, false)
}

listed_look(path) if {
	some e in scan.strings
	e.path == path
	not e.key
	needs_look(e)
}

needs_look(e) if e.invisible

needs_look(e) if e.markers

needs_look(e) if {
	not e.key
	e.bytes > cap
}

needs_look(_) if count(redact_patterns) > 0

# --- the budget

over_budget if scan.bytes > max_bytes

# cap: when the result's text is over max_bytes, the size in bytes
# each string is cut to so that it fits: the longest strings are cut first,
# all to the same size (shorter strings and keys are kept).
cap := cap_of(scan) if over_budget

cap_of(sc) := c if {
	lens := sort([e.bytes | some e in sc.strings; not e.key; e.bytes > sc.threshold])
	sc.key_bytes <= max_bytes
	room := max_bytes - (sc.bytes - sum(lens))
	room >= 0
	n := count(lens)
	k := min({j |
		some j in numbers.range(0, n - 1)
		sum(array.slice(lens, 0, j)) + (lens[j] * (n - j)) > room
	})
	c := floor((room - sum(array.slice(lens, 0, k))) / (n - k))
}

# --- cleaning

# attempted maps each look to what cleaning made of it. A string that
# cannot be cleaned (a builtin failing on it) is denied above rather than
# passed on. (Complete rules, so that each string is cleaned once however
# often the result is looked up.)
attempted := {id: clean(e) | some id, e in looks}

# cleaned holds the strings and keys that changed.
cleaned := {id: c |
	some id, c in attempted
	c.text != original(id)
}

original([path, false]) := object.get(input.result, path, null)

original([path, true]) := path[count(path) - 1]

# clean(e) is the string or key the scan entry e is about, cleaned, and
# what was done to it.
clean(e) := {"text": out, "kinds": set(), "stripped": false, "truncated": true} if {
	# The commonest case, a long plain text, needs nothing but the cut.
	not e.key
	e.ascii
	not e.invisible
	not e.markers
	count(redact_patterns) == 0
	not seam_path(e.path)
	e.bytes > cap
	out := concat("", [ascii_head(e.path, cap), truncation_note(e.bytes, cap)])
} else := {"text": out, "kinds": r.kinds, "stripped": stripped, "truncated": false} if {
	e.key
	s := original([e.path, true])
	plain := strip(s, e.invisible)
	stripped := plain != s
	r := redact(plain)
	out := r.text
} else := {"text": out, "kinds": r.kinds, "stripped": stripped, "truncated": truncated} if {
	s := object.get(input.result, e.path, null)
	is_string(s)
	head := value_head(e)
	precut := head != s
	plain := strip(head, e.invisible)
	stripped := plain != head
	r := redact_seams(plain, e.path)
	truncated := must_truncate(e.bytes, precut, r.text)
	out := truncate(r.text, e.bytes, truncated)
}

# value_head(e): the part of the string that is cleaned: all of it, or when
# it is cut, what is kept plus the margin.
value_head(e) := first_chars_at(e.path, cap + scan_margin) if {
	e.bytes > cap
} else := object.get(input.result, e.path, null)

strip(s, true) := text.clean(s)

strip(s, false) := s

# redact(t): t with every secret replaced, by position: the matches of all
# kinds that may occur in t are found in one pass (leftmost first, the
# earlier kind of secret_kinds where two start at the same place), and t is
# put together again from the text between them and their labels. A long
# text is matched only near its markers (see windows_in), which finds the
# same matches.
redact(t) := {"text": t, "kinds": set()} if {
	count(kinds_in(t)) == 0
} else := r if {
	n := count(t)
	n > 2 * window_after
	r := redact_windows(t, windows_in(t, n), n)
} else := redact_whole(t)

# redact_whole(t): redact(t) with the patterns matched over all of t.
redact_whole(t) := {"text": t, "kinds": set()} if {
	count(kinds_in(t)) == 0
} else := {"text": out, "kinds": {k | some k in labels_kinds}} if {
	ks := kinds_in_order(t)
	pattern := concat("|", [sprintf("(?:%s)", [all_patterns[k]]) | some k in ks])
	nb := count([k | some k in ks; not redact_patterns[k]])
	matches := regex.find_all_string_submatch_n(pattern, t, -1)
	pieces := regex.split(pattern, t)
	count(pieces) == count(matches) + 1
	labels_kinds := [kind_of(m[0], ks) | some m in matches]
	out := concat("", array.concat(
		[x |
			some i, m in matches
			x := concat("", [pieces[i], concat("", array.slice(m, 1, nb + 1)), "[REDACTED:", labels_kinds[i], "]"])
		],
		[pieces[count(matches)]],
	))
}

all_patterns := object.union(secret_patterns, redact_patterns)

# kinds_in(t): the kinds whose pattern may match in t: your own kinds
# always, the built-in ones when t holds one of their markers.
kinds_in(t) := {k |
	lt := folded(t)
	some k in builtin_kinds
	some marker in secret_markers[k]
	holds_marker(t, lt, marker)
} | {k | some k in site_kinds}

kinds_in_order(t) := [k | some k in array.concat(builtin_kinds, site_kinds); k in found] if {
	found := kinds_in(t)
}

# --- long texts: matching near the markers
#
# A regular expression costs a few hundred nanoseconds per character of
# text matched, so in a long text the patterns are matched only in windows
# around the places where a marker occurs: from window_before characters
# before it to the end of the token that runs window_after characters after
# it. That finds every match that matching the whole text finds, because a
# match of a built-in pattern holds a marker, begins at most a few
# characters before it, holds at most about 250 characters of fixed text
# after it (runs of blanks in the patterns are bounded for this), and then a
# token of token_chars only; a window ends at a character that no token
# holds. The private key kinds, whose matches run over lines, and your own
# patterns, which have no markers, are matched over the whole text.
# (secrets_test.rego checks both ways on its corpus.)

window_before := 64

window_after := 512

# At most this many windows, and a token of at most token_limit characters
# where a window ends; beyond, the whole text is matched.
max_windows := 16

token_limit := 1000

# token_chars: every character that a token of a built-in kind may hold;
# token_cutset, the same for trim_left and trim_right.
token_chars := `[A-Za-z0-9\-._~+/%=]`

token_cutset := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/%="

spanning_kinds := {"pem_private_key", "pgp_private_key", "ssh2_private_key", "putty_private_key", "private_key_base64"}

# windows_in(t, n): the windows of t (n characters) to match in, as
# [first, end] pairs, in order and apart; undefined when the whole text must
# be matched.
windows_in(t, n) := windows if {
	ks := kinds_in(t)
	count(ks & spanning_kinds) == 0
	count(site_kinds) == 0
	lt := folded(t)
	ps := sort({p | some k in ks; some m in secret_markers[k]; some p in marker_positions(t, lt, m)})
	firsts := [i | some i, _ in ps; starts_window(t, n, ps, i)]
	count(firsts) <= max_windows
	windows := [[max([0, ps[f] - window_before]), token_end(t, ps[last] + window_after, n)] |
		some g, f in firsts
		last := group_last(firsts, g, count(ps))
	]
	count(windows) == count(firsts) # no token too long
}

# starts_window: the marker at ps[i] is too far from the one before it to
# share its window: its window would begin after that one's ends. (The ends
# grow with the positions, so it suffices to compare with the one before.)
starts_window(_, _, _, 0)

starts_window(t, n, ps, i) if {
	i > 0
	ps[i] - ps[i - 1] > window_before + window_after
	ps[i] - window_before > token_end(t, ps[i - 1] + window_after, n)
}

group_last(firsts, g, _) := firsts[g + 1] - 1 if g + 1 < count(firsts)

group_last(firsts, g, k) := k - 1 if g + 1 == count(firsts)

# token_end(t, q, n): where the run of token characters from q ends;
# undefined for a run longer than token_limit.
token_end(t, q, n) := n if {
	q >= n
} else := q + k if {
	k := count(regex.find_n(concat("", ["^", token_chars, "*"]), substring(t, q, token_limit + 1), 1)[0])
	k <= token_limit
}

# redact_windows(t, windows, n): t with the windows redacted and the text
# between them as it is.
redact_windows(t, windows, n) := {"text": concat("", [d.text | some d in done]), "kinds": {k | some d in done; some k in d.kinds}} if {
	cuts := array.concat(array.concat([0], [x | some w in windows; some x in w]), [n])
	done := [piece(substring(t, cuts[j], cuts[j + 1] - cuts[j]), (j % 2) == 1) |
		some j in numbers.range(0, count(cuts) - 2)
	]
}

piece(s, true) := redact_whole(s)

piece(s, false) := {"text": s, "kinds": set()}

# kind_of(m, ks): the first kind of ks whose pattern matches all of m.
kind_of(m, ks) := k if {
	k := [x | some x in ks; regex.match(sprintf(`^(?:%s)$`, [all_patterns[x]]), m)][0]
} else := "secret"

# --- secrets split across two text items

# seam_tails maps the index of a text item to the part of a secret that
# begins in its last characters and ends in the next text item
# ({"n": characters, "kind": kind}); seam_heads, to the part of one that
# ends in its first characters.
seam_tails[t.a] := {"n": t.tail, "kind": t.kind} if {
	some t in seam_secrets
	t.tail > 0
	not cut_by_budget(t.a) # its end is cut off anyway
}

# The label goes where the secret begins, or after the cut of the item
# it began in.
seam_heads[t.b] := {"keep": t.keep, "n": t.head, "kind": kind} if {
	some t in seam_secrets
	kind := [t.kind | label_in_head(t)]
}

label_in_head(t) if t.tail == 0

label_in_head(t) if cut_by_budget(t.a)

seam_index(i) if seam_tails[i]

seam_index(i) if seam_heads[i]

# seam_secrets: a secret across a seam listed by the scan (also when the
# first item is cut to fit the budget: the secret's part in the next item
# is redacted all the same).
seam_secrets contains {"a": a, "b": b, "tail": tail, "keep": keep, "head": head, "kind": kind} if {
	some [a, b], c in seam_cuts
	left := c.left
	some i, m in c.matches
	start := sum([n | some j in numbers.range(0, i - 1); j < i; n := count(c.pieces[j]) + count(c.matches[j][0])]) + count(c.pieces[i])
	secret := start + count(concat("", array.slice(m, 1, c.nb + 1)))
	end := start + count(m[0])
	start < count(left)
	end > count(left)
	tail := max([0, count(left) - secret])
	keep := max([0, secret - count(left)])
	head := (end - count(left)) - keep
	kind := kind_of(m[0], c.ks)
}

# seam_cuts maps each listed seam to the matches of the policy's patterns
# in its cleaned windows: stretched through token runs (seam_left,
# seam_right), unless that puts more than seam_max_matches matches in
# them — the offsets seam_secrets works out cost the square of the
# matches —, then the windows of seam_window characters alone.
seam_cuts[[a, b]] := c if {
	some [a, b] in scan.seams
	lt := text.clean(input.result.content[a].text)
	rt := text.clean(first_chars(input.result.content[b].text, (2 * seam_window) + seam_stretch))
	c := seam_cut(seam_left(lt), seam_right(rt), last_chars(lt, seam_window), first_chars(rt, seam_window))
}

seam_max_matches := 64

seam_cut(left, right, left0, right0) := c if {
	c := seam_matches(left, right)
	count(c.matches) <= seam_max_matches
} else := seam_matches(left0, right0)

# seam_matches(left, right): the matches of the patterns whose markers
# left and right hold together, and the pieces between them.
seam_matches(left, right) := {"left": left, "ks": ks, "nb": nb, "matches": matches, "pieces": pieces} if {
	w := concat("", [left, right])
	ks := kinds_in_order(w)
	count(ks) > 0
	pattern := concat("|", [sprintf("(?:%s)", [all_patterns[k]]) | some k in ks])
	nb := count([k | some k in ks; not redact_patterns[k]])
	matches := regex.find_all_string_submatch_n(pattern, w, -1)
	pieces := regex.split(pattern, w)
}

cut_by_budget(i) if byte_len(input.result.content[i].text) > cap

# --- private keys across more than two text items
#
# The seams redact a secret split across two consecutive text items, piece
# by piece; the gateway withholds a result whose joined text items hold a
# secret running through a whole item (modules/policy/spans.go). A private
# key can be longer than the gateway looks: one whose BEGIN line is in a
# text item and whose END line is in a later one, not the next, with no
# other key line between (the items between hold nothing but its body,
# which no pattern recognises on its own), withholds the result.
cannot_inspect contains msg if {
	lines := [k |
		some k, i in text_items
		contains(input.result.content[i].text, "PRIVATE KEY")
		regex.match(key_line, input.result.content[i].text)
	]
	some n in numbers.range(0, count(lines) - 2)
	k := lines[n]
	l := lines[n + 1]
	l > k + 1
	key_opens(input.result.content[text_items[k]].text)
	key_closes(input.result.content[text_items[l]].text)
	msg := sprintf("a private key runs from content[%d] to content[%d], across more than two text items, which toolgate cannot redact piece by piece; the result was withheld", [text_items[k], text_items[l]])
}

# A private key cut off in one text item whose body runs on in the next
# (a BEGIN line without its END, then an item of base64 only), or whose
# body began in the item before (an END line without its BEGIN, after an
# item of base64 only): the item of body alone holds no marker, so it is
# withheld with the key.
cannot_inspect contains msg if {
	some k, a in text_items
	key_opens(input.result.content[a].text)
	b := text_items[k + 1]
	regex.match(key_body, input.result.content[b].text)
	msg := sprintf("a private key runs from content[%d] into content[%d], which toolgate cannot redact piece by piece; the result was withheld", [a, b])
}

cannot_inspect contains msg if {
	some k, b in text_items
	key_closes(input.result.content[b].text)
	k > 0
	a := text_items[k - 1]
	regex.match(key_body, input.result.content[a].text)
	msg := sprintf("a private key runs from content[%d] into content[%d], which toolgate cannot redact piece by piece; the result was withheld", [a, b])
}

# key_body: text that is nothing but the base64 lines of a key's body.
key_body := `\A[A-Za-z0-9+/=\s]{16,}\z`

key_begin := `-{4,5} ?BEGIN[A-Z0-9 ]*PRIVATE KEY`

key_end := `-{4,5} ?END[A-Z0-9 ]*PRIVATE KEY`

key_line := concat("|", [key_begin, key_end])

# key_opens(t): t's last private key BEGIN line has no END line after it.
key_opens(t) if {
	contains(t, "PRIVATE KEY")
	parts := regex.split(key_begin, t)
	count(parts) > 1
	not regex.match(key_end, parts[count(parts) - 1])
}

# key_closes(t): t's first private key END line has no BEGIN line before it.
key_closes(t) if {
	contains(t, "PRIVATE KEY")
	parts := regex.split(key_end, t)
	count(parts) > 1
	not regex.match(key_begin, parts[0])
}

# redact_seams(t, path): redact(t), with the parts of secrets spanning a
# seam (see seam_tails) replaced first.
redact_seams(t, ["content", i, "text"]) := {"text": out, "kinds": kinds} if {
	seam_index(i)
	h := object.get(seam_heads, i, {"keep": 0, "n": 0, "kind": []})
	tl := object.get(seam_tails, i, {"n": 0, "kind": ""})
	from := h.keep + h.n
	mid := redact(substring(t, from, (count(t) - from) - tl.n))
	out := concat("", [substring(t, 0, h.keep), concat("", [sprintf("[REDACTED:%s]", [k]) | some k in h.kind]), mid.text, seam_label(tl)])
	kinds := ({k | some k in h.kind} | {tl.kind | tl.n > 0}) | mid.kinds
}

redact_seams(t, path) := redact(t) if not seam_path(path)

seam_path(["content", i, "text"]) if seam_index(i)

seam_label(c) := "" if c.n == 0

seam_label(c) := sprintf("[REDACTED:%s]", [c.kind]) if c.n > 0

# --- blobs

# marked_blobs maps the path of every resource blob whose decoded bytes
# hold a marker, or are text holding an invisible character, to those
# bytes.
marked_blobs[path] := b if {
	some path, b in decoded_blobs
	any_marker(b)
}

marked_blobs[path] := b if {
	some path, b in text_blobs
	text.has_invisible(b)
}

# decoded_blobs maps the path of every resource blob that is base64 to its
# decoded bytes (decoded once: a blob may be megabytes).
decoded_blobs[path] := base64.decode(blob) if {
	some path, blob in blob_strings
	base64.is_valid(blob)
}

# long_blob: when the blobs of text hold more than this many bytes
# together, the payload is not clean (clean_of): they may be over the limit
# (see below). They are not redacted for it: a blob with no marker and no
# invisible character holds nothing redact would change. The gateway's
# scan uses the same length.
long_blob := 4096

# text_blobs maps the path of every blob of text to its decoded text.
text_blobs[path] := b if {
	some path, b in decoded_blobs
	text_blob(path, b)
}

blob_text_bytes := sum([byte_len(b) | some b in text_blobs])

# Blobs of text are bounded as text is, together, but not cut (a runner
# decodes a blob whole): blobs over the limit are withheld.
cannot_inspect contains msg if {
	blob_text_bytes > max_bytes
	msg := sprintf("the upstream's %s holds %d bytes of text in blobs, over the limit of %d bytes, so it was withheld; ask for less", [noun, blob_text_bytes, max_bytes])
}

# text_blob(path, b): the blob at path decodes to b, text a runner may show
# as such: valid UTF-8, of a resource without a mimeType (none, or null,
# which decoders read as none) or with one of text (text_mime) in UTF-8.
# Its invisible characters are removed as in any text; those of other blobs
# are bytes of binary data, left as they are even when they happen to be
# valid UTF-8 (a protocol buffer's).
text_blob(path, b) if {
	mime := blob_types[path]
	text_mime(mime_base(mime))
	not foreign_charset(mime)
	utf8(b)
}

# utf8(b): b is valid UTF-8 (JSON writes other bytes as U+FFFD).
utf8(b) if json.unmarshal(json.marshal(b)) == b

# blob_mime(path): the mimeType beside the blob at path, null without one.
blob_mime(path) := object.get(input.result, array.concat(array.slice(path, 0, count(path) - 1), ["mimeType"]), null)

# blob_types maps the path of every resource blob whose mimeType toolgate
# can read to that mimeType in lower case: "" for none or null (Go's,
# Python's and JavaScript's decoders read null as none). A blob whose
# mimeType is another value is withheld (unreadable_blobs).
blob_types[path] := lower(mime) if {
	some path, _ in blob_strings
	mime := blob_mime(path)
	is_string(mime)
}

blob_types[path] := "" if {
	some path, _ in blob_strings
	blob_mime(path) == null
}

# mime_base(m): the type of mimeType m, without its parameters.
mime_base(m) := trim_space(split(m, ";")[0])

# foreign_charset(m): mimeType m (lower case) has a charset parameter that
# names an encoding other than UTF-8 or US-ASCII. The gateway's scan reads
# it the same way.
foreign_charset(m) if {
	params := split(m, ";")
	some p in array.slice(params, 1, count(params))
	kv := split(p, "=")
	trim_space(kv[0]) == "charset"
	not trim(trim_space(concat("=", array.slice(kv, 1, count(kv)))), `"`) in utf8_charsets
}

utf8_charsets := {"utf-8", "utf8", "us-ascii", "ascii"}

# unreadable_blobs maps the path of every resource blob that toolgate cannot
# read as a runner may to the reason it is withheld: a mimeType that is not
# a string (a runner may take the blob for text or not); text in another
# charset than UTF-8, which a runner that honours the label decodes to text
# toolgate never saw (UTF-16, say); a blob labelled with a type of text
# whose bytes are not UTF-8; a blob without a mimeType that opens with a
# byte-order mark of UTF-16 or UTF-32 (foreign_bom); a blob beside a member
# that is mimeType spelled in another case. Another blob without a
# mimeType whose bytes are not UTF-8 is binary data. The gateway's scan
# withholds the same (its unreadableBlob, and variantRefusal for the
# spelling).
unreadable_blobs[path] := sprintf("the upstream's %s holds a blob at %s whose mimeType is not a string, so toolgate cannot tell whether it is text; it was withheld", [channel, place(path)]) if {
	some path, _ in blob_strings
	not blob_types[path]
}

unreadable_blobs[path] := sprintf("the upstream's %s holds a blob of text at %s whose mimeType names a charset other than UTF-8, which toolgate cannot inspect; it was withheld", [channel, place(path)]) if {
	some path, mime in blob_types
	text_mime(mime_base(mime))
	foreign_charset(mime)
}

unreadable_blobs[path] := sprintf("the upstream's %s holds a blob at %s whose mimeType is of text but whose bytes are not UTF-8, which toolgate cannot inspect; it was withheld", [channel, place(path)]) if {
	some path, b in decoded_blobs
	mime := blob_types[path]
	mime_base(mime) != ""
	text_mime(mime_base(mime))
	not foreign_charset(mime)
	not utf8(b)
}

# A blob without a mimeType (none, null, or only blanks or parameters)
# whose bytes open with a byte-order mark of UTF-16 or UTF-32: a runner
# that reads such a blob as text sniffs the mark and decodes text toolgate
# never saw (its bytes are not UTF-8, so toolgate would take it for binary
# data).
unreadable_blobs[path] := sprintf("the upstream's %s holds a blob at %s without a mimeType whose bytes open with a UTF-16 or UTF-32 byte-order mark, text in another charset than UTF-8, which toolgate cannot inspect; it was withheld", [channel, place(path)]) if {
	some path, b in decoded_blobs
	mime_base(blob_types[path]) == ""
	foreign_bom(b)
}

# foreign_bom(b): b opens with a byte-order mark of UTF-16 (FF FE, FE FF)
# or UTF-32 (FF FE 00 00, 00 00 FE FF). sprintf's precision keeps the
# first four characters of b as they are (a byte that is not UTF-8 counts
# as one), where substring would read all of b and write such bytes as
# U+FFFD.
foreign_bom(b) if {
	head := hex.encode(sprintf("%.4s", [b]))
	some mark in ["fffe", "feff", "0000feff"]
	startswith(head, mark)
}

# A member beside a blob that is mimeType spelled in another case (or with
# an invisible character): toolgate reads no mimeType, and a runner whose
# decoder ignores case in member names (Go's encoding/json) reads that one,
# a charset perhaps. The reason quotes neither the member nor its value.
unreadable_blobs[path] := sprintf("the upstream's %s holds a blob at %s beside a member that is mimeType spelled in another case, which runners may read as its mimeType, so toolgate cannot tell how they read the blob; it was withheld", [channel, place(path)]) if {
	some path, _ in blob_strings
	res := object.get(input.result, array.slice(path, 0, count(path) - 1), {})
	some k, _ in res
	k != "mimeType"
	lower(text.clean(k)) == "mimetype"
}

cannot_inspect contains msg if some msg in unreadable_blobs

# text_mime(m): m (lower case, without parameters) is empty, text/*, JSON,
# XML, YAML (also as a +json, +xml or +yaml suffix) or another language
# written as text. The gateway's scan has the same list.
text_mime("")

text_mime(m) if startswith(m, "text/")

text_mime(m) if m in text_applications

text_mime(m) if {
	some suffix in ["+json", "+xml", "+yaml"]
	endswith(m, suffix)
}

text_applications := {
	"application/json", "application/xml", "application/yaml", "application/x-yaml",
	"application/javascript", "application/ecmascript", "application/x-ndjson", "application/toml", "application/sql",
	"application/graphql", "application/x-sh",
}

# blob_plain(path, b): b without its invisible characters when it is text.
blob_plain(path, b) := text.clean(b) if {
	text_blobs[path]
} else := b

# blob_looks maps the path of every resource blob whose decoded bytes may
# hold a secret to those bytes: those with a marker, and with patterns of
# yours every one.
blob_looks[path] := b if some path, b in marked_blobs

blob_looks[path] := b if {
	count(redact_patterns) > 0
	some path, b in decoded_blobs
}

blob_attempted := {path: redact(blob_plain(path, b)) | some path, b in blob_looks}

blob_cleaned := {path: base64.encode(r.text) |
	some path, r in blob_attempted
	r.text != blob_looks[path]
}

# --- truncation

# must_truncate: the string as received is over the cap and its cleaned
# form still is, or only its head was cleaned.
must_truncate(size, true, _) if size > cap

must_truncate(size, _, t) if {
	size > cap
	byte_len(t) > cap
}

default must_truncate(_, _, _) := false

truncate(t, _, false) := t

truncate(t, size, true) := concat("", [cut_clusters(t, cap), truncation_note(size, cap)])

truncation_note(size, n) := sprintf("\n[truncated by toolgate: kept %d of %d bytes; a%s %s may hold %d bytes of text]", [n, size, article, noun, max_bytes])

article := "n" if noun == "upstream message"

else := ""

# byte_len: the length of s in UTF-8 bytes (count counts characters).
byte_len(s) := count(hex.encode(s)) / 2

# ascii_head(path, n): the first n characters of the ASCII string at path,
# one fewer when the cut would split CR LF.
ascii_head(path, n) := substring(h, 0, n - to_number(endswith(h, "\r\n"))) if {
	h := first_chars_at(path, n + 1)
}

# cut_clusters(t, n): the longest prefix of t that is at most n bytes and
# does not end inside a grapheme cluster (a character with its combining
# marks, CR LF, a Hangul syllable, a flag).
cut_clusters(t, n) := head if {
	head := cut_bytes(t, n)
	not splits_cluster(head, t)
} else := regex.replace(cut_bytes(t, n), last_cluster, "")

splits_cluster(head, t) if {
	count(head) < count(t)
	next := substring(t, count(head), 1)
	prev := substring(head, count(head) - 1, 1)
	regex.match(no_break, concat("", [prev, next]))
	not even_flags(head, next)
}

# even_flags: regional indicators pair up from the start of a run; a run of
# even length ends with a whole flag.
even_flags(head, next) if {
	regex.match(`^[\x{1F1E6}-\x{1F1FF}]$`, next)
	run := regex.find_n(`[\x{1F1E6}-\x{1F1FF}]+$`, head, 1)
	count(run) == 1
	count(run[0]) % 2 == 0
}

cluster_extend := `\p{M}\x{200C}\x{200D}\x{0E33}\x{0EB3}\x{FF9E}\x{FF9F}\x{1F3FB}-\x{1F3FF}\x{E0020}-\x{E007F}`

cluster_prepend := `\x{0600}-\x{0605}\x{06DD}\x{070F}\x{0890}\x{0891}\x{08E2}\x{0D4E}\x{110BD}\x{110CD}\x{111C2}\x{111C3}\x{1193F}\x{11941}\x{11A3A}\x{11A84}-\x{11A89}\x{11D46}`

hangul_l := `\x{1100}-\x{115F}\x{A960}-\x{A97C}`

hangul_v := `\x{1160}-\x{11A7}\x{D7B0}-\x{D7C6}`

hangul_t := `\x{11A8}-\x{11FF}\x{D7CB}-\x{D7FB}`

hangul_syllable := `\x{AC00}-\x{D7A3}`

control := `\x00-\x1F\x7F-\x9F\x{2028}\x{2029}`

# no_break matches two characters between which a grapheme cluster does
# not end (UAX #29, for text without default-ignorable characters).
no_break := concat("", [
	`^(?:\r\n`,
	sprintf(`|[^%s][%s]`, [control, cluster_extend]),
	sprintf(`|[%s][^%s]`, [cluster_prepend, control]),
	sprintf(`|[%s][%s%s%s]`, [hangul_l, hangul_l, hangul_v, hangul_syllable]),
	sprintf(`|[%s%s][%s%s]`, [hangul_v, hangul_syllable, hangul_v, hangul_t]),
	sprintf(`|[%s][%s]`, [hangul_t, hangul_t]),
	`|[\x{1F1E6}-\x{1F1FF}]{2})$`,
])

# last_cluster matches the grapheme cluster at the end of a text.
last_cluster := concat("", [
	sprintf(`(?:[%s]*(?:`, [cluster_prepend]),
	sprintf(`[%s]+(?:[%s]+|[%s][%s]*)?[%s]*`, [hangul_l, hangul_v, hangul_syllable, hangul_v, hangul_t]),
	sprintf(`|(?:[%s]+|[%s][%s]*)[%s]*`, [hangul_v, hangul_syllable, hangul_v, hangul_t]),
	sprintf(`|[%s]+`, [hangul_t]),
	`|[\x{1F1E6}-\x{1F1FF}]`,
	sprintf(`|[^%s])[%s]*|\r)$`, [control, cluster_extend]),
])

# first_chars(s, n) is substring(s, 0, n), but reads only the first n
# characters of s where substring reads all of it first: sprintf's precision
# stops after n characters (up to a million; beyond, substring it is).
first_chars(s, n) := sprintf("%.*s", [n, s]) if {
	n <= 1000000
} else := substring(s, 0, n)

# last_chars(s, n): the last n characters of s.
last_chars(s, n) := substring(s, count(s) - n, n) if {
	count(s) > n
} else := s

# first_chars_at(path, n) is first_chars of the inspected string at path.
# (OPA remembers every function call by its arguments, which costs a pass
# over them: a text of a megabyte is better not passed to a function.)
first_chars_at(path, n) := sprintf("%.*s", [n, object.get(input.result, path, null)]) if {
	n <= 1000000
} else := substring(object.get(input.result, path, null), 0, n)

# cut_bytes(t, n): the longest prefix of t that is at most n bytes and does
# not end inside a multi-byte character.
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

# --- the decision's result

changes contains sprintf("redacted %s", [concat(", ", kinds)]) if {
	kinds := {kind | some c in cleaned; some kind in c.kinds} | {kind | some r in blob_attempted; some kind in r.kinds}
	count(kinds) > 0
}

changes contains "removed invisible or bidirectional Unicode control characters" if {
	some c in cleaned
	c.stripped
}

changes contains "removed invisible or bidirectional Unicode control characters" if {
	some path, b in blob_looks
	blob_plain(path, b) != b
}

changes contains sprintf("cut texts to fit the limit of %d bytes", [max_bytes]) if {
	some c in cleaned
	c.truncated
}

# renamed_keys maps the path of every object whose keys change to their
# new names.
renamed_keys[parent] := [c.text |
	some [p, true], c in cleaned
	array.slice(p, 0, count(p) - 1) == parent
] if {
	some [path, true], _ in cleaned
	parent := array.slice(path, 0, count(path) - 1)
}

# kept_key: parent has a key name that is not renamed.
kept_key(parent, name) if {
	obj := object.get(input.result, parent, {})
	name in object.keys(obj)
	not cleaned[[array.concat(parent, [name]), true]]
}

# deepest_first(moves): the moves, those of the deepest paths first.
deepest_first(moves) := [] if {
	count(moves) == 0
} else := [m |
	depths := sort({count(m.from) | some m in moves})
	some i in numbers.range(count(depths) - 1, 0)
	some m in moves
	count(m.from) == depths[i]
]

# with_result adds the cleaned result to decision d, and what was done to its
# reason, when some inspected string changed; otherwise d goes out as it is.
# Without else on purpose: should the patch fail, the decision is undefined
# (a deny), never the unchanged result.
with_result(d) := d if {
	count(cleaned) == 0
	count(blob_cleaned) == 0
}

with_result(d) := object.union(d, {"reason": reason, "result": result}) if {
	count(cleaned) + count(blob_cleaned) > 0
	values := [{"op": "replace", "path": path, "value": c.text} | some [path, false], c in cleaned]
	blobs := [{"op": "replace", "path": path, "value": b} | some path, b in blob_cleaned]

	# Keys last, deepest first, so that the paths of the others still hold.
	moves := [{"op": "move", "from": path, "path": array.concat(array.slice(path, 0, count(path) - 1), [c.text])} |
		some [path, true], c in cleaned
	]
	by_depth := deepest_first(moves)
	result := json.patch(input.result, array.concat(array.concat(values, blobs), by_depth))
	done := sprintf("toolgate changed the %s: %s", [noun, concat("; ", changes)])
	reason := concat("; ", array.concat([r | r := d.reason], [done]))
}
