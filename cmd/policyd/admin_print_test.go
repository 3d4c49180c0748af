package main

import (
	"bytes"
	"strings"
	"testing"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestCLIEscapesWhatItCannotPrint: names with control, bidi or invisible
// characters (stored before policyd refused them) are printed quoted, so
// they can neither hide nor rearrange the table; printable ones as they
// are.
func TestCLIEscapesWhatItCannotPrint(t *testing.T) {
	var out bytes.Buffer
	printBudgets(&out, []*pb.TenantBudgetStatus{
		{Budget: &pb.TenantBudget{Tenant: "acme"}},
		{Budget: &pb.TenantBudget{Tenant: "café 東京"}},
		{Budget: &pb.TenantBudget{Tenant: "evil\u202eemca"}},
		{Budget: &pb.TenantBudget{Tenant: "tab\there"}},
		{Budget: &pb.TenantBudget{Tenant: "esc\x1b[31mred"}},
		{Budget: &pb.TenantBudget{Tenant: "zero\u200bwidth"}},
		{Budget: &pb.TenantBudget{Tenant: "bad\xffutf8"}},
	})
	got := out.String()
	for _, want := range []string{"\nacme ", "\ncafé 東京 ", `"evil\u202eemca"`, `"tab\there"`, `"esc\x1b[31mred"`, `"zero\u200bwidth"`, `"bad\xffutf8"`} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, raw := range []string{"\u202e", "\x1b", "\u200b", "\xff", "tab\there"} {
		if strings.Contains(got, raw) {
			t.Errorf("output holds the raw %q:\n%s", raw, got)
		}
	}
	var run bytes.Buffer
	printRun(&run, &pb.Run{RunId: "run\u2066x", Tenant: "acme"})
	if !strings.Contains(run.String(), `"run\u2066x"`) {
		t.Errorf("printRun shows the run id raw:\n%s", run.String())
	}
}
