package policyclient

import (
	"crypto/sha256"
	"encoding/hex"
)

// IdempotencyKey derives the idempotency key of a submission: the lowercase
// hex SHA-256 of the submission id's UTF-8 bytes, one 0x00 byte, and the
// payload. The same submission gives the same key on every retry, in every
// process and in every client language (the Python client derives it the
// same way; shared test vectors check both).
func IdempotencyKey(submissionID string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(submissionID))
	h.Write([]byte{0})
	h.Write(payload)
	return hex.EncodeToString(h.Sum(nil))
}
