package toolgate.channels_test

import data.toolgate.result

# The defaults on every channel an upstream sends on (input.channel), not
# only tools/call results.

base := {
	"caller": {"user": "alice@example.com", "groups": ["eng"], "claims": {}},
	"session": {"id": "sess-1", "services": ["tracker"]},
	"service": {"id": "tracker", "auth": "oauth", "tools": ["read_ticket"]},
	"listing": false,
	"request": {"remote_ip": "127.0.0.1", "protocol_version": "2025-11-25"},
	"time": "2026-11-29T12:00:00Z",
}

on(channel, method, payload) := object.union(base, {"channel": channel, "method": method, "result": payload})

decide(channel, method, payload) := d if {
	d := result.decision with input as on(channel, method, payload)
}

aws_key := concat("", ["AKIA", "IOSFODNN7EXAMPLE"])

github := concat("", ["ghp_", "16C7e42F292c6912E7710c838347Ae178B4a"])

# A zero-width space, then "ignore" in Unicode tag characters: shown as
# nothing, read by a model.
hidden := "\u200b\uDB40\uDC69\uDB40\uDC67\uDB40\uDC6E\uDB40\uDC6F\uDB40\uDC72\uDB40\uDC65"

b64(s) := base64.encode(s)

# --- notifications

test_clean_notification_is_allowed_as_is if {
	decide("notification", "notifications/progress", {"progressToken": 1, "progress": 2, "total": 3, "message": "step 2"}) == {"action": "allow"}
}

test_log_message_is_redacted_and_stripped if {
	d := decide("notification", "notifications/message", {"level": "info", "logger": "db", "data": {"line": concat("", ["connected with ", aws_key, hidden])}})
	d.action == "allow"
	d.result.data.line == "connected with [REDACTED:aws_access_key_id]"
	d.result.level == "info"
	contains(d.reason, "toolgate changed the upstream message")
}

test_resource_update_uri_is_inspected if {
	d := decide("notification", "notifications/resources/updated", {"uri": concat("", ["test://x?token=", github])})
	d.result.uri == "test://x?token=[REDACTED:github_token]"
}

test_notifications_are_cut_to_the_result_limit if {
	d := decide("notification", "notifications/message", {"level": "info", "data": concat("", [concat("", ["x" | some _ in numbers.range(1, 70000)])])})
	endswith(d.result.data, "; an upstream message may hold 65536 bytes of text]")
}

# --- errors

test_error_message_and_data_are_inspected if {
	d := decide("error", "resources/read", {"code": -32002, "message": concat(" ", ["not found:", aws_key]), "data": {"hint": concat("", ["use ", github, hidden])}})
	d.action == "allow"
	d.result == {"code": -32002, "message": "not found: [REDACTED:aws_access_key_id]", "data": {"hint": "use [REDACTED:github_token]"}}
}

# --- server→client requests

test_sampling_messages_are_inspected_but_not_their_images if {
	d := decide("server_request", "sampling/createMessage", {
		"messages": [
			{"role": "user", "content": {"type": "text", "text": concat("", ["summarize ", aws_key])}},
			{"role": "user", "content": [
				{"type": "image", "data": b64(aws_key), "mimeType": "image/png"},
				{"type": "text", "text": concat("", ["and", hidden])},
			]},
		],
		"systemPrompt": concat("", ["be brief", hidden]),
		"maxTokens": 100,
	})
	d.result.messages[0].content.text == "summarize [REDACTED:aws_access_key_id]"
	d.result.messages[1].content[0].data == b64(aws_key)
	d.result.messages[1].content[1].text == "and"
	d.result.systemPrompt == "be brief"
}

test_elicitation_message_and_schema_are_inspected if {
	d := decide("server_request", "elicitation/create", {
		"message": concat("", ["Paste your token", hidden]),
		"requestedSchema": {"type": "object", "properties": {"token": {"type": "string", "description": concat(" ", ["e.g.", github])}}},
	})
	d.result.message == "Paste your token"
	d.result.requestedSchema.properties.token.description == "e.g. [REDACTED:github_token]"
}

test_image_data_is_binary_only_in_blocks if {
	# Outside content blocks a "data" member is text like any other.
	d := decide("server_request", "sampling/createMessage", {"messages": [], "metadata": {"type": "image", "data": aws_key}})
	d.result.metadata.data == "[REDACTED:aws_access_key_id]"
}

