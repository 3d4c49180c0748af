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
// background goroutine in a single transaction, one starting every
// FlushInterval, so a crash loses at most that interval plus the duration
// of one commit (the one in progress); with SyncAlways every mutation and
// audit record is committed (through bbolt's Batch, so concurrent callers
// share an fsync) before it returns.
//
// Bucket and key layout, schema version 3. Bucket names are the package-level
// bucket* variables, created once by Open. Keys sort bytewise: integers are
// big-endian, composite keys are joined by a 0x00 byte (tenants, targets, run
// ids and call ids never contain 0x00), times are Unix nanoseconds, never
// RFC 3339 strings.
//
//	bucket       key                        value
//	meta         "schema"                   uint32 big-endian schema version (3); see the version rule below
//	breakers     tenant 0x00 target         fleet.Breaker, binary, version byte 2 (1 is still read): state, forced,
//	                                        mode, open-until, cool-down, counters, the 10 window slots, generation,
//	                                        probe permits (128-bit id, expiry); the layout is in record.go
//	budgets      tenant                     explicit TenantBudget, JSON (admin object)
//	tokens       tenant                     token bucket, binary: tokens, last refill, granted, refused, dry-run refusals
//	policies     tenant 0x00 target         PolicyEntry, JSON (admin object); an empty tenant or target is a wider scope
//	runs         run id                     run header, JSON: tenant, description, pool, cut-off, created, the run
//	                                        it re-drives (admin object)
//	runstate     run id                     spent retries and ledger, binary: 11 x uint64 big-endian, the last
//	                                        counters dead_letter_deadline and deduplicated (a record of 9,
//	                                        written before them, is read; the ledger is recomputed from runcalls
//	                                        at open; both are written in one commit)
//	runcalls     run id 0x00 call id        final disposition of one call, 2 bytes: policy.Disposition, policy.StopReason,
//	                                        and a third, 1, for a success the idempotency ledger answered
//	calltable    run id 0x00 call id        the run's call table for triage (fleet.CallRecord), binary, version
//	                                        byte 1, or 2 with a primary target: disposition, stop reason,
//	                                        attempts, first and last attempt times, then target, classification,
//	                                        detail, triage reference (and in 2 the primary target); at
//	                                        most Options.MaxRunCalls a run; the layout is in calltable.go. New in
//	                                        schema version 2 (created empty on open)
//	attempts     tenant 0x00 call id        fleet.Attempts, binary, version byte 1 (2 with a fallback target):
//	                                        the highest attempt decided for
//	                                        the call, its expiry (the call's deadline or the policy's horizon,
//	                                        whichever is later), and the answer (verdict, delay, attempt timeout,
//	                                        stop reason, disposition, category, checks, breaker state, budgets
//	                                        left, classification, pushback note); at most Options.MaxAttemptRecords,
//	                                        oldest dropped first, expired ones deleted by the sweep; the layout is
//	                                        in attempts.go. New in schema version 2 (created empty on upgrade).
//	idemkeys     tenant 0x00 key            an idempotency record (fleet.KeyRecord), binary, version byte 1: state,
//	                                        lease id, lease end, expiry, then the result reference; committed
//	                                        (fsync'd) before ClaimKey and CompleteKey answer; the layout is in
//	                                        idem.go; expired ones deleted by the sweep. New in schema version 2
//	                                        (created empty on open)
//	flow         tenant 0x00 target         fleet.Flow, binary, version byte 2 (1 is still read): the rate
//	                                        account's TAT (Unix ns), stray lease releases (uint64), the adaptive
//	                                        ceiling (fleet.AdaptiveLimit: limit, last decrease, outcomes since,
//	                                        decreases), lease count (uint32), then per lease its 128-bit id and
//	                                        expiry (Unix ns); the key is the breaker's; deleted when it holds
//	                                        nothing; the layout is in flow.go. New in schema version 2 (created
//	                                        empty on upgrade); version byte 2 in schema version 3
//	attemptstats tenant 0x00 target 0x00    fleet.AttemptStats, one record per hour bucket, version byte 1: the
//	             hour                       16 success counts then the 16 final-failure counts by attempt number
//	                                        (the last: 16 or more), uint64 big-endian each (257 bytes); hour is
//	                                        int64 big-endian, hours since the Unix epoch; target is the attempt's
//	                                        (a fallback's attempts count for it), at most Options.MaxBreakersPerTenant
//	                                        targets a tenant; counters, written by the group
//	                                        commit; hours past the 168 h retention deleted when the target is next
//	                                        counted and at open. New in schema version 3 (created empty on open)
//	meta         "auditseq"                 uint64 big-endian: the highest audit sequence number handed out
//	auditseg     time seq                   a segment of up to 512 audit records: a header (count, last record's
//	                                        time and seq, a Bloom filter over call ids and tenants) and the
//	                                        records, each a key delta and a binary body of version byte 1: event,
//	                                        verdict, stop reason, disposition, attempt (uvarint), delay ns
//	                                        (varint), then tenant, target, call id, run id, classification,
//	                                        detail (uvarint length + bytes); the full format is in internal/auditseg
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
// retention is exact to the record.
//
// The version rule: any change to this layout (a bucket, a key or a value
// format) bumps schemaVersion and adds a step to migrations, the step from
// the version before. A new bucket that an older build of the same version
// never reads (calltable, attempts, idemkeys, flow within version 2;
// attemptstats within version 3) is the one addition made without a bump:
// Open creates it empty, no record of another bucket changes, and a file
// written with it opens in a build without it, which ignores it (and so
// neither counts nor deletes the attempt statistics while it runs). Open reads meta/schema; a file of an older version is
// migrated forward, step by step, and the new version recorded, in one
// transaction (a file is migrated in full or not at all); a file of a newer
// version is refused with ErrSchema naming both versions ("schema version 4
// is newer than this policyd (3)"), so an older build never reads a layout
// it does not know. A file of the current version is not written to by
// Open. The versions so far:
//
//	1  the buckets above, the audit trail first a key per record (buckets
//	   audit, auditcall, audittenant), later, still within version 1,
//	   in segments (auditseg)
//	2  the audit trail in segments only: the step from 1 moves a trail of
//	   the one-key-per-record layout into segments and deletes its buckets
//	3  call table records of version byte 2 and audit records of version
//	   byte 2, both with a primary target, attempts records of version byte
//	   2, with the next attempt's target (a call that escalated to a
//	   fallback), and flow records of version byte 2, with the adaptive
//	   ceiling: the step from 2 rewrites the flow records of version byte 1
//	   (a ceiling never started) and nothing else
//
// Before bbolt maps a file, Open and Check read it through read(2) and
// verify what bbolt would otherwise fault on (filecheck.go): both meta
// pages (magic, version, checksum), the size against the high-water mark,
// the freelist, and every page of every bucket. A damaged, empty (0 bytes)
// or foreign file is refused with ErrCorrupt naming the file and every
// problem found; only a path that does not exist is created. A bad meta
// page is refused even when the other is sound: the meta fields sit in the
// page's first sector, so a crash does not tear them, and a bad checksum
// means the file was damaged after it was written.
//
// A breaker keyed by target only (policy.ScopeTarget) has the empty tenant, so
// its key starts with 0x00. Runs and explicit budgets are never expired; idle
// CLOSED breakers and idle default-budget token buckets are removed from
// memory and disk after Options.IdleTTL.
package breakerstore
