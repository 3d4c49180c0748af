// Package storetest is the contract suite of server.Store: the behaviours
// of fleet state that the handlers rely on, written once and run against
// every engine, so that a second engine is held to the first one's
// guarantees without a copy of the tests.
//
// It lives beside server because it tests the interface server declares
// and consumes; an engine's own tests import it (test code only, so no
// engine imports server in what it ships). The behaviours, one subtest
// each:
//
//	probes          exactly HalfOpenProbes of 64 concurrent Admits in HALF_OPEN get a permit, each distinct
//	budgets         a tenant budget and a run pool are never overspent under concurrent spends, deposits and
//	                a moving clock (property style: several random seeds)
//	cooldown        a cool-down only moves later, also under concurrent extensions
//	transitions     a transition happens once per generation: one OPEN for 64 concurrent failing workers, one
//	                HALF_OPEN for 64 concurrent Admits, one re-OPEN for concurrent probe failures
//	final           a call's final disposition is counted once in its run's ledger, however many reports race,
//	                and the first wins: a later different one is refused (naming final_disposition and the
//	                disposition in force, also as a batch's refused item), the ledger unchanged
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
//
// Time is the suite's Clock, handed to the engine at Open; the suite moves
// it, never sleeps. Events of a subscription may arrive asynchronously (an
// engine over a network delivers them later than the change): the suite
// waits for each event it expects, bounded, and counts transitions by the
// breaker's Generation rather than by the absence of events.
//
// The suite reads what it changed back through the same store right after
// the call that changed it returns (a run's ledger after ApplyOutcomes, a
// bucket's tokens after SpendRetry). An engine that applies some changes
// later (outcome batches, deposits, per flush) must show them to its own
// reads at once, or be opened by the suite's Open with that batching off.
// Deposits that lag are safe: the budget bound only tightens.
//
// How an engine runs it: one test in the engine's package calls Run with
// an Open that starts the engine over fresh state and a restart that stops
// it the way a crash would. breakerstore does it in contract_test.go (a
// bbolt file in t.TempDir(), restart without the final flush); an engine
// over a server (Redis, say) starts its server in the test, as STYLE.md
// asks, gives every test its own keyspace (a database or a key prefix),
// and restarts by dropping its client without flushing and connecting a
// new one (or by restarting the server on its append-only file):
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, clock *storetest.Clock) (server.Store, func() server.Store) {
//			s := openEngine(t, clock)
//			return s, func() server.Store { s.crash(); return openEngine(t, clock) }
//		})
//	}
package storetest
