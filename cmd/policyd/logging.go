package main

import (
	"io"
	"log/slog"
	"time"
)

// newLogger is the daemon's logger: JSON lines on w at level and above,
// with durations written as Go duration strings ("1.5s", not 1500000000
// nanoseconds).
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationsAsStrings}))
}

// durationsAsStrings is a slog ReplaceAttr that writes a time.Duration as
// its String form.
func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	switch v := a.Value; {
	case v.Kind() == slog.KindDuration:
		a.Value = slog.StringValue(v.Duration().String())
	case v.Kind() == slog.KindAny:
		if d, ok := v.Any().(time.Duration); ok {
			a.Value = slog.StringValue(d.String())
		}
	}
	return a
}
