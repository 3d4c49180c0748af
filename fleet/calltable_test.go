package fleet_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestCallTableNote(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	tab := fleet.NewCallTable(2)
	notes := []policy.CallNote{
		{Target: "grants", TriageRef: "doc-1.pdf", Attempt: 2, Classification: "transient:503", Detail: "retry", Time: at(20)},
		{Attempt: 1, Classification: "transport:timeout", Detail: "late", Time: at(10)}, // a lower attempt, reported late
		{Attempt: 2, Disposition: policy.DispositionDeadLetter, Stop: policy.StopAttemptsExhausted, Detail: "final", Time: at(30)},
	}
	for i := range notes {
		if _, changed := tab.Note("c1", &notes[i]); !changed {
			t.Errorf("note %d changed nothing", i)
		}
	}
	got := *tab.Calls["c1"]
	want := fleet.CallRecord{Final: fleet.Final{Disposition: policy.DispositionDeadLetter, Stop: policy.StopAttemptsExhausted},
		Attempts: 2, Classification: "transient:503", Detail: "final", First: at(10).UnixNano(), Last: at(30).UnixNano(),
		Target: "grants", TriageRef: "doc-1.pdf"}
	if got != want {
		t.Errorf("record: got %+v, want %+v", got, want)
	}
	if _, changed := tab.Note("c1", &notes[2]); changed {
		t.Errorf("the same note twice changed the record")
	}
	tab.Note("c2", &notes[0])
	if kept, changed := tab.Note("c3", &notes[0]); kept != "" || changed || tab.Untracked != 1 || len(tab.Calls) != 2 {
		t.Errorf("beyond the cap: kept %q changed %v, untracked %d, %d calls; want none kept, 1 untracked, 2 calls",
			kept, changed, tab.Untracked, len(tab.Calls))
	}
}