# A tool_result block of a sampling message holds blocks of its own: their
# blobs are decoded and inspected, their images are binary, in a
# sampling/createMessage request and in those of an input_required result.
tool_result_block(blocks) := {"type": "tool_result", "toolUseId": "t1", "content": blocks}

test_blocks_of_a_sampling_tool_result_are_blocks if {
	blocks := [
		{"type": "resource", "resource": {"uri": "file:///a", "mimeType": "text/plain", "blob": b64(concat(" ", ["key", aws_key]))}},
		{"type": "image", "data": b64(aws_key), "mimeType": "image/png"},
		{"type": "text", "text": concat("", ["ok", hidden])},
	]
	d := decide("server_request", "sampling/createMessage", {"messages": [{"role": "user", "content": tool_result_block(blocks)}], "maxTokens": 5})
	d.action == "allow"
	base64.decode(d.result.messages[0].content.content[0].resource.blob) == "key [REDACTED:aws_access_key_id]"
	d.result.messages[0].content.content[1].data == b64(aws_key)
	d.result.messages[0].content.content[2].text == "ok"
	a := decide("server_request", "sampling/createMessage", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, tool_result_block(blocks)]}]})
	base64.decode(a.result.messages[0].content[1].content[0].resource.blob) == "key [REDACTED:aws_access_key_id]"
	a.result.messages[0].content[1].content[1].data == b64(aws_key)
	e := decide("result", "tools/call", {"content": [{"type": "text", "text": "x"}], "resultType": "input_required", "inputRequests": {"s": {
		"method": "sampling/createMessage",
		"params": {"messages": [{"role": "user", "content": [tool_result_block(blocks)]}], "maxTokens": 5},
	}}})
	base64.decode(e.result.inputRequests.s.params.messages[0].content[0].content[0].resource.blob) == "key [REDACTED:aws_access_key_id]"
	e.result.inputRequests.s.params.messages[0].content[0].content[1].data == b64(aws_key)
}

test_blobs_of_a_sampling_tool_result_are_read_as_any_blob if {
	d := decide("server_request", "sampling/createMessage", {"messages": [{"role": "user", "content": [tool_result_block([
		{"type": "resource", "resource": {"uri": "file:///a", "mimeType": "text/plain; charset=utf-16le", "blob": utf16_secret}},
	])]}]})
	d.action == "deny"
	contains(d.reason, "a blob of text at messages[0].content[0].content[0].resource.blob whose mimeType names a charset other than UTF-8")
	e := decide("server_request", "sampling/createMessage", {"messages": [{"role": "user", "content": tool_result_block([
		{"type": "resource", "resource": {"uri": "file:///a", "blob": "not base64!"}},
	])}]})
	e.action == "deny"
	contains(e.reason, "a blob at messages[0].content.content[0].resource.blob that is not base64")
}

# Only a tool_result block's content is blocks: another block's is text.
test_content_of_other_sampling_blocks_is_text if {
	d := decide("server_request", "sampling/createMessage", {"messages": [{"role": "user", "content": [
		{"type": "tool_use", "id": "t1", "name": "read", "input": {}, "content": [{"type": "image", "data": aws_key}]},
	]}]})
	d.result.messages[0].content[0].content[0].data == "[REDACTED:aws_access_key_id]"
}

# --- results of other methods

test_resource_contents_text_and_blob_are_inspected if {
	d := decide("result", "resources/read", {"contents": [
		{"uri": "file:///a", "mimeType": "text/plain", "text": concat("", ["key=", aws_key])},
		{"uri": "file:///b", "mimeType": "application/octet-stream", "blob": b64(concat("", ["token: ", github]))},
		{"uri": "file:///c", "blob": b64("plain bytes")},
	]})
	d.result.contents[0].text == "key=[REDACTED:aws_access_key_id]"
	base64.decode(d.result.contents[1].blob) == "token: [REDACTED:github_token]"
	d.result.contents[2].blob == b64("plain bytes")
}

