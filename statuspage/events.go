package statuspage

import (
	"bytes"
	"fmt"
	"net/http"
	"time"
)

// streamRetry is the reconnection delay the event stream asks browsers for.
const streamRetry = 2 * time.Second

// serveEvents streams the page's <main> as "status" events: once the
// store's subscription has sent its snapshot, then after every breaker
// change, and every cfg.Refresh when the rendering differs from the last
// one sent. It ends when the client goes, when Close is called, or when the
// store closes; a subscription the store dropped for falling behind is
// renewed.
func (p *Page) serveEvents(w http.ResponseWriter, r *http.Request) {
	select {
	case p.streams <- struct{}{}:
		defer func() { <-p.streams }()
	default:
		http.Error(w, fmt.Sprintf("status page: %d event streams already open; try again later", cap(p.streams)), http.StatusServiceUnavailable)
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // proxies: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, "retry: %d\n\n", streamRetry.Milliseconds()); err != nil {
		return
	}
	_ = rc.Flush()

	events, cancel := p.cfg.Source.Subscribe("", p.cfg.SubscriptionBuffer)
	defer func() { cancel() }()
	snapshotDone := false // of the current subscription
	refresh := time.NewTicker(p.cfg.Refresh)
	defer refresh.Stop()
	var last []byte
	send := func() error {
		body, err := p.renderMain(p.status())
		if err != nil {
			p.cfg.Logger.Error("status page: rendering", "err", err)
			return err
		}
		if bytes.Equal(body, last) {
			return nil
		}
		last = body
		if err := writeEvent(w, "status", body); err != nil {
			return err
		}
		return rc.Flush()
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-p.done:
			return
		case ev, ok := <-events:
			if !ok {
				if !snapshotDone {
					return // closed before its snapshot: the store is closed
				}
				// Dropped for falling behind: a new subscription brings a
				// fresh snapshot, and a rendering once it is in.
				cancel()
				events, cancel = p.cfg.Source.Subscribe("", p.cfg.SubscriptionBuffer)
				snapshotDone = false
				continue
			}
			if ev.SnapshotDone {
				snapshotDone = true
			}
			// Render once a burst of changes (or the snapshot) is in.
			if !snapshotDone || len(events) > 0 {
				continue
			}
			if send() != nil {
				return
			}
		case <-refresh.C:
			if !snapshotDone {
				continue
			}
			if send() != nil {
				return
			}
		}
	}
}

// writeEvent writes one server-sent event named name whose data is body,
// one "data:" field a line.
func writeEvent(w http.ResponseWriter, name string, body []byte) error {
	var buf bytes.Buffer
	buf.WriteString("event: ")
	buf.WriteString(name)
	buf.WriteByte('\n')
	// A lone CR would end a line for the browser's parser; as a character
	// reference it means the same to HTML.
	body = bytes.ReplaceAll(body, []byte("\r"), []byte("&#13;"))
	for line := range bytes.Lines(body) {
		buf.WriteString("data: ")
		buf.Write(bytes.TrimRight(line, "\r\n"))
		buf.WriteByte('\n')
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}
