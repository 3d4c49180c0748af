package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// upstreamScript is how the demo's fake upstream misbehaves. Which request
// of which submission gets a 429, a 503 or hangs is a pure function of Seed,
// the request's Idempotency-Key and how many requests with that key the
// upstream has seen (verdict), so a seed replays the same faults; the outage
// is a fixed window of time from the start of the batch.
type upstreamScript struct {
	Seed uint64
	// P429, P503 and PHang are the chances, per request, of a 429 (which
	// opens a rate-limit window of RetryAfter for every caller), a 503, and
	// a hang of Hang (longer than the workers' attempt timeout; half of the
	// hung requests apply the write before hanging, as a slow commit does).
	P429, P503, PHang float64
	RetryAfter        time.Duration // whole seconds, sent as Retry-After
	Hang              time.Duration
	// LatencyMin and LatencyMax bound a successful answer's latency.
	LatencyMin, LatencyMax time.Duration
	// OutageAt is when the outage starts, from the start of the batch: the
	// upstream answers every request 503 for Outage503, then closes its port
	// (connection refused) for OutageRefused.
	OutageAt, Outage503, OutageRefused time.Duration
}

// verdict is what the script says about one request.
type verdict int

const (
	verdictOK verdict = iota
	verdict429
	verdict503
	verdictHang        // hang without applying the write
	verdictHangApplied // apply the write, then hang: the answer is lost
)

// verdict returns the script's answer to the n-th request (from 1) carrying
// key, and the latency of a successful answer. It is a pure function.
func (s upstreamScript) verdict(key string, n int) (verdict, time.Duration) {
	u := draw(s.Seed, key, uint64(n), 1)
	lat := s.LatencyMin + time.Duration(draw(s.Seed, key, uint64(n), 2)*float64(s.LatencyMax-s.LatencyMin))
	switch {
	case u < s.P429:
		return verdict429, 0
	case u < s.P429+s.P503:
		return verdict503, 0
	case u < s.P429+s.P503+s.PHang:
		if draw(s.Seed, key, uint64(n), 3) < 0.5 {
			return verdictHangApplied, 0
		}
		return verdictHang, 0
	}
	return verdictOK, lat
}

// draw is a uniform number in [0, 1) derived from seed, key, n and salt
// (splitmix64 over an FNV-1a hash of key).
func draw(seed uint64, key string, n, salt uint64) float64 {
	h := fnv.New64a()
	io.WriteString(h, key)
	x := mix(seed ^ mix(h.Sum64()^mix(n<<8|salt)))
	return float64(x>>11) / (1 << 53)
}

func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// demoDoc is one document of the batch; the upstream accepts it when its
// title is set and its amount is not negative.
type demoDoc struct {
	ID     string `json:"id"`
	Title  string `json:"title"`
	Amount int    `json:"amount"`
}

// makeDocs returns n documents, a share pBad of them malformed, the same
// for the same seed.
func makeDocs(seed uint64, n int, pBad float64) (ids []string, bodies [][]byte) {
	for i := range n {
		d := demoDoc{ID: fmt.Sprintf("doc-%04d", i+1), Title: fmt.Sprintf("Grant application %d", i+1),
			Amount: 1000 + int(draw(seed, "amount", uint64(i), 0)*90000)}
		if draw(seed, d.ID, 0, 9) < pBad {
			if i%2 == 0 {
				d.Title = ""
			} else {
				d.Amount = -d.Amount
			}
		}
		b, _ := json.Marshal(d)
		ids, bodies = append(ids, d.ID), append(bodies, b)
	}
	return ids, bodies
}

func validDoc(body []byte) bool {
	var d demoDoc
	return json.Unmarshal(body, &d) == nil && d.ID != "" && d.Title != "" && d.Amount >= 0
}

// upstreamCounts is what the fake upstream saw.
type upstreamCounts struct {
	Requests        int `json:"requests"`
	OK              int `json:"ok_200"`
	Replays         int `json:"replayed_200"` // answered from the idempotency-key cache
	Throttled       int `json:"throttled_429"`
	RateWindows     int `json:"retry_after_windows"`
	InsideWindow    int `json:"requests_inside_retry_after_window"`
	Outage503       int `json:"outage_503"`
	Flaky503        int `json:"flaky_503"`
	BadRequest      int `json:"bad_request_400"`
	Hung            int `json:"hung"`
	HungApplied     int `json:"hung_after_applying"`
	WritesApplied   int `json:"writes_applied"`
	DuplicateWrites int `json:"duplicate_writes"`
}

// upstream is the demo's fake flaky HTTP API on loopback: POST /documents
// with an Idempotency-Key header. It is safe for concurrent use; Close ends
// it.
type upstream struct {
	script upstreamScript
	log    *slog.Logger
	addr   string

	mu        sync.Mutex
	t0        time.Time // start of the batch; zero before start
	srv       *http.Server
	closed    bool
	seen      map[string]int // requests per key
	applied   map[string]int // writes per key
	throttled time.Time      // end of the current rate-limit window
	counts    upstreamCounts
	upAt      time.Duration // when the port reopened after the outage; -1 before
	timers    []*time.Timer

	serving sync.WaitGroup // Serve goroutines
	bg      sync.WaitGroup // timer functions
}

// startUpstream listens on a random loopback port and serves.
func startUpstream(script upstreamScript, log *slog.Logger) (*upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake upstream: %w", err)
	}
	u := &upstream{script: script, log: log, addr: l.Addr().String(),
		seen: map[string]int{}, applied: map[string]int{}, upAt: -1}
	u.mu.Lock()
	u.serveLocked(l)
	u.mu.Unlock()
	return u, nil
}

