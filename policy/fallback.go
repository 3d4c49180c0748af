package policy

import "strconv"

// The escalation chain of a call (Fallback): the primary, then the
// fallback targets in order, a target equal to the primary skipped (a
// policy stored for a tenant may name a target it also applies to). The
// functions here walk the chain in place, without building it.

// ChainLen returns the length of the chain of a call to primary under f,
// the primary included.
func (f *Fallback) ChainLen(primary string) int {
	n := 1
	for _, t := range f.Targets {
		if t != primary {
			n++
		}
	}
	return n
}

// ChainAt returns entry i of the chain of a call to primary under f (0 is
// the primary), or "" when i is past its end.
func (f *Fallback) ChainAt(primary string, i int) string {
	if i == 0 {
		return primary
	}
	for _, t := range f.Targets {
		if t == primary {
			continue
		}
		if i--; i == 0 {
			return t
		}
	}
	return ""
}

// ChainIndex returns the position of target in the chain of a call to
// primary under f, or -1 when it is not in it.
func (f *Fallback) ChainIndex(primary, target string) int {
	if target == primary {
		return 0
	}
	i := 0
	for _, t := range f.Targets {
		if t == primary {
			continue
		}
		i++
		if t == target {
			return i
		}
	}
	return -1
}

// TargetFor returns the target of attempt (from 1) of a call to primary
// by the after_attempts rule: entry min((attempt-1)/AfterAttempts, last)
// of the chain; the primary for every attempt when AfterAttempts is 0 (only
// an open circuit moves such a call, see OnCircuitOpen).
func (f *Fallback) TargetFor(primary string, attempt int) string {
	if f.AfterAttempts <= 0 || len(f.Targets) == 0 || attempt <= 1 {
		return primary
	}
	i := min((attempt-1)/f.AfterAttempts, f.ChainLen(primary)-1)
	return f.ChainAt(primary, i)
}

// validateFallback checks the rules of p.Fallback that need no other
// policy: at most MaxFallbacks targets, none empty or repeated,
// after_attempts below max_attempts when set, on_circuit_open only with
// targets. A target's name rules, the policy's own target and cycles
// through the stored policies are the caller's to check (they need the
// scope and the store).
func validateFallback(p *Policy) error {
	f := &p.Fallback
	if len(f.Targets) > MaxFallbacks {
		return fieldErr("fallback.targets", "must name at most "+itoa(MaxFallbacks)+" targets, got "+itoa(len(f.Targets)))
	}
	for i, t := range f.Targets {
		field := "fallback.targets[" + itoa(i) + "]"
		if t == "" {
			return fieldErr(field, "is required")
		}
		for j := range i {
			if f.Targets[j] == t {
				return fieldErr(field, "repeats fallback.targets["+itoa(j)+"] "+strconv.Quote(t))
			}
		}
	}
	switch {
	case f.AfterAttempts < 0:
		return fieldErr("fallback.after_attempts", "must be >= 0")
	case f.AfterAttempts > 0 && f.AfterAttempts >= p.MaxAttempts:
		return fieldErr("fallback.after_attempts", "must be below max_attempts ("+itoa(p.MaxAttempts)+
			") so a fallback gets an attempt, got "+itoa(f.AfterAttempts))
	case f.AfterAttempts > 0 && len(f.Targets) == 0:
		return fieldErr("fallback.after_attempts", "needs fallback.targets")
	case f.OnCircuitOpen && len(f.Targets) == 0:
		return fieldErr("fallback.on_circuit_open", "needs fallback.targets")
	}
	return nil
}
