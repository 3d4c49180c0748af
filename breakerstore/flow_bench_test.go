package breakerstore_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// BenchmarkAdmitFlow measures an attempt's cost under a concurrency
// ceiling: a lease taken through AdmitFlow and returned through
// ReleaseLease, serially and from every core on one key (the contended
// case: every worker of the fleet against one upstream's ceiling).
func BenchmarkAdmitFlow(b *testing.B) {
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	b.Run("serial", func(b *testing.B) {
		s := benchStore(b, breakerstore.SyncGroup)
		b.ReportAllocs()
		for b.Loop() {
			a, err := s.AdmitFlow(key, consecutive, policy.FlowLimits{Ceiling: 64, LeaseTTL: time.Minute, FullWait: time.Second})
			if err != nil || !a.Admitted {
				b.Fatal(a, err)
			}
			if _, err := s.ReleaseLease(key, a.LeaseID, policy.FlowLimits{}, policy.SignalNone); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		s := benchStore(b, breakerstore.SyncGroup)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				a, err := s.AdmitFlow(key, consecutive, policy.FlowLimits{Ceiling: 1 << 20, LeaseTTL: time.Minute, FullWait: time.Second})
				if err != nil || !a.Admitted {
					b.Error(a, err)
					return
				}
				if _, err := s.ReleaseLease(key, a.LeaseID, policy.FlowLimits{}, policy.SignalNone); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
