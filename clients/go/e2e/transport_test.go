package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// reply is one answer of a flaky upstream.
type reply struct {
	status int
	header map[string]string
	body   string
}

// received is what a flaky upstream saw of one request.
type received struct {
	key, body string
}

// flakyHTTP is an HTTP upstream on loopback that answers its nth request
// with script[n-1], and the last entry from then on.
type flakyHTTP struct {
	srv    *httptest.Server
	mu     sync.Mutex
	script []reply
	got    []received
}

func startFlakyHTTP(t *testing.T, script ...reply) *flakyHTTP {
	t.Helper()
	f := &flakyHTTP{script: script}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.got = append(f.got, received{key: r.Header.Get("Idempotency-Key"), body: string(body)})
		rep := f.script[min(len(f.got), len(f.script))-1]
		f.mu.Unlock()
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(rep.status)
		io.WriteString(w, rep.body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *flakyHTTP) requests() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.got...)
}

// readAll reads and closes resp's body.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the final response's body: %v", err)
	}
	return string(b)
}

func TestTransportRetriesWithPushbackAndAStableKey(t *testing.T) {
	d := startDaemon(t, nil)
	c, sl := newClient(t, d, nil)
	up := startFlakyHTTP(t,
		reply{status: 503, header: map[string]string{"Retry-After": "7"}, body: "busy"},
		reply{status: 429, header: map[string]string{"X-Amz-Retry-After": "3000"}},
		reply{status: 201, body: "filed"})
	payload := []byte(`{"id":"doc-17"}`)
	hc := &http.Client{Transport: &policyclient.Transport{Client: c, Call: func(r *http.Request) policyclient.Call {
		return policyclient.Call{Target: "portal", SubmissionID: "doc-17", Payload: payload}
	}}}
	resp, err := hc.Post(up.srv.URL, "application/json", bytes.NewReader(payload))
	if err != nil {
		t.Fatalf("Post: %v", err)
	}
	if got := readAll(t, resp); resp.StatusCode != 201 || got != "filed" {
		t.Errorf("final response: got %d %q, want 201 \"filed\"", resp.StatusCode, got)
	}
	reqs := up.requests()
	if len(reqs) != 3 {
		t.Fatalf("upstream saw %d requests, want 3", len(reqs))
	}
	want := policyclient.IdempotencyKey("doc-17", payload)
	for i, r := range reqs {
		if r.key != want || r.body != string(payload) {
			t.Errorf("request %d: got key %q body %q, want key %q body %q", i+1, r.key, r.body, want, payload)
		}
	}
	waits := sl.all()
	if len(waits) != 2 || waits[0] < 7*time.Second || waits[1] < 3*time.Second {
		t.Errorf("waits: got %v, want two, at least the 7s Retry-After and the 3s X-Amz-Retry-After", waits)
	}
}

// TestTransportReturnsTheFinalFailureReadable: when policyd says to stop,
// the last response is returned with its body readable (the attempt's
// context, which Do ends when the attempt returns, does not bound it).
func TestTransportReturnsTheFinalFailureReadable(t *testing.T) {
	d := startDaemon(t, nil)
	// Bodies larger than the connection's buffers, so that reading them
	// needs the connection after RoundTrip returned.
	long := func(line string) string { return strings.Repeat(line+"\n", 1<<16) }
	tests := []struct {
		name     string
		reply    reply
		requests int
	}{
		{"terminal 400 at once", reply{status: 400, body: long("field title: required")}, 1},
		{"503 after the attempts ran out", reply{status: 503, body: long("still busy")}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newClient(t, d, nil)
			up := startFlakyHTTP(t, tc.reply)
			hc := &http.Client{Transport: &policyclient.Transport{Client: c}}
			resp, err := hc.Get(up.srv.URL)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if got := readAll(t, resp); resp.StatusCode != tc.reply.status || got != tc.reply.body {
				t.Errorf("final response: got %d with %d bytes, want %d with the %d bytes sent", resp.StatusCode, len(got), tc.reply.status, len(tc.reply.body))
			}
			if got := len(up.requests()); got != tc.requests {
				t.Errorf("upstream saw %d requests, want %d", got, tc.requests)
			}
		})
	}
}

