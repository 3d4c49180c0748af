package breakerstore

import "testing"

// TestMigrationsReachTheSchemaVersion: one step per version, in order,
// from 1 to schemaVersion, so Open can run migrations[from-1:].
func TestMigrationsReachTheSchemaVersion(t *testing.T) {
	if got, want := len(migrations), int(schemaVersion)-1; got != want {
		t.Fatalf("len(migrations) = %d, want %d (schema version %d)", got, want, schemaVersion)
	}
	for i, m := range migrations {
		if m.from != uint32(i+1) || m.run == nil || m.what == "" {
			t.Errorf("migrations[%d] = {from %d, %q}, want from %d with a description and a step", i, m.from, m.what, i+1)
		}
	}
}
