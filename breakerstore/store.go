package breakerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// schemaVersion is the layout documented in doc.go; migrations move older
// files to it.
const schemaVersion uint32 = 3

// Bucket names; see the layout in doc.go. They are created once by Open.
var (
	bucketMeta     = []byte("meta")
	bucketBreakers = []byte("breakers")
	bucketBudgets  = []byte("budgets")
	bucketTokens   = []byte("tokens")
	bucketPolicies = []byte("policies")
	bucketRuns     = []byte("runs")
	bucketRunState = []byte("runstate")
	bucketRunCalls = []byte("runcalls")

	// The audit trail's buckets of the previous layout, a key per record
	// and two index entries: Open moves their records into bucketAuditSeg
	// and deletes them (see migrateAudit).
	bucketAudit       = []byte("audit")
	bucketAuditCall   = []byte("auditcall")
	bucketAuditTenant = []byte("audittenant")

	keySchema   = []byte("schema")
	keyAuditSeq = []byte("auditseq")

	allBuckets = [][]byte{bucketMeta, bucketBreakers, bucketBudgets, bucketTokens,
		bucketPolicies, bucketRuns, bucketRunState, bucketRunCalls,
		bucketAuditSeg, bucketAttempts, bucketCallTable, bucketIdemKeys, bucketFlow, bucketStats}
)

// Defaults of Options.
const (
	DefaultFlushInterval        = 100 * time.Millisecond
	DefaultLockTimeout          = time.Second
	DefaultMaxBreakersPerTenant = 10000
	DefaultIdleTTL              = 24 * time.Hour
	DefaultMaxTenants           = 100000
	DefaultMaxAutoTenants       = 1000
	DefaultMaxRuns              = 10000
	DefaultRunRetention         = 30 * 24 * time.Hour
)

// Clock tells the store the time. The store holds one; tests inject a fake.
// Implementations must be safe for concurrent use.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// SyncMode says when counter mutations reach the disk.
type SyncMode uint8

// Sync modes. Admin writes and breaker state transitions are durable before
// their method returns in both modes.
const (
	// SyncGroup (the default) marks counters dirty and commits them in one
	// transaction every Options.FlushInterval; a crash loses at most that
	// interval plus the duration of one commit of counters.
	SyncGroup SyncMode = iota
	// SyncAlways commits every mutation before the method returns, sharing
	// commits between concurrent callers through bbolt's Batch.
	SyncAlways
)

// String returns "group" or "always".
func (m SyncMode) String() string {
	switch m {
	case SyncGroup:
		return "group"
	case SyncAlways:
		return "always"
	}
	return fmt.Sprintf("SyncMode(%d)", uint8(m))
}

