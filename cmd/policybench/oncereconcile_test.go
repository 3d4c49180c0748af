package main

import (
	"slices"
	"testing"
)

func TestReconcileOnce(t *testing.T) {
	docs := []string{"doc-0", "doc-1", "doc-2", "doc-3", "doc-4"}
	for _, tc := range []struct {
		name    string
		records map[string]upstreamRecord
		subs    []submission
		calls   []ledgerCall
		ok      bool
		check   func(t *testing.T, r onceReport)
	}{{
		name: "exactly once: written, a lost answer written, a 503 dead letter",
		records: map[string]upstreamRecord{"doc-0": {"rec-1", 1}, "doc-1": {"rec-2", 1}, "doc-2": {"rec-3", 1},
			"doc-3": {"rec-4", 1}},
		subs: []submission{{Doc: "doc-0", Disposition: "succeeded"}, {Doc: "doc-1", Disposition: "succeeded"},
			{Doc: "doc-2", Disposition: "succeeded"}, {Doc: "doc-3", Disposition: "dead_letter", StopReason: "NOT_IDEMPOTENT"},
			{Doc: "doc-4", Disposition: "dead_letter", StopReason: "ATTEMPTS_EXHAUSTED"}},
		calls: []ledgerCall{{CallID: "doc-3", Doc: "doc-3", Disposition: "dead_letter", StopReason: "NOT_IDEMPOTENT"},
			{CallID: "doc-4", Doc: "doc-4", Disposition: "dead_letter", StopReason: "ATTEMPTS_EXHAUSTED", Detail: "transient:503"}},
		ok: true,
		check: func(t *testing.T, r onceReport) {
			if r.Records != 4 || r.Duplicates != 0 || len(r.Unwritten) != 1 || r.Unwritten[0].Doc != "doc-4" ||
				r.Unwritten[0].DeadLetter != "dead_letter (ATTEMPTS_EXHAUSTED): transient:503" {
				t.Errorf("got %+v, want 4 records, doc-4 dead-lettered", r)
			}
			if !slices.Equal(r.WrittenNotSucceeded, []string{"doc-3"}) {
				t.Errorf("written, not succeeded: got %v, want [doc-3]", r.WrittenNotSucceeded)
			}
		},
	}, {
		name: "a duplicate write",
		records: map[string]upstreamRecord{"doc-0": {"rec-1", 3}, "doc-1": {"rec-2", 1}, "doc-2": {"rec-3", 1},
			"doc-3": {"rec-4", 1}, "doc-4": {"rec-5", 2}},
		subs: []submission{{Doc: "doc-0", Disposition: "succeeded"}},
		check: func(t *testing.T, r onceReport) {
			if r.Duplicates != 3 || !slices.Equal(r.DuplicateDocs, []string{"doc-0", "doc-4"}) {
				t.Errorf("got %d duplicates %v, want 3 of doc-0 and doc-4", r.Duplicates, r.DuplicateDocs)
			}
		},
	}, {
		name:    "unwritten and not a dead letter in the ledger",
		records: map[string]upstreamRecord{"doc-0": {"rec-1", 1}, "doc-1": {"rec-2", 1}, "doc-2": {"rec-3", 1}, "doc-3": {"rec-4", 1}},
		subs:    []submission{{Doc: "doc-4", CallID: "doc-4", Disposition: "dead_letter"}},
		calls:   []ledgerCall{{CallID: "doc-4", Doc: "doc-4", Disposition: ""}}, // the final disposition never reached the ledger
		check: func(t *testing.T, r onceReport) {
			if !slices.Equal(r.Unaccounted, []string{"doc-4"}) || !slices.Equal(r.LedgerMissing, []string{"doc-4 (listed, not final)"}) {
				t.Errorf("unaccounted: got %v, ledger missing %v, want [doc-4] for both", r.Unaccounted, r.LedgerMissing)
			}
		},
	}, {
		name:    "a success without a record",
		records: map[string]upstreamRecord{"doc-0": {"rec-1", 1}, "doc-1": {"rec-2", 1}, "doc-2": {"rec-3", 1}, "doc-3": {"rec-4", 1}},
		subs:    []submission{{Doc: "doc-4", Disposition: "succeeded", Dedup: true}},
		calls:   []ledgerCall{{CallID: "doc-4", Doc: "doc-4", Disposition: "dead_letter"}},
		check: func(t *testing.T, r onceReport) {
			if !slices.Equal(r.SucceededUnwritten, []string{"doc-4"}) || r.Deduplicated != 1 {
				t.Errorf("got %v succeeded without a record, %d deduplicated; want [doc-4], 1", r.SucceededUnwritten, r.Deduplicated)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := reconcileOnce(docs, tc.records, tc.subs, tc.calls)
			if r.OK() != tc.ok {
				t.Errorf("OK: got %v, want %v (%+v)", r.OK(), tc.ok, r)
			}
			tc.check(t, r)
		})
	}
}

func TestDocsOf(t *testing.T) {
	const workers, docs = 3, 300
	for _, overlap := range []float64{0, 0.1} {
		seen := map[string]int{}
		calls := map[string]bool{}
		for w := range workers {
			ids, callIDs := docsOf(w, workers, docs, overlap)
			for i, id := range ids {
				seen[id]++
				if calls[callIDs[i]] {
					t.Errorf("overlap %v: call id %s given twice", overlap, callIDs[i])
				}
				calls[callIDs[i]] = true
			}
		}
		twice := 0
		for i := range docs {
			switch n := seen[docName(i)]; n {
			case 1:
			case 2:
				twice++
			default:
				t.Errorf("overlap %v: %s submitted %d times", overlap, docName(i), n)
			}
		}
		if want := int(overlap * docs); twice != want {
			t.Errorf("overlap %v: %d documents submitted twice, want %d", overlap, twice, want)
		}
	}
}
