package server

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzCheckName: checkName accepts exactly the names of at most max bytes
// of valid UTF-8 without white space at either end and without control,
// format, separator or noncharacter code points, and names the field
// whenever it refuses.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"acme", " acme", "acme ", "a b", "café", "\u00a0x", "x\u3000", "a\u202eb", "a\u200bb",
		"\ufeffa", "a\u2028b", "a\ufffeb", "a\ufdd0b", "a\U0010ffff", "a\x00b", "a\tb", "\xff", "東京", "\U0001f600"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		err := checkName("call.tenant", v, 128, true)
		want := v != "" && len(v) <= 128 && utf8.ValidString(v)
		if want {
			first, _ := utf8.DecodeRuneInString(v)
			last, _ := utf8.DecodeLastRuneInString(v)
			want = !unicode.IsSpace(first) && !unicode.IsSpace(last) && strings.IndexFunc(v, func(r rune) bool {
				return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) || (r >= 0xFDD0 && r <= 0xFDEF) || r&0xFFFE == 0xFFFE
			}) < 0
		}
		if (err == nil) != want {
			t.Fatalf("checkName(%q) = %v, want accepted %v", v, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), "call.tenant") {
			t.Fatalf("checkName(%q) = %v, does not name the field", v, err)
		}
	})
}