// Options configures Open. Zero fields take the documented defaults.
type Options struct {
	// Path is the bbolt file; it is created (mode 0600) when absent, and
	// an existing file must be a sound policyd database.
	Path string
	// FlushInterval is the group-commit interval for counters; default
	// 100ms. A group commit starts every FlushInterval (right away after
	// one that took longer), so with SyncGroup a crash loses at most
	// FlushInterval plus the duration of one commit of counting.
	FlushInterval time.Duration
	// Sync selects group commit (default) or a commit per mutation.
	Sync SyncMode
	// Clock is the time source; default the real clock.
	Clock Clock
	// LockTimeout bounds the wait for the file lock; opening a file another
	// process holds fails with ErrLocked within it. Default 1s.
	LockTimeout time.Duration
	// MaxBreakersPerTenant caps the breakers of one tenant (the empty tenant
	// of target-scoped breakers counts as one); default 10000.
	MaxBreakersPerTenant int
	// MaxTenants caps the tenants with state (a token bucket); a new
	// tenant beyond it gets ErrTooManyTenants. Tenants with an explicit
	// budget are always admitted. Default 100000.
	MaxTenants int
	// MaxAutoTenants caps the tenants that worker calls gave state without
	// an explicit budget (see tenants.go); a new one beyond it gets
	// ErrTooManyAutoTenants. Declared tenants never count. Default 1000.
	MaxAutoTenants int
	// MaxRuns caps the runs kept; OpenRun beyond it fails with
	// ErrTooManyRuns. Default 10000.
	MaxRuns int
	// MaxAttemptRecords caps the calls whose last decided attempt is
	// remembered (see ClaimAttempt); past it the oldest record goes first.
	// Default DefaultMaxAttemptRecords.
	MaxAttemptRecords int
	// MaxRunCalls caps the calls each run's call table keeps for
	// RunCalls; the calls beyond it are counted, not kept. Default
	// DefaultMaxRunCalls.
	MaxRunCalls int
	// MaxKeysPerTenant caps a tenant's live idempotency records; ClaimKey
	// of a new key beyond it fails with ErrTooManyKeys. Default
	// DefaultMaxKeysPerTenant.
	MaxKeysPerTenant int
	// RunRetention is how long a run is kept after its cut-off, with its
	// ledger and per-call dispositions; then the flusher deletes it from
	// memory and disk. Default 30 days.
	RunRetention time.Duration
	// IdleTTL is how long a CLOSED, unforced breaker (and a token bucket of a
	// tenant without an explicit budget) may go without activity before it is
	// dropped from memory and disk; default 24h.
	IdleTTL time.Duration
	// DefaultBudget applies to tenants without an explicit budget; zero
	// numeric fields take DefaultTenantBudget's values.
	DefaultBudget policy.TenantBudget
	// MaxSize caps the database file in bytes (0: unlimited); writes past it
	// fail with ErrDiskFull.
	MaxSize int
	// MaxBatchDelay is how long bbolt's Batch waits to gather SyncAlways
	// commits; default bbolt's (10ms).
	MaxBatchDelay time.Duration
	// Logger receives flush failures and recoveries; default discards.
	Logger *slog.Logger
	// AuditRetention is how long audit records are kept; the flusher
	// deletes older ones. Default DefaultAuditRetention (7 days).
	AuditRetention time.Duration
	// AuditMaxRecords caps the audit records kept; the flusher deletes the
	// oldest past it. Default DefaultAuditMaxRecords (1,000,000).
	AuditMaxRecords int
	// AuditBuffer caps the audit records waiting for a group commit; half
	// full, it starts one at once, and past it AppendAudit drops records
	// (counted in Stats.AuditDropped) rather than block. Default
	// DefaultAuditBuffer.
	AuditBuffer int
	// AuditSink, when set, is handed every audit record within its commit
	// (see AuditSink); nil keeps the trail in bbolt only.
	AuditSink AuditSink
}

// Stats counts the store's writes since Open, for benchmarks and metrics.
type Stats struct {
	Commits        uint64 // write transactions committed, of every kind
	GroupCommits   uint64 // commits by the flusher (group commits of counters)
	SyncCommits    uint64 // commits of SyncAlways batches
	SyncMutations  uint64 // mutations made durable by SyncAlways batches
	RecordsFlushed uint64 // records written by group and SyncAlways commits
	FlushErrors    uint64 // failed group commits (retried at the next interval)
	Breakers       int    // breakers in memory
	Tenants        int    // token buckets in memory
	Runs           int    // runs in memory
	AuditRecords   int    // audit records on disk
	AuditBuffered  int    // audit records waiting for a group commit
	AuditDropped   uint64 // audit records dropped: buffer full or unindexable
	AuditDeleted   uint64 // audit records deleted by retention

	AuditSinkErrors uint64 // commits refused because the AuditSink failed

	// StatsRefused counts the calls' ends not counted in the attempt
	// statistics because their tenant had statistics for
	// MaxBreakersPerTenant targets already.
	StatsRefused uint64
}

