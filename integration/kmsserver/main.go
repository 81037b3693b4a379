// Command kmsserver runs Local KMS (github.com/nsmithuk/local-kms), a server
// that speaks AWS KMS's API with real AES keys, on one loopback address, so
// that toolgate's tests can exercise the kms cipher against a real KMS
// server without a cloud account.
//
// It lives in its own module so that the main toolgate module never depends
// on Local KMS or its dependencies. Build it with build.sh, which caches the
// binary and prints its path:
//
//	export TOOLGATE_KMS_BIN=$(integration/kmsserver/build.sh)
//
// Local KMS's own main listens on every interface; this one listens only on
// the address given with -addr (default 127.0.0.1 on a free port), prints
// "kmsserver listening on <host:port>" once it accepts connections, keeps
// its keys in the directory given with -data (so a restart on the same
// address and directory finds them again), and exits cleanly on SIGTERM or
// SIGINT.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	localkms "github.com/nsmithuk/local-kms/src"
	"github.com/nsmithuk/local-kms/src/config"
	"github.com/nsmithuk/local-kms/src/data"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback `host:port` to listen on")
	dir := flag.String("data", "", "`directory` for the key database (required)")
	region := flag.String("region", "eu-west-2", "the AWS `region` the server pretends to be in")
	account := flag.String("account", "111122223333", "the AWS `account` id in key ARNs")
	version := flag.Bool("version", false, "print the Local KMS version and exit")
	flag.Parse()

	if *version {
		fmt.Println("kmsserver: local-kms", localKMSVersion())
		return
	}
	if err := run(*addr, *dir, *region, *account); err != nil {
		fmt.Fprintln(os.Stderr, "kmsserver:", err)
		os.Exit(1)
	}
}

func run(addr, dir, region, account string) error {
	if dir == "" {
		return errors.New("-data is required")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: give a loopback IP address", addr)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	config.AWSRegion = region
	config.AWSAccountId = account
	config.DatabasePath = abs

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	db := data.NewDatabase(abs)
	defer db.Close()

	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			localkms.HandleRequest(w, r, db)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		_ = srv.Close()
	}()
	fmt.Printf("kmsserver listening on %s\n", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func localKMSVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "github.com/nsmithuk/local-kms" {
				return m.Version
			}
		}
	}
	return "(unknown version)"
}
