package kms

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/toolgate/toolgate/modules/gateway"
)

// apiError is an error as the SDK returns it for a KMS answer with the
// given HTTP status and error code.
func apiError(status int, code, msg string) error {
	return &smithy.OperationError{ServiceID: "KMS", OperationName: "Decrypt", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      &smithy.GenericAPIError{Code: code, Message: msg},
		},
		RequestID: "req-1",
	}}
}

// TestClassify covers the answers Local KMS cannot give (it has no IAM and
// no quotas): which faults are retryable, and that each says what to do.
func TestClassify(t *testing.T) {
	c := &Cipher{region: "eu-west-1", timeout: DefaultTimeout}
	const key = "arn:aws:kms:eu-west-1:111122223333:key/k"
	for _, tc := range []struct {
		err       error
		retryable bool
		want      string
	}{
		{apiError(400, "AccessDeniedException", "User: arn:aws:sts::111122223333:assumed-role/gw is not authorized to perform: kms:Decrypt"), true, "needs kms:Decrypt on the key"},
		{apiError(400, "UnrecognizedClientException", "The security token included in the request is invalid."), true, "valid credentials"},
		{apiError(400, "ExpiredTokenException", "The security token included in the request is expired"), true, "valid credentials"},
		{apiError(400, "ThrottlingException", "Rate exceeded"), true, "throttling Decrypt requests"},
		{apiError(400, "DisabledException", "key is disabled"), true, "is disabled: enable it"},
		{apiError(400, "KMSInvalidStateException", "pending deletion"), true, "cancel its deletion"},
		{apiError(500, "KMSInternalException", ""), true, "retry later"},
		{apiError(503, "ServiceUnavailable", "busy"), true, "HTTP 503"},
		{apiError(400, "DependencyTimeoutException", "slow"), true, "retry later"},
		{apiError(400, "NotFoundException", "no such key"), false, "check key_url and region"},
		{apiError(400, "InvalidKeyUsageException", "SIGN_VERIFY"), false, "symmetric encryption key"},
		{apiError(400, "InvalidCiphertextException", ""), false, "another (service, user)"},
		{apiError(400, "IncorrectKeyException", ""), false, "another (service, user)"},
		{apiError(400, "ValidationException", "bad"), false, "refused Decrypt"},
		{&smithy.OperationError{ServiceID: "KMS", OperationName: "Decrypt", Err: &v4.SigningError{Err: errors.New("failed to retrieve credentials: no EC2 IMDS role found")}}, true, "no usable AWS credentials"},
		{&smithy.OperationError{ServiceID: "KMS", OperationName: "Decrypt", Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}, true, "is unreachable"},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), true, "did not answer Decrypt within 5s"},
	} {
		err := c.classify(opDecrypt, key, tc.err)
		if errors.Is(err, gateway.ErrCipherUnavailable) != tc.retryable {
			t.Errorf("%v → %v: retryable %v, want %v", tc.err, err, !tc.retryable, tc.retryable)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v → %q; want it to say %q", tc.err, err, tc.want)
		}
	}
	if err := c.classify(opDecrypt, key, fmt.Errorf("x: %w", context.Canceled)); !errors.Is(err, context.Canceled) || errors.Is(err, gateway.ErrCipherUnavailable) {
		t.Errorf("a cancelled request = %v; want context.Canceled", err)
	}
}