// Store is policyd's shared state. All methods are safe for concurrent use.
type Store struct {
	db    *bbolt.DB
	opts  Options
	clock Clock
	log   *slog.Logger

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	stop      chan struct{}
	wake      chan struct{} // the audit buffer is half full: flush now (flushEvery)
	done      chan struct{}

	breakers shardMap[policy.BreakerKey, *breaker] // the breaker table
	tenants  tenantBook

	buckets   shardMap[string, *tokenBucket]
	defBudget policy.TenantBudget

	runs shardMap[string, *run]

	attempts   attemptTable
	keys       keyTable // idempotency records (idem.go)
	attemptSeq atomic.Uint64

	pools        shardMap[policy.BreakerKey, *leasePool]   // fleet-wide ceilings (flow.go)
	attemptStats shardMap[policy.BreakerKey, *targetStats] // attempt statistics (attemptstats.go)
	statsTargets statsBook

	policies      atomic.Pointer[policyMap]
	defaultPolicy policy.Policy

	adminMu sync.Mutex // serialises admin writes so disk and memory agree

	group groupCommit
	subs  subscriptions
	trail auditTrail
	stats writeStats

	capped atomic.Bool // a write hit Options.MaxSize: see roomLeft
}

// tenantBook counts what each tenant holds, for the caps (tenants.go).
type tenantBook struct {
	mu       sync.Mutex
	breakers map[string]int      // breakers per tenant, guarded by mu
	auto     map[string]struct{} // automatic tenants, guarded by mu
	declared declaredSet         // declared tenants
}

// groupCommit is the flusher's queue and bookkeeping: the entities
// changed since the last group commit and the records the sweep dropped.
type groupCommit struct {
	dirtyMu sync.Mutex
	dirty   []entity

	flushMu    sync.Mutex // serialises flushes; guards lastSweep, pendingDel and auditTrail.dropLogged
	lastSweep  int64
	pendingDel []delKey
}

// subscriptions are the WatchBreakers subscribers (subscribe.go).
type subscriptions struct {
	mu   sync.RWMutex
	list []*subscriber
}

// auditTrail is the audit trail's state in memory: the records waiting
// for a group commit and what is on disk (audit.go).
type auditTrail struct {
	mu         sync.Mutex           // guards the fields below but dropLogged
	buf        []policy.AuditRecord // appended, waiting for a group commit
	spare      []policy.AuditRecord // a written buffer, for the next takeAudit
	seq        uint64               // the last sequence number handed out
	last       int64                // the last time stamped, Unix ns
	count      int                  // records on disk
	oldest     int64                // time of the oldest record on disk, Unix ns
	dropLogged uint64               // drops already logged; guarded by groupCommit.flushMu

	dropped, deleted atomic.Uint64
	sinkErrors       atomic.Uint64 // commits the AuditSink refused
}

// writeStats counts the store's commits for Stats (commit.go).
type writeStats struct {
	commits, groupCommits, syncCommits, syncMutations, records, flushErrors atomic.Uint64

	batchMu     sync.Mutex
	lastBatchTx *bbolt.Tx // the Batch transaction counted last
}

