package fleet

import "encoding/hex"

// String returns the id as the API carries it: 32 lowercase hex digits.
func (id PermitID) String() string { return hex.EncodeToString(id[:]) }

// ParsePermitID parses an id written by PermitID.String; ok is false for
// anything else.
func ParsePermitID(s string) (id PermitID, ok bool) {
	if len(s) != 2*len(id) {
		return id, false
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return PermitID{}, false
	}
	return id, true
}
