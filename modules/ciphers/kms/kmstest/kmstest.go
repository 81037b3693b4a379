// Package kmstest starts real KMS-compatible servers for tests: Local KMS
// (github.com/nsmithuk/local-kms), which speaks AWS KMS's API with real AES
// keys, built by integration/kmsserver.
//
// The binary comes from the TOOLGATE_KMS_BIN environment variable; build it
// once with
//
//	export TOOLGATE_KMS_BIN=$(integration/kmsserver/build.sh)
//
// Without it, tests that need KMS are skipped, or fail when
// TOOLGATE_REQUIRE_PEERS=1 (as in CI).
package kmstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kms"
)

// Environment variables read by this package.
const (
	EnvKMSBin       = "TOOLGATE_KMS_BIN"
	EnvRequirePeers = "TOOLGATE_REQUIRE_PEERS"
)

// Region is the AWS region the servers pretend to be in.
const Region = "eu-west-2"

// startTimeout bounds how long a server may take to listen.
const startTimeout = 20 * time.Second

// Server is a running KMS server on a loopback port, keeping its keys in a
// directory of its own so that it can be stopped and started again with
// them.
type Server struct {
	// Endpoint is the server's URL, http://127.0.0.1:<port>.
	Endpoint string

	bin, addr, data, logPath string

	mu   sync.Mutex
	proc *process
}

// process is one run of the server.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts a server for t and stops it when t ends. It also points the
// AWS SDK of the test process at harmless settings (see [Environ]).
func Start(t testing.TB) *Server {
	t.Helper()
	bin := binary(t)
	Environ(t)
	dir := t.TempDir()
	s := &Server{bin: bin, addr: "127.0.0.1:0", data: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "server.log")}
	if err := s.start(); err != nil {
		t.Fatalf("kmstest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kms server output (tail):\n%s", s.outputTail())
		}
		s.Stop()
	})
	return s
}

// Environ sets, for t, the environment the AWS SDK reads: static test
// credentials (Local KMS accepts any), no shared config or credentials
// files, no profile or endpoint from the machine, and no instance metadata
// lookups, so that nothing leaves the machine.
func Environ(t testing.TB) {
	t.Helper()
	none := filepath.Join(t.TempDir(), "none")
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":                      "AKIDTOOLGATETEST",
		"AWS_SECRET_ACCESS_KEY":                  "toolgate-test-secret",
		"AWS_SESSION_TOKEN":                      "",
		"AWS_PROFILE":                            "",
		"AWS_DEFAULT_PROFILE":                    "",
		"AWS_REGION":                             "",
		"AWS_DEFAULT_REGION":                     "",
		"AWS_CONFIG_FILE":                        none,
		"AWS_SHARED_CREDENTIALS_FILE":            none,
		"AWS_EC2_METADATA_DISABLED":              "true",
		"AWS_ENDPOINT_URL":                       "",
		"AWS_ENDPOINT_URL_KMS":                   "",
		"AWS_WEB_IDENTITY_TOKEN_FILE":            "",
		"AWS_ROLE_ARN":                           "",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI":     "",
	} {
		t.Setenv(k, v)
	}
}

// binary returns the server binary, or skips (or fails) t without one.
func binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv(EnvKMSBin)
	if bin == "" {
		msg := "no KMS server binary: run `export " + EnvKMSBin + "=$(integration/kmsserver/build.sh)` from the repository root"
		if os.Getenv(EnvRequirePeers) == "1" {
			t.Fatal(msg + " (" + EnvRequirePeers + "=1 makes this a failure)")
		}
		t.Skip(msg)
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		t.Fatalf("%s=%s is not a file: rebuild it with integration/kmsserver/build.sh", EnvKMSBin, bin)
	}
	return bin
}

// start runs the server on s.addr (a free port the first time, the same
// one afterwards) and waits until it listens.
func (s *Server) start() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "-addr", s.addr, "-data", s.data, "-region", Region)
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %v", s.bin, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "kmsserver listening on "); ok {
				listening <- addr
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	select {
	case addr := <-listening:
		s.mu.Lock()
		s.addr, s.proc = addr, p
		s.Endpoint = "http://" + addr
		s.mu.Unlock()
		return nil
	case <-p.exited:
		return fmt.Errorf("the kms server exited before listening on %s\n%s", s.addr, s.outputTail())
	case <-time.After(startTimeout):
		_ = cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("the kms server did not listen within %s", startTimeout)
	}
}

// Stop stops the server (SIGTERM, then SIGKILL after five seconds) and
// waits for it to exit. Its keys stay for [Server.Restart]. Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Restart starts a stopped server again on the same address with the same
// keys.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	var err error
	for range 50 { // the port may take a moment to be free again
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("kmstest: restarting on %s: %v", s.addr, err)
}

// Client returns a KMS client for the server.
func (s *Server) Client() *kms.Client {
	return kms.New(kms.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDTOOLGATETEST", "toolgate-test-secret", ""),
		Retryer:      aws.NopRetryer{},
	})
}

// NewKey creates a symmetric encryption key and returns its ARN.
func (s *Server) NewKey(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := s.Client().CreateKey(ctx, &kms.CreateKeyInput{Description: aws.String("toolgate test key")})
	if err != nil {
		t.Fatalf("kmstest: creating a key: %v", err)
	}
	return aws.ToString(out.KeyMetadata.Arn)
}

// SetAlias points alias/<name> at the key keyARN, creating the alias if
// needed.
func (s *Server) SetAlias(t testing.TB, name, keyARN string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := s.Client()
	_, err := c.UpdateAlias(ctx, &kms.UpdateAliasInput{AliasName: aws.String("alias/" + name), TargetKeyId: aws.String(keyARN)})
	var nf interface{ ErrorCode() string }
	if errors.As(err, &nf) && nf.ErrorCode() == "NotFoundException" {
		_, err = c.CreateAlias(ctx, &kms.CreateAliasInput{AliasName: aws.String("alias/" + name), TargetKeyId: aws.String(keyARN)})
	}
	if err != nil {
		t.Fatalf("kmstest: pointing alias/%s at %s: %v", name, keyARN, err)
	}
}

// DisableKey disables the key keyARN; EnableKey enables it again.
func (s *Server) DisableKey(t testing.TB, keyARN string) {
	t.Helper()
	if _, err := s.Client().DisableKey(context.Background(), &kms.DisableKeyInput{KeyId: aws.String(keyARN)}); err != nil {
		t.Fatalf("kmstest: disabling %s: %v", keyARN, err)
	}
}

// EnableKey enables the key keyARN.
func (s *Server) EnableKey(t testing.TB, keyARN string) {
	t.Helper()
	if _, err := s.Client().EnableKey(context.Background(), &kms.EnableKeyInput{KeyId: aws.String(keyARN)}); err != nil {
		t.Fatalf("kmstest: enabling %s: %v", keyARN, err)
	}
}

// outputTail returns the last lines the server logged.
func (s *Server) outputTail() string {
	b, _ := os.ReadFile(s.logPath)
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