// Open opens or creates the database at opts.Path, loads all state into
// memory and starts the flusher. Only a path that does not exist is
// created. A file held by another process fails with ErrLocked within
// opts.LockTimeout; an existing file is verified before bbolt maps it
// (filecheck.go), and a damaged, empty or foreign one fails with ErrCorrupt,
// one of a newer schema version with ErrSchema, each on one line naming
// the file. A file of an older schema version is migrated. Open never falls
// back to defaults.
func Open(opts Options) (*Store, error) {
	if opts.Path == "" {
		return nil, invalid("path", "must not be empty")
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	if opts.MaxBreakersPerTenant <= 0 {
		opts.MaxBreakersPerTenant = DefaultMaxBreakersPerTenant
	}
	if opts.IdleTTL <= 0 {
		opts.IdleTTL = DefaultIdleTTL
	}
	if opts.MaxTenants <= 0 {
		opts.MaxTenants = DefaultMaxTenants
	}
	if opts.MaxAutoTenants <= 0 {
		opts.MaxAutoTenants = DefaultMaxAutoTenants
	}
	if opts.MaxRuns <= 0 {
		opts.MaxRuns = DefaultMaxRuns
	}
	if opts.MaxAttemptRecords <= 0 {
		opts.MaxAttemptRecords = DefaultMaxAttemptRecords
	}
	if opts.MaxRunCalls <= 0 {
		opts.MaxRunCalls = DefaultMaxRunCalls
	}
	if opts.MaxKeysPerTenant <= 0 {
		opts.MaxKeysPerTenant = DefaultMaxKeysPerTenant
	}
	if opts.RunRetention <= 0 {
		opts.RunRetention = DefaultRunRetention
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.AuditRetention <= 0 {
		opts.AuditRetention = DefaultAuditRetention
	}
	if opts.AuditMaxRecords <= 0 {
		opts.AuditMaxRecords = DefaultAuditMaxRecords
	}
	if opts.AuditBuffer <= 0 {
		opts.AuditBuffer = DefaultAuditBuffer
	}
	if opts.Sync > SyncAlways {
		return nil, invalid("sync", "must be SyncGroup or SyncAlways")
	}
	def := fleet.FillBudget(opts.DefaultBudget, DefaultTenantBudget())
	def.Tenant = ""
	if err := ValidateBudget(def); err != nil {
		return nil, fmt.Errorf("default budget: %w", err)
	}

	// The file is locked and verified through read(2) before bbolt maps
	// it, so a damaged file is refused with its problems named, never a
	// fault; the reads of the mapped file run guarded all the same.
	f, err := openChecked(opts.Path, true, false, opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	var db *bbolt.DB
	err, panicked := guarded(opts.Path, func() error {
		var err error
		db, err = bbolt.Open(opts.Path, 0o600, &bbolt.Options{
			Timeout:  opts.LockTimeout,
			MaxSize:  opts.MaxSize,
			OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil },
		})
		return err
	})
	if err != nil {
		if panicked {
			_ = f.Close()
			return nil, err
		}
		return nil, openErr(opts, err)
	}
	if opts.MaxBatchDelay > 0 {
		db.MaxBatchDelay = opts.MaxBatchDelay
	}
	s := newStore(db, opts, def)
	err, panicked = guarded(opts.Path, func() error {
		if err := s.initBuckets(); err != nil {
			return err
		}
		return s.load()
	})
	if err != nil {
		if panicked {
			_ = f.Close() // bbolt's locks may be held: do not Close db
		} else {
			_ = db.Close()
		}
		return nil, inFile(opts.Path, err)
	}
	s.countTenants()
	go s.flushLoop()
	return s, nil
}

// newStore returns an empty store over db; Open loads it and starts the
// flusher.
func newStore(db *bbolt.DB, opts Options, def policy.TenantBudget) *Store {
	s := &Store{
		db:            db,
		opts:          opts,
		clock:         opts.Clock,
		log:           opts.Logger,
		stop:          make(chan struct{}),
		wake:          make(chan struct{}, 1),
		done:          make(chan struct{}),
		tenants:       tenantBook{breakers: make(map[string]int), auto: make(map[string]struct{})},
		defBudget:     def,
		defaultPolicy: policy.Default(),
	}
	s.breakers.init(hashKey)
	s.pools.init(hashKey)
	s.attemptStats.init(hashKey)
	s.buckets.init(maphash.String)
	s.runs.init(maphash.String)
	s.attempts.init(s.opts.MaxAttemptRecords)
	s.keys.init()
	s.policies.Store(&policyMap{m: map[policy.PolicyScope]*policy.PolicyEntry{}})
	s.group.lastSweep = s.now()
	return s
}

// Check verifies the database at path without changing it: the checks Open
// makes before bbolt maps the file (both meta pages, the size against the
// high-water mark, the freelist, every page of every bucket, all read with
// read(2)), then bbolt's own consistency check, the schema version, and
// that every record decodes. It takes the file's lock (shared, read-only),
// so it fails with ErrLocked while a daemon holds the file. It reports
// every problem it finds, on one line naming the file: ErrCorrupt, or
// ErrSchema when the only problem is the schema version.
func Check(path string, lockTimeout time.Duration) error {
	if lockTimeout <= 0 {
		lockTimeout = DefaultLockTimeout
	}
	opts := Options{Path: path, LockTimeout: lockTimeout, Clock: realClock{}, Logger: slog.New(slog.DiscardHandler)}
	f, err := openChecked(path, false, true, lockTimeout)
	if err != nil {
		return err
	}
	var db *bbolt.DB
	err, panicked := guarded(path, func() error {
		var err error
		db, err = bbolt.Open(path, 0o600, &bbolt.Options{
			Timeout:  lockTimeout,
			ReadOnly: true,
			OpenFile: func(string, int, os.FileMode) (*os.File, error) { return f, nil },
		})
		return err
	})
	if err != nil {
		if panicked {
			_ = f.Close()
			return err
		}
		return openErr(opts, err)
	}
	var problems []string
	schemaOnly, empty := false, false
	err, panicked = guarded(path, func() error {
		return db.View(func(tx *bbolt.Tx) error {
			for perr := range tx.Check() {
				problems = append(problems, perr.Error())
			}
			v, err := readSchema(tx, path)
			if err != nil {
				schemaOnly = len(problems) == 0 && errors.Is(err, ErrSchema)
				problems = append(problems, detail(err, path))
				return nil
			}
			if empty = v == 0; empty {
				return nil // no buckets yet: Open initialises the file
			}
			if err := checkAudit(tx); err != nil {
				problems = append(problems, detail(err, path))
			}
			return nil
		})
	})
	if err == nil && len(problems) == 0 && !empty {
		// Every bucket is loaded, each past the failures of the others.
		err, panicked = guarded(path, func() error {
			for _, lerr := range newStore(db, opts, DefaultTenantBudget()).loadReport() {
				if lerr != nil {
					problems = append(problems, detail(lerr, path))
				}
			}
			return nil
		})
	}
	if err != nil {
		problems = append(problems, detail(err, path))
	}
	if panicked {
		_ = f.Close()
	} else {
		_ = db.Close()
	}
	if len(problems) == 0 {
		return nil
	}
	if schemaOnly {
		return fmt.Errorf("%w: %s: %s", ErrSchema, path, problems[0])
	}
	more := max(len(problems)-maxListed, 0)
	return damaged(path, problems[:len(problems)-more], more)
}

// detail is err's message without the class and the file name, which
// damaged puts back once.
func detail(err error, path string) string {
	msg := err.Error()
	for _, class := range []error{ErrCorrupt, ErrSchema} {
		msg = strings.TrimPrefix(msg, class.Error()+": ")
	}
	return strings.TrimPrefix(msg, path+": ")
}

// openErr explains a bbolt.Open failure.
func openErr(opts Options, err error) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %s (gave up after %v)", ErrLocked, opts.Path, opts.LockTimeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch),
		errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrInvalidMapping):
		return fmt.Errorf("%w: %s is not a readable bbolt database: %v", ErrCorrupt, opts.Path, err)
	}
	// Other failures (permissions, a missing directory) keep their cause;
	// bbolt reports a short or mangled file as a plain error, so anything that
	// is not an *os.PathError is treated as corruption.
	var pe interface{ Timeout() bool }
	if errors.As(err, &pe) {
		return fmt.Errorf("breakerstore: open %s: %w", opts.Path, err)
	}
	return fmt.Errorf("%w: cannot open %s: %v", ErrCorrupt, opts.Path, err)
}

