package statuspage_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/statuspage"
)

// sseEvent is one server-sent event.
type sseEvent struct{ name, data string }

// openStream opens url's /status/events and returns its events, in order,
// on a channel closed when the stream ends.
func openStream(t *testing.T, url string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/status/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET /status/events: got %s %q, want 200 text/event-stream", resp.Status, resp.Header.Get("Content-Type"))
	}
	out := make(chan sseEvent, 64)
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var ev sseEvent
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" || data != nil {
					ev.data = strings.Join(data, "\n")
					out <- ev
				}
				ev, data = sseEvent{}, nil
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			}
		}
	}()
	return out
}

// awaitTimeout bounds how long a test waits for the stream; reaching it
// is a failure, never the normal path.
const awaitTimeout = 10 * time.Second

// await returns the first "status" event for which ok holds.
func await(t *testing.T, events <-chan sseEvent, what string, ok func(data string) bool) string {
	t.Helper()
	deadline := time.After(awaitTimeout)
	for {
		select {
		case ev, open := <-events:
			if !open {
				t.Fatalf("stream ended before %s", what)
			}
			if ev.name == "status" && ok(ev.data) {
				return ev.data
			}
		case <-deadline:
			t.Fatalf("no event with %s within %s", what, awaitTimeout)
		}
	}
}

// awaitEnd waits for the stream to end.
func awaitEnd(t *testing.T, events <-chan sseEvent) {
	t.Helper()
	deadline := time.After(awaitTimeout)
	for {
		select {
		case _, open := <-events:
			if !open {
				return
			}
		case <-deadline:
			t.Fatalf("stream still open after %s", awaitTimeout)
		}
	}
}

func anything(string) bool { return true }

// openRow reports whether a rendered <main> shows target's breaker OPEN.
func openRow(target string) func(string) bool {
	return func(data string) bool {
		i := strings.Index(data, `data-target="`+target+`"`)
		return i >= 0 && strings.Contains(data[i:min(len(data), i+400)], `class="state state-open">OPEN`)
	}
}

func TestEventsFollowBreakerChanges(t *testing.T) {
	store := openStore(t, nil)
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	fail(t, store, key, consecutive, 1)
	_, url := serve(t, statuspage.Config{Source: store, Open: true, Refresh: time.Hour})
	events := openStream(t, url)
	first := await(t, events, "the first rendering", anything)
	if !strings.HasPrefix(first, `<main id="status"`) || !strings.Contains(first, `data-target="payments"`) {
		t.Fatalf("first event: got %q, want the page's <main> with the breaker", first)
	}
	if _, err := store.ForceBreaker(key, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	await(t, events, "payments OPEN", openRow("payments"))
}

// droppingSource is the real store, with a hand on the subscriptions it
// hands out: drop closes the newest one's channel, which is what the store
// does to a subscriber that falls behind.
type droppingSource struct {
	*breakerstore.Store

	mu      sync.Mutex
	cancels []func()
	subs    chan int // the count of subscriptions, after each
}

func (s *droppingSource) Subscribe(tenant string, buffer int) (<-chan policy.BreakerEvent, func()) {
	ch, cancel := s.Store.Subscribe(tenant, buffer)
	s.mu.Lock()
	s.cancels = append(s.cancels, cancel)
	n := len(s.cancels)
	s.mu.Unlock()
	s.subs <- n
	return ch, cancel
}

func (s *droppingSource) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancels[len(s.cancels)-1]()
}

func TestEventsResubscribeWhenDropped(t *testing.T) {
	store := openStore(t, nil)
	src := &droppingSource{Store: store, subs: make(chan int, 8)}
	_, url := serve(t, statuspage.Config{Source: src, Open: true, Refresh: time.Hour})
	events := openStream(t, url)
	await(t, events, "the first rendering", anything)
	if n := <-src.subs; n != 1 {
		t.Fatalf("subscriptions: got %d, want 1", n)
	}

	src.drop()
	select {
	case n := <-src.subs:
		if n != 2 {
			t.Fatalf("subscriptions after the drop: got %d, want 2", n)
		}
	case <-time.After(awaitTimeout):
		t.Fatal("the stream did not subscribe again after its subscription was dropped")
	}
	// The changes after the drop reach the page (the refresh is an hour
	// away: only the new subscription can bring this one).
	if _, err := store.ForceBreaker(policy.BreakerKey{Tenant: "acme", Target: "search"}, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	await(t, events, "search OPEN after the drop", openRow("search"))
}

func TestEventsEndWhenTheStoreCloses(t *testing.T) {
	store := openStore(t, nil)
	_, url := serve(t, statuspage.Config{Source: store, Open: true, Refresh: time.Hour})
	events := openStream(t, url)
	await(t, events, "the first rendering", anything)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	awaitEnd(t, events)
}

func TestEventsEndWhenThePageCloses(t *testing.T) {
	store := openStore(t, nil)
	page, url := serve(t, statuspage.Config{Source: store, Open: true, Refresh: time.Hour})
	events := openStream(t, url)
	await(t, events, "the first rendering", anything)
	page.Close()
	awaitEnd(t, events)
}

func TestEventStreamsAreCapped(t *testing.T) {
	store := openStore(t, nil)
	_, url := serve(t, statuspage.Config{Source: store, Open: true, MaxStreams: 1, Refresh: time.Hour})
	events := openStream(t, url)
	await(t, events, "the first rendering", anything)
	resp, err := http.Get(url + "/status/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("second stream: got %s, want 503", resp.Status)
	}
}
