package server

import "google.golang.org/protobuf/reflect/protoreflect"

// pbEnum is a generated protobuf enum.
type pbEnum interface {
	~int32
	Descriptor() protoreflect.EnumDescriptor
}

// domainEnum is an enum of package policy: a small number with a name.
type domainEnum interface {
	~uint8
	String() string
}

// Every domain enum numbers its values as the API's enum of the same name
// does (TestEnumsMapByName walks every proto enum and checks it), so the
// conversions are a change of type; these functions are the only place
// where one happens.

// enumToPB converts a domain enum value to the proto enum P.
func enumToPB[P pbEnum, D domainEnum](d D) P { return P(d) }

// enumFromPB converts the proto enum value v to the domain enum D. A
// number the proto enum does not declare (and UNSPECIFIED unless zeroOK)
// is INVALID_ARGUMENT naming field+sub; the path is built only then, so a
// valid request builds none.
func enumFromPB[D domainEnum, P pbEnum](field, sub string, v P, zeroOK bool) (D, error) {
	switch {
	case v == 0 && zeroOK:
		return 0, nil
	case v > 0 && v <= 255 && declared(v.Descriptor().Values(), protoreflect.EnumNumber(v)):
		return D(v), nil
	}
	rule := "must be a known " + string(v.Descriptor().Name()) + " value"
	if !zeroOK {
		rule = "must be a known " + string(v.Descriptor().Name()) + " other than UNSPECIFIED"
	}
	return 0, invalid(field+sub, rule)
}

// declared reports whether vals declares n. Enums numbered 0, 1, 2, ... in
// order (all of policyd's) answer by index; ByNumber, a map lookup, costs
// several times more, and ReportOutcome converts two enums an outcome.
func declared(vals protoreflect.EnumValueDescriptors, n protoreflect.EnumNumber) bool {
	if int(n) < vals.Len() && vals.Get(int(n)).Number() == n {
		return true
	}
	return vals.ByNumber(n) != nil
}