// readSchema returns the schema version of the file open in tx, 0 for a
// bbolt file without buckets (a new one). A file with buckets but no
// meta/schema is foreign (ErrSchema), a version newer than this build's is
// refused (ErrSchema, naming both versions), a mangled one is ErrCorrupt.
func readSchema(tx *bbolt.Tx, path string) (uint32, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		foreign := false
		_ = tx.ForEach(func([]byte, *bbolt.Bucket) error { foreign = true; return nil })
		if foreign {
			return 0, fmt.Errorf("%w: %s: buckets but no meta/schema: not a policyd database", ErrSchema, path)
		}
		return 0, nil
	}
	v := meta.Get(keySchema)
	if len(v) != 4 {
		return 0, fmt.Errorf("%w: %s: meta/schema is %d bytes, want 4", ErrCorrupt, path, len(v))
	}
	switch got := binary.BigEndian.Uint32(v); {
	case got > schemaVersion:
		return 0, fmt.Errorf("%w: %s: schema version %d is newer than this policyd (%d)", ErrSchema, path, got, schemaVersion)
	case got == 0:
		return 0, fmt.Errorf("%w: %s: schema version 0 is not a policyd schema", ErrSchema, path)
	default:
		return got, nil
	}
}

// initBuckets checks the schema version, creates missing buckets, runs the
// migrations from the file's version to schemaVersion and records it, all
// in one transaction: a file is migrated in full or not at all. A file of
// the current version with every bucket is not written to, so a damaged
// record found by load leaves the file as it was.
func (s *Store) initBuckets() error {
	current := false
	err := s.db.View(func(tx *bbolt.Tx) error {
		v, err := readSchema(tx, s.opts.Path)
		current = v == schemaVersion
		for _, name := range allBuckets {
			current = current && tx.Bucket(name) != nil
		}
		return err
	})
	if err != nil || current {
		return err
	}
	var from uint32
	err = s.db.Update(func(tx *bbolt.Tx) error {
		var err error
		if from, err = readSchema(tx, s.opts.Path); err != nil {
			return err
		}
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if from == schemaVersion {
			return nil
		}
		if from != 0 {
			for _, m := range migrations[from-1:] {
				if err := m.run(s, tx); err != nil {
					return fmt.Errorf("migrating schema version %d to %d (%s): %w", m.from, m.from+1, m.what, err)
				}
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, binary.BigEndian.AppendUint32(nil, schemaVersion))
	})
	if err != nil && !errors.Is(err, ErrSchema) && !errors.Is(err, ErrCorrupt) {
		return storageErr("initialise buckets", err)
	}
	if err == nil && from != 0 && from != schemaVersion {
		s.log.Info("breakerstore: schema migrated", "file", s.opts.Path, "from", from, "to", schemaVersion)
	}
	return err
}

// load reads every record into memory, stopping at the first that does
// not decode.
func (s *Store) load() error {
	return s.db.View(func(tx *bbolt.Tx) error {
		for _, load := range s.loaders(tx) {
			if err := load(); err != nil {
				return err
			}
		}
		return nil
	})
}

// loadReport is load for Check: it runs every loader, each past the
// failures of the others, and returns the failures, so a bad record in
// one bucket does not hide one in another.
func (s *Store) loadReport() []error {
	var errs []error
	err := s.db.View(func(tx *bbolt.Tx) error {
		for _, load := range s.loaders(tx) {
			if err := load(); err != nil {
				errs = append(errs, err)
			}
		}
		return nil
	})
	return append(errs, err)
}

// loaders are the steps of load, in order.
func (s *Store) loaders(tx *bbolt.Tx) []func() error {
	now := s.now()
	return []func() error{
		func() error { return s.loadPolicies(tx) },
		func() error { return s.loadBudgets(tx, now) },
		func() error { return s.loadRuns(tx) },
		func() error { return s.loadCallTables(tx) },
		func() error { return s.loadKeys(tx) },
		func() error { return s.loadAudit(tx) },
		func() error { return s.loadAttempts(tx, now) },
		func() error { return s.loadBreakers(tx, now) },
		func() error { return s.loadFlow(tx) },
		func() error { return s.loadStats(tx, now) },
	}
}

// corrupt reports a record that cannot be decoded.
func corrupt(bucket, key []byte, err error) error {
	return fmt.Errorf("%w: bucket %s key %q: %v", ErrCorrupt, bucket, key, err)
}

// Close stops the flusher, flushes every dirty counter, and closes the
// database. Later calls to any method return ErrClosed; Close itself may be
// called more than once. Mutations racing with Close may miss the final flush.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.done
		err := s.flush(false)
		s.closeSubs()
		s.closeErr = errors.Join(err, s.db.Close())
	})
	return s.closeErr
}

