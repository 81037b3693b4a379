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

test_empty_result_plain_allow if {
	decide({"content": []}) == {"action": "allow"}
	decide({}) == {"action": "allow"}
}

test_missing_result_plain_allow if {
	d := result.decision with input as base
	d == {"action": "allow"}
}

# --- secrets

test_each_secret_kind_redacted if {
	cases := {
		"aws_access_key_id": [aws_key, aws_session_key],
		"github_token": [gh_classic, gh_fine],
		"slack_token": [slack_bot, concat("", ["xoxe.xoxp-", "1-Mi0yLTE2NTM0NTQ3NjAtOTc4"])],
		"jwt": [jwt],
		"bearer_token": [bearer, concat("", ["bearer ", "abcdefghijklmnop0123=="]), concat("", ["BEARER ", "abcdefghijklmnop0123"])],
		"pem_private_key": [pem, replace(pem, "RSA ", "ENCRYPTED "), replace(pem, "RSA ", "")],
	}
	object.keys(cases) == object.keys(result.secret_patterns) # a case for every built-in kind
	every kind, secrets in cases {
		every secret in secrets {
			text := concat("", ["before ", secret, " after"])
			d := decide(texts_result([text]))
			d.action == "allow"
			d.result.content[0].text == sprintf("before [REDACTED:%s] after", [kind])
			contains(d.reason, concat("", ["redacted ", kind]))

			# The quick test over the whole result sees it too, also in
			# structuredContent.
			result.has_marker with input as with_result({"content": [], "structuredContent": {"k": [text]}})
		}
	}
}

test_lookalikes_not_redacted if {
	every text in [
		"AKIA is a prefix", # too short
		"AKIAIOSFODNN7EXAMPL", # 15 characters after the prefix
		"ghp_short",
		"xoxb-short",
		"Bearer token", # prose, no token
		"eyJhbGciOiJIUzI1NiJ9 is one part only",
		"-----BEGIN PUBLIC KEY-----\nMIIBIjAN\n-----END PUBLIC KEY-----",
		"-----BEGIN CERTIFICATE-----\nMIIBIjAN\n-----END CERTIFICATE-----",
	] {
		decide(texts_result([text])) == {"action": "allow"}
	}
}

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

test_other_fields_kept if {
	r := {
		"content": [
			{"type": "text", "text": aws_key, "annotations": {"audience": ["user"]}, "_meta": {"k": "v"}},
			{"type": "image", "data": aws_key, "mimeType": "image/png"}, # not text: untouched
			{"type": "resource_link", "uri": "file:///x", "name": aws_key}, # not scanned
		],
		"isError": false,
		"_meta": {"k": aws_key}, # not scanned
		"vendorField": 1,
	}
	d := decide(r)
	d.result == json.patch(r, [{"op": "replace", "path": "/content/0/text", "value": "[REDACTED:aws_access_key_id]"}])
}

test_site_redact_pattern_from_settings if {
	conf := {"max_result_bytes": 65536, "redact_patterns": {"employee_id": `\bEMP-[0-9]{6}\b`}, "services": {}}
	d := decide(texts_result(["owner EMP-123456, see EMP-12"])) with data.toolgate.settings as conf
	d.result.content[0].text == "owner [REDACTED:employee_id], see EMP-12"
	d.reason == "toolgate changed the result: redacted employee_id"
}

