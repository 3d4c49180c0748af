package auditsink

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/policyd/policyd/policy"
)

// DefaultMaxBytes is Options.MaxBytes's default: 256 MiB.
const DefaultMaxBytes = 256 << 20

// dedupeWindow is how many of the latest sequence numbers Append remembers
// to skip records a retried commit hands it again.
const dedupeWindow = 1 << 16

// Options configures Open. Zero fields take the defaults named.
type Options struct {
	// MaxBytes is the size past which the next line starts a new file;
	// default DefaultMaxBytes.
	MaxBytes int64
	// Logger receives the rotations and a torn line cut off at Open;
	// default discards.
	Logger *slog.Logger
}

// Sink appends audit records to a chain of files. Its methods are safe for
// concurrent use.
type Sink struct {
	base string // the path the file names are made from
	opts Options
	log  *slog.Logger
	lock *os.File // PATH.lock, held while open

	mu     sync.Mutex
	num    int      // number of the file written to
	f      *os.File // open for appending
	size   int64    // bytes in f
	prev   string   // hash of the last line written
	seen   map[uint64]struct{}
	ring   []uint64 // the sequence numbers in seen, oldest overwritten first
	next   int      // ring's oldest slot once it is full
	buf    []byte
	closed bool

	failures atomic.Uint64
}

// FileName returns the name of file num of the sink at path.
func FileName(path string, num int) string {
	return fmt.Sprintf("%s-%06d.jsonl", strings.TrimSuffix(path, ".jsonl"), num)
}

// Files returns the files of the sink at path, in chain order.
func Files(path string) ([]string, error) {
	nums, err := fileNums(path)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(nums))
	for i, n := range nums {
		out[i] = FileName(path, n)
	}
	return out, nil
}

