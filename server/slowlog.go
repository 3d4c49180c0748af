package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// DefaultSlowRequest is Config.SlowRequest's default.
const DefaultSlowRequest = time.Second

// slowWindow is how long the slow-request log gathers slow calls into one
// line: when the engine stalls, every decision is slow, and one line a
// second says so as well as a hundred thousand would.
const slowWindow = time.Second

// slowLog logs the unary calls that took longer than after, as the
// handler saw them (from the interceptor's start to the handler's
// answer): the first slow call opens a window of slowWindow, and at its
// end one WARN line "slow requests" gives how many calls were slow in it
// and the slowest of them (method, tenant and target, attempt, whether it
// was answered degraded, and its code). Time spent before the handler
// runs (the request waiting in the socket, a process not scheduled) is
// not in it: a caller that measures more than the log shows lost it
// there.
type slowLog struct {
	after time.Duration
	clock Clock
	log   *slog.Logger

	mu      sync.Mutex
	open    bool // a window is open; its line is written when it ends
	count   int
	slowest time.Duration
	what    string // the slowest call, described
}

func newSlowLog(after time.Duration, clock Clock, log *slog.Logger) *slowLog {
	return &slowLog{after: after, clock: clock, log: log}
}

// unary times every unary call and notes those slower than l.after.
func (l *slowLog) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := l.clock.Now()
		resp, err := handler(ctx, req)
		if took := l.clock.Now().Sub(start); took > l.after {
			l.note(took, info.FullMethod, req, resp, err)
		}
		return resp, err
	}
}

// note counts one slow call in the open window, opening one if none is.
func (l *slowLog) note(took time.Duration, method string, req, resp any, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	if took > l.slowest {
		l.slowest, l.what = took, DescribeCall(method, req, resp, err)
	}
	if !l.open {
		l.open = true
		time.AfterFunc(slowWindow, l.flush)
	}
}

// flush writes the open window's line, if there is one, and closes it.
// Shutdown calls it so the last window is not lost.
func (l *slowLog) flush() {
	l.mu.Lock()
	count, slowest, what := l.count, l.slowest, l.what
	l.open, l.count, l.slowest, l.what = false, 0, 0, ""
	l.mu.Unlock()
	if count == 0 {
		return
	}
	l.log.Warn("slow requests", "count", count, "over", l.after, "slowest", slowest, "slowest_call", what)
}

// DescribeCall names a call of method (its full name, "/service/method",
// or the method alone) in a line: the method; the tenant and the target
// of the attempt it was about (attempt_target when set, else the call's),
// the attempt, and whether it held a lease; for ReportOutcome the number
// of outcomes; for an admin call its tenant; then whether the answer was
// degraded and the status code when not OK. The slow-request log and
// policybench's fault tests name their slowest calls with it.
func DescribeCall(method string, req, resp any, err error) string {
	var b strings.Builder
	b.WriteString(method[strings.LastIndexByte(method, '/')+1:])
	var call *pb.CallRef
	var attempt uint32
	var target string
	var lease bool
	switch r := req.(type) {
	case *pb.AdmitRequest:
		call, attempt, target = r.GetCall(), r.GetAttempt(), r.GetAttemptTarget()
	case *pb.NextDelayRequest:
		call, attempt, target, lease = r.GetCall(), r.GetAttempt(), r.GetAttemptTarget(), r.GetLeaseId() != ""
	case *pb.ClassifyRequest:
		call = r.GetCall()
	case *pb.ReportOutcomeRequest:
		fmt.Fprintf(&b, " of %d outcomes", len(r.GetOutcomes()))
	case interface{ GetTenant() string }:
		if t := r.GetTenant(); t != "" {
			fmt.Fprintf(&b, " %s", t)
		}
	}
	if call != nil {
		if target == "" {
			target = call.GetTarget()
		}
		fmt.Fprintf(&b, " %s/%s", call.GetTenant(), target)
	}
	if attempt > 0 {
		fmt.Fprintf(&b, " attempt %d", attempt)
	}
	if lease {
		b.WriteString(" with a lease")
	}
	if d, ok := resp.(interface{ GetDegraded() bool }); ok && d.GetDegraded() {
		b.WriteString(", degraded")
	}
	if err != nil {
		fmt.Fprintf(&b, ", %s", status.Code(err))
	}
	return b.String()
}
