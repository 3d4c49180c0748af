package statuspage

import (
	"bytes"
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/policyd/policyd/policy"
)

// Source is the fleet state the page reads. It is declared here, where it
// is consumed; breakerstore.Store and redisstore.Store satisfy it. Implementations must be
// safe for concurrent use.
type Source interface {
	// Breakers lists up to limit breakers (all when limit <= 0) in the
	// given state (any when zero) of tenant (every tenant when ""), by key.
	Breakers(tenant string, state policy.BreakerState, after policy.BreakerKey, limit int) ([]policy.BreakerSnapshot, error)
	// Breaker returns the breaker under key; one never seen is an error
	// of the not-found class (a NotFound method returning true).
	Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error)
	// Budgets lists up to limit tenants' budgets (all when limit <= 0).
	Budgets(after string, limit int) ([]policy.BudgetStatus, error)
	// Runs lists up to limit of tenant's runs (all when limit <= 0).
	Runs(tenant, after string, limit int) ([]policy.Run, error)
	// Run returns the run id; an unknown one is of the not-found class.
	Run(id string) (policy.Run, error)
	// RunCalls returns up to limit calls of run runID's call table that f
	// selects, by call id after the id after, and how many of the run's
	// calls are beyond the table's cap.
	RunCalls(runID string, f policy.RunCallFilter, after string, limit int) ([]policy.RunCall, uint64, error)
	// Resolve returns the policy a call of tenant to target follows.
	Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry)
	// Policies lists up to limit stored policies (all when limit <= 0),
	// by scope.
	Policies(after policy.PolicyScope, limit int) ([]policy.PolicyEntry, error)
	// Pool returns the concurrency ceiling's state under key.
	Pool(key policy.BreakerKey) (policy.PoolStatus, error)
	// Subscribe streams the breakers' states, then every change; the
	// channel is closed when the subscriber falls behind, when cancel is
	// called or when the store closes.
	Subscribe(tenant string, buffer int) (events <-chan policy.BreakerEvent, cancel func())
}

// Clock tells the time.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Defaults of Config's zero fields.
const (
	DefaultMaxBreakers = 500
	DefaultMaxTenants  = 500
	DefaultMaxRuns     = 200
	DefaultRefresh     = 2 * time.Second
	DefaultSample      = 5 * time.Second
	DefaultHistoryLen  = 60
	DefaultMaxStreams  = 32
)

// Config configures a Page. Zero fields take the defaults above.
type Config struct {
	Source Source
	// Health reports the store's health; nil shows none.
	Health func() StoreHealth
	// Replicas lists the daemons serving the fleet state (Sole for a
	// bbolt file); nil shows none.
	Replicas Replicas
	// Open serves every endpoint without a credential (a loopback
	// listener, or admin calls opened for development). Otherwise Admin
	// must accept the token presented.
	Open bool
	// Admin reports whether token is an admin token; nil accepts none.
	Admin func(token string) bool
	// MaxBreakers, MaxTenants and MaxRuns cap the rows of each section.
	MaxBreakers, MaxTenants, MaxRuns int
	// Refresh is how often an event stream re-renders to show what moves
	// without a breaker change: tokens, ledgers, ages.
	Refresh time.Duration
	// Sample is how often the breakers' failure counts are sampled for the
	// sparklines, and HistoryLen how many samples are kept.
	Sample     time.Duration
	HistoryLen int
	// MaxStreams caps the event streams open at once (each holds one store
	// subscription); past it /status/events answers 503.
	MaxStreams int
	// SubscriptionBuffer is each stream's subscription buffer (0: the
	// store's default).
	SubscriptionBuffer int
	Clock              Clock
	Logger             *slog.Logger
}

//go:embed assets
var assets embed.FS

var pageTmpl = template.Must(template.New("status.html.tmpl").Funcs(funcs).ParseFS(assets, "assets/status.html.tmpl"))

// Page is the status page's HTTP handler and the sampler behind its
// sparklines. It is safe for concurrent use; Close ends it.
type Page struct {
	cfg     Config
	mux     *http.ServeMux
	streams chan struct{} // one token per open event stream
	done    chan struct{} // closed by Close
	sampled chan struct{} // closed when the sampler has ended
	once    sync.Once
	hist    history
}

// New returns the page for cfg and starts its sampler, which runs until
// Close.
func New(cfg Config) *Page {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.MaxBreakers, DefaultMaxBreakers)
	def(&cfg.MaxTenants, DefaultMaxTenants)
	def(&cfg.MaxRuns, DefaultMaxRuns)
	def(&cfg.HistoryLen, DefaultHistoryLen)
	def(&cfg.MaxStreams, DefaultMaxStreams)
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Sample <= 0 {
		cfg.Sample = DefaultSample
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Page{cfg: cfg, mux: http.NewServeMux(), streams: make(chan struct{}, cfg.MaxStreams),
		done: make(chan struct{}), sampled: make(chan struct{}), hist: newHistory(cfg.HistoryLen)}
	static, _ := fs.Sub(assets, "assets")
	p.mux.HandleFunc("GET /status", p.servePage)
	p.mux.HandleFunc("GET /status.json", p.serveJSON)
	p.mux.HandleFunc("GET /status/events", p.serveEvents)
	p.mux.HandleFunc("GET /status/runs/{id}", p.serveRun)
	p.mux.Handle("GET /status/assets/", http.StripPrefix("/status/assets/", http.FileServerFS(static)))
	go p.sampleLoop()
	return p
}

// Register mounts the page's endpoints on mux.
func (p *Page) Register(mux *http.ServeMux) {
	for _, pat := range []string{"/status", "/status.json", "/status/"} {
		mux.Handle(pat, p)
	}
}

// ServeHTTP checks the credential, sets the headers every answer carries
// and serves the endpoint.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if !p.authorized(r) {
		h.Add("WWW-Authenticate", `Basic realm="policyd status", charset="UTF-8"`)
		h.Add("WWW-Authenticate", `Bearer realm="policyd status"`)
		http.Error(w, "status page: an admin credential is required off loopback: "+
			"\"Authorization: Bearer <admin token>\", or the admin token as the password of HTTP Basic", http.StatusUnauthorized)
		return
	}
	p.mux.ServeHTTP(w, r)
}

// Close ends every event stream and the sampler, and waits for the
// sampler. It may be called more than once.
func (p *Page) Close() {
	p.once.Do(func() { close(p.done) })
	<-p.sampled
}

func (p *Page) servePage(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, p.status()); err != nil {
		p.cfg.Logger.Error("status page: rendering", "err", err)
		http.Error(w, "status page: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

func (p *Page) serveJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(p.status())
}

// renderMain renders the page's <main>, what an event carries.
func (p *Page) renderMain(st Status) ([]byte, error) {
	var buf bytes.Buffer
	err := pageTmpl.ExecuteTemplate(&buf, "main", st)
	return buf.Bytes(), err
}

// sampleLoop samples the failure counts every cfg.Sample until Close.
func (p *Page) sampleLoop() {
	defer close(p.sampled)
	t := time.NewTicker(p.cfg.Sample)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.sample()
		}
	}
}

// sample records the listed breakers' failure counts and the store's flush
// errors in the history.
func (p *Page) sample() {
	bs, _ := p.breakers()
	var flushErrors uint64
	if p.cfg.Health != nil {
		flushErrors = p.cfg.Health().FlushErrors
	}
	p.hist.record(p.cfg.Clock.Now(), bs, flushErrors)
}
