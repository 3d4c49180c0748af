// Package storetest is the one contract suite of server.Store: the
// behaviours of fleet state that the handlers rely on, within one engine
// and across replicas sharing one engine, written once and run unchanged
// against every engine: bbolt (breakerstore), Redis standalone and Redis
// Cluster (redisstore). No engine has a suite of its own.
//
// It lives beside server because it tests the interface server declares
// and consumes; an engine's own tests import it (test code only, so no
// engine imports server in what it ships). The behaviours, one subtest
// each; "over the replicas" means the concurrent calls are spread over
// three replicas (Engine.Replica), for an embedded engine three times the
// one store:
//
//	probes          exactly HalfOpenProbes of 64 concurrent Admits in HALF_OPEN, over the replicas, get a
//	                permit, each distinct
//	budgets         a tenant budget and a run pool are never overspent under concurrent spends, deposits and
//	                a moving clock, over the replicas (property style: several random seeds)
//	cooldown        a cool-down only moves later, also under concurrent extensions
//	transitions     a transition happens once per generation: one OPEN for 64 concurrent failing workers, one
//	                HALF_OPEN for 64 concurrent Admits, one re-OPEN for concurrent probe failures, over the
//	                replicas
//	order           (order.go) on one replica a breaker takes reported outcomes and a decision's Record in the order
//	                made: a reported success ends a run of failures, reported failures count before the Record
//	                after them, in its answer; an admin reset comes after the outcomes reported before it; a
//	                run's call table takes an outcome's note before the next decision's
//	final           a call's final disposition is counted once in its run's ledger, however many reports race
//	                from the replicas, and the first wins: a later different one is refused (naming
//	                final_disposition and the disposition in force, also as a batch's refused item), the
//	                ledger unchanged; the same one again is taken
//	durability      admin writes (policies, budgets, runs, forced and reset breakers, deletions) and breaker
//	                transitions survive a crash: a store reopened without a final flush has them
//	subscriptions   a subscriber gets the snapshot, then every transition of its tenant's breakers in order,
//	                and nothing of other tenants
//	attempts        attempts are never rewound: the same attempt replays its answer, a lower one and any after
//	                a STOP are refused with a precondition failure naming attempt; a claim let go without an
//	                answer leaves the attempt to the next request
//	duplicates      64 concurrent NextDelays of one attempt of one call are decided once (one claim, one
//	                spend) and all get the one answer
//	permits         a probe permit settles only its own breaker's current HALF_OPEN generation: another
//	                breaker's, an earlier generation's, an expired or an invented permit is refused and changes
//	                nothing
//	replicas        an admin write (policy, budget) on one replica shows on every replica; a breaker forced
//	                OPEN on one refuses on another that had it CLOSED; concurrent cool-down extensions from
//	                every replica keep the latest; a subscriber on one replica sees the transitions the others
//	                make, in order
//	escalation      a run's call table keeps the target a call ended on and its primary (a call back on its
//	                primary has none), on every replica; an audit record keeps its primary target; a RETRY's
//	                target replays with it on every replica
//	leases          exactly the ceiling of 64 concurrent AdmitFlows over the replicas get a lease, each distinct,
//	                the rest concurrency:full with FullWait; a lease returned on another replica frees its
//	                slot, returned again (or invented, or unparseable) it is ignored and counted as stray;
//	                leases expire; a breaker that refuses takes none; no ceiling at all is invalid
//	rate            a rate ceiling over the replicas admits its burst of 64 concurrent AdmitFlows at one instant,
//	                then one per interval, each refusal with the exact wait; slots taken by attempts that a
//	                full concurrency ceiling or the breaker refused are given back
//	adaptive        (flow.go) an adaptive ceiling starts at its maximum; a congestion signal released on one replica cuts
//	                it for all, successes grow it by Increase/limit, a second cut waits for a window of
//	                outcomes and Hold, a signal counts with a lease not held (engines with Engine.Adaptive)
//	ceilings        (adaptive.go) an adaptive concurrency ceiling (fleet.AdaptiveLimit) over the replicas: a fresh one admits
//	                exactly its maximum of 64 concurrent Admits; concurrent congestion signals within the hold cut
//	                it once; it then admits exactly its Ceiling; a window of successes adds Increase; a lease
//	                released after its expiry still teaches; the floor and the maximum hold. Only for an engine
//	                whose Engine.Adaptive is set (skipped otherwise)
//	attempt stats   the attempt statistics count each call's end once, by tenant, target, hour and attempt,
//	                through both write paths, on every replica alike
//	nextdelays      (nextdelay.go) NextDelay decisions through the server over the engine, by whatever path the
//	                engine takes them (a batch of Changes, or one step: server.OneCallNextDelay), against the
//	                rules: a retry and its spend, a replay on another replica, a lower attempt and one after a
//	                STOP refused, an open circuit, a delay spread over the fleet's cool-down, the deadline it
//	                breaks, a tenant's budget and a run's pool spent; and the audit records, call-table notes
//	                and attempt tallies the decisions leave, on every replica
//
// Time is the suite's Clock, handed to the engine at Open; the suite moves
// it, never sleeps. An engine over a server decides at that clock too
// (redisstore's Options.Clock passes it to every function call instead of
// the server's TIME). Events of a subscription and what one replica learns
// from another may arrive asynchronously (an engine over a network
// delivers them later than the change): the suite waits for each event or
// state it expects, bounded, and counts transitions by the breaker's
// Generation rather than by the absence of events.
//
// The suite reads what it changed back through the same store right after
// the call that changed it returns (a run's ledger after ApplyOutcomes, a
// bucket's tokens after SpendRetry), with one exception, Engine.Settle: an
// engine may hold the counters and deposits of reported outcomes (the
// results of ApplyOutcomes without a probe permit, its deposits and
// attempt tallies) and what a NextDelay decided in one step leaves for
// later (OneCallNextDelay's DecidedInOneCall: the run's call-table note
// and the attempt tally of the decision) for a flush, and so promise only
// that they reach the engine, and every replica, within one flush
// interval. Such an engine
// sets Settle to send them on at once; the suite calls it right before it
// reads such counters, and nowhere else: every answer (a refusal, a
// permit's settling, a final disposition and its ledger) and every other
// read must hold without it. Deposits that lag are safe: the budget bound
// only tightens. redisstore runs the whole suite with its outcomes held
// per flush (Options.BatchOutcomes, as policyd serve opens it), and the
// behaviours that report outcomes again with them sent before
// ApplyOutcomes returns (--sync=always).
//
// How an engine runs it: one test in the engine's package calls Run with
// an Open that starts the engine over fresh state and returns an Engine:
// the store, a Restart that stops it the way a crash would, and, for an
// engine many processes share, a Replica constructor. breakerstore does it
// in contract_test.go (a bbolt file in t.TempDir(), Restart without the
// final flush, no Replica); redisstore in contract_test.go (one
// redis-server on AOF, or one 3-master Cluster, shared by the subtests,
// each starting from FLUSHALL; Restart kills the server and starts it
// again on its append-only file; Replica opens another Store on another
// client; with outcomes held, Settle flushes every Store the test opened):
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Engine {
//			s := openEngine(t, clock)
//			return storetest.Engine{Store: s,
//				Restart: func() server.Store { s.crash(); return openEngine(t, clock) },
//				Replica: func() server.Store { return openEngine(t, clock) }}
//		})
//	}
package storetest
