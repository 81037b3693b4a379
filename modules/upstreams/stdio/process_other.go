//go:build !unix

package stdio

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/toolgate/toolgate/internal/mcpbridge"
)

// process is not available off Unix: supported reports it at config load.
type process struct{ pid int }

func startProcess(*spec, string, []string, *zap.Logger) (*process, error) {
	return nil, errors.New("programs run on Linux only")
}

func (*process) serve(*mcpbridge.Link, func(why, reason string)) {}
func (*process) send(context.Context, []byte) error              { return errors.ErrUnsupported }
func (*process) kill(reason, why string)                         {}
func (*process) stop(time.Duration)                              {}
