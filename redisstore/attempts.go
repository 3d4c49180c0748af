package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// attemptOf reads call k's fleet.Attempts ({T}:attempt:CALLID, expiring
// with the record); the zero value when there is none.
func (s *Store) attemptOf(k policy.CallKey) (fleet.Attempts, error) {
	ctx, cancel := s.call()
	defer cancel()
	h, err := s.c.HGetAll(ctx, keyAttempt(k.Tenant, k.CallID)).Result()
	if err != nil {
		return fleet.Attempts{}, fmt.Errorf("redisstore: read attempt of %q/%q: %w", k.Tenant, k.CallID, err)
	}
	a, err := decodeAttempt(h)
	if err != nil {
		return fleet.Attempts{}, fmt.Errorf("redisstore: attempt record of %q/%q is %w", k.Tenant, k.CallID, err)
	}
	return a, nil
}

// errDamagedAttempt is an attempt record whose fields do not parse.
var errDamagedAttempt = errors.New("damaged")

// decodeAttempt decodes an attempt record ({T}:attempt:CALLID, its hash
// as HGETALL returns it) into fleet.Attempts by the one decoder of the
// record's layout (attemptFields.decode): an empty hash is the zero value
// (no record), a field that does not parse errDamagedAttempt.
func decodeAttempt(h map[string]string) (fleet.Attempts, error) {
	f := attemptFields{present: len(h) > 0, attempt: h["attempt"], expiry: h["expiry"], answer: h["answer"], verdict: h["verdict"]}
	return f.decode()
}

// applyVerdict completes ans, the answer policyd_nextdelay was given (what
// the stateless rules and the breaker's check decided), with v, what the
// library's fleet-wide rules made of it: "retry delay stop disposition
// breaker checks tokens remaining spread" (see policyd.lua nextdelay).
func applyVerdict(ans *policy.Answer, v string) error {
	var n [9]int64
	var tokens float64
	for i := range n {
		var f string
		var err error
		f, v, _ = strings.Cut(v, " ")
		if i == 6 {
			tokens, err = strconv.ParseFloat(f, 64)
		} else {
			n[i], err = strconv.ParseInt(f, 10, 64)
		}
		if err != nil {
			return errDamagedAttempt
		}
	}
	if v != "" {
		return errDamagedAttempt // more than 9 numbers
	}
	ans.Retry, ans.Stop, ans.Disposition = n[0] == 1, policy.StopReason(n[2]), policy.Disposition(n[3])
	ans.Breaker, ans.Checks = policy.BreakerState(n[4]), policy.Check(n[5])
	ans.TenantTokens, ans.RunRemaining = tokens, uint64(n[7])
	ans.Delay = 0
	if ans.Retry {
		ans.Delay = time.Duration(n[1])
	} else {
		ans.AttemptTimeout = 0
	}
	if n[8] == 1 {
		ans.Note = fleet.SpreadNote(ans.Note)
	}
	return nil
}

// CheckAttempt says what a NextDelay for attempt of call k must get, by
// fleet.Attempts.Check: replay and the answer given before for the same
// attempt, a *fleet.Refusal for a lower one or any after a STOP, else
// nothing. It costs one round trip.
func (s *Store) CheckAttempt(k policy.CallKey, attempt uint32) (policy.Answer, bool, error) {
	if err := s.check(); err != nil {
		return policy.Answer{}, false, err
	}
	a, err := s.attemptOf(k)
	if errors.Is(err, ErrUnavailable) {
		// Degraded: the engine's record is out of reach; this replica's
		// own, decided while the engine was down, still counts.
		a, err = fleet.Attempts{}, nil
	}
	if err != nil {
		return policy.Answer{}, false, err
	}
	now := s.opts.Clock().UnixNano()
	a = newest(a, s.down.get(k), now)
	replay, err := a.Check(now, attempt)
	if replay {
		return a.Answer, true, nil
	}
	return policy.Answer{}, false, err
}

// LastAnswer returns the answer to the highest attempt of call k decided,
// while it is remembered. It reads the engine's record alone, not one this
// replica kept while the engine was down (downAttempts): a later attempt
// of the call may have been answered by another replica meanwhile, which
// this one cannot know, and a final disposition checked against the
// earlier answer would be refused and lost. Once the records are written,
// the engine holds the latest of them (never rewound).
func (s *Store) LastAnswer(k policy.CallKey) (policy.Answer, bool) {
	if s.check() != nil {
		return policy.Answer{}, false
	}
	a, err := s.attemptOf(k)
	if err != nil || a.Attempt == 0 || s.opts.Clock().UnixNano() >= a.Expiry {
		return policy.Answer{}, false
	}
	return a.Answer, true
}

