// Package redisstore is policyd's Redis engine: fleet state (breakers,
// cool-downs, tenant token buckets, run pools and ledgers) held in one
// Redis (7.x standalone, Sentinel or Cluster; Valkey too: only commands of
// Debian's redis-server are used) that many stateless policyd replicas
// share. The rules of that state live in package fleet as Go values; here
// every change that must be atomic is one call of a Redis Function of the
// library in policyd.lua, which mirrors fleet's methods line for line at
// the server's TIME, so no replica's clock and no lock around a caller's
// call takes part in a decision. The tests run the same scenarios through
// fleet and through the library and compare them step by step.
//
// The client is github.com/redis/go-redis/v9: one UniversalClient type
// covers standalone, Sentinel (failover) and Cluster with the URL forms
// policyd accepts, it has FCALL and FUNCTION LOAD, and it is the client the
// Redis project maintains as its Go reference. rueidis' strengths do not
// apply here: its client-side caching tracks keys, but a replica here
// caches breaker states from the ordered per-tenant event stream (which it
// needs anyway for WatchBreakers), and its auto-pipelining batches many
// small commands, where this engine sends one function call per failure
// decision and one per tenant per outcome flush.
//
// Key layout, schema version 1. Every key of one tenant starts with the
// tenant's hash tag, so the tenant's breakers, cool-downs, bucket and runs
// live in one slot and one function call decides over all of them, also
// on Redis Cluster. The tag is "{=" tenant "}" for a name without braces,
// else "{#" hex(tenant) "}"; the empty tenant of target-scoped breakers is
// "{#}". Times are Unix microseconds (Lua numbers are doubles, exact to
// 2^53: Unix nanoseconds are not), integers in decimal.
//
//	key                          type    value
//	policyd:schema               string  "1"; written at first start, another value refuses to start
//	{T}:breaker:TARGET           hash    fleet.Breaker: state, forced, mode, open_until, changed, gen,
//	                                     cooldown, last_failure, consecutive, half_open_ok, slot_width,
//	                                     slots ("epoch:calls:failures" x 10, space-separated), permits
//	                                     ("hexid:expiry", space-separated)
//	{T}:events                   stream  one entry per breaker transition or new cool-down of the tenant,
//	                                     in order: target, state (the 11-number snapshot); MAXLEN ~ 100000
//	{T}:bucket                   hash    fleet.Bucket: tokens (%.17g), last, granted, refused, dry
//	{T}:run:ID                   hash    pool, cutoff, spent, and the ledger counters (succeeded,
//	                                     failed_terminal, dl_exhausted, dl_budget, dl_not_idempotent,
//	                                     dl_pushback, circuit_open, deadline_cut)
//	{T}:runcalls:ID              hash    call id -> "disposition:stop/ledger field" of its final disposition
//
// The library's name carries its version (policyd_v1): a layout change
// bumps both the schema key and the library name, so replicas of two
// versions never run each other's code over one layout.
package redisstore