// URL is the base URL of the upstream.
func (u *upstream) URL() string { return "http://" + u.addr }

func (u *upstream) serveLocked(l net.Listener) {
	srv := &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(u.log.Handler(), slog.LevelDebug)}
	u.srv = srv
	u.serving.Add(1)
	go func() {
		defer u.serving.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			u.log.Warn("fake upstream stopped serving", "err", err)
		}
	}()
}

// start marks the start of the batch, from which the outage is timed.
func (u *upstream) start(t0 time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.t0 = t0
	if u.script.OutageRefused <= 0 {
		return
	}
	down := u.script.OutageAt + u.script.Outage503
	u.after(time.Until(t0.Add(down)), u.goDown)
	u.after(time.Until(t0.Add(down+u.script.OutageRefused)), u.comeBack)
}

// after runs fn after d, unless Close comes first; u.mu is held.
func (u *upstream) after(d time.Duration, fn func()) {
	u.bg.Add(1)
	u.timers = append(u.timers, time.AfterFunc(d, func() { defer u.bg.Done(); fn() }))
}

// goDown closes the port: connections are refused until comeBack.
func (u *upstream) goDown() {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return
	}
	srv := u.srv
	u.srv = nil
	u.mu.Unlock()
	srv.Close()
}

// comeBack listens on the same port again.
func (u *upstream) comeBack() {
	for {
		l, err := net.Listen("tcp", u.addr)
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			if err == nil {
				l.Close()
			}
			return
		}
		if err == nil {
			u.upAt = time.Since(u.t0)
			u.serveLocked(l)
			u.mu.Unlock()
			return
		}
		u.mu.Unlock()
		u.log.Warn("fake upstream: port not free yet; trying again", "addr", u.addr, "err", err)
		time.Sleep(50 * time.Millisecond)
	}
}

// Close stops the timers and the server and waits for them.
func (u *upstream) Close() {
	u.mu.Lock()
	u.closed = true
	for _, t := range u.timers {
		if t.Stop() {
			u.bg.Done()
		}
	}
	srv := u.srv
	u.srv = nil
	u.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	u.bg.Wait()
	u.serving.Wait()
}

// outage returns the outage window as it happened, from the start of the
// batch: its end is when the port reopened (or the scheduled end of the 503
// phase when there is no refused phase).
func (u *upstream) outage() (start, end time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	start, end = u.script.OutageAt, u.script.OutageAt+u.script.Outage503
	if u.script.OutageRefused > 0 {
		end += u.script.OutageRefused
		if u.upAt >= 0 {
			end = u.upAt
		}
	}
	return start, end
}

// snapshot returns the counters.
func (u *upstream) snapshot() upstreamCounts {
	u.mu.Lock()
	defer u.mu.Unlock()
	c := u.counts
	c.WritesApplied = len(u.applied)
	for _, n := range u.applied {
		c.DuplicateWrites += n - 1
	}
	return c
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/documents" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		return // the client went away
	}
	key := r.Header.Get("Idempotency-Key")
	now := time.Now()

	u.mu.Lock()
	u.counts.Requests++
	var rel time.Duration = -1
	if !u.t0.IsZero() {
		rel = now.Sub(u.t0)
	}
	s := u.script
	if rel >= s.OutageAt && rel < s.OutageAt+s.Outage503+s.OutageRefused {
		u.counts.Outage503++
		u.mu.Unlock()
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		return
	}
	if now.Before(u.throttled) {
		u.counts.InsideWindow++
		u.counts.Throttled++
		left := u.throttled.Sub(now)
		u.mu.Unlock()
		tooMany(w, left)
		return
	}
	if key == "" {
		u.counts.BadRequest++
		u.mu.Unlock()
		http.Error(w, "Idempotency-Key header required", http.StatusBadRequest)
		return
	}
	u.seen[key]++
	v, lat := s.verdict(key, u.seen[key])
	if v == verdict429 {
		u.throttled = now.Add(s.RetryAfter)
		u.counts.RateWindows++
		u.counts.Throttled++
		u.mu.Unlock()
		tooMany(w, s.RetryAfter)
		return
	}
	if u.applied[key] > 0 {
		// A retry of a write already applied: answer it, write nothing.
		u.counts.Replays++
		u.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusOK)
		return
	}
	if !validDoc(body) {
		u.counts.BadRequest++
		u.mu.Unlock()
		http.Error(w, "invalid document", http.StatusBadRequest)
		return
	}
	switch v {
	case verdict503:
		u.counts.Flaky503++
		u.mu.Unlock()
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	case verdictHang, verdictHangApplied:
		u.counts.Hung++
		if v == verdictHangApplied {
			u.counts.HungApplied++
			u.applied[key]++
		}
		u.mu.Unlock()
		wait(r, s.Hang)
		w.WriteHeader(http.StatusGatewayTimeout)
		return
	}
	u.applied[key]++
	u.counts.OK++
	u.mu.Unlock()
	wait(r, lat)
	w.WriteHeader(http.StatusOK)
}

// tooMany answers 429 with Retry-After: the seconds left, rounded up.
func tooMany(w http.ResponseWriter, left time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(left.Seconds())))))
	http.Error(w, "rate limited", http.StatusTooManyRequests)
}

// wait waits d or until the client goes away.
func wait(r *http.Request, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}
