package server

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Rules of identifiers (tenant, target, call, run and permit ids) beyond
// their length and UTF-8 validity. An identifier is shown in logs, metrics
// and the CLI and compared byte for byte, so it must look like what it is:
// no white space at either end, and none of the characters that are
// invisible or reorder text.
const ruleEdgeSpace = "must not begin or end with white space"

// nameRule returns the rule the valid UTF-8 identifier v breaks, or "":
// white space at either end, a control (Cc), format (Cf, which holds the
// bidi controls such as U+202E), line or paragraph separator (Zl, Zp)
// character, or a noncharacter (U+FDD0 to U+FDEF, and U+xFFFE and U+xFFFF
// of every plane). The rule names the first such character and its byte
// offset.
func nameRule(v string) string {
	first, _ := utf8.DecodeRuneInString(v)
	last, _ := utf8.DecodeLastRuneInString(v)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return ruleEdgeSpace
	}
	for i, r := range v {
		var what string
		switch {
		case unicode.In(r, unicode.Cc):
			what = "control"
		case unicode.In(r, unicode.Cf):
			what = "format or bidi"
		case unicode.In(r, unicode.Zl, unicode.Zp):
			what = "line or paragraph separator"
		case noncharacter(r):
			what = "noncharacter"
		default:
			continue
		}
		return "must not contain " + what + " characters, got " + fmt.Sprintf("%U", r) + " at byte " + strconv.Itoa(i)
	}
	return ""
}

// noncharacter reports whether r is one of Unicode's 66 noncharacters.
func noncharacter(r rune) bool {
	return (r >= 0xFDD0 && r <= 0xFDEF) || r&0xFFFE == 0xFFFE
}
