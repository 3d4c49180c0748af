package redisstore

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestNextDelayFormatsAreTheLibrarys: the library reads policyd_nextdelay's
// numbers with the formats nextDelayCall writes them by, and the fresh
// numbers fill nextDelayNumbersLen bytes with the head.
func TestNextDelayFormatsAreTheLibrarys(t *testing.T) {
	for name, want := range map[string]string{"ND_HEAD": nextDelayHead, "ND_FRESH": nextDelayFresh} {
		m := regexp.MustCompile(`(?m)^local ` + name + ` = '([^']*)'$`).FindStringSubmatch(library)
		if m == nil {
			t.Fatalf("policyd.lua has no %s", name)
		}
		if m[1] != want {
			t.Errorf("policyd.lua %s = %q, want %q", name, m[1], want)
		}
	}
	size := func(f string) int {
		n := 0
		for _, tok := range regexp.MustCompile(`i8|d|B|.`).FindAllString(strings.TrimPrefix(f, "<"), -1) {
			switch tok {
			case "i8", "d":
				n += 8
			case "B":
				n++
			default:
				t.Fatalf("format %q: %q is not i8, d or B", f, tok)
			}
		}
		return n
	}
	if got := size(nextDelayHead) + size(nextDelayFresh); got != nextDelayNumbersLen {
		t.Errorf("the formats read %d bytes, nextDelayNumbersLen is %d", got, nextDelayNumbersLen)
	}
}

