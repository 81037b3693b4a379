package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "hash-key",
		Short: "Prints the stored form of an API key read from standard input",
		Long: `
Reads one API key from standard input (the first line, without its line
break) and prints the form the auth block stores: sha256:<hex>. Use it for
api_key lines and api_keys files; the key itself is never stored:

	printf %s "$KEY" | toolgate hash-key
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.RunE = func(cmd *cobra.Command, _ []string) error {
				hash, err := hashKeyFrom(os.Stdin)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), hash)
				return err
			}
		},
	})
}

// hashKeyFrom reads an API key (the first line of r) and returns its
// stored form.
func hashKeyFrom(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && line == "" {
		return "", errors.New("give the API key on standard input")
	}
	key := strings.TrimRight(line, "\r\n")
	if key == "" || strings.TrimSpace(key) != key {
		return "", errors.New("the API key is empty or starts or ends with white space")
	}
	return HashAPIKey(key), nil
}
