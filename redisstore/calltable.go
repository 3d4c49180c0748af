package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// DefaultMaxRunCalls is Options.MaxRunCalls's default, as breakerstore's.
const DefaultMaxRunCalls = 100000

// pendingNote is a NoteCall waiting for its Commit.
type pendingNote struct {
	tenant, run, call string
	n                 policy.CallNote
}

// NoteCall tells the call table of run runID what n says of call callID
// (fleet.CallRecord.Note, mirrored by policyd_note_call): one function
// call. An unknown run is ErrNotFound; a call beyond Options.MaxRunCalls
// is counted (RunCalls' untracked), not kept.
func (s *Store) NoteCall(runID, callID string, n policy.CallNote) error {
	p, err := s.pendingNote(runID, callID, n)
	if err != nil {
		return err
	}
	if s.opts.BatchOutcomes {
		// After the tenant's held batch, whose notes were made before.
		_, err := s.runOutcomes(nil, nil, []pendingNote{p}, true)
		return err
	}
	ctx, cancel := s.call()
	defer cancel()
	_, err = s.lib.run(ctx, "policyd_note_call", p.keys(), p.args(s.opts.MaxRunCalls)...).Result()
	if err != nil {
		return libraryErr("policyd_note_call", err)
	}
	return nil
}

// NoteCall queues the note for Commit's pipeline; an unknown run is
// ErrNotFound at once.
func (c *changes) NoteCall(runID, callID string, n policy.CallNote) error {
	p, err := c.s.pendingNote(runID, callID, n)
	if err != nil {
		return err
	}
	c.notes = append(c.notes, p)
	return nil
}

func (s *Store) pendingNote(runID, callID string, n policy.CallNote) (pendingNote, error) {
	if err := s.check(); err != nil {
		return pendingNote{}, err
	}
	if err := checkName("call_id", callID, false); err != nil {
		return pendingNote{}, err
	}
	tenant, err := s.runTenant(runID)
	if err != nil {
		return pendingNote{}, err
	}
	return pendingNote{tenant: tenant, run: runID, call: callID, n: n}, nil
}

func (p *pendingNote) keys() []string {
	return []string{keyRun(p.tenant, p.run), keyCallTable(p.tenant, p.run), keyCallIDs(p.tenant, p.run)}
}

// args are policyd_note_call's arguments for the note under a table cap.
func (p *pendingNote) args(limit int) []any {
	var at int64
	if !p.n.Time.IsZero() {
		at = p.n.Time.UnixMicro()
	}
	n := &p.n
	return []any{p.call, limit, n.Target, n.TriageRef, n.Attempt, n.Classification, n.Detail,
		int(n.Disposition), int(n.Stop), at, n.PrimaryTarget}
}

// callPage is how many call ids RunCalls reads per round trip.
const callPage = 512

// RunCalls returns up to limit calls (all when limit <= 0) of run runID's
// call table that f selects, sorted by call id, starting after the id
// after, and how many of the run's calls are beyond the table's cap. It
// reads the ids in order (ZRANGE BYLEX) and their records a page at a
// time; f is applied here. An unknown run is ErrNotFound.
func (s *Store) RunCalls(runID string, f policy.RunCallFilter, after string, limit int) ([]policy.RunCall, uint64, error) {
	if err := s.check(); err != nil {
		return nil, 0, err
	}
	tenant, err := s.runTenant(runID)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := s.call()
	defer cancel()
	untracked, err := s.c.HGet(ctx, keyRun(tenant, runID), "calls_untracked").Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, fmt.Errorf("redisstore: read run %q: %w", runID, err)
	}
	var out []policy.RunCall
	from := "-"
	if after != "" {
		from = "(" + after
	}
	for limit <= 0 || len(out) < limit {
		ids, err := s.c.ZRangeByLex(ctx, keyCallIDs(tenant, runID), &redis.ZRangeBy{Min: from, Max: "+", Count: callPage}).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("redisstore: read calls of run %q: %w", runID, err)
		}
		if len(ids) == 0 {
			break
		}
		vals, err := s.c.HMGet(ctx, keyCallTable(tenant, runID), ids...).Result()
		if err != nil {
			return nil, 0, fmt.Errorf("redisstore: read calls of run %q: %w", runID, err)
		}
		for i, v := range vals {
			sv, ok := v.(string)
			if !ok {
				continue
			}
			c, err := decodeCall(sv)
			if err != nil {
				return nil, 0, fmt.Errorf("redisstore: call %q of run %q is damaged: %w", ids[i], runID, err)
			}
			rc := runCallOf(ids[i], &c)
			if f.Matches(&rc) {
				out = append(out, rc)
				if limit > 0 && len(out) == limit {
					break
				}
			}
		}
		if len(ids) < callPage {
			break
		}
		from = "(" + ids[len(ids)-1]
	}
	return out, untracked, nil
}

// runCallOf converts a record (times in Unix µs) to the API's call.
func runCallOf(id string, c *fleet.CallRecord) policy.RunCall {
	return policy.RunCall{CallID: id, Disposition: c.Final.Disposition, Stop: c.Final.Stop, Attempts: c.Attempts,
		Classification: c.Classification, Detail: c.Detail, Target: c.Target, TriageRef: c.TriageRef,
		PrimaryTarget: c.PrimaryTarget, First: fromUS(c.First), Last: fromUS(c.Last)}
}

// decodeCall reads a call table record as the library writes it
// (call_encode): version 1, or 2 with a primary target (one more length
// and string); its times stay in Unix µs.
func decodeCall(v string) (fleet.CallRecord, error) {
	var c fleet.CallRecord
	head, rest, ok := strings.Cut(v, "\n")
	f := strings.Fields(head)
	if !ok || !(len(f) == 10 && f[0] == "1" || len(f) == 11 && f[0] == "2") {
		return c, errors.New("want a header of version 1 and 10 numbers or of version 2 and 11")
	}
	var n [11]int64
	for i := 1; i < len(f); i++ {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || x < 0 {
			return c, fmt.Errorf("header field %d is %q", i, f[i])
		}
		n[i] = x
	}
	if n[6]+n[7]+n[8]+n[9]+n[10] != int64(len(rest)) {
		return c, errors.New("string lengths do not match the record")
	}
	c.Final = fleet.Final{Disposition: policy.Disposition(n[1]), Stop: policy.StopReason(n[2])}
	c.Attempts, c.First, c.Last = uint32(n[3]), n[4], n[5]
	for i, dst := range [...]*string{&c.Target, &c.Classification, &c.Detail, &c.TriageRef, &c.PrimaryTarget} {
		*dst, rest = rest[:n[6+i]], rest[n[6+i]:]
	}
	return c, nil
}

// queueNotes adds the notes' policyd_note_call calls to l (a pipeline).
func queueNotes(ctx context.Context, l lib, notes []pendingNote, limit int) {
	for i := range notes {
		l.run(ctx, "policyd_note_call", notes[i].keys(), notes[i].args(limit)...)
	}
}
