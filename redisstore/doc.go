// Package redisstore is policyd's Redis engine: fleet state (breakers,
// cool-downs, tenant token buckets, run pools, ledgers and call tables,
// the idempotency ledger, the fleet-wide ceilings) held in one
// Redis (7.x standalone, Sentinel or Cluster; Valkey too: only commands of
// Debian's redis-server are used) that many stateless policyd replicas
// share. The rules of that state live in package fleet as Go values; here
// every change that must be atomic is one call of a Redis Function of the
// library in policyd.lua, which mirrors fleet's methods line for line at
// the server's TIME, so no replica's clock and no lock around a caller's
// call takes part in a decision. The tests run the same scenarios through
// fleet and through the library and compare them step by step.
//
// Time. Every function of the library takes the caller's clock as its
// first argument, put there by the one Go helper every call goes through
// (lib.run) and taken off by the one Lua helper every function is
// registered with (register), so no function can decide at another time
// than the others: the argument is empty in production (Options.Clock
// nil), and the function reads the server's TIME; when Options.Clock is
// set it is that clock's time in Unix µs, and the function decides at it.
// That is how the contract suite (server/storetest) moves a fake clock
// over a real Redis without sleeping: replicas of one test share its
// clock. Two things stay on the server's own clock either way: the expiry
// of attempt records (PEXPIREAT) and the audit streams' entry ids (and so
// their trimming by age).
//
// The client is github.com/redis/go-redis/v9: one UniversalClient type
// covers standalone, Sentinel (failover) and Cluster with the URL forms
// policyd accepts, it has FCALL and FUNCTION LOAD, and it is the client the
// Redis project maintains as its Go reference. rueidis' strengths do not
// apply here: its client-side caching tracks keys, but a replica here
// caches breaker states from the ordered per-tenant event stream (which it
// needs anyway for WatchBreakers), and its auto-pipelining batches many
// small commands, where this engine sends few and large ones: one function
// call per failure decision and, for outcomes, one per tenant per flush
// interval (Options.BatchOutcomes: a replica holds the updates
// that need no answer and merges them per tenant, held.go), or per
// ReportOutcome for a batch whose answer needs the engine (a run's final
// disposition, a probe permit); a note of a run's call table sent at once
// goes after its tenant's held batch (whose notes were made before), and a
// decision's failure takes its breaker's held results along in its own
// call (policyd_record, policyd_nextdelay).
//
// A NextDelay (server.OneCallNextDelay, nextdelay.go) of a call whose
// policy has no fallback targets and whose attempt held no lease is one
// call of policyd_nextdelay: the attempt check (fleet.Attempts.Check), the
// breaker's record of the failure, the pushback cool-down, the fleet-wide
// rules (fleet.GateRetry), the spend, fleet.Spent, fleet.CutRun and the
// attempt record with its verdict, in one step on the tenant's slot. The
// writes that need no answer go with the replica's next flush: the audit
// record through the audit buffer (AppendAudit), the run's call-table
// note and a STOP's attempt tally in an outcome batch of the tenant's,
// held like outcomes (Options.BatchOutcomes; sent at once without it).
// Like bbolt's --sync=group, a replica killed loses at most one flush
// interval of them; the attempt record is written in the call, on disk
// before the answer with appendfsync always. A fallback chain or a lease
// adds its own calls (the batch of Changes: the attempt check, the
// breaker, the cool-down, the spend, then one pipeline of the attempt,
// audit and note writes), and degraded mode decides through that batch
// too. A request's calls share one Options.Timeout from its Begin (the
// Store view of changes.s, Store.bound), policyd_nextdelay's too, so a
// decision of several calls waits for a stalled Redis no longer than one
// of one call. A call of a run costs one read of the run the first time this
// replica sees the run (KnownRun: its tenant and cut-off never change).
//
// An Admit of a target with a fleet-wide ceiling (AdmitFlow) is one call
// of policyd_admit_flow whatever its breaker's state: the rate slot, the
// lease and the breaker's admission in one step, what was taken given
// back in the same step when a later one refuses. A target without a
// ceiling is answered from the cache while its breaker is CLOSED.
//
// A replica follows the event streams of the tenants it has used with one
// blocking XREAD per group of them (one group on a standalone server, one
// per hash slot in use on a Cluster), from the last entry id seen, so a
// reconnect misses nothing the streams hold.
//
// Key layout, schema version 2. Every key of one tenant starts with the
// tenant's hash tag, so the tenant's breakers, cool-downs, bucket and runs
// live in one slot and one function call decides over all of them, also
// on Redis Cluster. The tag is "{=" tenant "}" for a name without braces,
// else "{#" hex(tenant) "}"; the empty tenant of target-scoped breakers is
// "{#}". The fleet-wide admin objects share the tag {policyd}, which no
// tenant's tag can be, so an admin write and its change entry commit in
// one MULTI. Times are Unix microseconds (Lua numbers are doubles, exact to
// 2^53: Unix nanoseconds are not), integers in decimal, unless noted.
//
//	key                      type    value
//	{policyd}:schema         string  "2"; written at first start; "1" is migrated forward at start
//	                                 (loadLibrary), another value refuses to start
//	{policyd}:tenants        set     every tenant a replica has used (the empty one included)
//	{policyd}:policies       hash    tenant 0x00 target -> PolicyEntry, JSON (admin object, Updated in ns)
//	{policyd}:budgets        hash    tenant -> explicit TenantBudget, JSON (admin object)
//	{policyd}:runs           hash    run id -> tenant: run ids are unique fleet-wide
//	{policyd}:changes        stream  one entry per admin write: kind (policy, budget), tenant, target,
//	                                 and per tenant new to the fleet (kind tenant); every replica
//	                                 follows it and reloads what changed; MAXLEN ~ 10000
//	{policyd}:wake:R         stream  replica R's wake-up of its read of {policyd}:changes: an entry at
//	                                 Close ends the read at once; MAXLEN 1, expires an hour after it
//	{T}:breaker:TARGET       string  fleet.Breaker as a record: 41 little-endian 64-bit integers
//	                                 (state, forced, mode, open_until, changed, gen, cooldown,
//	                                 last_failure, consecutive, half_open_ok, slot_width, then
//	                                 epoch, calls, failures of each of the 10 window slots), then
//	                                 its permits as text ("hexid:expiry", space-separated); the
//	                                 library packs and reads it with one struct call. A hash of
//	                                 those fields as text (the layout before it) is read as it is
//	                                 and written as a record at its next change
//	{T}:breakers             set     the tenant's breaker targets
//	{T}:events               stream  one entry per breaker transition or new cool-down of the tenant,
//	                                 in order: target, state (the 11-number snapshot); MAXLEN ~ 100000
//	{T}:wake:R               stream  replica R's wake-up of its feed read of T's slot (T the first
//	                                 tenant R followed there): an entry when R follows a tenant more,
//	                                 so that the read blocked meanwhile ends at once; MAXLEN 1, expires
//	                                 an hour after its last entry
//	{T}:bucket               string  fleet.Bucket as a record: tokens (a double), last (µs), granted,
//	                                 refused, dry (little-endian 64-bit); then per replica id R that
//	                                 spent from it its degraded-mode share (see degraded.go): R's length
//	                                 (a byte) and R, hold and lock (doubles), version, last call (µs)
//	                                 (bucketrecord.go). A hash of those fields as text (tokens, last,
//	                                 granted, refused, dry; h:R, l:R, v:R, a:R), the layout before it,
//	                                 is read as it is and written as a record at its next change
//	{T}:run:ID               hash    pool, cutoff, spent, tenant, description, created, redrive_of (the
//	                                 run it re-drives, "" for none), calls_untracked (calls beyond the
//	                                 call table's cap), and the ledger counters (succeeded,
//	                                 failed_terminal, dl_exhausted, dl_budget, dl_not_idempotent,
//	                                 dl_pushback, dl_deadline, circuit_open, deadline_cut, and
//	                                 deduplicated: of succeeded, those the idempotency ledger answered);
//	                                 the replicas' shares of its pool: h:R hold, l:R lock (%.17g), v:R
//	                                 version, a:R last call (µs)
//	{T}:runcalls:ID          hash    call id -> "disposition:stop/ledger field" of its final disposition,
//	                                 "/dedup" after it for a deduplicated success
//	{T}:calls:ID             hash    the run's call table (fleet.CallTable, at most Options.MaxRunCalls):
//	                                 call id -> "1 disposition stop attempts first last" and the byte
//	                                 lengths of target, classification, detail and triage reference,
//	                                 a newline, then those four strings (times in µs, 0 for none);
//	                                 "2 ..." for a call that ended on a fallback: one more length and
//	                                 string, its primary target
//	{T}:callids:ID           zset    the call table's ids, score 0, for listing in id order (BYLEX)
//	{T}:idem:KEY             hash    fleet.KeyRecord of idempotency key KEY: state, lease (hex, "" for
//	                                 none), lease_until, expires, result; the key expires then
//	                                 (PEXPIREAT, rounded up to the ms); written like an admin write
//	{T}:idemkeys             zset    the tenant's idempotency keys by expiry (score, µs): the live ones
//	                                 count against Options.MaxKeysPerTenant
//	{T}:applied              set     ids of the outcome batches applied (policyd_outcomes skips a
//	                                 batch id it holds: a replay) and of the degraded-mode grants
//	                                 charged (policyd_charge, likewise); expires 10 minutes after the last
//	{policyd}:replicas       zset    replica id -> last heartbeat (Unix ms); the live ones divide
//	                                 probes, tokens and pools in degraded mode
//	{T}:flow:TARGET          hash    the ceilings of breaker key T/TARGET (fleet.Flow, fleet.AdaptiveLimit):
//	                                 tat (the GCRA rate account's theoretical arrival time), stray
//	                                 (releases of leases not held), alimit (the adaptive limit, %.17g;
//	                                 0 before it moved), adec (its last decrease, 0 for none), asince
//	                                 (outcomes since then), adecs (its decreases so far); written by
//	                                 policyd_admit_flow, so a release under a key without it is only
//	                                 ignored
//	{T}:leases:TARGET        zset    the concurrency leases of T/TARGET: lease id (32 hex digits) by
//	                                 expiry (score, µs); the expired ones are dropped at the next
//	                                 Admit and no longer count
//	{T}:stats:HOUR           hash    fleet.AttemptStats of one hour bucket (HOUR: hours since the Unix
//	                                 epoch, by the replica's clock when the batch was made): field "s" or
//	                                 "f" (a success, a final failure), the attempt slot 1..16 (16: 16 or
//	                                 more), ":" and the attempt's target -> the count; HINCRBY by
//	                                 policyd_outcomes (a batch's successes and finals, a final only when
//	                                 the ledger took it as the call's first) and by NextDelay's commit
//	                                 pipeline (its STOP); expires 169 h after its last count (the 168 h
//	                                 retention and an hour)
//	{T}:attempt:CALL         hash    fleet.Attempts: attempt, answer (policy.Answer packed, see
//	                                 attemptanswer.go; or its JSON, first byte '{', as written before),
//	                                 expiry (Unix ms), and verdict when policyd_nextdelay decided it:
//	                                 "retry delay stop disposition breaker checks tokens remaining
//	                                 spread" (delay ns, tokens %.17g, spread 0 or 1), laid over the
//	                                 answer (attemptFields.decode); the key expires then (PEXPIREAT)
//	{T}:audit                stream  the tenant's audit records, in chunks: an entry holds up to 1024 of one
//	                                 flush (or commit), fields n (their count) and b (the records packed by
//	                                 appendAuditChunk, auditentry.go, each after the one before it: the
//	                                 strings equal to its left out) or, in its place, z (b's bytes as an S2
//	                                 block, for a chunk of 256 bytes or more that it makes smaller); entries written before chunks hold
//	                                 one record each, in field r (appendAuditEntry) or in one field an
//	                                 attribute (t (ns), ev, tenant, target, call, run, attempt, class,
//	                                 verdict, delay (ns), stop, disp, detail, primary). Record i of entry
//	                                 ms-seq has the Seq ms << 20 | (seq + i): an entry of n records leaves
//	                                 the n-1 sequences after its id free. policyd_audit adds the entries
//	                                 and trims the stream at each, to AuditMaxRecords records exactly and
//	                                 to AuditRetention by entry id (the server's clock; XTRIM MINID)
//	{T}:auditmeta            hash    the audit stream's count and head, kept by policyd_audit: records
//	                                 (the records kept), head (the first entry's id), headn (its records),
//	                                 skip (of them, those the cap removed: readers skip them), next (the
//	                                 first id free after the last entry's records); a stream without it
//	                                 was written before chunks and is counted (one record an entry) at
//	                                 its next write
//	{T}:auditchunks          zset    ids of the audit chunks added (drawn by the replica) by the server's
//	                                 time (ms): a chunk sent again after its answer was lost adds
//	                                 nothing; the ids older than 10 minutes are removed at each write
//
// The call tables, the idempotency keys, the run hash's redrive_of,
// calls_untracked, dl_deadline and deduplicated, the call table's records
// of version 2, the audit entries' primary field, and the flow hashes and
// leases sets (with the functions policyd_admit_flow,
// policyd_release_lease and policyd_pool) were new in schema version 1,
// before its release, under the library policyd_v1. Leases and rate
// accounts are counters, durable as the server's AOF makes them (like
// probe permits), never waited for with WAIT.
// The {T}:stats:HOUR hashes are such an addition too: no key before
// them changes, and the policyd_outcomes call carries their counts
// between its finals and its batch id, where a library without them reads
// past them (it counts nothing) and a call without them counts nothing.
//
// Schema version 2 adds the attempt record's verdict field (and the
// library's policyd_nextdelay): every key of version 1 reads the same, so
// a replica opening a Redis of version 1 migrates it forward, deleting
// the library policyd_v1 (its functions have the names of policyd_v2's:
// a replica of version 1 still running then fails its calls rather than
// write attempt records without clearing a verdict) and writing "2".
// Version 2 also adds, before its release, the replicas' shares of
// buckets and runs (the h:R, l:R, v:R and a:R fields; a library without
// them reads a bucket's tokens and a run's spent as before), and the
// library's policyd_attempts (a tenant's attempt records in one read),
// policyd_read_many (a tenant's breakers in one read, for listings),
// policyd_audit (a tenant's audit records in one call) and
// policyd_release_shares; policyd_spend and policyd_charge take and
// return the caller's shares. So is the attempt record's answer packed
// (attemptanswer.go, fleet's layout of an answer) instead of
// policy.Answer's JSON: a packed answer never starts with '{', and both
// the replica (decodeAnswer) and the library (attempt_check, for a record
// without a verdict) read a JSON answer as before, so the records a
// replica of version 1, or of version 2 before this, wrote replay and
// refuse as they did. Before its release too, the audit streams hold
// chunks (fields n and b, or n and z: policyd_audit takes the field as an
// argument, b when a caller gives none) with their {T}:auditmeta and {T}:auditchunks,
// written by policyd_audit only (a decision's commit included), which
// counts a stream of version 2's one-record entries at its first write;
// the readers read those entries still, mixed with chunks, and their Seqs
// are the ones they had. So are the policyd_outcomes call's results runs
// (a triple of result, count and permit id per run of consecutive equal
// results without a permit, or per result with one) instead of one pair
// per result: the keys it writes
// are the same, but a replica of version 2 from before this and the
// library after it misread each other's calls, so they must not share a
// Redis. So are policyd_nextdelay's numbers one argument, packed
// (little-endian integers, doubles and flags, read with the server's
// struct.unpack: nextdelaynumbers.go and policyd.lua have the layout),
// with its strings as arguments of their own, instead of an argument per
// number in decimal: the keys it reads and writes are the same, but a
// replica of version 2 from before this and the library after it fail
// each other's calls (neither reads the other's form), so they must not
// share a Redis either. So is policyd_outcomes' reply of a group's
// refusals the indexes of its refused runs (only a run with a permit can
// be) instead of a flag per run: a replica of version 2 from before this
// and the library after it misread each other's replies. So is a tenant's
// bucket a record, its shares in it, instead of a hash of text fields: the
// library reads a bucket of either layout and writes a record, but a
// replica of version 2 from before this fails its calls over a record
// (WRONGTYPE), so they must not share a Redis either. So are a
// policyd_outcomes group's numbers one argument, packed (its breaker's
// configuration and its runs: policyd.lua OUTCOMES_GROUP and
// OUTCOMES_RUN, outcomes.go outcomesGroup), instead of an argument per
// number and three per run: a replica of version 2 from before this and
// the library after it misread each other's calls, so they must not share
// a Redis either.
//
// The library's name carries its version (policyd_v2): a layout change
// bumps both the schema key and the library name, so replicas of two
// versions never run each other's code over one layout.
package redisstore
