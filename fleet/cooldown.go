package fleet

// Cooldown is a fleet-wide pushback cool-down: a server told one worker to
// back off until Until (Unix ns), so every worker of the fleet waits with
// it. The zero value is no cool-down.
type Cooldown struct {
	Until int64
}

// Extend moves the cool-down's end to until when that is later, never
// earlier, and returns the end in force. It reports Mutated when the end
// moved and CooldownStarted too when no cool-down was in force at now.
func (c *Cooldown) Extend(now, until int64) (int64, Effect) {
	if until <= c.Until {
		return c.Until, 0
	}
	e := Mutated
	if c.Until <= now && until > now {
		e |= CooldownStarted
	}
	c.Until = until
	return c.Until, e
}

// Active reports whether the cool-down is in force at now, and for how long
// yet (ns).
func (c Cooldown) Active(now int64) (bool, int64) {
	if c.Until > now {
		return true, c.Until - now
	}
	return false, 0
}