test_text_blobs_lose_invisible_characters_and_are_bounded if {
	# Text is valid UTF-8 in a blob without a mimeType or with one of text;
	# the bytes of other blobs are binary data, even valid UTF-8.
	spoof := concat("", ["invoice.", "\u202e", "fdp.exe"])
	d := decide("result", "resources/read", {"contents": [
		{"uri": "file:///a.txt", "mimeType": "text/plain", "blob": b64(spoof)},
		{"uri": "file:///b", "blob": b64(spoof)},
		{"uri": "file:///c.json", "mimeType": "application/json", "blob": b64(spoof)},
		{"uri": "file:///d.png", "mimeType": "image/png", "blob": b64(spoof)},
		{"uri": "file:///e.pb", "mimeType": "application/x-protobuf", "blob": b64(spoof)},
	]})
	base64.decode(d.result.contents[0].blob) == "invoice.fdp.exe"
	base64.decode(d.result.contents[1].blob) == "invoice.fdp.exe"
	base64.decode(d.result.contents[2].blob) == "invoice.fdp.exe"
	d.result.contents[3].blob == b64(spoof) # bytes of binary data
	d.result.contents[4].blob == b64(spoof)
	contains(d.reason, "removed invisible")

	# Blobs of text count together against the limit, and are withheld
	# over it rather than cut.
	part := concat("", ["x" | some _ in numbers.range(1, 20000)])
	blobs := [{"uri": sprintf("file:///%d.txt", [i]), "mimeType": "text/plain", "blob": b64(part)} | some i in numbers.range(1, 4)]
	w := decide("result", "resources/read", {"contents": blobs})
	w.action == "deny"
	contains(w.reason, "80000 bytes of text in blobs")
	decide("result", "resources/read", {"contents": array.slice(blobs, 0, 3)}) == {"action": "allow"}
	images := [{"uri": b.uri, "mimeType": "image/png", "blob": b.blob} | some b in blobs]
	decide("result", "resources/read", {"contents": images}) == {"action": "allow"}
}

# A mimeType of null is none (Go's, Python's and JavaScript's decoders read
# it so): the blob is text when it is UTF-8, and loses its invisible
# characters. Any other mimeType that is not a string withholds the blob:
# a runner may read it as text or not.
test_blob_with_null_mime_type_is_text if {
	spoof := concat("", ["invoice.", "\u202e", "fdp.exe", hidden])
	d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": null, "blob": b64(spoof)}]})
	base64.decode(d.result.contents[0].blob) == "invoice.fdp.exe"
	d.result.contents[0].mimeType == null
	e := decide("result", "tools/call", {"content": [{"type": "resource", "resource": {"uri": "file:///a", "mimeType": null, "blob": b64(spoof)}}]})
	base64.decode(e.result.content[0].resource.blob) == "invoice.fdp.exe"
}

test_blob_with_mime_type_not_a_string_is_withheld if {
	every mime in [0, ["text/plain"], {"type": "text/plain"}, true, false] {
		d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": mime, "blob": b64("plain")}]})
		d.action == "deny"
		contains(d.reason, "a blob at contents[0].blob whose mimeType is not a string")
		e := decide("result", "tools/call", {"content": [{"type": "resource", "resource": {"uri": "file:///a", "mimeType": mime, "blob": b64("plain")}}]})
		e.action == "deny"
		contains(e.reason, "a blob at content[0].resource.blob whose mimeType is not a string")
	}
}

# Text in another charset than UTF-8 decodes, in a runner that honours the
# label, to text toolgate never saw (a secret in UTF-16 holds no marker in
# its bytes); a blob labelled text whose bytes are not UTF-8 may be read in
# some charset too. Both are withheld, with a reason that quotes nothing of
# the upstream's.
utf16_secret := "awBlAHkAIABBAEsASQBBAEkATwBTAEYATwBEAE4ATgA3AEUAWABBAE0AUABMAEUACgA="

utf16_bom_secret := "//5rAGUAeQAgAEEASwBJAEEASQBPAFMARgBPAEQATgBOADcARQBYAEEATQBQAEwARQAKAA=="

test_blob_of_text_in_another_charset_is_withheld if {
	every mime in [
		"text/plain; charset=utf-16le", `text/plain; Charset="UTF-16"`, "application/json;charset=latin1",
		"text/plain; format=flowed; charset=utf-16", "text/csv; charset", "; charset=utf-16", "text/plain; charset=utf-8; charset=utf-16",
	] {
		d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": mime, "blob": utf16_secret}]})
		d.action == "deny"
		contains(d.reason, "a blob of text at contents[0].blob whose mimeType names a charset other than UTF-8")
		not contains(d.reason, "utf-16")
	}
}

test_blob_of_text_in_utf8_or_ascii_is_text if {
	every mime in ["text/plain; charset=UTF-8", `text/plain; charset="us-ascii"`, "application/json; charset=utf8", "text/plain;charset = ascii"] {
		d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": mime, "blob": b64(concat("", ["a", hidden]))}]})
		base64.decode(d.result.contents[0].blob) == "a"
	}
}

