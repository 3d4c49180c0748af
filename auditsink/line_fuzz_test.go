package auditsink_test

import (
	"bytes"
	"testing"

	"github.com/policyd/policyd/auditsink"
)

// FuzzParseLine checks that ParseLine never panics, and that what it
// accepts encodes back to a line that parses to the same record and prev.
func FuzzParseLine(f *testing.F) {
	var c auditsink.Chain
	for _, r := range records(1, 4) {
		f.Add(bytes.TrimSuffix(c.Line(r), []byte("\n")))
	}
	f.Add([]byte(`{"prev":"` + auditsink.Genesis + `","time":"2026-11-28T10:00:00Z","event":"ADMIT","tenant":"a","target":"t"}`))
	f.Add([]byte(`{"prev":"` + auditsink.Genesis + `","time":"2026-11-28T10:00:00Z","event":"NOPE","tenant":"a","target":"t"}`))
	f.Add([]byte(`{"prev":"x","time":"yesterday"}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(` {"prev":"` + auditsink.Genesis + `"}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, prev, err := auditsink.ParseLine(b)
		if err != nil {
			return
		}
		again, prev2, err := auditsink.ParseLine(auditsink.Encode(rec, prev))
		if err != nil {
			t.Fatalf("ParseLine(Encode(%+v)) error = %v", rec, err)
		}
		if prev2 != prev || !again.Time.Equal(rec.Time) {
			t.Fatalf("round trip: got %+v %s, want %+v %s", again, prev2, rec, prev)
		}
		again.Time = rec.Time
		if again != rec {
			t.Fatalf("round trip: got %+v, want %+v", again, rec)
		}
	})
}
