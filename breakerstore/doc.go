// Package breakerstore holds policyd's shared state — fleet-wide circuit
// breakers, per-tenant retry budgets, batch-run retry pools and runtime
// policies — in memory, and persists it in one bbolt file.
//
// Every decision (Admit, Record, SpendRetry, Deposit, Resolve) is served from
// memory. Admin writes and breaker state transitions are committed with an
// fsync before the method returns. Counters (breaker windows, token buckets,
// run spend and ledgers) are marked dirty and written by one background
// goroutine every FlushInterval in a single transaction, so a crash loses at
// most that interval; with SyncAlways every mutation is committed (through
// bbolt's Batch, so concurrent callers share an fsync) before it returns.
//
// Bucket and key layout, schema version 1. Bucket names are the package-level
// bucket* variables, created once by Open. Keys sort bytewise: integers are
// big-endian, composite keys are joined by a 0x00 byte (tenants, targets, run
// ids and call ids never contain 0x00), times are Unix nanoseconds, never
// RFC 3339 strings.
//
//	bucket    key                        value
//	meta      "schema"                   uint32 big-endian schema version (1); another version refuses to open
//	breakers  tenant 0x00 target         breaker record, binary, version byte 1: state, forced, mode, open-until,
//	                                     cool-down, counters, the 10 window slots, probe permits
//	budgets   tenant                     explicit TenantBudget, JSON (admin object)
//	tokens    tenant                     token bucket, binary: tokens, last refill, granted, refused, dry-run refusals
//	policies  tenant 0x00 target         PolicyEntry, JSON (admin object); an empty tenant or target is a wider scope
//	runs      run id                     run header, JSON: tenant, description, pool, cut-off, created (admin object)
//	runstate  run id                     spent retries and ledger, binary: 9 x uint64 big-endian (the ledger
//	                                     is recomputed from runcalls at open; both are written in one commit)
//	runcalls  run id 0x00 call id        final disposition of one call, 2 bytes: policy.Disposition, policy.StopReason
//	audit     (reserved)                 audit trail of attempts, waits and dispositions; added by a later change
//
// A breaker keyed by target only (policy.ScopeTarget) has the empty tenant, so
// its key starts with 0x00. Runs and explicit budgets are never expired; idle
// CLOSED breakers and idle default-budget token buckets are removed from
// memory and disk after Options.IdleTTL.
package breakerstore