func TestTransportRefusesABodyItCannotReplay(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	up := startFlakyHTTP(t, reply{status: 200})
	req, err := http.NewRequest(http.MethodPut, up.srv.URL, io.NopCloser(strings.NewReader("once only")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&http.Client{Transport: &policyclient.Transport{Client: c}}).Do(req)
	if !errors.Is(err, policyclient.ErrBodyNotReplayable) {
		t.Errorf("got %v, want ErrBodyNotReplayable", err)
	}
	if got := len(up.requests()); got != 0 {
		t.Errorf("upstream saw %d requests, want none", got)
	}
}

func TestTransportErrorEndsInACallError(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now: connection refused
	_, err = (&http.Client{Transport: &policyclient.Transport{Client: c}}).Get("http://" + addr + "/")
	var ce *policyclient.CallError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *CallError", err)
	}
	if ce.Result.Disposition != policyclient.DeadLetter || ce.Result.Reason != "transport:connection_refused" || ce.Result.Attempts != 3 {
		t.Errorf("got %v/%q after %d attempts, want dead_letter/transport:connection_refused after 3",
			ce.Result.Disposition, ce.Result.Reason, ce.Result.Attempts)
	}
}

// TestTransportMapsTargetsToHosts: the request names the target; Hosts
// says where it lives, and the key header's name is configurable.
func TestTransportMapsTargetsToHosts(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("X-Request-Key"))
	}))
	t.Cleanup(up.Close)
	tr := &policyclient.Transport{Client: c, KeyHeader: "X-Request-Key",
		Hosts: map[string]string{"geo": strings.TrimPrefix(up.URL, "http://")}}
	req, err := http.NewRequest(http.MethodGet, "http://geo/lookup", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Request-Key", "caller-key")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	readAll(t, resp)
	if len(got) != 1 || got[0] != "caller-key" {
		t.Errorf("upstream saw keys %q, want the caller's [caller-key]", got)
	}
}

// closeRecorder is a request body that notes its Close.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (b *closeRecorder) Close() error { b.closed = true; return nil }

// TestTransportClosesABodyItNeverSent: a call the breaker refuses before
// any attempt still closes the request's body, as a RoundTripper must.
func TestTransportClosesABodyItNeverSent(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, func(cfg *policyclient.Config) { cfg.NoWatch = true }) // every attempt asks Admit
	if _, err := d.admin.ForceBreaker(context.Background(), &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "shut"}, State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
	up := startFlakyHTTP(t, reply{status: 200})
	body := &closeRecorder{Reader: strings.NewReader("doc")}
	req, err := http.NewRequest(http.MethodPut, up.srv.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("doc")), nil }
	tr := &policyclient.Transport{Client: c, Call: func(*http.Request) policyclient.Call {
		return policyclient.Call{Target: "shut", Idempotent: true}
	}}
	_, err = tr.RoundTrip(req)
	var ce *policyclient.CallError
	if !errors.As(err, &ce) || ce.Result.Disposition != policyclient.CircuitOpen || ce.Result.Attempts != 0 {
		t.Fatalf("got %v, want a CallError for circuit_open before any attempt", err)
	}
	if !body.closed || len(up.requests()) != 0 {
		t.Errorf("body closed %v, upstream saw %d requests; want closed and none", body.closed, len(up.requests()))
	}
}

// TestTransportKeyIsTheSameFromEveryClient: two workers (two clients, two
// transports) sending the same submission derive the same key, so the
// upstream deduplicates a request one worker sent before it died and
// another sent again (the shared vectors pin the same key in Python). With
// policyd's idempotency ledger the second worker does not even send it: it
// finds the key SUCCEEDED and ends deduplicated, its CallError saying so.
func TestTransportKeyIsTheSameFromEveryClient(t *testing.T) {
	d := startDaemon(t, nil)
	up := startFlakyHTTP(t, reply{status: 200})
	payload := []byte(`{"id":"doc-5"}`)
	var second error
	for i := range 2 {
		c, _ := newClient(t, d, nil)
		hc := &http.Client{Transport: &policyclient.Transport{Client: c, Call: func(*http.Request) policyclient.Call {
			return policyclient.Call{Target: "portal", SubmissionID: "doc-5", Payload: payload}
		}}}
		resp, err := hc.Post(up.srv.URL, "application/json", bytes.NewReader(payload))
		if i == 1 {
			second = err
			continue
		}
		if err != nil {
			t.Fatalf("Post: %v", err)
		}
		readAll(t, resp)
	}
	reqs := up.requests()
	if want := policyclient.IdempotencyKey("doc-5", payload); len(reqs) != 1 || reqs[0].key != want {
		t.Errorf("upstream saw %+v, want one request with key %s", reqs, want)
	}
	var ce *policyclient.CallError
	if !errors.As(second, &ce) || !ce.Result.Deduplicated || ce.Result.Disposition != policyclient.Succeeded {
		t.Errorf("second worker got %v, want a deduplicated success", second)
	}
}
