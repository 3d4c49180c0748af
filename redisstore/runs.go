package redisstore

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// OpenRun creates a batch run (an id is drawn when r.ID is empty): a retry
// pool of r.Pool retries its calls share until r.Cutoff. The id is unique
// across the fleet ({policyd}:runs), ErrExists otherwise. r.RedriveOf, when
// set, must be a run of the same tenant (ErrNotFound otherwise, the same
// answer for another tenant's) and is kept with the run.
func (s *Store) OpenRun(r policy.Run) (policy.Run, error) {
	if err := s.check(); err != nil {
		return policy.Run{}, err
	}
	now := s.opts.Clock()
	if r.ID == "" {
		var b [12]byte
		binary.BigEndian.PutUint64(b[:8], uint64(now.UnixNano()))
		_, _ = rand.Read(b[8:])
		r.ID = hex.EncodeToString(b[:])
	}
	if err := fieldErr(fleet.CheckRun(&r, now)); err != nil {
		return policy.Run{}, err
	}
	if r.RedriveOf != "" {
		if t, err := s.runTenant(r.RedriveOf); err != nil || t != r.Tenant {
			if err != nil && !errors.Is(err, ErrNotFound) {
				return policy.Run{}, err
			}
			return policy.Run{}, fmt.Errorf("%w: run %q", ErrNotFound, r.RedriveOf)
		}
	}
	r = policy.Run{ID: strings.Clone(r.ID), Tenant: strings.Clone(r.Tenant), Description: strings.Clone(r.Description),
		Pool: r.Pool, Cutoff: r.Cutoff.Truncate(time.Microsecond), Created: now.Truncate(time.Microsecond),
		RedriveOf: strings.Clone(r.RedriveOf)}
	ctx, cancel := s.adminCtx()
	defer cancel()
	ok, err := s.c.HSetNX(ctx, keyRuns, r.ID, r.Tenant).Result()
	if err != nil {
		return policy.Run{}, fmt.Errorf("redisstore: write %s: %w", keyRuns, err)
	}
	if !ok {
		return policy.Run{}, fmt.Errorf("%w: run %q", ErrExists, r.ID)
	}
	if err := s.durably(ctx, keyRun(r.Tenant, r.ID), func(c redis.Cmdable) error {
		return c.HSet(ctx, keyRun(r.Tenant, r.ID), "pool", r.Pool, "cutoff", r.Cutoff.UnixMicro(), "spent", 0,
			"tenant", r.Tenant, "description", r.Description, "created", r.Created.UnixMicro(), "redrive_of", r.RedriveOf).Err()
	}); err != nil {
		return policy.Run{}, fmt.Errorf("redisstore: write run %q: %w", r.ID, err)
	}
	s.runTenants.Store(r.ID, r.Tenant)
	s.runCutoffs.Store(r.ID, policy.Run{ID: r.ID, Tenant: r.Tenant, Cutoff: r.Cutoff})
	s.degraded.sawRun(r) // as a read of it would: degraded mode decides from it (KnownRun spares the read)
	return r, nil
}

// runTenant returns the tenant of run id, or ErrNotFound.
func (s *Store) runTenant(id string) (string, error) {
	if t, ok := s.runTenants.Load(id); ok {
		return t.(string), nil
	}
	ctx, cancel := s.call()
	defer cancel()
	t, err := s.c.HGet(ctx, keyRuns, id).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", fmt.Errorf("%w: run %q", ErrNotFound, id)
	case err != nil:
		return "", fmt.Errorf("redisstore: read %s: %w", keyRuns, err)
	}
	s.runTenants.Store(id, t)
	return t, nil
}

// Run returns the run id with its spend and ledger, or ErrNotFound.
func (s *Store) Run(id string) (policy.Run, error) {
	if err := s.check(); err != nil {
		return policy.Run{}, err
	}
	tenant, err := s.runTenant(id)
	if err != nil {
		return policy.Run{}, err
	}
	ctx, cancel := s.call()
	defer cancel()
	h, err := s.c.HGetAll(ctx, keyRun(tenant, id)).Result()
	if errors.Is(err, ErrUnavailable) {
		if r, ok := s.degraded.run(id); ok {
			return r, nil // as last read: what degraded mode decides from
		}
	}
	if err != nil {
		return policy.Run{}, fmt.Errorf("redisstore: read run %q: %w", id, err)
	}
	if len(h) == 0 {
		return policy.Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	num := func(f string) int64 { n, _ := toInt(h[f]); return n }
	r := policy.Run{ID: id, Tenant: tenant, Description: h["description"], Pool: uint64(num("pool")),
		Spent: uint64(num("spent")), Cutoff: fromUS(num("cutoff")), Created: fromUS(num("created")), RedriveOf: h["redrive_of"]}
	for i, p := range ledgerCounters(&r.Ledger) {
		*p = uint64(num(ledgerFields[i]))
	}
	s.degraded.sawRun(r)
	s.runCutoffs.Store(id, policy.Run{ID: id, Tenant: tenant, Cutoff: r.Cutoff})
	return r, nil
}

// Runs returns up to limit runs (all when limit <= 0) of tenant (every
// tenant's when empty) sorted by id, after the id after.
func (s *Store) Runs(tenant, after string, limit int) ([]policy.Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ctx, cancel := s.call()
	all, err := s.c.HGetAll(ctx, keyRuns).Result()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("redisstore: read %s: %w", keyRuns, err)
	}
	var ids []string
	for id, t := range all {
		if (tenant == "" || t == tenant) && (after == "" || id > after) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	out := make([]policy.Run, 0, len(ids))
	for _, id := range ids {
		r, err := s.Run(id)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// RecordFinal records call's final disposition in run runID's ledger by
// fleet.Run.RecordFinal's rule (one call of policyd_final): the first
// final disposition of a call id wins; the same report twice counts once,
// a different one is refused (fleet.AlreadyFinal) and changes nothing.
func (s *Store) RecordFinal(runID, callID string, d policy.Disposition, stop policy.StopReason) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := checkName("call_id", callID, false); err != nil {
		return err
	}
	f := fleet.Final{Disposition: d, Stop: stop}
	if ledgerField(f) == "" {
		return invalid("disposition", "must be a final disposition")
	}
	tenant, err := s.runTenant(runID)
	if err != nil {
		return err
	}
	ctx, cancel := s.call()
	defer cancel()
	_, err = finalCall(ctx, s.lib, tenant, runID, callID, f)
	return err
}