// TestNextDelayNumbersReadBack sends a step's numbers, a value of every
// kind at its extremes (negative, zero, 2^53-1, fractions, the smallest
// double), through the library's own reader (nextdelay_numbers and
// nextdelay_results, in a test library made of policyd.lua with a
// function that returns what they read) on a real server, and compares
// each with the step's: a value written out of the layout's order or
// kind reads back as another.
func TestNextDelayNumbersReadBack(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	var src strings.Builder
	src.WriteString("#!lua name=policyd_numbers_test\n")
	for line := range strings.Lines(library) {
		if !strings.HasPrefix(line, "#!lua") && !strings.HasPrefix(line, "register(") {
			src.WriteString(line)
		}
	}
	src.WriteString(`
register('policyd_test_nextdelay_numbers', function(keys, args, now)
  local p = args[1]
  local n, carried, pos = struct.unpack(ND_HEAD, p)
  local d = nextdelay_numbers(p, pos)
  local out = {}
  local function put(name, v)
    if type(v) == 'boolean' then v = v and 1 or 0 end
    out[#out + 1] = name
    out[#out + 1] = float(v)
  end
  put('attempt', n)
  put('carried', carried)
  for _, k in ipairs({'mode', 'consecutive', 'rate', 'window', 'min_calls', 'cooldown', 'probes', 'probe_timeout'}) do
    put(k, d.c[k])
  end
  for _, k in ipairs({'result', 'cap', 'share', 'retry', 'delay', 'stop', 'disp', 'deadline_us', 'deadline_ns',
      'timeout', 'ratio', 'min_spread', 'max_hint', 'draw'}) do
    put(k, d[k])
  end
  for _, k in ipairs({'cap', 'ratio', 'per_second', 'cost', 'timeout_cost', 'dry_run'}) do put('budget ' .. k, d.bg[k]) end
  for _, k in ipairs({'spend_timeout', 'has_run', 'cut_us', 'cut_ns', 'cut_binds', 'checks', 'keep', 'ack_k', 'ack_r',
      'grace'}) do
    put(k, d[k])
  end
  put('bytes', d.pos - 1 + carried)
  local results = nextdelay_results(p, d.pos, carried, args, 7)
  for i = 1, #results, 2 do
    put('result ' .. results[i + 1], results[i])
  end
  return out
end)
`)
	if err := c.FunctionLoadReplace(ctx, src.String()).Err(); err != nil {
		t.Fatalf("FUNCTION LOAD the test library: %v", err)
	}

	const max = 1<<53 - 1
	st, cfg, bg, sa := nextDelayCallStep()
	st.Attempt = 1<<32 - 1
	cfg.Mode, cfg.ConsecutiveFailures, cfg.FailureRate = policy.BreakerFailureRate, 7, 0.3
	cfg.Window, cfg.MinCalls, cfg.Cooldown = max*time.Microsecond, 0, time.Nanosecond
	cfg.HalfOpenProbes, cfg.ProbeTimeout = 3, 0
	st.Result, st.Share = policy.ResultPushback, max
	st.Decision.Retry, st.Decision.Delay = true, -1
	st.Decision.Stop, st.Decision.Disposition = policy.StopDeadline, policy.DispositionDeadlineCut
	st.Decision.Deadline = time.Unix(-5, -7) // before 1970: µs and ns negative
	p := *st.Policy
	p.AttemptTimeout, p.Pushback.SpreadRatio, p.Pushback.MinSpread, p.Pushback.MaxHint = max, 0.1, 0, -max
	st.Policy, st.SpreadDraw = &p, 0.9999999999999999
	bg = policy.TenantBudget{Tenant: "acme", Capacity: 1e300, DepositRatio: 0.1, MinPerSecond: -0.5, RetryCost: 1.25,
		TimeoutCost: 5e-324, DryRun: true}
	st.Spend.Timeout, st.RunCutoff, st.CutBinds = false, time.Unix(1_800_000_000, 999_999_999), true
	st.Decision.Checks, st.Keep = 0x3f, time.UnixMilli(1<<52)
	sa.bucket, sa.run, sa.grace = max, 1, 0
	carried := []result{{Result: policy.ResultSuccess, Permit: "p1"}, {Result: policy.ResultPushback}}

	_, args := nextDelayCall(&st, &cfg, &bg, max, carried, &sa)
	r, err := c.FCall(ctx, "policyd_test_nextdelay_numbers", nil, append([]any{""}, args...)...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		v    float64
	}{
		{"attempt", 1<<32 - 1}, {"carried", 2},
		{"mode", 2}, {"consecutive", 7}, {"rate", 0.3}, {"window", max}, {"min_calls", 0}, {"cooldown", 1},
		{"probes", 3}, {"probe_timeout", 0},
		{"result", 4}, {"cap", max}, {"share", max}, {"retry", 1}, {"delay", -1}, {"stop", float64(policy.StopDeadline)},
		{"disp", float64(policy.DispositionDeadlineCut)}, {"deadline_us", -5_000_000}, {"deadline_ns", -7},
		{"timeout", max}, {"ratio", 0.1}, {"min_spread", 0}, {"max_hint", -max}, {"draw", 0.9999999999999999},
		{"budget cap", 1e300}, {"budget ratio", 0.1}, {"budget per_second", -0.5}, {"budget cost", 1.25},
		{"budget timeout_cost", 5e-324}, {"budget dry_run", 1},
		{"spend_timeout", 0}, {"has_run", 1}, {"cut_us", 1_800_000_000_999_999}, {"cut_ns", 999}, {"cut_binds", 1},
		{"checks", 0x3f}, {"keep", 1<<52 + 1}, {"ack_k", max}, {"ack_r", 1}, {"grace", 0},
		{"bytes", float64(nextDelayNumbersLen + len(carried))},
		{"result p1", 1}, {"result ", 4},
	}
	if len(r) != 2*len(want) {
		t.Fatalf("the library read %d values, want %d: %v", len(r)/2, len(want), r)
	}
	for i, w := range want {
		name, s := toString(r[2*i]), toString(r[2*i+1])
		v, err := strconv.ParseFloat(s, 64)
		if name != w.name || err != nil || v != w.v {
			t.Errorf("value %d: the library read %s = %s, want %s = %v", i, name, s, w.name, strconv.FormatFloat(w.v, 'g', -1, 64))
		}
	}
}

// TestNextDelayReplayReadsTheHead: with no results carried, the attempt
// check goes first and a replay reads the head of the numbers alone (a
// call whose numbers are cut after it replays), while a fresh decision
// reads them all (the same cut numbers of another call are refused).
func TestNextDelayReplayReadsTheHead(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	l := lib{c: c}
	st, cfg, bg, sa := nextDelayCallStep()
	st.Spend.RunID, st.RunCutoff = "", time.Time{}
	st.Keep = time.Now().Add(time.Hour)
	call := func(st *policy.NextDelayStep, cut bool) ([]any, error) {
		keys, args := nextDelayCall(st, &cfg, &bg, 1000, nil, &sa)
		if cut {
			args[0] = args[0].([]byte)[:16] // the head: attempt and n
		}
		return l.fcall(ctx, "policyd_nextdelay", keys, args...)
	}
	if r, err := call(&st, false); err != nil || toString(r[1]) != "decided" {
		t.Fatalf("first: %v %v, want a decision", r, err)
	}
	if r, err := call(&st, true); err != nil || toString(r[1]) != "replay" {
		t.Fatalf("again, the numbers cut after the head: %v %v, want a replay", r, err)
	}
	other := st
	other.Call.CallID = "call-000124"
	if r, err := call(&other, true); err == nil {
		t.Fatalf("another call, the numbers cut after the head: %v, want an error", r)
	}
}
