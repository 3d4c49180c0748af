// Package auditsink is the write-once, long-term tier of policyd's audit
// trail: every audit record the store commits is appended to a file as one
// JSON line, and each line carries the SHA-256 of the line before it, so
// that an edited, removed or reordered line breaks the chain where it was
// changed.
//
// # Files
//
// A sink at PATH writes PATH-000001.jsonl, then PATH-000002.jsonl and so
// on (a ".jsonl" ending of PATH is dropped first: audit.jsonl gives
// audit-000001.jsonl). A file is closed and the next one started when the
// next line would take it past the size limit; a line longer than the limit
// gets a file of its own. The number orders the files; it is at least six
// digits and compared as a number.
//
// # Lines
//
// Each line is one JSON object, fields in this order, then "\n":
//
//	prev            SHA-256, lower-case hex, of the previous line's bytes
//	                (without its "\n"); for the first line of the first
//	                file, Genesis (64 zeros); for the first line of any
//	                later file, the last line of the file before
//	time            the record's time, RFC 3339 with nanoseconds, UTC
//	seq             the store's sequence number (absent in an export)
//	event           ADMIT, DECISION, OUTCOME or FINAL
//	tenant, target  the call's tenant and target
//	call_id, run_id, attempt, classification
//	decision        RETRY or STOP (decisions only)
//	delay_ns        the wait handed out, or an outcome's latency, in ns
//	stop, disposition, detail
//
// Fields with their zero value other than prev, time, event, tenant and
// target are left out. Lines are in commit order: within one commit in
// sequence order. Verify checks a chain; the hash of the last line (the
// head) it reports is what an auditor records elsewhere to detect a
// truncated tail, which no chain can show by itself.
//
// # Durability
//
// Append writes and fsyncs its lines before it returns, from within the
// store's commit: when it fails, the store refuses the commit and keeps the
// records pending, and nothing of the failed Append is left in the file.
// A record whose sequence number is among the last 65536 appended in this
// process is skipped, so a commit the store retries (bbolt's Batch may run
// a commit twice) does not write it twice. A torn last line, left by a
// crash in the middle of a write, is cut off when the sink is opened. An
// open sink holds PATH.lock (flock(2)), so a second writer, which would
// fork the chain, is refused.
package auditsink
