//go:build open_findings

package integration

// Findings reproduced and not fixed yet: each test here and in the other
// adversarial_open_*_test.go files fails today (adversarial_open_gen_test.go,
// adversarial_open_genfed_test.go: a server→client request relayed from
// the stream of an upstream session replaced meanwhile is named, and its
// answer sent, as the new session's). They are kept out of `make test`
// (build tag open_findings) and listed in the README's adversarial suite;
// run them with
// `go test -tags open_findings -run 'Test.*Attack' ./integration/`.
// A fixed finding's test moves, marked "Attack (fixed)", to the file of
// its class.
