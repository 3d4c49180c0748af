// Package statuspage serves policyd's live status page: the fleet's
// breakers, tenants' retry budgets, active runs, cool-downs and the store's
// health, as server-rendered HTML at /status, as JSON at /status.json, and
// as a stream of server-sent events at /status/events that the page's few
// lines of JavaScript (an EventSource) use to replace its body whenever a
// breaker changes.
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
// The page reads through Source, a small interface the bbolt engine
// satisfies, in domain types only (no protobuf). Breakers are listed by
// severity (OPEN, HALF_OPEN, DISABLED, then CLOSED) up to
// Config.MaxBreakers; the cool-downs shown are those of the listed
// breakers. Runs are listed while their cut-off is ahead. A breaker's
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