test_blob_of_binary_data_with_a_charset_is_binary if {
	decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": "image/png; charset=utf-16", "blob": utf16_secret}]}) == {"action": "allow"}
}

test_blob_labelled_text_that_is_not_utf8_is_withheld if {
	every mime in ["text/plain", "application/json", "TEXT/markdown; charset=utf-8"] {
		d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": mime, "blob": utf16_bom_secret}]})
		d.action == "deny"
		contains(d.reason, "a blob at contents[0].blob whose mimeType is of text but whose bytes are not UTF-8")
		e := decide("result", "tools/call", {"content": [{"type": "resource", "resource": {"uri": "file:///a", "mimeType": mime, "blob": utf16_bom_secret}}]})
		e.action == "deny"
	}
}

# FF 6B 00 65 00 79 00: not UTF-8, and no byte-order mark.
not_utf8 := "/2sAZQB5AA=="

test_blob_without_mime_type_that_is_not_utf8_is_binary if {
	every mime in [null, "", " "] {
		decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": mime, "blob": not_utf8}]}) == {"action": "allow"}
		decide("result", "resources/read", {"contents": [{"uri": "file:///a", "blob": not_utf8}]}) == {"action": "allow"}
	}
}

# A blob without a mimeType whose bytes open with a byte-order mark of
# UTF-16 or UTF-32 is text to a runner that sniffs the mark (WHATWG
# decoding, Python's codecs): withheld, with a reason that quotes nothing
# of the upstream's. With a mimeType of binary data it is binary.
bom_secrets := [
	utf16_bom_secret, # FF FE, UTF-16LE
	"/v8AawBlAHkAIABBAEsASQBBAEkATwBTAEYATwBEAE4ATgA3AEUAWABBAE0AUABMAEUACg==", # FE FF, UTF-16BE
	"//4AAGsAAABlAAAAeQAAACAAAABBAAAASwAAAEkAAABBAAAASQAAAE8AAABTAAAARgAAAE8AAABEAAAATgAAAE4AAAA3AAAARQAAAFgAAABBAAAATQAAAFAAAABMAAAARQAAAAoAAAA=", # FF FE 00 00, UTF-32LE
	"AAD+/wAAAGsAAABlAAAAeQAAACAAAABBAAAASwAAAEkAAABBAAAASQAAAE8AAABTAAAARgAAAE8AAABEAAAATgAAAE4AAAA3AAAARQAAAFgAAABBAAAATQAAAFAAAABMAAAARQAAAAo=", # 00 00 FE FF, UTF-32BE
]

test_blob_without_mime_type_with_a_byte_order_mark_is_withheld if {
	every blob in bom_secrets {
		every mime in [null, "", " ", "; x=y"] {
			d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": mime, "blob": blob}]})
			d.action == "deny"
			contains(d.reason, "a blob at contents[0].blob without a mimeType whose bytes open with a UTF-16 or UTF-32 byte-order mark")
			not contains(d.reason, "AKIA")
		}
		e := decide("result", "tools/call", {"content": [{"type": "resource", "resource": {"uri": "file:///a", "blob": blob}}]})
		e.action == "deny"
		contains(e.reason, "a blob at content[0].resource.blob without a mimeType")
		decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": "image/png", "blob": blob}]}) == {"action": "allow"}
	}
}

# A member beside a blob that is mimeType in another case is read by
# runners whose decoders ignore case (Go's encoding/json), not by toolgate:
# withheld, with a reason that quotes neither the member nor its value.
test_blob_beside_mime_type_in_another_case_is_withheld if {
	every key in ["MimeType", "mimetype", "MIMETYPE", "mime\u200bType"] {
		d := decide("result", "resources/read", {"contents": [{"uri": "file:///a", key: "text/plain; charset=utf-16le", "blob": utf16_secret}]})
		d.action == "deny"
		contains(d.reason, "a blob at contents[0].blob beside a member that is mimeType spelled in another case")
		not contains(d.reason, key)
		not contains(d.reason, "utf-16")
		e := decide("result", "tools/call", {"content": [{"type": "resource", "resource": {"uri": "file:///a", "mimeType": "text/plain", key: "text/plain; charset=utf-16le", "blob": b64("plain")}}]})
		e.action == "deny"
		contains(e.reason, "a blob at content[0].resource.blob beside a member that is mimeType spelled in another case")
	}
	decide("result", "resources/read", {"contents": [{"uri": "file:///a", "mimeType": "text/plain", "blob": b64("plain"), "Note": "x"}]}) == {"action": "allow"}
}

