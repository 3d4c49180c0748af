package breakerstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/policyd/policyd/policy"
)

// BenchmarkVerifyFile measures what Open's file check costs on a file of
// 500,000 audit records: the read(2) walk of every page, before bbolt maps
// the file.
func BenchmarkVerifyFile(b *testing.B) {
	path := filepath.Join(b.TempDir(), "policyd.db")
	s, err := Open(Options{Path: path, AuditBuffer: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]policy.AuditRecord, 10000)
	for range 50 {
		for i := range recs {
			recs[i] = policy.AuditRecord{Event: policy.AuditDecision, Tenant: "acme", Target: "geo",
				CallID: fmt.Sprint("call-", i), Attempt: 1, Verdict: policy.VerdictRetry}
		}
		s.AppendAudit(recs...)
		if err := s.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	b.ResetTimer()
	for range b.N {
		if problems, _ := verifyFile(f, st.Size()); len(problems) > 0 {
			b.Fatal(problems)
		}
	}
	b.ReportMetric(float64(st.Size())/1e6, "MB")
}
