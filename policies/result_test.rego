package toolgate.result_test

import data.toolgate.result

# The request input of a tools/call; tests add a "result".
base := {
	"caller": {"user": "alice@example.com", "groups": ["eng"], "claims": {}},
	"session": {"id": "sess-1", "services": ["tracker"]},
	"service": {"id": "tracker", "auth": "oauth", "tools": ["read_ticket"]},
	"method": "tools/call",
	"tool": {"name": "read_ticket", "annotations": {"readOnlyHint": true}},
	"arguments": {"ticket_id": "TEST-123"},
	"listing": false,
	"request": {"remote_ip": "127.0.0.1", "protocol_version": "2025-11-25"},
	"time": "2026-11-29T12:00:00Z",
}

with_result(r) := object.union(base, {"result": r})

plain(ts) := {"content": [{"type": "text", "text": t} | some t in ts]}

texts_result(ts) := {"content": [{"type": "text", "text": t} | some t in ts], "isError": false}

decide(r) := d if {
	d := result.decision with input as with_result(r)
}

# Shapes of secrets, built so that this file holds no real-looking secret in
# one piece.
aws_key := concat("", ["AKIA", "IOSFODNN7EXAMPLE"])

aws_session_key := concat("", ["ASIA", "Y34FZKBOKMUTVV7A"])

gh_classic := concat("", ["ghp_", "16C7e42F292c6912E7710c838347Ae178B4a"])

gh_fine := concat("", ["github_pat_", "11ABCDEFG0123456789abc_", "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"])

slack_bot := concat("", ["xoxb-", "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"])

jwt := concat(".", [
	"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",
	"eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ",
	"SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
])

bearer := concat(" ", ["Bearer", "mF_9.B5f-4.1JqM-opaque-token"])

pem := concat("\n", [
	"-----BEGIN RSA PRIVATE KEY-----",
	"MIIEowIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi",
	"Z1BjP5CE8Wm0wHcQOaVSKLTZ3zSlX1AoQ+qqVE=",
	"-----END RSA PRIVATE KEY-----",
])

# --- nothing to change: plain allow, so the gateway passes the bytes through