# A limit smaller than the blobs the gateway's scan calls clean
# (long_blob) still holds for blobs of text.
test_blobs_of_text_are_held_to_a_limit_below_long_blob if {
	part := concat("", ["x" | some _ in numbers.range(1, 3000)])
	blobs := [{"uri": "file:///a.txt", "mimeType": "text/plain", "blob": b64(part)}]
	w := decide("result", "resources/read", {"contents": blobs}) with data.toolgate.settings.max_result_bytes as 1000
	w.action == "deny"
	contains(w.reason, "3000 bytes of text in blobs")
	decide("result", "resources/read", {"contents": blobs}) == {"action": "allow"}
}

test_resource_blob_that_is_not_base64_is_withheld if {
	d := decide("result", "resources/read", {"contents": [{"uri": "file:///b", "blob": concat("", [aws_key, "!"])}]})
	d.action == "deny"
	contains(d.reason, "not base64")
}

test_clean_resource_contents_are_allowed_as_is if {
	decide("result", "resources/read", {"contents": [{"uri": "file:///a", "text": "hello"}, {"uri": "file:///b", "blob": b64("bytes")}]}) == {"action": "allow"}
}

test_prompt_messages_are_inspected if {
	d := decide("result", "prompts/get", {"description": concat("", ["review", hidden]), "messages": [
		{"role": "user", "content": {"type": "text", "text": concat("", ["use ", github])}},
		{"role": "user", "content": {"type": "image", "data": b64(aws_key), "mimeType": "image/png"}},
		{"role": "user", "content": {"type": "resource", "resource": {"uri": "file:///k", "blob": b64(aws_key)}}},
	]})
	d.result.description == "review"
	d.result.messages[0].content.text == "use [REDACTED:github_token]"
	d.result.messages[1].content.data == b64(aws_key)
	base64.decode(d.result.messages[2].content.resource.blob) == "[REDACTED:aws_access_key_id]"
}

test_tool_definitions_are_inspected if {
	d := decide("result", "tools/list", {"tools": [{
		"name": "read_ticket",
		"description": concat("", ["Reads a ticket.", hidden]),
		"inputSchema": {"type": "object", "properties": {"id": {"type": "string", "description": concat(" ", ["default", aws_key])}}},
	}]})
	d.result.tools[0].description == "Reads a ticket."
	d.result.tools[0].inputSchema.properties.id.description == "default [REDACTED:aws_access_key_id]"
}

test_listings_have_their_own_limit if {
	long := concat("", ["d" | some _ in numbers.range(1, 100000)])
	decide("result", "tools/list", {"tools": [{"name": "t", "description": long}]}) == {"action": "allow"}
	d := result.decision with input as on("result", "tools/list", {"tools": [{"name": "t", "description": long}]})
		with data.toolgate.settings as {"max_listing_bytes": 50000}
	endswith(d.result.tools[0].description, "; an upstream message may hold 50000 bytes of text]")
}

test_a_listing_limit_per_service if {
	long := concat("", ["d" | some _ in numbers.range(1, 1000)])
	d := result.decision with input as on("result", "prompts/list", {"prompts": [{"name": "p", "description": long}]})
		with data.toolgate.settings as {"max_listing_bytes": 5000, "services": {"tracker": {"max_listing_bytes": 500}}}
	contains(d.result.prompts[0].description, "may hold 500 bytes of text]")
}

test_other_results_need_no_content if {
	decide("result", "completion/complete", {"completion": {"values": ["a", "b"], "hasMore": false}}) == {"action": "allow"}
	d := decide("result", "completion/complete", {"completion": {"values": [aws_key]}})
	d.result.completion.values == ["[REDACTED:aws_access_key_id]"]
}

