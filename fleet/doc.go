// Package fleet holds the rules of policyd's fleet-wide state as plain
// values: each kind of state is a struct of numbers with methods that take
// the time (now, Unix nanoseconds) and, where the rule needs chance, the
// random draw, change the value in place and report what happened. There
// is no I/O, no lock and no clock here; an engine (breakerstore over bbolt,
// redisstore over Redis, whose Lua library mirrors these methods) holds
// the values, guards them, persists them and publishes their changes, and
// applies these methods to change them. That every engine keeps the
// invariants below, also across replicas, is the one contract suite's
// business (server/storetest), run on bbolt, Redis standalone and Redis
// Cluster.
//
// Where each kind's rules live:
//
//	kind                 type       file          invariant kept here
//	breaker              Breaker    breaker.go    CONSECUTIVE and FAILURE_RATE trips, OPEN until, a transition once
//	                                              per HALF_OPEN generation, at most N probe permits per generation,
//	                                              only a live permit of the breaker settles a probe, permits expire,
//	                                              forced states
//	pushback cool-down   Cooldown   cooldown.go   only moves later
//	tenant budget        Bucket     bucket.go     tokens never below zero (dry run aside); deposits capped at capacity
//	run pool and ledger  Run        run.go        never overspent; the first final disposition of a call id wins
//	                                              (a later different one is refused: AlreadyFinal);
//	                                              a disposition agrees with what was decided
//	attempts per call    Attempts   attempts.go   never rewound: the same attempt replays its answer, a lower one
//	                                              is refused
//	concurrency ceiling  Pool       lease.go      at most the ceiling live at once; leases expire; a release of a
//	                                              lease not held is ignored and counted
//	breaker result       (func)     pushback.go   a pushback-bearing failure counts nothing unless the policy says so
//	attempt statistics   AttemptStats attemptstats.go  per hour, successes and final failures by attempt (1..15,
//	                                              16 or more); buckets older than 168 h dropped
//	adaptive ceiling     AdaptiveLimit adaptive.go   AIMD: a decrease at most once per window of outcomes, never
//	                                              below the floor
//	a retry's fleet      (funcs)    retry.go      GateRetry, Spent, CutRun: an OPEN breaker stops a retry, a
//	rules                                         longer fleet cool-down spreads its delay, the deadline is checked
//	                                              again, the budgets' refusal stops it, a run's cut-off makes the
//	                                              stop a cut; the server's batch path and policyd_nextdelay apply
//	                                              them alike
//
// answer.go packs a policy.Answer as both engines store it with a call's
// attempts (AppendAnswer, ReadAnswer): one byte layout, not one per engine.
//
// Every method is allocation-free unless its doc comment says otherwise,
// so an engine can apply them on the hot path (Admit, NextDelay,
// ReportOutcome). A value's zero state is meaningful (a CLOSED breaker, a
// cool-down never set); constructors exist only where a value needs its
// configuration from the start.
//
// fleet imports only the standard library and policy; engines and the
// server import fleet, never the other way round.
package fleet
