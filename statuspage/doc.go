// Package statuspage serves policyd's live status page: the fleet's
// breakers, their ceilings (leases in flight, rate, adaptive value), the
// policies' escalation chains with each target's breaker, tenants' retry
// budgets, active runs with their dead-letter lists, cool-downs, the
// replicas and the store's health, as server-rendered HTML at /status, as
// JSON at /status.json, and as a stream of server-sent events at
// /status/events that the page's few lines of JavaScript (an EventSource)
// use to replace its body whenever a breaker changes: the breakers'
// states, and with them their chains' states and their ceilings, arrive
// on the change; what moves without one (leases, tokens, ledgers,
// replicas) every Config.Refresh.
//
// # Endpoints
//
//	GET /status            the page (html/template, assets embedded)
//	GET /status.json       the same data as a JSON document (Status)
//	GET /status/events     text/event-stream; one "status" event carries
//	                       the page's rendered <main>, sent at once, on
//	                       every breaker change (the store's subscription)
//	                       and, when something else moved (tokens, ledgers,
//	                       the ages shown), every Config.Refresh
//	GET /status/runs/{id}  a run's ledger and dead-letter list: its
//	                       dead-lettered, circuit-open, deadline-cut and
//	                       failed-terminal calls from its call table, by
//	                       call id, RunCallsPage a page (?after=CALL_ID is
//	                       the cursor; the page links the next)
//	GET /status/runs/{id}.json  the same as a JSON document (RunPage); a
//	                       run id ending in .json is linked with the dot
//	                       escaped (%2Ejson), which asks for the HTML
//	GET /status/assets/... the page's stylesheet and script
//
// Everything is read-only: the page changes nothing, and nothing is fetched
// from another origin (the Content-Security-Policy says 'self' only).
//
// # Credentials
//
// When Config.Open is false (policyd sets it when --metrics-listen is not a
// loopback address and admin calls are not open), every endpoint needs the
// admin token, in the Authorization header: "Bearer <token>" for scripts
// and curl, or HTTP Basic with the token as the password, which is what a
// browser sends after its own prompt (a 401 asks for it). The browser then
// resends it on every request of the page, the event stream included, so
// the token never appears in a URL, a cookie or an access log. Over plain
// HTTP the header crosses the network in clear: off loopback, serve the
// page behind TLS.
//
// # Data
//
// The page reads through Source, a small interface both engines satisfy,
// in domain types only (no protobuf), and lists the replicas through
// Replicas (policyd serve adapts the Redis engine's heartbeat set; Sole is
// a daemon alone on its bbolt file). A listed breaker whose effective
// policy sets a ceiling carries it (Ceiling). Escalations are the stored
// policies with a fallback chain, each target with its breaker's state:
// the breaker under the policy's tenant, or for a policy of every tenant
// with per-tenant breakers, the most severe of the listed ones. Breakers
// are listed by severity (OPEN, HALF_OPEN, DISABLED, then CLOSED) up to
// Config.MaxBreakers; the cool-downs and ceilings shown are those of the
// listed breakers. Runs are listed while their cut-off is ahead. A breaker's
// "recent failures" sparkline is sampled by the page itself every
// Config.Sample (the count its mode trips on: consecutive failures, or the
// failures in the FAILURE_RATE window), the last HistoryLen samples.
//
// Each event stream holds one subscription. A subscriber that falls behind
// is dropped by the store (its channel closed): the stream subscribes
// again, which brings a fresh snapshot, and renders; a subscription closed
// before its snapshot means the store is closed, and the stream ends
// (the browser reconnects by itself).
package statuspage
