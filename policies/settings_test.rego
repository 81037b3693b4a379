package toolgate.config_test

import data.toolgate.config

test_shipped_settings_are_valid if {
	count(config.errors) == 0
}

test_no_settings_at_all_is_valid if {
	count(config.errors) == 0 with data.toolgate.settings as {}
}

test_full_settings_are_valid if {
	count(config.errors) == 0 with data.toolgate.settings as {
		"admin_groups": ["admins"],
		"max_result_bytes": 65536,
		"redact_patterns": {"employee_id": `\bEMP-[0-9]{6}\b`},
		"services": {
			"billing": {"read_only": true},
			"tracker": {
				"admin_groups": ["tracker-admins"],
				"allow_without_approval": ["update_ticket"],
				"pin_arguments": {"create_ticket": {"project": "SEC"}},
				"max_result_bytes": 262144,
				"max_listing_bytes": 2097152,
				"review_results": false,
			},
		},
	}
}

test_wrong_types_name_their_key if {
	every c in [
		[{"max_result_bytes": "2000"}, `settings.max_result_bytes: "2000" is not a whole number of bytes`],
		[{"max_result_bytes": 0}, "settings.max_result_bytes: 0 is not"],
		[{"max_result_bytes": 1.5}, "settings.max_result_bytes: 1.5 is not"],
		[{"admin_groups": "admins"}, `settings.admin_groups: "admins" is not an array of non-empty strings`],
		[{"admin_groups": ["admins", ""]}, "settings.admin_groups:"],
		[{"redact_patterns": {"x": "("}}, "settings.redact_patterns:"],
		[{"redact_patterns": ["x"]}, "settings.redact_patterns:"],
		[{"services": []}, "settings.services: [] is not an object"],
		[{"services": {"tracker": true}}, "settings.services.tracker: true is not an object of settings"],
		[{"services": {"tracker": {"read_only": "yes"}}}, `settings.services.tracker.read_only: "yes" is not true or false`],
		[{"services": {"tracker": {"review_results": 1}}}, "settings.services.tracker.review_results: 1 is not true or false"],
		[{"services": {"tracker": {"max_result_bytes": "2000"}}}, "settings.services.tracker.max_result_bytes:"],
		[{"max_listing_bytes": -1}, "settings.max_listing_bytes: -1 is not"],
		[{"services": {"tracker": {"max_listing_bytes": true}}}, "settings.services.tracker.max_listing_bytes: true is not"],
		[{"services": {"tracker": {"allow_without_approval": "update_ticket"}}}, "settings.services.tracker.allow_without_approval:"],
		[{"services": {"tracker": {"pin_arguments": {"create_ticket": "SEC"}}}}, "settings.services.tracker.pin_arguments:"],
		[{"max_result_byte": 2000}, "settings.max_result_byte: unknown setting (known: admin_groups, max_listing_bytes, max_result_bytes, redact_patterns, services)"],
		[{"services": {"tracker": {"readonly": true}}}, "settings.services.tracker.readonly: unknown setting"],
	] {
		[s, want] := c
		errs := config.errors with data.toolgate.settings as s
		count(errs) == 1
		some e in errs
		startswith(e, want)
	}
	config.errors == {"settings: must be an object"} with data.toolgate.settings as [1]
}

test_own_settings_can_be_declared if {
	s := {"ticket_prefixes": ["SEC"], "services": {"tracker": {"reviewers": ["secops"]}}}
	count(config.errors) == 2 with data.toolgate.settings as s
	count(config.errors) == 0 with data.toolgate.settings as s
		with config.setting_kinds as {"services": "object", "ticket_prefixes": "names"}
		with config.service_setting_kinds as {"reviewers": "names"}
}