// Flush commits every dirty counter now and removes idle breakers and token
// buckets, as the background flusher does every FlushInterval. It is safe for
// concurrent use.
func (s *Store) Flush() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.flush(true)
}

// Stats returns the write counters since Open. It is safe for concurrent use.
func (s *Store) Stats() Stats {
	st := Stats{
		Commits:        s.stats.commits.Load(),
		GroupCommits:   s.stats.groupCommits.Load(),
		SyncCommits:    s.stats.syncCommits.Load(),
		SyncMutations:  s.stats.syncMutations.Load(),
		RecordsFlushed: s.stats.records.Load(),
		FlushErrors:    s.stats.flushErrors.Load(),
		Breakers:       s.breakers.len(),
		Tenants:        s.buckets.len(),
		Runs:           s.runs.len(),
		AuditDropped:   s.trail.dropped.Load(),
		AuditDeleted:   s.trail.deleted.Load(),
	}
	st.AuditSinkErrors = s.trail.sinkErrors.Load()
	st.StatsRefused = s.statsTargets.refused.Load()
	s.trail.mu.Lock()
	st.AuditRecords, st.AuditBuffered = s.trail.count, len(s.trail.buf)
	s.trail.mu.Unlock()
	return st
}

func (s *Store) now() int64 { return s.clock.Now().UnixNano() }

