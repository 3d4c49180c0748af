package policyclient_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// A worker posting documents to a grant portal it does not control. The
// post is not idempotent by itself; the idempotency key derived from the
// submission makes retrying it safe, and the portal deduplicates on it.
func ExampleClient_Do() {
	client, err := policyclient.Dial("127.0.0.1:50051", policyclient.Config{Tenant: "acme"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())

	doc := []byte(`{"id":"doc-17","title":"..."}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := client.Do(ctx, policyclient.Call{
		Target:       "grants-portal",
		SubmissionID: "doc-17",
		Payload:      doc,
		RunID:        "nightly-2026-11-29",
	}, func(ctx context.Context, a policyclient.Attempt) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://portal.invalid/submissions", bytes.NewReader(doc))
		if err != nil {
			return policyclient.ValidationError(err)
		}
		req.Header.Set("Idempotency-Key", a.IdempotencyKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err // timeouts, resets and refusals are recognised
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			return policyclient.HTTPError(resp.StatusCode, resp.Header) // carries Retry-After
		}
		return nil
	})
	if err != nil {
		log.Fatal(err) // misuse only: no target, nil function
	}
	switch res.Disposition {
	case policyclient.Succeeded:
	case policyclient.FailedTerminal:
		fmt.Println("fix the document:", res.Reason)
	default: // dead_letter, deadline_cut, circuit_open
		fmt.Println("park for tomorrow:", res.Disposition, res.StopReason)
	}
}

// Misuse fails at construction, before any worker runs.
func ExampleNew() {
	_, err := policyclient.Dial("127.0.0.1:50051", policyclient.Config{})
	fmt.Println(err)
	// Output: policyclient: Config.Tenant is required
}

// The idempotency key is the same for the same submission in every process
// and in the Python client.
func ExampleIdempotencyKey() {
	fmt.Println(policyclient.IdempotencyKey("doc-17", []byte("payload")))
}

// A worker on net/http: every request through the client's http.Client
// runs through Do, and the final response comes back readable.
func ExampleTransport() {
	client, err := policyclient.Dial("127.0.0.1:50051", policyclient.Config{Tenant: "acme"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	doc := []byte(`{"id":"doc-17","title":"..."}`)
	hc := &http.Client{Transport: &policyclient.Transport{Client: client, Call: func(*http.Request) policyclient.Call {
		return policyclient.Call{Target: "grants-portal", SubmissionID: "doc-17", Payload: doc}
	}}}
	resp, err := hc.Post("https://portal.invalid/submissions", "application/json", bytes.NewReader(doc))
	if err != nil {
		log.Fatal(err) // a *policyclient.CallError: no response (breaker open, transport errors)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		body, _ := io.ReadAll(resp.Body) // the failure policyd stopped on, readable
		fmt.Println("fix the document:", resp.Status, string(body))
	}
}

// A worker calling a gRPC geocoder, geo-a, whose policy escalates to
// geo-b: an attempt policyd sends to geo-b goes on geo-b's connection.
func ExampleWithFallbackConns() {
	client, err := policyclient.Dial("127.0.0.1:50051", policyclient.Config{Tenant: "acme"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	connB, err := grpc.NewClient("geo-b.internal:443", creds)
	if err != nil {
		log.Fatal(err)
	}
	defer connB.Close()
	describe := func(context.Context, string) policyclient.Call {
		return policyclient.Call{Target: "geo-a", Idempotent: true}
	}
	fallbacks := policyclient.WithFallbackConns(map[string]*grpc.ClientConn{"geo-b": connB})
	connA, err := grpc.NewClient("geo-a.internal:443", creds,
		grpc.WithUnaryInterceptor(policyclient.UnaryClientInterceptor(client, describe, fallbacks)),
		grpc.WithStreamInterceptor(policyclient.StreamClientInterceptor(client, describe, fallbacks)))
	if err != nil {
		log.Fatal(err)
	}
	defer connA.Close()
	// Calls on connA (a generated client of it) now run through policyd.
}
