package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// upstreamFaults are the shares of writes the fake upstream answers
// otherwise than with its record, each in [0, 1), drawn per request:
//
//   - Fail503: refused with a 503 before anything is applied;
//   - Lose: applied, then the connection is reset before any answer
//     (the worker lost the answer);
//   - Apply504: applied, then answered 504 (a gateway that gave up);
//   - Hang: applied, then no answer until the client gives up (the
//     attempt's timeout).
type upstreamFaults struct {
	Fail503, Lose, Apply504, Hang float64
}

func (f upstreamFaults) check() error {
	for _, v := range []float64{f.Fail503, f.Lose, f.Apply504, f.Hang} {
		if v < 0 || v >= 1 {
			return errors.New("--fail503, --lose, --apply504 and --hang must each be in [0, 1)")
		}
	}
	if f.Fail503+f.Lose+f.Apply504+f.Hang >= 1 {
		return errors.New("--fail503 + --lose + --apply504 + --hang must be below 1")
	}
	return nil
}

// writesUpstream is the once command's fake upstream: a loopback HTTP
// service that creates one record per idempotency key (POST /documents
// with the Idempotency-Key header): a write with a key it has a record of
// is a duplicate, counted, and answered as the first write was. It is safe
// for concurrent use.
type writesUpstream struct {
	faults  upstreamFaults
	latency time.Duration
	srv     *http.Server
	addr    string

	mu       sync.Mutex
	rng      *rand.Rand
	records  map[string]upstreamRecord
	epoch    time.Time           // when it started, the origin of the times in history
	history  map[string][]string // by key: each write's answer and when it was applied
	requests int                 // every request received
	outcomes map[string]int
	// downFrom and downUntil bound a window (policyd away) in which
	// requests are counted apart, in downRequests.
	downFrom, downUntil time.Time
	downRequests        int
	dupsDown            int // duplicates among them
}

// startWritesUpstream serves the fake upstream on a free loopback port.
func startWritesUpstream(faults upstreamFaults, latency time.Duration, seed uint64) (*writesUpstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &writesUpstream{epoch: time.Now(), faults: faults, latency: latency, addr: l.Addr().String(), rng: rand.New(rand.NewPCG(seed, 14)),
		records: map[string]upstreamRecord{}, history: map[string][]string{}, outcomes: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /documents", u.write)
	u.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(l) }()
	return u, nil
}

// url is the base URL of the upstream.
func (u *writesUpstream) url() string { return "http://" + u.addr }

// close stops the server and its connections.
func (u *writesUpstream) close() { _ = u.srv.Close() }

// write applies one write. The fault is drawn before the latency so that
// the draws follow the order of arrival.
func (u *writesUpstream) write(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	now := time.Now()
	u.requests++
	down := !u.downFrom.IsZero() && !now.Before(u.downFrom) && (u.downUntil.IsZero() || now.Before(u.downUntil))
	if down {
		u.downRequests++
	}
	x := u.rng.Float64()
	u.mu.Unlock()
	f := u.faults
	if !sleepReq(r, u.latency) {
		return
	}
	if x < f.Fail503 {
		u.count("503 (not applied)")
		u.note(key, "503", down)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	x -= f.Fail503
	rec, dup := u.apply(key, x, f, down)
	switch {
	case dup:
		u.count("duplicate (answered as the first)")
	case x < f.Lose:
		u.count("applied, connection reset")
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // a reset, as a proxy or a crashed server gives
				}
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	case x < f.Lose+f.Apply504:
		u.count("applied, answered 504")
		http.Error(w, "gateway timeout", http.StatusGatewayTimeout)
		return
	case x < f.Lose+f.Apply504+f.Hang:
		u.count("applied, no answer (client timeout)")
		<-r.Context().Done()
		return
	default:
		u.count("applied, answered 201")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]string{"id": rec.ID})
}

// apply creates key's record, or counts a duplicate write of it, and
// notes the write in the key's history with the answer it gets.
func (u *writesUpstream) apply(key string, x float64, f upstreamFaults, down bool) (rec upstreamRecord, dup bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	rec, dup = u.records[key]
	if !dup {
		rec.ID = fmt.Sprintf("rec-%d", len(u.records)+1)
	}
	rec.Writes++
	u.records[key] = rec
	answer := "201"
	switch {
	case dup:
		answer = "duplicate"
	case x < f.Lose:
		answer = "applied+reset"
	case x < f.Lose+f.Apply504:
		answer = "applied+504"
	case x < f.Lose+f.Apply504+f.Hang:
		answer = "applied+no answer"
	}
	if dup && down {
		u.dupsDown++
	}
	u.noteLocked(key, answer, down)
	return rec, dup
}

// note adds a write that applied nothing to key's history.
func (u *writesUpstream) note(key, answer string, down bool) {
	u.mu.Lock()
	u.noteLocked(key, answer, down)
	u.mu.Unlock()
}

// noteLocked adds a write to key's history: its answer, when (since the
// upstream started), and "[down]" when it was sent while policyd was down.
func (u *writesUpstream) noteLocked(key, answer string, down bool) {
	e := fmt.Sprintf("%s@%.2fs", answer, time.Since(u.epoch).Seconds())
	if down {
		e += "[down]"
	}
	u.history[key] = append(u.history[key], e)
}

// duplicatesWhileDown counts the duplicate writes sent while policyd was
// down.
func (u *writesUpstream) duplicatesWhileDown() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.dupsDown
}

func (u *writesUpstream) count(outcome string) {
	u.mu.Lock()
	u.outcomes[outcome]++
	u.mu.Unlock()
}

// markDown starts (until zero) or ends the window of requests counted as
// arriving while policyd was away.
func (u *writesUpstream) markDown(from, until time.Time) {
	u.mu.Lock()
	if !from.IsZero() {
		u.downFrom = from
	}
	u.downUntil = until
	u.mu.Unlock()
}

// historyOf returns the writes of key with their answers and times.
func (u *writesUpstream) historyOf(key string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.history[key])
}

// snapshot returns a copy of the records and counters.
func (u *writesUpstream) snapshot() (records map[string]upstreamRecord, requests, down int, outcomes map[string]int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.records), u.requests, u.downRequests, maps.Clone(u.outcomes)
}

// created returns how many records exist.
func (u *writesUpstream) created() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.records)
}

// sleepReq waits d unless the request ends first (false then).
func sleepReq(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}