test_server_instructions_are_inspected if {
	d := decide("result", "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "s", "version": "1"}, "instructions": concat("", ["Be helpful.", hidden])})
	d.result.instructions == "Be helpful."
	d.result.protocolVersion == "2025-11-25"
}

# --- tasks

test_a_created_task_is_not_a_tool_result if {
	task := {"task": {"taskId": "t1", "status": "working", "statusMessage": concat(" ", ["started with", aws_key]), "createdAt": "2026-11-29T12:00:00Z"}}
	d := result.decision with input as object.union(on("task", "tools/call", task), {"task": {"id": "t1"}, "tool": {"name": "build"}, "arguments": {}})
	d.action == "allow"
	d.result.task.statusMessage == "started with [REDACTED:aws_access_key_id]"
}

test_a_deferred_tool_result_is_a_tool_result if {
	# tasks/result: the task's tools/call result, decided like a direct one.
	d := deferred({"content": [{"type": "text", "text": concat(" ", ["built with", aws_key])}]})
	d.result.content[0].text == "built with [REDACTED:aws_access_key_id]"
	deferred({"task": {"taskId": "t1"}}).action == "deny"
	deferred({"content": [{"type": "html", "text": "x"}]}).action == "deny"
}

deferred(payload) := d if {
	d := result.decision with input as object.union(on("result", "tools/call", payload), {"task": {"id": "t1"}, "tool": {"name": "build"}, "arguments": {}})
}

test_review_results_asks_only_for_tool_results if {
	settings := {"services": {"tracker": {"review_results": true}}}
	d := result.decision with input as on("result", "tools/call", {"content": []}) with data.toolgate.settings as settings
	d.action == "ask"
	deferred := result.decision with input as object.union(on("result", "tools/call", {"content": []}), {"task": {"id": "t1"}})
		with data.toolgate.settings as settings
	deferred.action == "ask"
	result.decision with input as on("notification", "notifications/progress", {"progress": 1}) with data.toolgate.settings as settings == {"action": "allow"}
	result.decision with input as on("result", "resources/read", {"contents": []}) with data.toolgate.settings as settings == {"action": "allow"}
}

# --- input_required results (2026-07-28)

test_an_input_required_result_is_inspected_like_server_requests if {
	r := {
		"resultType": "input_required",
		"inputRequests": {
			"s": {"method": "sampling/createMessage", "params": {"maxTokens": 5, "messages": [
				{"role": "user", "content": {"type": "image", "data": b64(aws_key), "mimeType": "image/png"}},
				{"role": "user", "content": [{"type": "text", "text": concat(" ", ["summarize", aws_key])}]},
			]}},
			"e": {"method": "elicitation/create", "params": {"message": concat("", ["Paste it", hidden]), "requestedSchema": {"type": "object"}}},
		},
		"requestState": "opaque",
	}
	d := decide("result", "tools/call", r)
	d.action == "allow" # not a tool result: no content needed
	d.result.inputRequests.s.params.messages[0].content.data == b64(aws_key)
	d.result.inputRequests.s.params.messages[1].content[0].text == "summarize [REDACTED:aws_access_key_id]"
	d.result.inputRequests.e.params.message == "Paste it"
	decide("result", "prompts/get", object.union(r, {"inputRequests": {}})).action == "allow"
}

test_what_else_an_input_required_result_holds_is_its_methods_result if {
	# A runner of an earlier revision ignores resultType and reads the rest
	# as the answer: content items of unknown type are withheld, blobs
	# decoded and redacted, as in any tool result or resource contents.
	ask := {"resultType": "input_required", "inputRequests": {}}
	d := decide("result", "tools/call", object.union(ask, {"content": [{"type": "html", "html": "<b>x</b>"}]}))
	d.action == "deny"
	contains(d.reason, "not a content item of a type toolgate inspects")
	blob := {"uri": "file:///k", "blob": b64(concat(" ", ["key", aws_key]))}
	t := decide("result", "tools/call", object.union(ask, {"content": [{"type": "resource", "resource": blob}]}))
	base64.decode(t.result.content[0].resource.blob) == "key [REDACTED:aws_access_key_id]"
	r := decide("result", "resources/read", object.union(ask, {"contents": [blob]}))
	base64.decode(r.result.contents[0].blob) == "key [REDACTED:aws_access_key_id]"
}

test_review_results_does_not_ask_about_input_requests if {
	r := {"resultType": "input_required", "inputRequests": {"e": {"method": "elicitation/create", "params": {"message": "ok"}}}}
	result.decision with input as on("result", "tools/call", r) with data.toolgate.settings as {"services": {"tracker": {"review_results": true}}} == {"action": "allow"}
}

# --- the gateway's scan decides the same

test_scan_clean_decides_other_channels_alone if {
	scan := {"clean": true, "threshold": 4096, "bytes": 20, "key_bytes": 12, "strings": [], "seams": []}
	d := result.decision with input as object.union(on("notification", "notifications/message", {"level": "info", "data": "hi"}), {"scan": scan})
	d == {"action": "allow"}
}