// flushLoop is the one background goroutine; it ends when Close closes stop.
func (s *Store) flushLoop() {
	defer close(s.done)
	flushEvery(s.stop, s.wake, s.opts.FlushInterval, func() { _ = s.flush(false) })
}

// flushEvery calls flush until stop closes, each call due interval after
// the previous one started: the time a commit takes does not push the
// schedule later, and a commit that runs past the interval is followed at
// once. So a counter changed at any moment is in a commit that starts
// within interval and is durable when it ends: a crash loses at most
// interval plus the duration of one commit (see Options.FlushInterval).
// A signal on wake (the audit buffer half full) starts a flush at once,
// or as soon as the one running ends, and the next is due interval after
// it.
func flushEvery(stop, wake <-chan struct{}, interval time.Duration, flush func()) {
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		case <-wake: // the timer's Reset below discards a value it sent meanwhile (Go 1.23)
		}
		start := time.Now()
		flush()
		t.Reset(max(time.Until(start.Add(interval)), 0))
	}
}

// sweepEvery is how often the flusher looks for idle entities (clock time).
func (s *Store) sweepEvery() int64 {
	d := s.opts.IdleTTL / 10
	d = max(d, s.opts.FlushInterval)
	d = min(d, time.Minute)
	return int64(d)
}

// flush writes the dirty entities and the buffered audit records, removes
// idle entities when a sweep is due or forced, and deletes audit records
// past their retention, in one transaction. On failure the entities and
// records are queued again and the error is logged; decisions keep being
// served from memory.
func (s *Store) flush(forceSweep bool) error {
	s.group.flushMu.Lock()
	defer s.group.flushMu.Unlock()

	now := s.now()
	if forceSweep || now-s.group.lastSweep >= s.sweepEvery() {
		// Safe outside the transaction: deleteRecords skips keys that are
		// back in memory, and their writes commit after this transaction.
		s.group.pendingDel = append(s.group.pendingDel, s.sweep(now)...)
		s.group.lastSweep = now
	}

	s.logAuditDrops()
	s.group.dirtyMu.Lock()
	batch := s.group.dirty
	s.group.dirty = nil
	s.group.dirtyMu.Unlock()
	audit := s.takeAudit()
	auditDue := len(audit) > 0 || s.auditSweepDue(now)
	if len(batch) == 0 && len(s.group.pendingDel) == 0 && !auditDue {
		return nil
	}
	s.trail.mu.Lock()
	count := s.trail.count
	s.trail.mu.Unlock()

	var deleted int
	var oldest int64
	err := s.commit(&pending{kind: commitGroup, floor: counterPages, op: "flush counters", ents: batch, audit: audit,
		step: func(tx *bbolt.Tx) error {
			if err := s.deleteRecords(tx, s.group.pendingDel); err != nil {
				return err
			}
			if !auditDue {
				return nil
			}
			var err error
			deleted, oldest, err = s.flushAudit(tx, audit, now, count)
			return err
		}})
	if err != nil {
		s.stats.flushErrors.Add(1)
		s.log.Error("breakerstore: group commit failed; will retry", "err", err, "records", len(batch), "audit_records", len(audit))
		return err
	}
	if auditDue {
		s.auditCommitted(len(audit), deleted, oldest)
	}
	s.recycleAudit(audit)
	s.group.pendingDel = nil
	return nil
}

// finite reports whether f is neither NaN nor infinite.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
