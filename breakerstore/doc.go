// Package breakerstore holds policyd's shared state — fleet-wide circuit
// breakers, per-tenant retry budgets, batch-run retry pools and runtime
// policies — in memory, and persists it in one bbolt file.
//
// Every decision (Admit, Record, SpendRetry, Deposit, Resolve) is served from
// memory, and AppendAudit only adds to an in-memory buffer. Admin writes and
// breaker state transitions are committed with an fsync before the method
// returns. Counters (breaker windows, token buckets, run spend and ledgers)
// and audit records are marked dirty or buffered and written by one
// background goroutine every FlushInterval in a single transaction, so a
// crash loses at most that interval; with SyncAlways every mutation and
// audit record is committed (through bbolt's Batch, so concurrent callers
// share an fsync) before it returns.
//
// Bucket and key layout, schema version 1. Bucket names are the package-level
// bucket* variables, created once by Open. Keys sort bytewise: integers are
// big-endian, composite keys are joined by a 0x00 byte (tenants, targets, run
// ids and call ids never contain 0x00), times are Unix nanoseconds, never
// RFC 3339 strings.
//
//	bucket       key                        value
//	meta         "schema"                   uint32 big-endian schema version (1); another version refuses to open
//	breakers     tenant 0x00 target         breaker record, binary, version byte 1: state, forced, mode, open-until,
//	                                        cool-down, counters, the 10 window slots, probe permits
//	budgets      tenant                     explicit TenantBudget, JSON (admin object)
//	tokens       tenant                     token bucket, binary: tokens, last refill, granted, refused, dry-run refusals
//	policies     tenant 0x00 target         PolicyEntry, JSON (admin object); an empty tenant or target is a wider scope
//	runs         run id                     run header, JSON: tenant, description, pool, cut-off, created (admin object)
//	runstate     run id                     spent retries and ledger, binary: 9 x uint64 big-endian (the ledger
//	                                        is recomputed from runcalls at open; both are written in one commit)
//	runcalls     run id 0x00 call id        final disposition of one call, 2 bytes: policy.Disposition, policy.StopReason
//	meta         "auditseq"                 uint64 big-endian: the highest audit sequence number handed out
//	audit        time seq                   audit record, binary, version byte 1: event, verdict, stop reason,
//	                                        disposition, attempt (uvarint), delay ns (varint), then tenant,
//	                                        target, call id, run id, classification, detail (uvarint length + bytes)
//	auditcall    call id 0x00 time seq      empty: by-call index into audit (no entry for an empty call id)
//	audittenant  tenant 0x00 time seq       empty: by-tenant index into audit
//
// In audit keys, time is the record's Unix nanoseconds and seq a sequence
// number, both uint64 big-endian, so the trail sorts by time, then by order of
// append; the index keys end in the same 16 bytes, so a call's records or a
// tenant's time range are one ordered range scan. Records are written once
// and never updated: appended to an in-memory buffer and written by the group
// commit (by bbolt's Batch with SyncAlways), and deleted with their index
// entries, oldest first, by the flusher once older than
// Options.AuditRetention or beyond Options.AuditMaxRecords. The audit buckets
// were added within schema version 1: Open creates them in older files.
//
// A breaker keyed by target only (policy.ScopeTarget) has the empty tenant, so
// its key starts with 0x00. Runs and explicit budgets are never expired; idle
// CLOSED breakers and idle default-budget token buckets are removed from
// memory and disk after Options.IdleTTL.
package breakerstore