// fileNums returns the numbers of the sink's files at path, ascending.
func fileNums(path string) ([]int, error) {
	base := strings.TrimSuffix(path, ".jsonl")
	dir, prefix := filepath.Split(base)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-([0-9]{6,})\.jsonl$`)
	var nums []int
	for _, e := range entries {
		if m := re.FindStringSubmatch(e.Name()); m != nil {
			n, err := strconv.Atoi(m[1])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("auditsink: %s: not a file number", filepath.Join(dir, e.Name()))
			}
			nums = append(nums, n)
		}
	}
	slices.Sort(nums)
	return nums, nil
}

// Open opens the sink at path (see the package doc for the file names),
// creating its first file when there is none, and continues the chain of
// its last file. It holds PATH.lock (a ".jsonl" ending dropped) until
// Close: a sink another process has open is refused. A torn last line is
// cut off and logged; a last line that is not an audit line is refused
// with an error naming the file.
func Open(path string, opts Options) (*Sink, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	lock, err := lockFile(strings.TrimSuffix(path, ".jsonl") + ".lock")
	if err != nil {
		return nil, err
	}
	s, err := open(path, opts)
	if err != nil {
		lock.Close()
		return nil, err
	}
	s.lock = lock
	return s, nil
}

func open(path string, opts Options) (*Sink, error) {
	s := &Sink{base: path, opts: opts, log: opts.Logger, prev: Genesis, seen: make(map[uint64]struct{})}
	nums, err := fileNums(path)
	if err != nil {
		return nil, err
	}
	if len(nums) == 0 {
		if err := s.create(1); err != nil {
			return nil, err
		}
		return s, nil
	}
	// The chain continues from the last line of the newest file that has
	// one.
	for i := len(nums) - 1; i >= 0; i-- {
		name := FileName(path, nums[i])
		last, err := lastLine(name, i == len(nums)-1, s.log)
		if err != nil {
			return nil, err
		}
		if last != nil {
			s.prev = Hash(last)
			break
		}
	}
	s.num = nums[len(nums)-1]
	f, err := os.OpenFile(FileName(path, s.num), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	s.f, s.size = f, st.Size()
	return s, nil
}

// lastLine returns the last complete line of file name (without its "\n"),
// nil when it has none. When cut is set a torn line after it is cut off.
// It reads the file's tail, more of it while no line start is in it.
func lastLine(name string, cut bool, log *slog.Logger) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	var data []byte // the file from offset on
	offset := st.Size()
	for chunk := int64(64 << 10); offset > 0; chunk *= 2 {
		n := min(chunk, offset)
		offset -= n
		buf := make([]byte, n, int(n)+len(data))
		if _, err := f.ReadAt(buf, offset); err != nil {
			return nil, fmt.Errorf("auditsink: %w", err)
		}
		data = append(buf, data...)
		// Enough once the tail holds the newline ending the last complete
		// line and the one before it (or reaches the file's start).
		if end := bytes.LastIndexByte(data, '\n'); end >= 0 && bytes.LastIndexByte(data[:end], '\n') >= 0 {
			break
		}
	}
	end := bytes.LastIndexByte(data, '\n') + 1
	if end < len(data) {
		if !cut {
			return nil, fmt.Errorf("auditsink: %s: torn last line in a file that is not the newest", name)
		}
		if err := os.Truncate(name, offset+int64(end)); err != nil {
			return nil, fmt.Errorf("auditsink: cutting the torn last line: %w", err)
		}
		log.Warn("auditsink: torn last line cut off (a write a crash interrupted; its records were never committed)",
			"file", name, "bytes", len(data)-end)
	}
	if end == 0 {
		return nil, nil
	}
	last := data[bytes.LastIndexByte(data[:end-1], '\n')+1 : end-1]
	if _, _, err := ParseLine(last); err != nil {
		return nil, fmt.Errorf("auditsink: %s: last line is not an audit line: %w", name, err)
	}
	return last, nil
}

// create starts file num, durably (the directory is synced too).
func (s *Sink) create(num int) error {
	name := FileName(s.base, num)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("auditsink: %w", err)
	}
	if err := syncDir(filepath.Dir(name)); err != nil {
		f.Close()
		return err
	}
	s.f, s.num, s.size = f, num, 0
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("auditsink: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("auditsink: syncing %s: %w", dir, err)
	}
	return nil
}

// Append writes recs as lines, in order, and fsyncs them before it returns,
// starting a new file whenever the next line would take the current one
// past MaxBytes. A record whose Seq (when not 0) was among the last 65536
// appended is skipped. On an error nothing of the file being written when
// it happened is kept (lines fsynced into files before it are), the chain
// is where it was, and Failures counts it: the caller keeps the records and
// hands them again.
func (s *Sink) Append(recs []policy.AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("auditsink: closed")
	}
	if err := s.append(recs); err != nil {
		s.failures.Add(1)
		return err
	}
	return nil
}

func (s *Sink) append(recs []policy.AuditRecord) error {
	buf, prev := s.buf[:0], s.prev
	var seqs []uint64
	for _, rec := range recs {
		if _, dup := s.seen[rec.Seq]; dup && rec.Seq != 0 {
			continue
		}
		l := Encode(rec, prev)
		if s.size+int64(len(buf)) > 0 && s.size+int64(len(buf)+len(l)+1) > s.opts.MaxBytes {
			if err := s.write(buf, prev, seqs); err != nil {
				return err
			}
			buf, seqs = buf[:0], seqs[:0]
			if err := s.rotate(); err != nil {
				return err
			}
		}
		buf = append(append(buf, l...), '\n')
		prev = Hash(l)
		seqs = append(seqs, rec.Seq)
	}
	err := s.write(buf, prev, seqs)
	s.buf = buf[:0]
	return err
}

// write appends buf, lines ending in the one that hashes to prev, to the
// current file and fsyncs it; then the chain moves on to prev and seqs are
// remembered. On failure the file is cut back to where it was.
func (s *Sink) write(buf []byte, prev string, seqs []uint64) error {
	if len(buf) == 0 {
		return nil
	}
	_, err := s.f.Write(buf)
	if err == nil {
		err = s.f.Sync()
	}
	if err != nil {
		if terr := s.f.Truncate(s.size); terr != nil {
			err = fmt.Errorf("%w (and cutting back: %w)", err, terr)
		}
		return fmt.Errorf("auditsink: writing %s: %w", s.f.Name(), err)
	}
	s.size += int64(len(buf))
	s.prev = prev
	for _, q := range seqs {
		if q == 0 {
			continue
		}
		if len(s.ring) < dedupeWindow {
			s.ring = append(s.ring, q)
		} else {
			delete(s.seen, s.ring[s.next])
			s.ring[s.next] = q
			s.next = (s.next + 1) % dedupeWindow
		}
		s.seen[q] = struct{}{}
	}
	return nil
}

// rotate closes the current file and starts the next.
func (s *Sink) rotate() error {
	old := s.f.Name()
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("auditsink: closing %s: %w", old, err)
	}
	if err := s.create(s.num + 1); err != nil {
		// Keep appending to the old file rather than lose the sink.
		f, rerr := os.OpenFile(old, os.O_WRONLY|os.O_APPEND, 0)
		if rerr == nil {
			s.f = f
		}
		return err
	}
	s.log.Info("auditsink: new file", "file", s.f.Name(), "previous", old)
	return nil
}

// Failures returns how many Appends failed since Open.
func (s *Sink) Failures() uint64 { return s.failures.Load() }

// Close closes the current file; later Appends fail.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.f.Close()
	s.lock.Close()
	return err
}

// Verified is what Verify found in a chain that holds.
type Verified struct {
	Files int    // files read
	Lines int    // lines checked
	Head  string // hash of the last line; Genesis for no line
}

// Break is where a chain does not hold: a line of a file that is not an
// audit line, or whose prev is not the hash of the line before.
type Break struct {
	File   string
	Line   int // 1-based
	Reason string
}

func (b *Break) Error() string { return fmt.Sprintf("%s:%d: %s", b.File, b.Line, b.Reason) }

// Verify reads files in the order given, as one chain from Genesis, and
// returns the first *Break, or another error when a file cannot be read.
func Verify(files []string) (Verified, error) {
	v := Verified{Head: Genesis}
	last := "" // where the line Head hashes is, for messages
	for _, name := range files {
		if err := verifyFile(name, &v, &last); err != nil {
			return v, err
		}
		v.Files++
	}
	return v, nil
}

func verifyFile(name string, v *Verified, last *string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	for n := 1; ; n++ {
		l, err := r.ReadBytes('\n')
		if err == io.EOF {
			if len(l) > 0 {
				return &Break{name, n, "no newline at the end: a torn or truncated line"}
			}
			return nil
		}
		if err != nil {
			return err
		}
		l = l[:len(l)-1]
		_, prev, err := ParseLine(l)
		if err != nil {
			return &Break{name, n, err.Error()}
		}
		if prev != v.Head {
			reason := fmt.Sprintf("prev %s is not the genesis value: the chain does not start here (lines or files before it are missing)", short(prev))
			if v.Lines > 0 {
				reason = fmt.Sprintf("prev %s is not the hash of %s, %s: that line was edited, or lines were removed, added or moved here",
					short(prev), *last, short(v.Head))
			}
			return &Break{name, n, reason}
		}
		v.Head = Hash(l)
		v.Lines++
		*last = fmt.Sprintf("%s:%d", name, n)
	}
}

// short abbreviates a hash for messages.
func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}
