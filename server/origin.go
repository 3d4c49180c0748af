package server

import "time"

// DefaultMaxClockSkew is Config.MaxClockSkew's default.
const DefaultMaxClockSkew = 5 * time.Minute

// checkOrigin refuses an origin time more than skew after now: the call
// cannot have started in the future, and a deadline anchored there would
// stretch every bound of the policy. A zero origin means none.
func checkOrigin(field string, origin, now time.Time, skew time.Duration) error {
	if origin.IsZero() || origin.Sub(now) <= skew {
		return nil
	}
	return invalid(field, "must not be more than "+skew.String()+" after the daemon's clock (--max-clock-skew), got "+
		origin.Sub(now).Round(time.Second).String()+" ahead")
}
