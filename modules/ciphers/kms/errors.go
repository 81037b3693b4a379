package kms

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/toolgate/toolgate/modules/gateway"
)

// unavailable reports that KMS cannot be used right now (see
// gateway.CipherUnavailable).
func unavailable(format string, args ...any) error {
	return gateway.CipherUnavailable(format, args...)
}

// op names a KMS operation and the IAM permission it needs.
type op struct {
	name       string // GenerateDataKey, Decrypt
	permission string // kms:GenerateDataKey, kms:Decrypt
}

var (
	opGenerate = op{name: "GenerateDataKey", permission: "kms:GenerateDataKey"}
	opDecrypt  = op{name: "Decrypt", permission: "kms:Decrypt"}
)

// classify turns an error of a KMS request into one that says what to do.
// Faults that may pass by themselves or that an operator fixes outside the
// gateway (unreachable, slow, throttled, denied, key disabled) wrap
// gateway.ErrCipherUnavailable; a key that does not exist or cannot encrypt,
// and a value that does not decrypt, do not. Requests carry no plaintext
// and the responses' data keys never reach an error, so the messages hold
// only key ids, codes and KMS's own explanations.
func (c *Cipher) classify(o op, keyID string, err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("kms %s: %w", o.name, context.Canceled)
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return c.classifyTransport(o, err)
	}
	code, msg := ae.ErrorCode(), ae.ErrorMessage()
	if msg == "" {
		msg = "no message"
	}
	switch code {
	case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException",
		"ExpiredTokenException", "IncompleteSignature", "MissingAuthenticationToken", "InvalidClientTokenId":
		return unavailable("%s denied %s on key %s (%s: %s): the gateway's AWS identity needs %s on the key, "+
			"allowed by its IAM policy and the key policy, and valid credentials", c.endpointName(), o.name, keyID, code, msg, o.permission)
	case "ThrottlingException", "LimitExceededException", "TooManyRequestsException", "RequestLimitExceeded":
		return unavailable("%s is throttling %s requests (%s): retry later, or raise the account's KMS request quota", c.endpointName(), o.name, code)
	case "DisabledException":
		return unavailable("kms key %s is disabled: enable it (aws kms enable-key) [%s]", keyID, code)
	case "KMSInvalidStateException":
		return unavailable("kms key %s cannot be used in its current state (%s: %s): cancel its deletion or finish its import, then enable it", keyID, code, msg)
	case "KeyUnavailableException", "KMSInternalException", "DependencyTimeoutException",
		"CustomKeyStoreInvalidStateException", "XksProxyUriUnreachableException", "XksProxyInvalidResponseException":
		return unavailable("%s could not %s with key %s (%s: %s): retry later", c.endpointName(), o.name, keyID, code, msg)
	case "NotFoundException":
		return fmt.Errorf("kms key %s does not exist in region %s (%s): check key_url and region", keyID, c.region, msg)
	case "InvalidKeyUsageException":
		return fmt.Errorf("kms key %s cannot %s (%s): use a symmetric encryption key (key spec SYMMETRIC_DEFAULT, usage ENCRYPT_DECRYPT)", keyID, o.name, msg)
	case "InvalidCiphertextException", "IncorrectKeyException":
		return fmt.Errorf("%w (kms %s refused the wrapped data key: %s)", errWrongContext, o.name, code)
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && (re.HTTPStatusCode() >= 500 || re.HTTPStatusCode() == http.StatusTooManyRequests) {
		return unavailable("%s failed to %s with key %s (HTTP %d, %s: %s): retry later", c.endpointName(), o.name, keyID, re.HTTPStatusCode(), code, msg)
	}
	return fmt.Errorf("%s refused %s with key %s (%s: %s)", c.endpointName(), o.name, keyID, code, msg)
}

// classifyTransport handles errors without an answer from KMS: no
// credentials, timeouts, connection failures. All may pass.
func (c *Cipher) classifyTransport(o op, err error) error {
	var se *v4.SigningError // the only signing failure is getting credentials
	if errors.As(err, &se) {
		return unavailable("kms: found no usable AWS credentials for %s (%v): give the gateway an AWS identity "+
			"(environment variables, shared config profile, web identity, container or instance role)", o.name, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return unavailable("%s did not answer %s within %s: check that it is reachable", c.endpointName(), o.name, c.timeout)
	}
	return unavailable("%s is unreachable for %s (%v): check the network, endpoint and region", c.endpointName(), o.name, err)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
