package redisstore

import "github.com/policyd/policyd/policy"

// PackAuditEntry is appendAuditEntry, for the tests that write an audit
// entry as it was written before chunks (field "r").
func PackAuditEntry(r policy.AuditRecord) string { return string(appendAuditEntry(nil, &r)) }
