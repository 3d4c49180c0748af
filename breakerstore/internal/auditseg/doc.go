// Package auditseg is the byte format of policyd's audit trail: a record's
// key and body, and segments of records with a Bloom filter over their
// call ids and tenants. Bytes in, bytes out: it knows nothing of bbolt;
// breakerstore puts the segments in its bucket auditseg and keeps them
// sorted and disjoint.
//
// The audit trail is stored in segments: one bbolt key per run of up to
// Max records, in bucket auditseg. A record used to be three keys (the
// record and two index entries), and at tens of thousands of records a
// second bbolt's per-key cost (a node insert, a page write at the commit, a
// delete and a page rewrite at retention) was most of the daemon's CPU. A
// segment costs one Put and, at retention, one Delete for hundreds of
// records, and its header answers the questions retention, Open and
// queries ask without decoding the records.
//
// The key of a segment is the key of its first record: Unix nanoseconds and
// sequence number, uint64 big-endian each, so segments sort by time.
// Segments never overlap: every record of a segment sorts after every
// record of the segments before it. The value is
//
//	version     byte, segVersion (1)
//	count       uvarint, the records in the segment (at least 1)
//	last        uint64 big-endian nanoseconds and uint64 big-endian sequence
//	            number of the last record
//	k           byte, the Bloom filter's hash functions
//	bloom size  uvarint, the filter's length in bytes (a multiple of 8)
//	bloom       the Bloom filter over "c" 0x00 call id and "t" 0x00 tenant of
//	            every record (empty names are not entered)
//	records     count times: nanoseconds since the previous record (uvarint;
//	            the first record's previous is the segment key, so its delta
//	            is 0), its sequence number minus the previous one (zigzag
//	            varint: a record with an explicit earlier time may carry a
//	            later sequence number than the next one), the body's length
//	            (uvarint) and the body, as EncodeRecord writes it.
package auditseg
