package toolgate.secrets_test

import data.toolgate.result

# The corpus of secret shapes: every built-in kind with secrets it must
# redact, and near misses it must leave alone. Secrets are put together
# from pieces so that this file holds no real-looking secret in one piece.
# policies_test.go and the gateway's scan tests read it too.

# positives: [kind, the text as received, the text once redacted].
positives := [
	["aws_access_key_id", concat("", ["AKIA", "IOSFODNN7EXAMPLE"]), "[REDACTED:aws_access_key_id]"],
	["aws_access_key_id", concat("", ["ASIA", "Y34FZKBOKMUTVV7A"]), "[REDACTED:aws_access_key_id]"],
	["aws_secret_access_key", concat("", ["aws_secret_access_key = ", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"]), "aws_secret_access_key = [REDACTED:aws_secret_access_key]"],
	["aws_secret_access_key", concat("", [`"SecretAccessKey": "`, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", `"`]), `"SecretAccessKey": "[REDACTED:aws_secret_access_key]"`],
	["github_token", concat("", ["ghp_", "16C7e42F292c6912E7710c838347Ae178B4a"]), "[REDACTED:github_token]"],
	["github_token", concat("", ["github_pat_", "11ABCDEFG0123456789abc_", "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"]), "[REDACTED:github_token]"],
	["slack_token", concat("", ["xoxb-", "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"]), "[REDACTED:slack_token]"],
	["slack_token", concat("", ["xoxe.xoxp-", "1-Mi0yLTE2NTM0NTQ3NjAtOTc4"]), "[REDACTED:slack_token]"],
	["slack_token", concat("", ["xapp-", "1-A0123BCDE45-6789012345678-abcdef0123456789abcdef"]), "[REDACTED:slack_token]"],
	["slack_webhook", concat("", ["https://hooks.slack.com/services/", "T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"]), "[REDACTED:slack_webhook]"],
	["stripe_key", concat("", ["sk_live_", "4eC39HqLyjWDarjtT1zdp7dc"]), "[REDACTED:stripe_key]"],
	["stripe_key", concat("", ["rk_live_", "51H8xYzAbCdEfGhIjKlMnOp"]), "[REDACTED:stripe_key]"],
	["gcp_api_key", concat("", ["AIza", "SyA-1234567890abcdefghijklmnopqrstu"]), "[REDACTED:gcp_api_key]"],
	["azure_storage_key", concat("", ["DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq", "/K1SZFPTOtr/KBHBeksoGMGw==;EndpointSuffix=core.windows.net"]), "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=[REDACTED:azure_storage_key];EndpointSuffix=core.windows.net"],
	["azure_sas_signature", concat("", ["https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sr=b&sig=", "Xy7%2BabcDEF0123456789ghijKLMNopqr%3D"]), "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sr=b&sig=[REDACTED:azure_sas_signature]"],
	["oauth_token", concat("", [`{"access_token": "`, "ya29.a0AfH6SMBxExampleTokenValue", `", "token_type": "Bearer"}`]), `{"access_token": "[REDACTED:oauth_token]", "token_type": "Bearer"}`],
	["oauth_token", concat("", ["#refresh_token=", "1//0gExampleRefreshTokenValue", "&x=1"]), "#refresh_token=[REDACTED:oauth_token]&x=1"],
	# Labels with the long s (U+017F) and the Kelvin sign (U+212A), which
	# RE2 matches as s and k in any case: their markers are found too.
	["oauth_token", concat("", ["acce\u017fs_token=", "ya29.a0AfH6SMBxExampleTokenValue"]), "acce\u017fs_token=[REDACTED:oauth_token]"],
	["oauth_token", concat("", ["{\"access_to\u212aen\": \"", "ya29.a0AfH6SMBxExampleTokenValue", "\"}"]), "{\"access_to\u212aen\": \"[REDACTED:oauth_token]\"}"],
	["azure_storage_key", concat("", ["Account\u212aey=", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq"]), "Account\u212aey=[REDACTED:azure_storage_key]"],
	["basic_auth", concat("", ["Authorization: Basic ", "dXNlcjpwYXNzd29yZA=="]), "Authorization: [REDACTED:basic_auth]"],
	["bearer_token", concat(" ", ["Bearer", "mF_9.B5f-4.1JqM-opaque-token"]), "[REDACTED:bearer_token]"],
	["bearer_token", concat(" ", ["bEaReR", "abcdefghijklmnop0123=="]), "[REDACTED:bearer_token]"],
	["jwt", concat(".", ["eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", "eyJzdWIiOiIxMjM0NTY3ODkwIn0", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"]), "[REDACTED:jwt]"],
	["pem_private_key", concat("\n", ["-----BEGIN RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi", "-----END RSA PRIVATE KEY-----"]), "[REDACTED:pem_private_key]"],
	["pem_private_key", concat("\n", ["-----BEGIN OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ", "-----END OPENSSH PRIVATE KEY-----"]), "[REDACTED:pem_private_key]"],
	["pgp_private_key", concat("\n", ["-----BEGIN PGP PRIVATE KEY BLOCK-----", "", "lQOYBF0example", "-----END PGP PRIVATE KEY BLOCK-----"]), "[REDACTED:pgp_private_key]"],
	["ssh2_private_key", concat("\n", ["---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----", "Comment: \"key\"", "P2/56wAAA+wAAAA3aWYtbW9kbntzaWdu", "---- END SSH2 ENCRYPTED PRIVATE KEY ----"]), "[REDACTED:ssh2_private_key]"],
	["putty_private_key", concat("\n", ["PuTTY-User-Key-File-3: ssh-ed25519", "Encryption: none", "Private-Lines: 1", "AAAAIExample", "Private-MAC: 0123456789abcdef"]), "[REDACTED:putty_private_key]"],
	["private_key_base64", concat("", ["LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQ", "pNSUlFb3dJQkFBS0NBUUVBM1R6Mm1yN1NaaUFNZlF5dXZCak05T2k="]), "[REDACTED:private_key_base64]"],
	["private_key_base64", concat("", ["LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t", "Ck1JSUV2UUlCQURBTkJna3Foa2lHOXcwQkFRRUZBQVNDQktjd2dnU2pBZ0VBQW9JQkFRQw=="]), "[REDACTED:private_key_base64]"],
]

# contexts: where a secret appears in a text; %s is the secret. Escape
# tails (\n, %3D, \u0022) before a token count as word boundaries.
contexts := [
	"%s",
	"before %s after",
	"line one\n%s\nline two",
	`token\n%s`,
	`{\"value\":\"%s\"}`,
	"key%%3D%s",
	`key\u0022%s`,
	"(%s)",
]

# near_misses must pass unchanged.
near_misses := [
	"AKIA is a prefix",
	"AKIAIOSFODNN7EXAMPL",
	concat("", ["x", "AKIA", "IOSFODNN7EXAMPLE"]), # part of a longer word
	"ghp_short",
	"xoxb-short",
	"Bearer token",
	"the bearer of bad news",
	"eyJhbGciOiJIUzI1NiJ9 is one part only",
	"-----BEGIN PUBLIC KEY-----\nMIIBIjAN\n-----END PUBLIC KEY-----",
	"-----BEGIN CERTIFICATE-----\nMIIBIjAN\n-----END CERTIFICATE-----",
	"sk_live_short",
	"AIzaShort",
	"sig=abc",
	"AccountKey=short",
	"hooks.slack.com is where webhooks go",
	"the access_token field holds a token",
	"commit 3f786850e387550fdab836ed7e6dc881de23001b",
	"secret_access_key is not set",
	"Authorization: see the docs",
	"RFC 6750 describes Bearer tokens.",
]

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

decide(r) := d if {
	d := result.decision with input as object.union(base, {"result": r}) with data.toolgate.settings as {}
}

text_result(t) := {"content": [{"type": "text", "text": t}]}

test_corpus_covers_every_kind if {
	{p[0] | some p in positives} == object.keys(result.secret_patterns)
	{k | some k in result.secret_kinds} == object.keys(result.secret_patterns)
	count(result.secret_kinds) == count(result.secret_patterns)
}

test_every_shape_redacted_in_every_context if {
	every p in positives {
		[kind, secret, redacted] := p
		every c in contexts {
			d := decide(text_result(sprintf(c, [secret])))
			d.action == "allow"
			d.result.content[0].text == sprintf(c, [redacted])
			contains(d.reason, kind)
		}
	}
}

test_every_shape_redacted_everywhere if {
	# In structured content, _meta, annotations, a resource link, an object
	# key and a resource blob alike.
	every p in positives {
		[_, secret, redacted] := p
		r := {
			"content": [
				{"type": "text", "text": "see below", "annotations": {"note": secret}},
				{"type": "resource_link", "uri": "file:///x", "name": "x", "description": secret},
				{"type": "resource", "resource": {"uri": "file:///b", "blob": base64.encode(secret)}},
			],
			"structuredContent": {"v": [secret], secret: 1},
			"_meta": {"trace": secret},
		}
		d := decide(r)
		d.result.content[0].annotations.note == redacted
		d.result.content[1].description == redacted
		base64.decode(d.result.content[2].resource.blob) == redacted
		d.result.structuredContent == {"v": [redacted], redacted: 1}
		d.result._meta.trace == redacted
	}
}

test_every_shape_has_a_marker if {
	# The quick pass (and the gateway's) notices every shape.
	every p in positives {
		s := result.scan with input as object.union(base, {"result": text_result(p[1])})
		s.strings[_].markers
	}
}

test_near_misses_pass_unchanged if {
	every t in near_misses {
		decide(text_result(t)) == {"action": "allow"}
	}
}

test_longer_match_never_loses_to_a_shorter_one if {
	# Redaction by position: a shorter secret elsewhere in the text does
	# not leave the tail of a longer one behind.
	short := concat("", ["Bearer ", "abcdefghijklmnop"])
	long := concat("", ["Bearer ", "abcdefghijklmnopSECRETtail0123"])
	d := decide(text_result(concat(" and ", [short, long])))
	d.result.content[0].text == "[REDACTED:bearer_token] and [REDACTED:bearer_token]"
}

test_text_and_structured_twin_redacted_alike if {
	secret := concat("", ["ghp_", "16C7e42F292c6912E7710c838347Ae178B4a"])
	r := {"content": [{"type": "text", "text": concat("", [`{"log":"token\n`, secret, `"}`])}], "structuredContent": {"log": concat("", ["token\n", secret])}}
	d := decide(r)
	d.result.content[0].text == `{"log":"token\n[REDACTED:github_token]"}`
	d.result.structuredContent.log == "token\n[REDACTED:github_token]"
}

texts_result(ts) := {"content": [{"type": "text", "text": t} | some t in ts]}

test_secret_after_a_cut_item_is_redacted if {
	# The first item is cut to fit the limit, which drops the label; the
	# secret's part in the next item is redacted all the same.
	long := concat("", [concat("", ["x" | some _ in numbers.range(1, 70000)]), " Authorization: Bearer "])
	d := decide(texts_result([long, "tok9Kp4Vx2Qm7Ws3Zn8Lr5TabcdEFGH done"]))
	d.action == "allow"
	d.result.content[1].text == "[REDACTED:bearer_token] done"
	contains(d.result.content[0].text, "[truncated by toolgate")
}

test_private_key_across_three_text_items_is_withheld if {
	body := concat("", ["MIIEowIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi" | some _ in numbers.range(1, 60)])
	d := decide(texts_result([
		concat("\n", ["chunk 1", "-----BEGIN RSA PRIVATE KEY-----", body]),
		body,
		concat("\n", [body, "-----END RSA PRIVATE KEY-----", "chunk 3"]),
	]))
	d.action == "deny"
	contains(d.reason, "private key runs from content[0] to content[2]")

	# Cut off after its BEGIN line, the body running on in the next item;
	# or its END line after an item of body.
	cut := decide(texts_result([concat("\n", ["-----BEGIN RSA PRIVATE KEY-----", body]), body]))
	cut.action == "deny"
	contains(cut.reason, "private key runs from content[0] into content[1]")
	ends := decide(texts_result(["log", body, concat("\n", [body, "-----END RSA PRIVATE KEY-----"])]))
	ends.action == "deny"
	contains(ends.reason, "private key runs from content[1] into content[2]")

	# Whole keys in separate items, with text between them, are redacted.
	whole := concat("\n", ["-----BEGIN RSA PRIVATE KEY-----", body, "-----END RSA PRIVATE KEY-----"])
	ok := decide(texts_result([whole, "between", whole]))
	ok.action == "allow"
	ok.result.content[2].text == "[REDACTED:pem_private_key]"
}

test_secret_split_across_text_items if {
	every p in positives {
		[_, secret, redacted] := p
		n := count(secret)
		every at in [1, floor(n / 2), n - 1] {
			left := concat("", ["value: ", substring(secret, 0, at)])
			right := concat("", [substring(secret, at, n - at), " end"])
			d := decide({"content": [{"type": "text", "text": left}, {"type": "text", "text": right}]})
			concat("", [d.result.content[0].text, d.result.content[1].text]) == concat("", ["value: ", redacted, " end"])
		}
	}
}

# --- long texts, matched near their markers

# fillers: long texts around the secrets: prose, compact JSON (no blanks at
# all), and a run of token characters longer than a window may end in.
fillers := [
	concat("", [s | some i in numbers.range(1, 40); s := sprintf("line %d of the log, nothing to see.\n", [i])]),
	concat("", [s | some i in numbers.range(1, 60); s := sprintf(`{"id":%d,"state":"open"},`, [i])]),
	concat("", [s | some _ in numbers.range(1, 60); s := "abcdefghij0123456789"]),
]

test_windows_find_what_the_whole_text_holds if {
	every p in positives {
		secret := p[1]
		every f in fillers {
			every t in [
				concat("", [secret, f]),
				concat("", [f, secret, " ", f]),
				concat("", [f, secret]),
				concat("", [f, secret, " ", substring(f, 0, 560), secret, " ", f]),
				concat("", [f, secret, substring(f, 0, 10), secret, f]),
			] {
				result.redact(t) == result.redact_whole(t)
			}
		}
	}
}

test_windows_are_used if {
	t := concat("", [fillers[0], positives[0][1], " ", fillers[0], positives[0][1], fillers[1]])
	ws := result.windows_in(t, count(t))
	count(ws) == 2
	result.redact(t).text == concat("", [fillers[0], "[REDACTED:aws_access_key_id] ", fillers[0], "[REDACTED:aws_access_key_id]", fillers[1]])
}

test_near_misses_in_long_texts if {
	every m in near_misses {
		every f in fillers {
			t := concat(" ", [f, m, f])
			result.redact(t) == {"text": t, "kinds": set()}
		}
	}
}

test_blanks_in_patterns_are_bounded if {
	# Blanks between a field name and its value (aligned configuration
	# files) count up to 64; the window after a marker holds them all.
	key := "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	t := concat("", [fillers[0], "secret_accesskey", concat("", [" " | some _ in numbers.range(1, 64)]), "= ", key, "\n", fillers[0]])
	result.redact(t).text == concat("", [fillers[0], "secret_accesskey", concat("", [" " | some _ in numbers.range(1, 64)]), "= [REDACTED:aws_secret_access_key]\n", fillers[0]])
	result.redact(t) == result.redact_whole(t)
}
