// Package logtest finds secrets in what a test's loggers wrote: a secret
// must reach no log line, whichever field carries it.
package logtest

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Leaked returns every line of logs holding one of secrets, each as zap's
// JSON encoder writes it (the message and every field, escaped as a log
// file would hold them).
func Leaked(t testing.TB, logs *observer.ObservedLogs, secrets ...string) []string {
	t.Helper()
	var out []string
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	for _, e := range logs.All() {
		buf, err := enc.EncodeEntry(e.Entry, e.Context)
		if err != nil {
			t.Fatal(err)
		}
		line := buf.String()
		buf.Free()
		for _, s := range secrets {
			if s != "" && (strings.Contains(line, s) || strings.Contains(e.Message, s)) {
				out = append(out, strings.TrimSpace(line))
				break
			}
		}
	}
	return out
}
