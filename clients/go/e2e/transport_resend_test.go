package e2e_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// connKey carries a connection's request count in a request's context.
type connKey struct{}

// TestTransportBaseDoesNotResendBeneathTheLedger: net/http's Transport
// sends a request again by itself when a reused connection breaks after
// the request was written, if the request is "replayable" (a body it can
// get again through GetBody, and an Idempotency-Key header on a POST).
// Below Transport that resend is a second write nobody decided: not
// policyd, not the idempotency ledger. The upstream here applies the second
// request of every kept-alive connection and then drops the connection
// without an answer; the document must reach it once.
func TestTransportBaseDoesNotResendBeneathTheLedger(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	var mu sync.Mutex
	writes := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		writes[string(body)]++
		mu.Unlock()
		n := r.Context().Value(connKey{}).(*int)
		*n++
		if *n == 2 { // applied, then the connection dies before the answer
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(int))
	}
	srv.Start()
	t.Cleanup(srv.Close)

	hc := &http.Client{Transport: &policyclient.Transport{Client: c, Base: &http.Transport{}, Call: func(r *http.Request) policyclient.Call {
		return policyclient.Call{Target: "portal", SubmissionID: r.URL.Query().Get("doc")}
	}}}
	for _, doc := range []string{"doc-1", "doc-2"} {
		resp, err := hc.Post(srv.URL+"?doc="+doc, "application/json", bytes.NewReader([]byte(doc)))
		if err == nil {
			resp.Body.Close()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if writes["doc-1"] != 1 || writes["doc-2"] != 1 {
		t.Errorf("upstream writes: %v, want each document once (net/http must not resend beneath the ledger)", writes)
	}
}