// LastAnswers is LastAnswer of every call of keys, into out[i], with the
// attempt it answered in attempts[i] (0: none; both as long as keys): one
// call of policyd_attempts per tenant (a tenant's records share its hash
// slot, also on a Cluster), whatever the number of keys. The records of a tenant that cannot be read (the engine
// down) and a damaged record are none, as with LastAnswer.
func (s *Store) LastAnswers(keys []policy.CallKey, out []policy.Answer, attempts []uint32) {
	clear(out[:len(keys)])
	clear(attempts[:len(keys)])
	if s.check() != nil || len(keys) == 0 {
		return
	}
	now := s.opts.Clock().UnixNano()
	done := make([]bool, len(keys))
	var idx []int
	var names []string
	for first := range keys {
		if done[first] {
			continue
		}
		idx, names = idx[:0], names[:0]
		// keyAttempt of the tenant's calls, its tag made once: the key
		// is its tenant's prefix and the call id.
		prefix := keyAttempt(keys[first].Tenant, "")
		for i := first; i < len(keys); i++ {
			if !done[i] && keys[i].Tenant == keys[first].Tenant {
				done[i] = true
				idx = append(idx, i)
				names = append(names, prefix+keys[i].CallID)
			}
		}
		recs, err := s.attemptsOf(names)
		if err != nil {
			s.log.Debug("redisstore: attempt records not read", "tenant", keys[first].Tenant, "err", err)
			continue
		}
		for j, i := range idx {
			if a := recs[j]; a.Attempt > 0 && now < a.Expiry {
				out[i], attempts[i] = a.Answer, a.Attempt
			}
		}
	}
}

// attemptsOf reads the attempt records under names, keys of one tenant,
// in one call of policyd_attempts; the zero value for each one missing
// or damaged (logged).
func (s *Store) attemptsOf(names []string) ([]fleet.Attempts, error) {
	ctx, cancel := s.call()
	defer cancel()
	r, err := s.lib.runROSlice(ctx, "policyd_attempts", names)
	if err != nil {
		return nil, fmt.Errorf("redisstore: policyd_attempts: %w", err)
	}
	if len(r) != len(names) {
		return nil, errReply
	}
	out := make([]fleet.Attempts, len(names))
	for i, v := range r {
		flat, _ := v.([]any)
		f := attemptFieldsOf(flat)
		if out[i], err = f.decode(); err != nil {
			s.log.Warn("redisstore: attempt record damaged: read as none", "key", names[i])
		}
	}
	return out, nil
}

// pendingAttempt is a RecordAttempt waiting for its Commit.
type pendingAttempt struct {
	k       policy.CallKey
	attempt uint32
	ans     policy.Answer
	keep    time.Time
}

// queueAttempt adds the policyd_attempt call of a to l's pipeline.
func queueAttempt(ctx context.Context, l lib, a pendingAttempt) error {
	l.run(ctx, "policyd_attempt", []string{keyAttempt(a.k.Tenant, a.k.CallID)}, a.attempt, packAnswer(&a.ans), a.keep.UnixMilli()+1)
	return nil
}

// claims are the calls of this replica whose attempt is being decided: a
// NextDelay of the same call waits for the first one's answer instead of
// deciding again. They are local to the replica; across replicas the
// attempt record itself (policyd_attempt, never rewound) keeps a call's
// answers in order.
type claims struct {
	mu sync.Mutex
	m  map[policy.CallKey]chan struct{} // closed when the claim ends
}

// ClaimAttempt is server.Attempts.ClaimAttempt: CheckAttempt under the
// call's claim on this replica. A claim that does not decide (a replay or
// a refusal) ends at once.
func (s *Store) ClaimAttempt(k policy.CallKey, attempt uint32) (policy.Answer, bool, error) {
	for {
		s.claims.mu.Lock()
		if s.claims.m == nil {
			s.claims.m = map[policy.CallKey]chan struct{}{}
		}
		if wait, held := s.claims.m[k]; held {
			s.claims.mu.Unlock()
			<-wait
			continue
		}
		s.claims.m[k] = make(chan struct{})
		s.claims.mu.Unlock()
		ans, replay, err := s.CheckAttempt(k, attempt)
		if replay || err != nil {
			s.ReleaseAttempt(k)
		}
		return ans, replay, err
	}
}

// ReleaseAttempt ends the claim ClaimAttempt gave on call k, if any.
func (s *Store) ReleaseAttempt(k policy.CallKey) {
	s.claims.mu.Lock()
	if done, held := s.claims.m[k]; held {
		delete(s.claims.m, k)
		close(done)
	}
	s.claims.mu.Unlock()
}
