// Package breakerstore holds policyd's shared state — fleet-wide circuit
// breakers, per-tenant retry budgets, batch-run retry pools and runtime
// policies — in memory, and persists it in one bbolt file. The rules of
// that state (when a breaker trips, what a retry costs, what a run's pool
// allows) live in package fleet as plain values; breakerstore holds those
// values, locks, shards, persists and publishes them, and applies their
// methods.
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
//	breakers     tenant 0x00 target         fleet.Breaker, binary, version byte 2 (1 is still read): state, forced,
//	                                        mode, open-until, cool-down, counters, the 10 window slots, generation,
//	                                        probe permits (128-bit id, expiry); the layout is in record.go
//	budgets      tenant                     explicit TenantBudget, JSON (admin object)
//	tokens       tenant                     token bucket, binary: tokens, last refill, granted, refused, dry-run refusals
//	policies     tenant 0x00 target         PolicyEntry, JSON (admin object); an empty tenant or target is a wider scope
//	runs         run id                     run header, JSON: tenant, description, pool, cut-off, created (admin object)
//	runstate     run id                     spent retries and ledger, binary: 9 x uint64 big-endian (the ledger
//	                                        is recomputed from runcalls at open; both are written in one commit)
//	runcalls     run id 0x00 call id        final disposition of one call, 2 bytes: policy.Disposition, policy.StopReason
//	attempts     tenant 0x00 call id        fleet.Attempts, binary, version byte 1: the highest attempt decided for
//	                                        the call, its expiry (the call's deadline or the policy's horizon,
//	                                        whichever is later), and the answer (verdict, delay, attempt timeout,
//	                                        stop reason, disposition, category, checks, breaker state, budgets
//	                                        left, classification, pushback note); at most Options.MaxAttemptRecords,
//	                                        oldest dropped first, expired ones deleted by the sweep; the layout is
//	                                        in attempts.go. New in schema version 2 (created empty on upgrade).
//	meta         "auditseq"                 uint64 big-endian: the highest audit sequence number handed out
//	auditseg     time seq                   a segment of up to 512 audit records: a header (count, last record's
//	                                        time and seq, a Bloom filter over call ids and tenants) and the
//	                                        records, each a key delta and a binary body of version byte 1: event,
//	                                        verdict, stop reason, disposition, attempt (uvarint), delay ns
//	                                        (varint), then tenant, target, call id, run id, classification,
//	                                        detail (uvarint length + bytes); the full format is in auditseg.go
//
// An audit record's key is its Unix nanoseconds and a sequence number, both
// uint64 big-endian, so the trail sorts by time, then by order of append; a
// segment is keyed by its first record and segments never overlap, so the
// trail is one ordered range scan. A query by call id or tenant skips the
// segments whose filter rules it out. Records are written once: appended to
// an in-memory buffer and written in segments by the group commit (by bbolt's
// Batch with SyncAlways), and deleted oldest first by the flusher once older
// than Options.AuditRetention or beyond Options.AuditMaxRecords, whole
// segments at a time and the one partly expired segment rewritten, so
// retention is exact to the record. The audit trail was added within schema
// version 1; Open creates its bucket in older files and moves a trail of the
// earlier one-key-per-record layout (buckets audit, auditcall, audittenant)
// into segments.
//
// A breaker keyed by target only (policy.ScopeTarget) has the empty tenant, so
// its key starts with 0x00. Runs and explicit budgets are never expired; idle
// CLOSED breakers and idle default-budget token buckets are removed from
// memory and disk after Options.IdleTTL.
package breakerstore
