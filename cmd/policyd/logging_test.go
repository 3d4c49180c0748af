package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

func TestLogsWriteDurationsAsStrings(t *testing.T) {
	// Failed before: slog's JSON handler writes a duration as nanoseconds
	// ("delay":1500000000).
	var buf bytes.Buffer
	log := newLogger(&buf, slog.LevelInfo)
	log.Info("decision", slog.Duration("delay", 1500*time.Millisecond), "grace", 10*time.Second,
		slog.Group("breaker", slog.Duration("cooldown", time.Minute)), "attempt", 2)
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	if got["delay"] != "1.5s" || got["grace"] != "10s" || got["breaker"].(map[string]any)["cooldown"] != "1m0s" || got["attempt"] != 2.0 {
		t.Errorf("got %s, want delay 1.5s, grace 10s, breaker.cooldown 1m0s and attempt 2", buf.Bytes())
	}
}