test_clean_result_plain_allow if {
	r := {
		"content": [
			{"type": "text", "text": "Ticket TEST-123: printer on fire. Bearer tokens are described in RFC 6750."},
			{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
			{"type": "resource_link", "uri": "file:///tickets/TEST-123", "name": "TEST-123"},
			{"type": "resource", "resource": {"uri": "file:///a.txt", "text": "plain text é 👍"}},
			{"type": "resource", "resource": {"uri": "file:///a.bin", "blob": "AAEC"}},
		],
		"structuredContent": {"id": "TEST-123", "count": 3, "tags": ["a", "b"], "ok": true, "none": null},
		"isError": false,
		"_meta": {"progressToken": 1},
	}
	decide(r) == {"action": "allow"}
}

# --- secrets

test_bearer_with_jwt_is_one_marker if {
	d := decide(texts_result([concat(" ", ["Authorization: Bearer", jwt])]))
	d.result.content[0].text == "Authorization: [REDACTED:bearer_token]"
}

test_several_secrets_in_one_text if {
	d := decide(texts_result([concat(" ", [aws_key, gh_classic, aws_key])]))
	d.result.content[0].text == "[REDACTED:aws_access_key_id] [REDACTED:github_token] [REDACTED:aws_access_key_id]"
	d.reason == "toolgate changed the result: redacted aws_access_key_id, github_token"
}

test_pem_without_end_redacted_to_the_end if {
	cut := concat("\n", ["key:", "-----BEGIN OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ", "AAAAAAAB"])
	d := decide(texts_result([cut]))
	d.result.content[0].text == "key:\n[REDACTED:pem_private_key]"
}

test_two_pem_keys_redacted_separately if {
	d := decide(texts_result([concat("\n", [pem, "between", pem])]))
	d.result.content[0].text == "[REDACTED:pem_private_key]\nbetween\n[REDACTED:pem_private_key]"
}

test_embedded_resource_text_redacted if {
	r := {"content": [
		{"type": "resource", "resource": {"uri": "file:///.env", "mimeType": "text/plain", "text": concat("", ["AWS_ACCESS_KEY_ID=", aws_key])}},
		{"type": "resource", "resource": {"uri": "file:///a.bin", "blob": "AAEC"}},
	]}
	d := decide(r)
	d.result == {"content": [
		{"type": "resource", "resource": {"uri": "file:///.env", "mimeType": "text/plain", "text": "AWS_ACCESS_KEY_ID=[REDACTED:aws_access_key_id]"}},
		{"type": "resource", "resource": {"uri": "file:///a.bin", "blob": "AAEC"}},
	]}
}

test_structured_content_strings_redacted if {
	r := {
		"content": [{"type": "text", "text": "see structured content"}],
		"structuredContent": {
			"token": gh_classic,
			"nested": {"list": [1, "fine", {"auth": bearer}], "count": 2},
			"flag": true,
		},
		"isError": false,
		"_meta": {"trace": "abc"},
	}
	d := decide(r)
	d.action == "allow"
	d.result == {
		"content": [{"type": "text", "text": "see structured content"}],
		"structuredContent": {
			"token": "[REDACTED:github_token]",
			"nested": {"list": [1, "fine", {"auth": "[REDACTED:bearer_token]"}], "count": 2},
			"flag": true,
		},
		"isError": false,
		"_meta": {"trace": "abc"},
	}
}

test_error_results_scanned_too if {
	d := decide({"content": [{"type": "text", "text": concat("", ["failed with ", slack_bot])}], "isError": true})
	d.result == {"content": [{"type": "text", "text": "failed with [REDACTED:slack_token]"}], "isError": true}
}

test_site_redact_pattern_from_settings if {
	conf := {"max_result_bytes": 65536, "redact_patterns": {"employee_id": `\bEMP-[0-9]{6}\b`}, "services": {}}
	d := decide(texts_result(["owner EMP-123456, see EMP-12"])) with data.toolgate.settings as conf
	d.result.content[0].text == "owner [REDACTED:employee_id], see EMP-12"
	d.reason == "toolgate changed the result: redacted employee_id"
}

test_site_patterns_checked_per_string if {
	# (keys are inspected too)
	# An anchored site pattern: each string is tested on its own, and the
	# built-in kinds are still found.
	conf := {"redact_patterns": {"whole": `^internal-only$`}}
	r := {"content": [{"type": "text", "text": "internal-only"}], "structuredContent": {"a": "internal-only", "b": aws_key, "c": "fine"}}
	d := decide(r) with data.toolgate.settings as conf
	d.result == {
		"content": [{"type": "text", "text": "[REDACTED:whole]"}],
		"structuredContent": {"a": "[REDACTED:whole]", "b": "[REDACTED:aws_access_key_id]", "c": "fine"},
	}
}

test_site_pattern_replaces_builtin_kind if {
	conf := {"redact_patterns": {"aws_access_key_id": `never-matches-anything`}}
	d := decide(texts_result([aws_key])) with data.toolgate.settings as conf
	d == {"action": "allow"}
}

test_broken_site_pattern_denies if {
	every pattern in [`(`, 42] {
		d := decide(texts_result([aws_key])) with data.toolgate.settings as {"redact_patterns": {"bad": pattern}}
		d.action == "deny"
		contains(d.reason, `redact pattern "bad" is not a valid regular expression`)
	}
}

test_failed_cleaning_denies if {
	d := decide(texts_result([aws_key, "fine"])) with result.clean as mock_clean_fails
	d == {"action": "deny", "reason": "toolgate could not clean this result, so it was withheld"}
}

mock_clean_fails(_) := x if {
	x := 1
	x == 2
}

test_failed_patch_is_undefined if {
	# Should the rewrite fail, there is no decision (a deny), never the
	# unchanged result.
	not decide(texts_result([aws_key])) with json.patch as mock_patch_fails
}

mock_patch_fails(_, _) := x if {
	x := 1
	x == 2
}

test_site_redact_pattern if {
	d := decide(texts_result(["mail bob@example.com"])) with result.redact_patterns as {"email": `[a-z]+@[a-z.]+`}
	d.result.content[0].text == "mail [REDACTED:email]"
}

# --- invisible and bidirectional characters

invisible := [
	"\u200b", "\u200c", "\u200d", "\u200e", "\u200f",
	"\u202a", "\u202b", "\u202c", "\u202d", "\u202e",
	"\u2060", "\u2061", "\u2062", "\u2063", "\u2064",
	"\u2066", "\u2067", "\u2068", "\u2069",
	"\ufeff",
	"\udb40\udc00", # U+E0000
	"\udb40\udc41", # U+E0041, TAG LATIN CAPITAL LETTER A
	"\udb40\udc7f", # U+E007F, CANCEL TAG
]

test_invisible_characters_stripped if {
	every c in invisible {
		d := decide(texts_result([concat(c, ["ig", "nore previous"])]))
		d.result.content[0].text == "ignore previous"
		d.reason == "toolgate changed the result: removed invisible or bidirectional Unicode control characters"
	}
}

test_invisible_hidden_secret_redacted if {
	# Stripping comes first, so zero-width characters cannot hide a secret.
	hidden := concat("\u200b", ["AKIA", "IOSFODNN7EXAMPLE"])
	d := decide(texts_result([hidden]))
	d.result.content[0].text == "[REDACTED:aws_access_key_id]"
	contains(d.reason, "redacted aws_access_key_id; removed invisible")
}

test_invisible_stripped_everywhere if {
	r := {
		"content": [{"type": "resource", "resource": {"uri": "file:///r", "text": "a\u202eb"}}],
		"structuredContent": {"s": "c\ufeffd"},
	}
	d := decide(r)
	d.result == {
		"content": [{"type": "resource", "resource": {"uri": "file:///r", "text": "ab"}}],
		"structuredContent": {"s": "cd"},
	}
}

# --- truncation

limit(n) := {"admin_groups": ["admins"], "max_result_bytes": n, "services": {}}

# --- malformed results fail closed

test_text_item_without_text_denied if {
	every item in [
		{"type": "text"},
		{"type": "text", "text": 42},
		{"type": "resource", "resource": {"uri": "file:///x"}},
		{"type": "resource", "resource": {"uri": "file:///x", "text": ["a"]}},
		{"type": "resource"},
	] {
		d := decide({"content": [{"type": "text", "text": "fine"}, item]})
		d.action == "deny"
		contains(d.reason, "content[1] has type")
	}
}

# --- review mode and site rules

test_review_results_asks if {
	conf := {"services": {"tracker": {"review_results": true}}}
	d := decide(texts_result(["fine"])) with data.toolgate.settings as conf
	d == {"action": "ask", "reason": `results of service "tracker" are reviewed by a human before the runner sees them (settings.services["tracker"].review_results); wait for the approval`}
}

test_review_results_carries_cleaned_result if {
	conf := {"services": {"tracker": {"review_results": true}}}
	d := decide(texts_result([aws_key])) with data.toolgate.settings as conf
	d.action == "ask"
	d.result.content[0].text == "[REDACTED:aws_access_key_id]"
	contains(d.reason, "review_results); wait for the approval; toolgate changed the result: redacted aws_access_key_id")
}

test_review_results_per_service if {
	conf := {"services": {"wiki": {"review_results": true}, "tracker": {"review_results": "yes"}}}
	d := decide(texts_result(["fine"])) with data.toolgate.settings as conf
	d == {"action": "allow"}
}

test_site_deny_withholds_result if {
	d := decide(texts_result([aws_key])) with result.deny as {"mentions project falcon"}
	d == {"action": "deny", "reason": "mentions project falcon"}
}

# --- the gateway's quick pass (input.scan)

# gateway_scan(r) is input.scan as the gateway makes it for result r: the
# entries of the scan the policy computes itself that are over the
# threshold or hold an invisible character or a marker.
gateway_scan(r) := {"clean": full.clean, "threshold": 4096, "bytes": full.bytes, "key_bytes": full.key_bytes, "seams": full.seams, "strings": [e |
	some e in full.strings
	listed(e)
]} if {
	full := result.scan with input as with_result(r)
}

listed(e) if e.bytes > 4096

listed(e) if e.invisible

listed(e) if e.markers

scanned_input(r) := object.union(with_result(r), {"scan": gateway_scan(r)})

# Results and settings for which the decision with and without the
# gateway's scan must be the same.
scan_cases := [
	[texts_result(["Ticket TEST-123: printer on fire"]), {}],
	[texts_result([concat(" ", ["key", aws_key, "and", jwt])]), {}],
	[texts_result([concat("\u200b", ["ig", "nore"]), "plain"]), {}],
	[{"content": [{"type": "resource", "resource": {"uri": "file:///r", "text": concat("", ["x", slack_bot])}}], "structuredContent": {"a": [1, {"b": bearer}], "c": "fine", "d": "c\ufeffd"}}, {}],
	[texts_result([concat("", [s | some _ in numbers.range(1, 600); s := "0123456789"])]), limit(5000)],
	[texts_result([concat("", [s | some _ in numbers.range(1, 600); s := "ééééé"])]), limit(5000)],
	[texts_result([concat("", [pem, concat("", [s | some _ in numbers.range(1, 600); s := "0123456789"])])]), limit(5000)],
	[{"content": [], "structuredContent": {"log": concat("", [s | some _ in numbers.range(1, 500); s := "abcdefghij"])}}, limit(4096)],
	[texts_result(["0123456789abcdef"]), limit(10)], # a limit under the threshold: the policy scans itself
	[texts_result(["owner EMP-123456"]), {"redact_patterns": {"employee_id": `\bEMP-[0-9]{6}\b`}}], # site patterns: likewise
	[{"content": [{"type": "text", "text": "fine"}, {"type": "text"}]}, {}],
	[{"content": {"type": "text", "text": aws_key}}, {}],
]

test_gateway_scan_gives_the_same_decisions if {
	every c in scan_cases {
		[r, conf] := c
		settings := object.union({"max_result_bytes": 65536, "services": {}}, conf)
		without := result.decision with input as with_result(r) with data.toolgate.settings as settings
		with_scan := result.decision with input as scanned_input(r) with data.toolgate.settings as settings
		without == with_scan
	}
}

test_head_is_substring if {
	every s in ["", "abc", "héllo wörld", "👍👍👍", "a\u200bb"] {
		every n in [0, 1, 2, 5, 100] {
			result.first_chars(s, n) == substring(s, 0, n)
		}
	}
	result.first_chars("abcdef", 2000000) == "abcdef"
}

test_limit_over_a_million_characters if {
	# Heads longer than sprintf's precision allows are taken with substring.
	d := decide(texts_result([aws_key])) with data.toolgate.settings as limit(2000000)
	d.result.content[0].text == "[REDACTED:aws_access_key_id]"
}

# --- what is inspected, and what is withheld

test_empty_content_plain_allow if {
	decide({"content": []}) == {"action": "allow"}
}

test_result_without_content_denied if {
	every r in [{}, {"structuredContent": {"a": 1}}, {"content": {"type": "text", "text": "x"}}] {
		d := decide(r)
		d.action == "deny"
		contains(d.reason, "no content array")
		not d.result
	}
	d := result.decision with input as base
	d.action == "deny"
}

test_unknown_content_types_denied if {
	every item in [{"type": "html", "text": "x"}, {"text": "no type"}, {"type": 1}, "a bare string", 42, null, ["text"]] {
		d := decide({"content": [{"type": "text", "text": "fine"}, item]})
		d.action == "deny"
		contains(d.reason, "content[1], which is not a content item")
	}
}

test_resource_blob_that_is_not_base64_denied if {
	# Runners decode blobs leniently (URL-safe alphabet, line breaks), so a
	# blob toolgate cannot decode could hide a secret, even next to a text.
	hidden := replace(base64.encode(concat("", ["key ", aws_key, " ??>"])), "/", "_")
	every res in [
		{"uri": "file:///k", "blob": hidden},
		{"uri": "file:///k", "text": "see the blob", "blob": hidden},
		{"uri": "file:///k", "blob": "AAEC AAEC"},
	] {
		d := decide({"content": [{"type": "resource", "resource": res}]})
		d.action == "deny"
		contains(d.reason, "a blob that is not base64")
	}
}

test_every_field_inspected if {
	r := {
		"content": [
			{"type": "text", "text": aws_key, "annotations": {"audience": ["user"]}, "_meta": {"k": aws_key}},
			{"type": "image", "data": aws_key, "mimeType": "image/png"}, # binary: not inspected
			{"type": "resource_link", "uri": "file:///x", "name": aws_key},
		],
		"isError": false,
		"_meta": {"k": aws_key},
		"vendorField": [aws_key],
	}
	d := decide(r)
	d.result == {
		"content": [
			{"type": "text", "text": "[REDACTED:aws_access_key_id]", "annotations": {"audience": ["user"]}, "_meta": {"k": "[REDACTED:aws_access_key_id]"}},
			{"type": "image", "data": aws_key, "mimeType": "image/png"},
			{"type": "resource_link", "uri": "file:///x", "name": "[REDACTED:aws_access_key_id]"},
		],
		"isError": false,
		"_meta": {"k": "[REDACTED:aws_access_key_id]"},
		"vendorField": ["[REDACTED:aws_access_key_id]"],
	}
}

test_keys_cleaned_and_collisions_denied if {
	d := decide({"content": [], "structuredContent": {aws_key: {"a\u200bb": 1}}})
	d.result.structuredContent == {"[REDACTED:aws_access_key_id]": {"ab": 1}}
	c := decide({"content": [], "structuredContent": {"a\u200bb": 1, "ab": 2}})
	c.action == "deny"
	contains(c.reason, "the same name")
	contains(c.reason, "the object at structuredContent")
}

# The reason reaches the runner: it names the object whose keys collide by
# its place, never by the upstream's keys as received (a secret, invisible
# characters).
test_collision_reason_quotes_no_upstream_key if {
	c := decide({"content": [], "structuredContent": {concat("", ["key ", aws_key]): [{"a\u200bb": 1, "ab": 2}]}})
	c.action == "deny"
	contains(c.reason, "the object at structuredContent.<key>[0] the same name")
	not contains(c.reason, aws_key)
	not contains(c.reason, "\u200b")
	k := decide({"content": [], "structuredContent": {"x": {aws_key: 2, "[REDACTED:aws_access_key_id]": 3}}})
	k.action == "deny"
	contains(k.reason, "the object at structuredContent.<key> the same name")
	not contains(k.reason, "IOSFODNN7EXAMPLE")
	t := decide({"content": [], "a\u200bb": 1, "ab": 2})
	contains(t.reason, "two keys of the object at the top level")
}

test_place_names_no_upstream_key if {
	result.place(["inputRequests", aws_key, "params", "messages", 0, "content", 1, "resource", "blob"]) == "inputRequests.<key>.params.messages[0].content[1].resource.blob"
	result.place(["content", 0, "resource", "blob"]) == "content[0].resource.blob"
	result.place([aws_key]) == "<key>"
	result.place([]) == "the top level"
}

test_invalid_blob_denied if {
	d := decide({"content": [{"type": "resource", "resource": {"uri": "file:///b", "blob": "not base64!"}}]})
	d.action == "deny"
}

test_texts_for_site_rules if {
	t := result.texts with input as with_result({
		"content": [{"type": "text", "text": "pro\u200bject falcon"}, {"type": "image", "data": "eA=="}],
		"structuredContent": {"a": ["b"]},
	})
	t == {"project falcon", "b", "text", "image", "content", "type", "data", "structuredContent", "a"}
}

test_neighbouring_characters_kept if {
	every c in [
		"\u200a", # HAIR SPACE
		"\u2010", # HYPHEN
		"\u0600", # ARABIC NUMBER SIGN, a visible prepended concatenation mark
		"é", "\u00a0", "👍",
	] {
		decide(texts_result([concat(c, ["a", "b"])])) == {"action": "allow"}
	}
}

# --- the budget of the whole result

limit(n) := {"admin_groups": ["admins"], "max_result_bytes": n, "services": {}}

test_result_under_the_limit_kept if {
	d := decide(plain(["0123456789"])) with data.toolgate.settings as limit(30)
	d == {"action": "allow"}
}

test_budget_counts_every_string_and_key if {
	# Two texts of 16 bytes and the keys ("content", "type" twice, "text"
	# twice: 23 bytes) plus "text" twice as values (8): 71 bytes. With a
	# limit of 51 the two texts share 20 bytes.
	d := decide(plain(["0123456789abcdef", "ghijklmnopqrstuv"])) with data.toolgate.settings as limit(51)
	d.result.content[0].text == "0123456789\n[truncated by toolgate: kept 10 of 16 bytes; a result may hold 51 bytes of text]"
	d.result.content[1].text == "ghijklmnop\n[truncated by toolgate: kept 10 of 16 bytes; a result may hold 51 bytes of text]"
	d.reason == "toolgate changed the result: cut texts to fit the limit of 51 bytes"
}

test_longest_strings_cut_first if {
	d := decide({"content": [{"type": "text", "text": "short"}], "structuredContent": {"log": "0123456789abcdefghij"}}) with data.toolgate.settings as limit(61)
	d.result.content[0].text == "short"
	startswith(d.result.structuredContent.log, "0123456789abcdefg\n[truncated by toolgate: kept 17 of 20 bytes")
}

test_structure_over_the_limit_denied if {
	d := decide({"content": [], "structuredContent": {"a_long_key_name": 1, "another_long_key": 2}}) with data.toolgate.settings as limit(20)
	d.action == "deny"
	contains(d.reason, "keys and structure alone")
}

test_cut_counts_bytes_and_keeps_clusters if {
	# "é" is two bytes; "e" + U+0301 is one cluster of three bytes; a flag
	# is two regional indicators; CR LF is one cluster.
	cases := [
		["éééééé", "éé"],
		["e\u0301e\u0301e\u0301", "e\u0301"],
		["🇩🇪🇫🇷", ""],
		["abcd\r\nef", "abcd"],
		["12345👍👍", "12345"],
	]
	every c in cases {
		[t, kept] := c
		d := decide(plain([t])) with data.toolgate.settings as limit(24)
		startswith(d.result.content[0].text, concat("", [kept, "\n[truncated by toolgate"]))
	}
}

test_service_limit_override if {
	conf := {"max_result_bytes": 65536, "services": {"tracker": {"max_result_bytes": 30}}}
	d := decide(plain(["abcdefghijklmnopqrstuvwxyz"])) with data.toolgate.settings as conf
	contains(d.result.content[0].text, "truncated by toolgate: kept 11 of 26 bytes; a result may hold 30 bytes")
}

test_redaction_before_truncation if {
	# The key straddles the cut: it is redacted whole, never cut in half.
	text := concat("", ["0123456789 ", aws_key, " tail"])
	d := decide(plain([text])) with data.toolgate.settings as limit(40)
	not contains(d.result.content[0].text, "AKIA")
	contains(d.reason, "redacted aws_access_key_id")
	contains(d.reason, "cut texts")
}

test_huge_text_only_head_cleaned if {
	filler := concat("", [s | some _ in numbers.range(1, 2000); s := "0123456789"])
	text := concat("", ["x\u200by ", pem, filler])
	d := decide(plain([text])) with data.toolgate.settings as limit(40)
	startswith(d.result.content[0].text, "xy [REDACTED:pem_priv\n[truncated by toolgate:")
}

test_scan_entries if {
	s := result.scan with input as with_result({"content": [{"type": "text", "text": "é\u200b"}]})
	s.threshold == 0
	s.bytes == 24 # "content", "type", "text" (value), "text" (key), "é\u200b"
	{"path": ["content", 0, "text"], "key": false, "bytes": 5, "ascii": false, "invisible": true, "markers": false} in s.strings
	{"path": ["content", 0, "type"], "key": true, "bytes": 4, "ascii": true, "invisible": false, "markers": false} in s.strings
}

test_gateway_scan_is_used if {
	r := texts_result([aws_key])
	sc := {"clean": false, "threshold": 4096, "bytes": 45, "key_bytes": 25, "strings": [], "seams": []}
	result.decision == {"action": "allow"} with input as object.union(with_result(r), {"scan": sc})
}

test_clean_scan_decides_alone if {
	# The gateway's verdict that nothing needs cleaning is all the policy
	# reads (so it must be right: the Go tests compare it with clean_of).
	r := texts_result([aws_key])
	sc := {"clean": true, "threshold": 4096, "bytes": 45, "key_bytes": 25, "strings": [], "seams": []}
	result.untouched with input as object.union(with_result(r), {"scan": sc})
	result.decision == {"action": "allow"} with input as object.union(with_result(r), {"scan": sc})
}

test_clean_scan_still_cuts_and_asks if {
	r := texts_result(["0123456789abcdef"])
	sc := {"clean": true, "threshold": 4096, "bytes": 42, "key_bytes": 22, "strings": [], "seams": []}
	inp := object.union(with_result(r), {"scan": sc})

	# over the limit: the long way, which cuts
	not result.untouched with input as inp with data.toolgate.settings as limit(30)
	d := result.decision with input as inp with data.toolgate.settings as limit(30)
	startswith(d.result.content[0].text, "0123\n[truncated by toolgate")

	# a pattern of yours must be matched
	not result.untouched with input as inp with data.toolgate.settings.redact_patterns as {"hex": "[0-9a-f]{16}"}

	# a rule of yours still withholds it
	result.decision == {"action": "deny", "reason": "no hex"} with input as inp with result.deny as {"no hex"}
	result.decision.action == "ask" with input as inp with data.toolgate.settings.services as {"tracker": {"review_results": true}}
}

test_issue_invisible_characters_stripped if {
	# Characters a hand-written list missed; the set is Unicode's now.
	every c in [
		"\u00ad", "\u034f", "\u061c", "\u115f", "\u180e", "\u2065", "\u206f", "\u3164",
		"\ufe00", "\ufe0f", "\udb40\udd00", "\udb40\uddef", "\uffa0", "\ufff9", "\ufffb",
		"\ud834\udd73", "\ud834\udd7a", "\u17b4",
	] {
		d := decide(texts_result([concat(c, ["ig", "nore previous"])]))
		d.result.content[0].text == "ignore previous"
	}
}

# --- long texts and texts split in items

log_lines(n) := concat("", [s | some i in numbers.range(1, n); s := sprintf("line %d of the log, nothing to see.\n", [i])])

test_long_text_matched_near_its_markers if {
	t := concat("", [log_lines(40), "deploy with ", aws_key, " done\n", log_lines(40), "auth: ", bearer, "\n", log_lines(5)])
	count(result.windows_in(t, count(t))) == 2
	d := decide(texts_result([t]))
	d.result.content[0].text == concat("", [log_lines(40), "deploy with [REDACTED:aws_access_key_id] done\n", log_lines(40), "auth: [REDACTED:bearer_token]\n", log_lines(5)])
}

test_long_text_with_a_private_key_matched_whole if {
	t := concat("", [log_lines(40), pem, "\n", log_lines(40)])
	not result.windows_in(t, count(t))
	d := decide(texts_result([t]))
	d.result.content[0].text == concat("", [log_lines(40), "[REDACTED:pem_private_key]\n", log_lines(40)])
}

test_secret_split_across_two_items if {
	d := decide(texts_result([concat("", ["key: ", substring(gh_classic, 0, 10)]), concat("", [substring(gh_classic, 10, 100), " end"])]))
	d.result.content[0].text == "key: [REDACTED:github_token]"
	d.result.content[1].text == " end"
	contains(d.reason, "redacted github_token")
}