test_site_patterns_checked_per_string if {
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

test_same_match_labelled_with_first_kind if {
	d := decide(texts_result(["x secret y"])) with result.redact_patterns as {"b_kind": `secret`, "a_kind": `sec\w+`}
	d.result.content[0].text == "x [REDACTED:a_kind] y"
	contains(d.reason, "redacted a_kind, b_kind")
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

test_neighbouring_characters_kept if {
	every c in [
		"\u200a", # HAIR SPACE
		"\u2010", # HYPHEN
		"\u2065", # unassigned, outside the ranges
		"\u206a", # outside the ranges
		"\udb40\udc80", # U+E0080, just after the tag block
		"é", "\u00a0", "👍",
	] {
		decide(texts_result([concat(c, ["a", "b"])])) == {"action": "allow"}
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

test_texts_for_site_rules if {
	t := result.texts with input as with_result({
		"content": [{"type": "text", "text": "pro\u200bject falcon"}, {"type": "image", "data": "x"}],
		"structuredContent": {"a": ["b"]},
	})
	t == {"project falcon", "b"}
}

# --- truncation

limit(n) := {"admin_groups": ["admins"], "max_result_bytes": n, "services": {}}

test_long_ascii_text_truncated if {
	d := decide(texts_result(["0123456789abcdef", "short"])) with data.toolgate.settings as limit(10)
	d.result.content[0].text == "0123456789\n[truncated by toolgate: 6 bytes over the limit of 10 bytes]"
	d.result.content[1].text == "short"
	d.reason == "toolgate changed the result: truncated text over the limit of 10 bytes"
}

test_text_at_the_limit_kept if {
	d := decide(texts_result(["0123456789"])) with data.toolgate.settings as limit(10)
	d == {"action": "allow"}
}

test_limit_counts_bytes_not_characters if {
	# "é" is two bytes: 6 characters, 12 bytes.
	d := decide(texts_result(["éééééé"])) with data.toolgate.settings as limit(10)
	d.result.content[0].text == "ééééé\n[truncated by toolgate: 2 bytes over the limit of 10 bytes]"
}

test_cut_never_splits_a_character if {
	# 9 ASCII bytes then 3-byte characters: the cut falls inside "€".
	d := decide(texts_result(["123456789€€"])) with data.toolgate.settings as limit(10)
	d.result.content[0].text == "123456789\n[truncated by toolgate: 5 bytes over the limit of 10 bytes]"

	# "¿" is c2 bf: the cut would leave a lone c2.
	f := decide(texts_result(["123456789¿"])) with data.toolgate.settings as limit(10)
	f.result.content[0].text == "123456789\n[truncated by toolgate: 1 bytes over the limit of 10 bytes]"

	# A 4-byte character straddling the limit.
	e := decide(texts_result(["12345678👍👍"])) with data.toolgate.settings as limit(10)
	e.result.content[0].text == "12345678\n[truncated by toolgate: 6 bytes over the limit of 10 bytes]"
}

test_service_limit_override if {
	conf := {"max_result_bytes": 65536, "services": {"tracker": {"max_result_bytes": 4}}}
	d := decide(texts_result(["abcdef"])) with data.toolgate.settings as conf
	d.result.content[0].text == "abcd\n[truncated by toolgate: 2 bytes over the limit of 4 bytes]"
	contains(d.reason, "limit of 4 bytes")
}

test_default_limit_without_settings if {
	long := concat("", [s | some _ in numbers.range(1, 6554); s := "0123456789"]) # 65540 bytes
	d := decide(texts_result([long])) with data.toolgate.settings as {}
	endswith(d.result.content[0].text, "\n[truncated by toolgate: 4 bytes over the limit of 65536 bytes]")
	ok := decide(texts_result([substring(long, 0, 65536)])) with data.toolgate.settings as {}
	ok == {"action": "allow"}
}

test_structured_strings_truncated if {
	d := decide({"content": [], "structuredContent": {"log": "abcdefghijkl"}}) with data.toolgate.settings as limit(8)
	d.result.structuredContent.log == "abcdefgh\n[truncated by toolgate: 4 bytes over the limit of 8 bytes]"
}

test_redaction_before_truncation if {
	# The key straddles the limit: it is redacted whole, never cut in half.
	text := concat("", ["0123456789 ", aws_key, " tail"])
	d := decide(texts_result([text])) with data.toolgate.settings as limit(20)
	d.result.content[0].text == "0123456789 [REDACTED\n[truncated by toolgate: 16 bytes over the limit of 20 bytes]"
	not contains(d.result.content[0].text, "AKIA")
	d.reason == "toolgate changed the result: redacted aws_access_key_id; truncated text over the limit of 20 bytes"
}

test_redaction_can_bring_text_under_the_limit if {
	# Over the limit as received, but the marker is shorter than the key.
	d := decide(texts_result([pem])) with data.toolgate.settings as limit(40)
	d.result.content[0].text == "[REDACTED:pem_private_key]"
	not contains(d.reason, "truncated")
}

test_markers_do_not_trigger_truncation if {
	# Under the limit as received; the marker is longer than the key.
	d := decide(texts_result([aws_key])) with data.toolgate.settings as limit(24)
	d.result.content[0].text == "[REDACTED:aws_access_key_id]"
	not contains(d.reason, "truncated")
}

test_huge_text_only_head_cleaned if {
	# Longer than limit + scan margin: only the head is cleaned, the rest is
	# cut, and the note still appears even though the head shrank.
	filler := concat("", [s | some _ in numbers.range(1, 2000); s := "0123456789"])
	text := concat("", ["x\u200by ", pem, filler])
	d := decide(texts_result([text])) with data.toolgate.settings as limit(8)
	d.result.content[0].text == sprintf("xy [REDA\n[truncated by toolgate: %d bytes over the limit of 8 bytes]", [(count(text) + 2) - 8])
	d.reason == "toolgate changed the result: redacted pem_private_key; removed invisible or bidirectional Unicode control characters; truncated text over the limit of 8 bytes"
}

test_huge_text_key_cut_off_by_head_still_redacted if {
	# A private key starting inside the cleaned head but ending beyond it.
	filler := concat("", [s | some _ in numbers.range(1, 2000); s := "0123456789"])
	text := concat("", ["-----BEGIN PRIVATE KEY-----\n", filler, "\n-----END PRIVATE KEY-----"])
	d := decide(texts_result([text])) with data.toolgate.settings as limit(100)
	startswith(d.result.content[0].text, "[REDACTED:pem_private_key]\n[truncated by toolgate:")
}

# --- malformed results fail closed

test_content_not_array_denied if {
	d := decide({"content": {"type": "text", "text": "x"}})
	d.action == "deny"
	contains(d.reason, "content is not an array")
	not d.result
}

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
gateway_scan(r) := {"threshold": 4096, "strings": [e |
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

test_gateway_scan_is_used if {
	# Only what the scan lists is looked at (the gateway found nothing here),
	# and a scan made with a threshold over the limit is not used.
	r := texts_result([aws_key])
	result.decision == {"action": "allow"} with input as object.union(with_result(r), {"scan": {"threshold": 4096, "strings": []}})
	d := result.decision with input as object.union(with_result(r), {"scan": {"threshold": 70000, "strings": []}})
	d.result.content[0].text == "[REDACTED:aws_access_key_id]"
}

test_scan_entries if {
	s := result.scan with input as with_result({"content": [{"type": "text", "text": "é\u200b"}, {"type": "text", "text": concat("", ["a", gh_classic])}]})
	s.threshold == 0
	s.strings == [
		{"path": ["content", 0, "text"], "bytes": 5, "ascii": false, "invisible": true, "markers": false},
		{"path": ["content", 1, "text"], "bytes": 41, "ascii": true, "invisible": false, "markers": true},
	]
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

test_ascii_text_with_a_marker_truncated if {
	# A marker but no secret: cleaned in full, then cut.
	d := decide(texts_result(["Bearer x is fine here"])) with data.toolgate.settings as limit(10)
	d.result.content[0].text == "Bearer x i\n[truncated by toolgate: 11 bytes over the limit of 10 bytes]"
	d.reason == "toolgate changed the result: truncated text over the limit of 10 bytes"
}

test_cut_counts_bytes_after_redaction if {
	# An ASCII text is no longer ASCII once a kind named in Cyrillic is
	# redacted in it: the cut still counts bytes.
	conf := {"max_result_bytes": 25, "redact_patterns": {"ключ": `EMP-[0-9]{6}`}}
	d := decide(texts_result(["id EMP-123456 and a long tail"])) with data.toolgate.settings as conf
	d.result.content[0].text == "id [REDACTED:ключ] an\n[truncated by toolgate: 4 bytes over the limit of 25 bytes]"
}
