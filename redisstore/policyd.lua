#!lua name=policyd_v2

-- policyd's fleet state changes as Redis Functions: every change that must
-- be atomic is one call of one function here, on the keys of one tenant
-- (one hash tag, one slot), at the server's TIME (or at the caller's
-- clock, when the engine was given one: see register). The rules are those of
-- the Go package fleet, line for line; redisstore's tests run the same
-- scenarios through both and compare. Times are Unix microseconds (Lua
-- numbers are doubles: exact up to 2^53, and Unix ns are not), written
-- with string.format('%d') because tostring keeps 14 digits only.
--
-- Numbers are policy's: states 1 CLOSED 2 OPEN 3 HALF_OPEN 4 DISABLED;
-- modes 1 CONSECUTIVE 2 FAILURE_RATE; results 1 success 2 transient
-- failure 3 terminal; stops 4 DEADLINE 5 BUDGET_EXHAUSTED; dispositions
-- 3 DEAD_LETTER 4 DEADLINE_CUT.

local CLOSED, OPEN, HALF_OPEN, DISABLED = 1, 2, 3, 4
local FAILURE_RATE = 2
local TRANSIENT, PUSHBACK = 2, 4
local SLOTS = 10
local EVENTS_MAXLEN = '100000'
-- how long a tenant's applied set keeps a batch id (s): longer than any
-- replay takes once the engine answers again
local APPLIED_TTL = 600
-- how long an hour of attempt statistics outlives its last count (s): the
-- retention (168 h) and an hour
local STATS_TTL = 169 * 3600

-- effects, as fleet.Effect
local MUTATED, TRANSITIONED, COOLDOWN_STARTED = 1, 2, 4

local function int(x) return string.format('%d', x) end
local function float(x) return string.format('%.17g', x) end

-- clock_us is the time a call decides at, Unix µs: the server's TIME
-- when the caller's clock argument is empty (production), else that
-- argument (an engine told to use a clock of its own: the contract suite's
-- fake clock).
local function clock_us(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- idiv is floor(a / b) for non-negative integers below 2^53, exact.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- has and union are an effect's test and or, with the server's bit
-- library (a loop over a table of the flags cost a breaker's record
-- more than its window; the library is there when a function runs, not
-- while this file loads).
local function has(e, f) return bit.band(e, f) ~= 0 end
local function union(a, b) return bit.bor(a, b) end


-- cfg reads a breaker configuration (fleet.NormConfig already applied by
-- the caller) of 8 arguments from args at i. policyd_nextdelay's packed
-- numbers hold one too, read by nextdelay_numbers into a table of the
-- same fields.
local function cfg_at(args, i)
  return {
    mode = tonumber(args[i]), consecutive = tonumber(args[i + 1]), rate = tonumber(args[i + 2]),
    window = tonumber(args[i + 3]), min_calls = tonumber(args[i + 4]), cooldown = tonumber(args[i + 5]),
    probes = tonumber(args[i + 6]), probe_timeout = tonumber(args[i + 7]),
  }, i + 8
end

-- A breaker as its key stores it: a string of 11 + 3 x SLOTS
-- little-endian 64-bit integers (BREAKER_FMT: state, forced, mode,
-- open_until, changed, gen, cooldown, last_failure, consecutive,
-- half_open_ok, slot_width, then each slot's epoch, calls and failures),
-- then its permits as text ("hexid:expiry", space-separated; none for
-- none). One struct.unpack reads it: a hash of text fields cost a
-- breaker's load and store more than everything a call decides with it.
local BREAKER_FMT = '<i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8'
local BREAKER_LEN = 328
-- the record's first 11 numbers, and its slots from byte 89 on
local FIELDS_FMT = '<i8i8i8i8i8i8i8i8i8i8i8'
local SLOTS_FMT = '<i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8'

-- A breaker's window is one flat array, as its record holds it: slot s
-- (1..SLOTS) is epoch, calls, failures at 3s - 2, 3s - 1 and 3s. A table
-- per slot cost a load ten tables.
local function empty_slots()
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
end

-- new_breaker is fleet.NewBreaker(now): every field zero but changed,
-- an empty window, no permits.
local function new_breaker(now, fresh)
  return {state = CLOSED, forced = 0, mode = 0, open_until = 0, changed = now, gen = 0,
    cooldown = 0, last_failure = 0, consecutive = 0, half_open_ok = 0, slot_width = 0,
    slots = empty_slots(), permits = {}, fresh = fresh}
end

-- load_hash reads into b a breaker that an earlier layout stored as a
-- hash (h, as HGETALL returns it); its next store writes it packed.
local function load_hash(b, h)
  for i = 1, #h, 2 do
    local f, v = h[i], h[i + 1]
    if f == 'slots' then
      local j = 0 -- the slots read so far, three numbers each
      for e, c, x in string.gmatch(v, '(%d+):(%d+):(%d+)') do
        if j < 3 * SLOTS then b.slots[j + 1], b.slots[j + 2], b.slots[j + 3] = tonumber(e), tonumber(c), tonumber(x) end
        j = j + 3
      end
    elseif f == 'permits' then
      for id, exp in string.gmatch(v, '(%x+):(%d+)') do
        b.permits[#b.permits + 1] = {id = id, expiry = tonumber(exp)}
      end
    elseif f ~= 'fresh' then
      b[f] = tonumber(v)
    end
  end
  return b
end

-- load reads the breaker at key; a missing one is fleet.NewBreaker(now),
-- fresh, and stored by the call that created it, as an engine holding Go
-- values keeps a breaker from its first use. A record shorter than the
-- numbers is an error reply DAMAGED naming the key.
local function load(key, now)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    return load_hash(new_breaker(now, false), redis.call('HGETALL', key))
  end
  if not v then return new_breaker(now, true) end
  if #v < BREAKER_LEN then
    error({err = 'DAMAGED ' .. key .. ' is ' .. #v .. ' bytes, a breaker at least ' .. BREAKER_LEN})
  end
  local slots = {struct.unpack(SLOTS_FMT, v, 89)}
  slots[3 * SLOTS + 1] = nil -- the position after them
  local state, forced, mode, open_until, changed, gen, cooldown, last_failure, consecutive, half_open_ok,
    slot_width = struct.unpack(FIELDS_FMT, v)
  -- made whole by its constructor, as nextdelay_numbers' tables
  local b = {state = state, forced = forced, mode = mode, open_until = open_until, changed = changed, gen = gen,
    cooldown = cooldown, last_failure = last_failure, consecutive = consecutive, half_open_ok = half_open_ok,
    slot_width = slot_width, slots = slots, permits = {}, fresh = false}
  if #v > BREAKER_LEN then
    for id, exp in string.gmatch(string.sub(v, BREAKER_LEN + 1), '(%x+):(%d+)') do
      b.permits[#b.permits + 1] = {id = id, expiry = tonumber(exp)}
    end
  end
  return b
end

-- check_new refuses a breaker new to Redis once the tenant's index holds
-- cap of them (cap 0: no cap), with an error reply CAPACITY.
local function check_new(b, index, cap)
  if b.fresh and cap > 0 then
    local n = redis.call('SCARD', index)
    if n >= cap then
      error({err = 'CAPACITY tenant has ' .. int(n) .. ' breakers (cap ' .. int(cap) .. ')'})
    end
  end
end

-- store writes b to key and, for a breaker new in Redis, adds its target
-- to the tenant's index of breakers.
local function store(key, index, target, b)
  if b.fresh then redis.call('SADD', index, target) end
  local v = struct.pack(BREAKER_FMT, b.state, b.forced, b.mode, b.open_until, b.changed, b.gen, b.cooldown,
    b.last_failure, b.consecutive, b.half_open_ok, b.slot_width, unpack(b.slots, 1, 3 * SLOTS))
  if #b.permits > 0 then
    local permits = {}
    for i, p in ipairs(b.permits) do permits[i] = p.id .. ':' .. int(p.expiry) end
    v = v .. table.concat(permits, ' ')
  end
  redis.call('SET', key, v)
end

-- clear_slots gives b a new, empty window (a new table: Force keeps the
-- old one to put back).
local function clear_slots(b)
  b.slots = empty_slots()
end

-- to_state is fleet.Breaker.toState.
local function to_state(b, now, st)
  b.state, b.changed, b.gen = st, now, b.gen + 1
  b.permits, b.half_open_ok, b.consecutive = {}, 0, 0
  clear_slots(b)
  if st ~= OPEN then b.open_until = 0 end
end

local function advance(b, now)
  if b.state == OPEN and b.forced == 0 and now >= b.open_until then
    to_state(b, now, HALF_OPEN)
    return TRANSITIONED + MUTATED
  end
  return 0
end

local function window(b, now)
  if b.slot_width == 0 then return 0, 0 end
  local cur = idiv(now, b.slot_width)
  local calls, failures = 0, 0
  local sl = b.slots
  for i = 1, 3 * SLOTS, 3 do
    local e = sl[i]
    if e > cur - SLOTS and e <= cur then
      calls, failures = calls + sl[i + 1], failures + sl[i + 2]
    end
  end
  return calls, failures
end

local function live_permits(b, now)
  local n = 0
  for _, p in ipairs(b.permits) do if p.expiry > now then n = n + 1 end end
  return n
end

local function expire_permits(b, now)
  local kept = {}
  for _, p in ipairs(b.permits) do if p.expiry > now then kept[#kept + 1] = p end end
  local changed = #kept ~= #b.permits
  b.permits = kept
  return changed
end

-- count is fleet.Breaker.count of k results at now, one after another:
-- after the first, a failure is never further than the window from the
-- last, and every one lands in now's slot.
local function count(b, now, c, failure, k)
  if failure then
    if b.last_failure ~= 0 and now - b.last_failure > c.window then b.consecutive = 0 end
    b.consecutive = b.consecutive + k
    b.last_failure = now
  else
    b.consecutive = 0
  end
  local width = math.max(idiv(c.window, SLOTS), 1)
  if width ~= b.slot_width then
    b.slot_width = width
    clear_slots(b)
  end
  local epoch = idiv(now, width)
  local sl, i = b.slots, 3 * (epoch % SLOTS) + 1
  if sl[i] ~= epoch then sl[i], sl[i + 1], sl[i + 2] = epoch, 0, 0 end
  sl[i + 1] = sl[i + 1] + k
  if failure then sl[i + 2] = sl[i + 2] + k end
end

local function should_trip(b, now, c)
  if c.mode == FAILURE_RATE then
    local calls, failures = window(b, now)
    return calls >= c.min_calls and failures >= c.rate * calls
  end
  return b.consecutive >= c.consecutive
end

local function trip(b, now, c)
  b.open_until = now + c.cooldown
  to_state(b, now, OPEN)
end

-- snapshot is the breaker as the engine caches and reports it: 11
-- integers, as Lua numbers (a reply makes each an integer, exact below
-- 2^53: formatting them as text cost an outcome batch more than reading
-- its breakers).
local function snapshot(b, now)
  local calls, failures = window(b, now)
  return {b.state, b.forced, b.mode, b.open_until, b.changed, b.gen,
    b.cooldown, b.consecutive, calls, failures, live_permits(b, now)}
end

-- snapshot_text is snapshot as the events stream carries it: the 11
-- integers as text, separated by spaces (tostring keeps 14 digits only).
local function snapshot_text(b, now)
  local v = snapshot(b, now)
  for i = 1, #v do v[i] = int(v[i]) end
  return table.concat(v, ' ')
end

-- settle persists b when e says it changed and appends its new state to
-- the tenant's event stream on a transition or a new cool-down; it returns
-- the stream entry id, or '' when nothing was published.
local function settle(key, events, index, target, b, now, e)
  if e == 0 and not b.fresh then return '' end
  store(key, index, target, b)
  b.fresh = false
  if has(e, TRANSITIONED) or has(e, COOLDOWN_STARTED) then
    return redis.call('XADD', events, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'target', target, 'state', snapshot_text(b, now))
  end
  return ''
end

-- breaker_admit is fleet.Breaker.Advance then Admit on b at now, handing
-- out newid as a probe permit; it returns admitted (0 or 1), the reason,
-- the permit, the retry after (µs) and the effect.
local function breaker_admit(b, c, now, newid)
  b.mode = c.mode
  local e = advance(b, now)
  local ok, reason, permit, after = 0, '', '', 0
  if b.state == DISABLED then
    ok, reason = 1, 'breaker:disabled'
  elseif b.forced == 1 and b.state == OPEN then
    reason = 'breaker:forced_open'
  elseif b.forced == 1 then
    ok, reason = 1, 'breaker:closed'
  elseif b.cooldown > now then
    reason, after = 'cooldown:pushback', b.cooldown - now
  elseif b.state == OPEN then
    reason, after = 'breaker:open', b.open_until - now
  elseif b.state == HALF_OPEN then
    if expire_permits(b, now) then e = union(e, MUTATED) end
    if #b.permits < c.probes then
      b.permits[#b.permits + 1] = {id = newid, expiry = now + c.probe_timeout}
      ok, reason, permit = 1, 'breaker:probe', newid
      e = union(e, MUTATED)
    else
      local earliest = b.permits[1].expiry
      for i = 2, #b.permits do earliest = math.min(earliest, b.permits[i].expiry) end
      reason, after = 'breaker:probes_taken', earliest - now
    end
  else
    ok, reason = 1, 'breaker:closed'
  end
  return ok, reason, permit, after, e
end

-- admit is fleet.Breaker.Advance then Admit.
-- KEYS: breaker, events, index. ARGV: target, cfg (8), permit id (hex),
-- the tenant's cap of breakers.
-- Returns {now, admitted, reason, permit, retry_after, event id, snapshot...}.
local function admit(keys, args, now)
  local c = cfg_at(args, 2)
  local b = load(keys[1], now)
  check_new(b, keys[3], tonumber(args[11]))
  local ok, reason, permit, after, e = breaker_admit(b, c, now, args[10])
  local ev = settle(keys[1], keys[2], keys[3], args[1], b, now, e)
  local out = {int(now), ok, reason, permit, int(after), ev}
  for _, v in ipairs(snapshot(b, now)) do out[#out + 1] = v end
  return out
end

-- record1 is fleet.Breaker.Record for one result; it returns the effect
-- and 1 when the permit was refused (fleet.ErrPermit).
local function record1(b, now, c, r, permit)
  local e, i = 0, 0
  if permit ~= '' then
    for j, p in ipairs(b.permits) do if p.id == permit then i = j break end end
    if i > 0 and b.permits[i].expiry <= now then i = 0 end
  end
  if b.state == HALF_OPEN and b.forced == 0 then
    if permit == '' then return 0, 0 end
    if i == 0 then return 0, 1 end
  end
  if i > 0 then
    table.remove(b.permits, i)
    e = MUTATED
  end
  -- pushback: the upstream is up and asked for time; the cool-down handles
  -- it, and a probe answered so frees its permit and settles nothing
  if r == PUSHBACK then return e, 0 end
  local failure = r == TRANSIENT
  if b.state == DISABLED or b.state == OPEN then return e, 0 end
  if b.forced == 1 then
    count(b, now, c, failure, 1)
    return MUTATED, 0
  end
  if b.state == HALF_OPEN then
    if failure then
      trip(b, now, c)
      return TRANSITIONED + MUTATED, 0
    end
    b.half_open_ok = b.half_open_ok + 1
    if b.half_open_ok >= c.probes then
      to_state(b, now, CLOSED)
      return TRANSITIONED + MUTATED, 0
    end
    return MUTATED, 0
  end
  count(b, now, c, failure, 1)
  if failure and should_trip(b, now, c) then
    trip(b, now, c)
    return TRANSITIONED + MUTATED, 0
  end
  return MUTATED, 0
end

-- record_run is record1 of k results r without a permit, one after
-- another at now; it returns the effect (such a result is never refused).
-- Each is record1's: nothing in an unforced HALF_OPEN, for a pushback,
-- or in OPEN or DISABLED; counted when forced (never tripping). In CLOSED
-- k successes are one count of k (each resets the consecutive count and
-- adds a call to now's slot), while failures count one by one until one
-- trips the breaker: OPEN then, the rest change nothing.
local function record_run(b, now, c, r, k)
  if b.state == HALF_OPEN and b.forced == 0 then return 0 end
  if r == PUSHBACK or b.state == DISABLED or b.state == OPEN then return 0 end
  local failure = r == TRANSIENT
  if b.forced == 1 or not failure then
    count(b, now, c, failure, k)
    return MUTATED
  end
  for _ = 1, k do
    count(b, now, c, true, 1)
    if should_trip(b, now, c) then
      trip(b, now, c)
      return TRANSITIONED + MUTATED
    end
  end
  return MUTATED
end

-- record_on is Advance then Record of results (pairs of result and
-- permit id or '') on b, the breaker at key of target under c, at now;
-- every transition is published. It returns the event ids and the
-- refused flags, and stores b when it changed or is new.
local function record_on(key, events_key, index, target, b, c, now, results)
  b.mode = c.mode
  local events, refused, dirty = {}, {}, 0
  local e = advance(b, now)
  if has(e, TRANSITIONED) then
    events[#events + 1] = settle(key, events_key, index, target, b, now, e)
    e = 0
  end
  dirty = union(dirty, e)
  for i = 1, #results, 2 do
    local e2, bad = record1(b, now, c, results[i], results[i + 1])
    refused[#refused + 1] = bad
    if has(e2, TRANSITIONED) then
      events[#events + 1] = settle(key, events_key, index, target, b, now, e2)
    else
      dirty = union(dirty, e2)
    end
  end
  if dirty ~= 0 or b.fresh then store(key, index, target, b) end
  return events, refused
end

-- record applies results to breakers of one tenant, in order, each as
-- Advance then Record, and publishes every transition.
-- KEYS: events, index, then one breaker per group. ARGV: the tenant's cap
-- of breakers, then per group: target,
-- cfg (8), n, then n pairs (result, permit id or '').
-- Returns {now, then per group: {event ids...}, {refused flags...}, snapshot}.
local function record(keys, args, now)
  local cap = tonumber(args[1])
  local out, a = {int(now)}, 2
  for g = 3, #keys do
    local target = args[a]
    local c
    c, a = cfg_at(args, a + 1)
    local n = tonumber(args[a])
    a = a + 1
    local results = {}
    for _ = 1, n do
      results[#results + 1] = tonumber(args[a])
      results[#results + 1] = args[a + 1]
      a = a + 2
    end
    local b = load(keys[g], now)
    check_new(b, keys[2], cap)
    local events, refused = record_on(keys[g], keys[1], keys[2], target, b, c, now, results)
    out[#out + 1] = events
    out[#out + 1] = refused
    out[#out + 1] = snapshot(b, now)
  end
  return out
end

-- cooldown_on is Advance then ExtendCooldown to untl on b, the breaker at
-- key of target, at now; it returns the event ids published.
local function cooldown_on(key, events_key, index, target, b, now, untl)
  local evs = {}
  local e = advance(b, now)
  if e ~= 0 then evs[#evs + 1] = settle(key, events_key, index, target, b, now, e) end
  if untl > b.cooldown then
    e = MUTATED
    if b.cooldown <= now and untl > now then e = e + COOLDOWN_STARTED end
    b.cooldown = untl
    local ev = settle(key, events_key, index, target, b, now, e)
    if ev ~= '' then evs[#evs + 1] = ev end
  end
  if b.fresh then store(key, index, target, b) end
  return evs
end

-- cooldown is fleet.Breaker.Advance then ExtendCooldown.
-- KEYS: breaker, events, index. ARGV: target, cfg (8), until, the
-- tenant's cap of breakers.
-- Returns {now, until in force, event ids..., snapshot}.
local function cooldown(keys, args, now)
  local c = cfg_at(args, 2)
  local b = load(keys[1], now)
  check_new(b, keys[3], tonumber(args[11]))
  b.mode = c.mode
  local evs = cooldown_on(keys[1], keys[2], keys[3], args[1], b, now, tonumber(args[10]))
  return {int(now), int(b.cooldown), evs, snapshot(b, now)}
end

-- admin is fleet.Breaker.Reset (op 'reset': the breaker must exist) or
-- Force (op 'force', state OPEN, CLOSED or DISABLED).
-- KEYS: breaker, events, index. ARGV: target, op, state, the tenant's cap
-- of breakers.
-- Returns {now, event id, snapshot} or an error NOTFOUND.
local function admin(keys, args, now)
  local op = args[2]
  if op == 'reset' and redis.call('EXISTS', keys[1]) == 0 then
    return redis.error_reply('NOTFOUND breaker')
  end
  local b = load(keys[1], now)
  check_new(b, keys[3], tonumber(args[4]))
  if op == 'reset' then
    b.forced, b.cooldown = 0, 0
    to_state(b, now, CLOSED)
  else
    local st = tonumber(args[3])
    b.forced, b.cooldown, b.open_until = 1, 0, 0
    local cons, slots = b.consecutive, b.slots
    to_state(b, now, st)
    if st == CLOSED then b.consecutive, b.slots = cons, slots end
  end
  local ev = settle(keys[1], keys[2], keys[3], args[1], b, now, TRANSITIONED + MUTATED)
  return {int(now), ev, snapshot(b, now)}
end

-- Shares. A replica may grant from a tenant's bucket or a run's pool
-- alone, while the engine does not answer it (degraded mode), only what
-- the engine set aside for it: its share. A share is four numbers, in
-- the bucket's record (bucket_store) or as four fields of the run's hash,
-- by replica id: h:ID the share the engine last
-- told it (hold), l:ID what it may believe it holds (lock: the hold of
-- every reply it may not have seen yet, less what it spent from them
-- since), v:ID the version of the last reply, a:ID the time of its last
-- call. The locks together never exceed the level (tokens, or retries
-- left): what one replica may grant alone is never what another spends,
-- and the fleet never grants more than the level. A replica's spend
-- takes from what no replica holds first, then from its own lock, and
-- sets its hold to SHARE of the level over the live replicas (or less,
-- what the others' locks leave); its lock becomes that hold once it has
-- seen the reply (its next call's ack is the version). A replica out of
-- the live set and silent for the grace is forfeited: its lock is taken
-- from the level, as if spent (it may have been).
local SHARE = 0.5

-- shares_load reads the shares of a hash as HGETALL returned it into t:
-- t.shares[id] = {hold, lock, v, at}, t.locked their locks' sum.
local function shares_load(t, h)
  t.shares, t.locked = {}, 0
  for i = 1, #h, 2 do
    local f, id = string.match(h[i], '^([hlva]):(.+)$')
    if f then
      local sh = t.shares[id] or {hold = 0, lock = 0, v = 0, at = 0}
      local x = tonumber(h[i + 1])
      if f == 'h' then sh.hold = x elseif f == 'l' then sh.lock = x elseif f == 'v' then sh.v = x else sh.at = x end
      t.shares[id] = sh
    end
  end
  for _, sh in pairs(t.shares) do t.locked = t.locked + sh.lock end
end

-- shares_forfeit deletes from t, and from the hash at key (nil: t's
-- store writes them, a bucket's), the shares of replicas other than me
-- neither in live (a set of ids) nor heard from since now - grace, and
-- returns what they locked.
local function shares_forfeit(key, t, me, live, now, grace)
  local gone = 0
  for id, sh in pairs(t.shares) do
    if id ~= me and not live[id] and sh.at < now - grace then
      gone = gone + sh.lock
      t.locked = t.locked - sh.lock
      t.shares[id] = nil
      if key then redis.call('HDEL', key, 'h:' .. id, 'l:' .. id, 'v:' .. id, 'a:' .. id) end
    end
  end
  return gone
end

-- share_mine returns me's share of t, a new one when it has none: at
-- version ack, me's latest, so its replies are newer than every one me
-- has seen (of a share forfeited before, say).
local function share_mine(t, me, ack)
  local sh = t.shares[me]
  if not sh then
    sh = {hold = 0, lock = 0, v = ack, at = 0}
    t.shares[me] = sh
    if t.ids then t.ids[#t.ids + 1] = me end
  end
  return sh
end

-- share_spend updates me's share sh of t after a call that took cost of
-- the level (level before: lvl) at version ack of me's replies: from
-- what no replica holds first, then from sh's lock; the new hold is
-- SHARE of the level left over n live replicas, at most what the others'
-- locks leave, and the lock covers both it and the hold me may still
-- believe. Its caller stores it (share_store).
local function share_spend(t, sh, lvl, cost, ack, n, now)
  local others = t.locked - sh.lock
  local free = math.max(lvl - others - sh.lock, 0)
  local own = math.max(cost - free, 0)
  local believed = sh.lock
  if ack >= sh.v then believed = sh.hold end
  believed = math.max(believed - own, 0)
  local left = lvl - cost
  local hold = math.max(math.min(SHARE * left / math.max(n, 1), left - others), 0)
  local lock = math.max(believed, hold)
  t.locked = others + lock
  sh.hold, sh.lock, sh.v, sh.at = hold, lock, sh.v + 1, now
end

-- share_store writes me's share sh to the run hash at key.
local function share_store(key, me, sh)
  redis.call('HSET', key, 'h:' .. me, float(sh.hold), 'l:' .. me, float(sh.lock), 'v:' .. me, int(sh.v), 'a:' .. me, int(sh.at))
end

-- live_set reads a space-separated list of replica ids into a set.
local function live_set(s)
  local live = {}
  for id in string.gmatch(s, '%S+') do live[id] = true end
  return live
end

-- A bucket as its key stores it: fleet.Bucket's tokens (a double), last
-- (µs), granted, refused and dry (BUCKET_FMT), then each share
-- (SHARE_FMT): its replica id's length (a byte) and the id, hold and lock
-- (doubles), version and last call (µs). One struct.unpack reads the
-- numbers: a hash of text fields (the layout before it, read as it is and
-- written as a record at its next change) cost a fresh NextDelay's spend
-- more than the rest of it, the breaker's story again.
local BUCKET_FMT = '<di8i8i8i8'
local BUCKET_LEN = 40
local SHARE_FMT = '<Bc0ddi8i8'
local SHARE_LEN = 33 -- and the id

-- bucket_load reads a tenant's token bucket (fleet.NewBucket when absent)
-- and its shares; k.ids are the shares' ids in their record's order. A
-- record shorter than its numbers is an error reply DAMAGED naming the
-- key.
local function bucket_load(key, cap, now)
  local k = {tokens = cap, last = now, granted = 0, refused = 0, dry = 0, shares = {}, ids = {}, locked = 0}
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    local h = redis.call('HGETALL', key)
    for i = 1, #h, 2 do
      if not string.find(h[i], ':', 1, true) then k[h[i]] = tonumber(h[i + 1]) end
    end
    shares_load(k, h)
    for id in pairs(k.shares) do k.ids[#k.ids + 1] = id end
    table.sort(k.ids)
    return k
  end
  if not v then return k end
  local function damaged(what)
    error({err = 'DAMAGED ' .. key .. ' is ' .. #v .. ' bytes, ' .. what})
  end
  if #v < BUCKET_LEN then damaged('a bucket at least ' .. BUCKET_LEN) end
  local pos
  k.tokens, k.last, k.granted, k.refused, k.dry, pos = struct.unpack(BUCKET_FMT, v)
  while pos <= #v do
    if #v - pos + 1 < SHARE_LEN + string.byte(v, pos) then damaged('a share cut short at byte ' .. pos) end
    local id, hold, lock, ver, at
    id, hold, lock, ver, at, pos = struct.unpack(SHARE_FMT, v, pos)
    k.shares[id] = {hold = hold, lock = lock, v = ver, at = at}
    k.ids[#k.ids + 1] = id
    k.locked = k.locked + lock
  end
  return k
end

-- bucket_cap is what k's tokens may reach: the capacity, or the shares'
-- locks when a lower capacity was set since they were handed out.
local function bucket_cap(k, bg) return math.max(bg.cap, k.locked) end

-- bucket_store writes k, its shares with it, as one record (replacing a
-- hash of the layout before it).
local function bucket_store(key, k)
  local parts = {struct.pack(BUCKET_FMT, k.tokens, k.last, k.granted, k.refused, k.dry)}
  for _, id in ipairs(k.ids) do
    local sh = k.shares[id]
    if sh then parts[#parts + 1] = struct.pack(SHARE_FMT, #id, id, sh.hold, sh.lock, sh.v, sh.at) end
  end
  redis.call('SET', key, table.concat(parts))
end

-- release_shares gives back the caller's shares of a tenant's bucket and
-- of its runs' pools (what no replica holds again), as a replica that
-- stops does once the engine has been charged everything it granted
-- alone. KEYS: the tenant's bucket, then its runs. ARGV: replica id.
-- Returns the fields deleted (four a share).
local function release_shares(keys, args)
  local n, me = 0, args[1]
  if redis.call('EXISTS', keys[1]) == 1 then
    local k = bucket_load(keys[1], 0, 0)
    if k.shares[me] then
      k.shares[me], n = nil, 4
      bucket_store(keys[1], k)
    end
  end
  for i = 2, #keys do
    n = n + redis.call('HDEL', keys[i], 'h:' .. me, 'l:' .. me, 'v:' .. me, 'a:' .. me)
  end
  return n
end

-- budget_at reads a budget of 6 arguments: capacity, deposit ratio, floor
-- per second, retry cost, timeout cost, dry run (0 or 1). policyd_nextdelay's
-- packed numbers hold one too, read by nextdelay_numbers into a table of
-- the same fields.
local function budget_at(args, i)
  return {cap = tonumber(args[i]), ratio = tonumber(args[i + 1]), per_second = tonumber(args[i + 2]),
    cost = tonumber(args[i + 3]), timeout_cost = tonumber(args[i + 4]), dry_run = args[i + 5] == '1'}
end

local function refill(k, now, bg)
  if now > k.last then
    k.tokens = k.tokens + bg.per_second * (now - k.last) / 1e6
    k.last = now
  end
  k.tokens = math.min(k.tokens, bucket_cap(k, bg))
end

-- share_args reads the caller's share arguments from args at i: its
-- replica id, the versions of its bucket and run shares it last saw, the
-- live replica ids (space-separated; their count divides the shares) and
-- the grace of a silent share (µs); share_new makes them of those values
-- (policyd_nextdelay's packed numbers hold the versions and the grace).
local function share_new(me, ack_k, ack_r, live, grace)
  local sa = {me = me, ack_k = ack_k, ack_r = ack_r, live = live_set(live), grace = grace, n = 0}
  sa.live[sa.me] = true
  for _ in pairs(sa.live) do sa.n = sa.n + 1 end
  return sa
end

local function share_args(args, i)
  return share_new(args[i], tonumber(args[i + 1]), tonumber(args[i + 2]), args[i + 3], tonumber(args[i + 4]))
end

-- spend_on is breakerstore's SpendRetry: the run's refusal first (cut-off,
-- then pool), then fleet.Bucket.Withdraw, then the run's pool, on the
-- bucket and run keys under budget bg at now, for the replica sa names
-- (share_args): a grant takes what no replica holds first, then the
-- caller's own share (see Shares), and both its shares are set again,
-- whether granted or not. It returns granted (0 or 1), stop,
-- disposition, tokens, the run's pool remaining, dry (1: a dry run's
-- refusal granted) and the caller's bucket and run shares ({hold, v}),
-- or nil for a run that does not exist.
local function spend_on(bucket, runkey, bg, timeout, has_run, now, sa)
  local me = sa.me
  local stop, disp, remaining = 0, 0, 0
  local pool, spent = 0, 0
  local run
  if has_run then
    local h = redis.call('HGETALL', runkey)
    local f = {}
    for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
    if not f.pool then return nil end
    pool, spent = tonumber(f.pool), tonumber(f.spent or '0')
    run = {}
    shares_load(run, h)
    spent = math.min(spent + shares_forfeit(runkey, run, me, sa.live, now, sa.grace), pool)
    if now >= tonumber(f.cutoff) then
      stop, disp = 4, 4
    elseif pool - spent - (run.locked - share_mine(run, me, sa.ack_r).lock) < 1 then
      stop, disp = 5, 3
    end
  end
  local k = bucket_load(bucket, bg.cap, now)
  refill(k, now, bg)
  k.tokens = math.max(k.tokens - shares_forfeit(nil, k, me, sa.live, now, sa.grace), 0)
  local mine = share_mine(k, me, sa.ack_k)
  local granted, dry, cost = 0, 0, 0
  local level = k.tokens
  if stop == 0 then
    cost = timeout and bg.timeout_cost or bg.cost
    if k.tokens - (k.locked - mine.lock) >= cost then
      k.tokens, k.granted, granted = k.tokens - cost, k.granted + 1, 1
    elseif bg.dry_run then
      k.tokens = math.max(k.tokens - cost, 0)
      k.granted, k.dry, granted, dry = k.granted + 1, k.dry + 1, 1, 1
    else
      k.refused = k.refused + 1
      stop, disp = 5, 3
    end
  end
  if granted == 0 or dry == 1 then cost = 0 end
  share_spend(k, mine, level, cost, sa.ack_k, sa.n, now)
  bucket_store(bucket, k)
  local rmine = {hold = 0, v = 0}
  if has_run then
    local left = pool - spent
    rmine = share_mine(run, me, sa.ack_r)
    local took = 0
    if granted == 1 then
      took = 1
      spent = spent + 1
    end
    share_spend(run, rmine, left, took, sa.ack_r, sa.n, now)
    redis.call('HSET', runkey, 'spent', int(spent))
    share_store(runkey, me, rmine)
    remaining = pool - math.min(spent, pool)
  end
  return granted, stop, disp, k.tokens, remaining, dry, mine, rmine
end

-- spend is spend_on of one retry.
-- KEYS: bucket, run (a key of the tenant with no run when ARGV[8] is 0).
-- ARGV: budget (6), timeout (0 or 1), has run (0 or 1), the share
-- arguments (5, share_args).
-- Returns {now, granted, stop, disposition, tokens, run remaining, dry
-- run refused, bucket share, its version, run share, its version}.
local function spend(keys, args, now)
  local granted, stop, disp, tokens, remaining, dry, mine, rmine = spend_on(keys[1], keys[2], budget_at(args, 1),
    args[7] == '1', args[8] == '1', now, share_args(args, 9))
  if granted == nil then return redis.error_reply('NOTFOUND run') end
  return {int(now), granted, stop, disp, float(tokens), int(remaining), dry,
    float(mine.hold), int(mine.v), float(rmine.hold), int(rmine.v)}
end

-- deposit is fleet.Bucket.Deposit of successes.
-- KEYS: bucket. ARGV: budget (6), successes.
-- Returns {now, tokens}.
local function deposit(keys, args, now)
  local bg = budget_at(args, 1)
  local k = bucket_load(keys[1], bg.cap, now)
  refill(k, now, bg)
  k.tokens = math.min(k.tokens + bg.ratio * tonumber(args[7]), bucket_cap(k, bg))
  bucket_store(keys[1], k)
  return {int(now), float(k.tokens)}
end

-- charge withdraws what one replica granted while the engine did not
-- answer it (degraded mode) once it answers again, at most once per charge
-- id: tokens from the tenant's bucket, down to zero at most (the grants
-- were made already: the bucket only stops paying for more), and retries
-- from the run's pool, up to the pool; the replica granted them from its
-- shares, whose locks they are taken from.
-- KEYS: bucket, run (a key of the tenant with no run when ARGV[9] is 0),
-- applied. ARGV: budget (6), tokens, retries, has run (0 or 1), charge
-- id, replica id.
-- Returns {now, tokens, run remaining, charged (0: the id was charged
-- before), bucket share, its version, run share, its version}.
local function charge(keys, args, now)
  local bg = budget_at(args, 1)
  local has_run, id, me = args[9] == '1', args[10], args[11]
  local k = bucket_load(keys[1], bg.cap, now)
  local stored, last = k.tokens, k.last
  refill(k, now, bg)
  local charged, tokens = 0, k.tokens
  local mine = k.shares[me]
  if redis.call('SISMEMBER', keys[3], id) == 0 then
    local t = tonumber(args[7])
    k.tokens, charged = math.max(k.tokens - t, 0), 1
    tokens = k.tokens
    if mine then
      mine.lock = math.max(mine.lock - t, 0)
      mine.hold = math.min(mine.hold, mine.lock)
    end
  else
    k.tokens, k.last = stored, last -- only the share changes
  end
  if mine then mine.v, mine.at = mine.v + 1, now end
  if charged == 1 or mine then bucket_store(keys[1], k) end
  mine = mine or {hold = 0, v = 0}
  local remaining = 0
  local rmine = {hold = 0, v = 0}
  if has_run then
    local h = redis.call('HGETALL', keys[2])
    local f = {}
    for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
    if f.pool then
      local run = {}
      shares_load(run, h)
      local pool, spent = tonumber(f.pool), tonumber(f.spent or '0')
      local r = tonumber(args[8])
      if charged == 1 then
        spent = math.min(spent + r, pool)
        redis.call('HSET', keys[2], 'spent', int(spent))
      end
      if run.shares[me] then
        rmine = run.shares[me]
        if charged == 1 then
          rmine.lock = math.max(rmine.lock - r, 0)
          rmine.hold = math.min(rmine.hold, rmine.lock)
        end
        rmine.v, rmine.at = rmine.v + 1, now
        share_store(keys[2], me, rmine)
      end
      remaining = pool - math.min(spent, pool)
    end
  end
  redis.call('SADD', keys[3], id)
  redis.call('EXPIRE', keys[3], APPLIED_TTL)
  return {int(now), float(tokens), int(remaining), charged, float(mine.hold), int(mine.v), float(rmine.hold), int(rmine.v)}
end

-- record_final is fleet.Run.RecordFinal on run and calls keys: the first
-- final disposition of a call id wins. It returns 1 when the ledger
-- changed, 0 for the same report again, the value in force
-- ("disposition:stop/slot") for a different one, which changes nothing,
-- and nil for a run that does not exist. A value ending in /dedup (a
-- success the idempotency ledger answered) counts in deduplicated too, as
-- fleet.Run.count does.
local function record_final(run, calls, call, field, value)
  if redis.call('EXISTS', run) == 0 then return nil end
  local prev = redis.call('HGET', calls, call)
  if prev == value then return 0 end
  if prev then return prev end
  redis.call('HINCRBY', run, field, 1)
  if string.sub(value, -6) == '/dedup' then redis.call('HINCRBY', run, 'deduplicated', 1) end
  redis.call('HSET', calls, call, value)
  return 1
end

-- final is fleet.Run.RecordFinal: the same report twice counts once, a
-- different one later is refused (the first wins).
-- KEYS: run, its calls hash. ARGV: call id, ledger slot (the run hash's
-- field counting the disposition, as fleet.LedgerSlot picks it), the
-- calls hash's value "disposition:stop/slot". Returns 1 when the ledger
-- changed, 0 when not, the value in force for a refused one, or an error
-- NOTFOUND.
local function final(keys, args, now)
  local r = record_final(keys[1], keys[2], args[1], args[2], args[3])
  if r == nil then return redis.error_reply('NOTFOUND run') end
  return r
end

-- A group of policyd_outcomes' numbers, packed (outcomes.go writes them):
-- its breaker's cfg as cfg_at reads it (mode, consecutive failures,
-- failure rate, window µs, min calls, cool-down µs, probes, probe timeout
-- µs) and its runs' count n, then n runs of OUTCOMES_RUN: the result, the
-- count and the permit id (its length a byte; 0 for none). An argument per
-- number, in decimal, cost the call more to take in than to decide.
local OUTCOMES_GROUP = '<i8i8di8i8i8i8i8i4'
local OUTCOMES_RUN = '<Bi4Bc0'

-- outcomes applies one flush of a tenant's reported outcomes in one call:
-- the results on its breakers (as record), then the final dispositions in
-- its runs' ledgers (as final; one whose result had its permit refused is
-- skipped), then the deposit of its successes into its bucket (as
-- deposit).
-- KEYS: events, index, bucket, then G breakers, then R pairs (run, calls).
-- ARGV: G, R, successes, budget (6), the tenant's cap of breakers, then
-- per group: target, then its numbers packed (OUTCOMES_GROUP: cfg and n)
-- and n runs of its results in the order they were reported
-- (OUTCOMES_RUN each: result, count k, permit id or ''): k consecutive
-- results of one value without a permit (record_run), or one result (k 1)
-- with its permit (record1); then F, then F finals: run
-- index (1..R), the 1-based index among this call's result runs (group
-- by group) whose refusal cancels it (0: none), call id, ledger field,
-- value, and last the
-- batch id; KEYS end with the tenant's applied set when it is not ''.
-- Between the finals and the batch id there may be the attempt
-- statistics' counts: T, then T quadruples (field of {T}:stats:HOUR, the
-- count, the 1-based result index whose refusal cancels it or 0, the
-- 1-based final index that must change the ledger or 0), with the hour's
-- hash in KEYS
-- after the run pairs; each is counted with HINCRBY and the hash expires
-- STATS_TTL after its last count; a condition's index is a result run's,
-- as a final's.
-- Returns {now, per group: {event ids}, {the 1-based indexes among the
-- group's result runs of those refused (fleet.ErrPermit; only a run with
-- a permit can be)}, snapshot, then
-- per final 1 (changed), 0 (unchanged), -1 (no such run) or the value in
-- force (refused: the first wins), then tokens}, or {'applied'} for a batch
-- id applied before (a replay): nothing changes.
local function outcomes(keys, args, now)
  local batch = args[#args]
  if batch ~= '' and redis.call('SISMEMBER', keys[#keys], batch) == 1 then
    return {'applied'}
  end
  local ng, nr, successes = tonumber(args[1]), tonumber(args[2]), tonumber(args[3])
  local bg = budget_at(args, 4)
  local cap = tonumber(args[10])
  local a = 11
  -- refused_all: true at the call's index (group by group) of every
  -- result run refused
  local out, refused_all, nruns = {int(now)}, {}, 0
  for g = 1, ng do
    local key = keys[3 + g]
    local target, p = args[a], args[a + 1]
    a = a + 2
    local c, n, pos = {}
    c.mode, c.consecutive, c.rate, c.window, c.min_calls, c.cooldown, c.probes, c.probe_timeout, n, pos =
      struct.unpack(OUTCOMES_GROUP, p)
    local b = load(key, now)
    check_new(b, keys[2], cap)
    b.mode = c.mode
    -- dirty: a change not stored yet (settle stores a transition's); a
    -- run's effect is 0, MUTATED or TRANSITIONED + MUTATED, so no union
    local events, refused, dirty = {}, {}, false
    local e = advance(b, now)
    if has(e, TRANSITIONED) then
      events[#events + 1] = settle(key, keys[1], keys[2], target, b, now, e)
      e = 0
    end
    dirty = e ~= 0
    for i = 1, n do
      local r, k, permit
      r, k, permit, pos = struct.unpack(OUTCOMES_RUN, p, pos)
      local e2, bad = 0, 0
      if permit == '' then
        e2 = record_run(b, now, c, r, k)
      else
        e2, bad = record1(b, now, c, r, permit)
      end
      if bad == 1 then
        refused[#refused + 1] = i
        refused_all[nruns + i] = true
      end
      if e2 >= TRANSITIONED then
        events[#events + 1] = settle(key, keys[1], keys[2], target, b, now, e2)
      elseif e2 ~= 0 then
        dirty = true
      end
    end
    if dirty or b.fresh then store(key, keys[2], target, b) end
    nruns = nruns + n
    out[#out + 1] = events
    out[#out + 1] = refused
    out[#out + 1] = snapshot(b, now)
  end
  local nf = tonumber(args[a])
  a = a + 1
  local finals = {}
  for f = 1, nf do
    local ri, cond = tonumber(args[a]), tonumber(args[a + 1])
    local run, calls = keys[3 + ng + 2 * ri - 1], keys[3 + ng + 2 * ri]
    local r = 0
    if not refused_all[cond] then
      r = record_final(run, calls, args[a + 2], args[a + 3], args[a + 4])
      if r == nil then r = -1 end
    end
    out[#out + 1] = r
    finals[f] = r
    a = a + 5
  end
  if a < #args then
    local nt = tonumber(args[a])
    local stats = keys[3 + ng + 2 * nr + 1]
    a = a + 1
    for _ = 1, nt do
      local cond, fi = tonumber(args[a + 2]), tonumber(args[a + 3])
      if not refused_all[cond] and (fi == 0 or finals[fi] == 1) then
        redis.call('HINCRBY', stats, args[a], args[a + 1])
      end
      a = a + 4
    end
    redis.call('EXPIRE', stats, STATS_TTL)
  end
  local tokens = ''
  if successes > 0 then
    local k = bucket_load(keys[3], bg.cap, now)
    refill(k, now, bg)
    k.tokens = math.min(k.tokens + bg.ratio * successes, bucket_cap(k, bg))
    bucket_store(keys[3], k)
    tokens = float(k.tokens)
  end
  out[#out + 1] = tokens
  if batch ~= '' then
    redis.call('SADD', keys[#keys], batch)
    redis.call('EXPIRE', keys[#keys], APPLIED_TTL)
  end
  return out
end

-- attempt_store is fleet.Attempts.Decided on the record at key: attempt
-- n's answer (packed by redisstore's appendAnswer; only attempt_check
-- reads it, for its retry flag) and, when the library decided it, its
-- verdict (policyd_nextdelay), never rewinding (a lower attempt than
-- the one stored changes nothing), kept until expiry (Unix ms) at least.
-- h is the record's attempt and expiry first, as HMGET read them earlier
-- in the same call (policyd_nextdelay's attempt check), or nil to read
-- them here. It returns 1 when stored.
local function attempt_store(key, n, answer, expiry, verdict, h)
  h = h or redis.call('HMGET', key, 'attempt', 'expiry')
  if n < tonumber(h[1] or '0') then return 0 end
  local at = int(math.max(expiry, tonumber(h[2] or '0')))
  if verdict then
    redis.call('HSET', key, 'attempt', int(n), 'answer', answer, 'expiry', at, 'verdict', verdict)
  else
    redis.call('HSET', key, 'attempt', int(n), 'answer', answer, 'expiry', at)
    redis.call('HDEL', key, 'verdict')
  end
  redis.call('PEXPIREAT', key, at)
  return 1
end

-- attempt is fleet.Attempts.Decided: the answer to attempt of a call,
-- never rewinding (a lower attempt than the one stored changes nothing),
-- kept until expiry at least. KEYS: the call's attempt key. ARGV: attempt,
-- answer (packed: appendAnswer), expiry (Unix ms), and optionally first:
-- '1' leaves the same attempt stored and live as it is (a record a
-- replica decided while the engine was down, written afterwards: the
-- engine's answer came first). Returns 1 when stored.
local function attempt(keys, args, now)
  local n = tonumber(args[1])
  if args[4] == '1' then
    local h = redis.call('HMGET', keys[1], 'attempt', 'expiry')
    if tonumber(h[1] or '0') == n and now < tonumber(h[2] or '0') * 1000 then return 0 end
    return attempt_store(keys[1], n, args[2], tonumber(args[3]), nil, h)
  end
  return attempt_store(keys[1], n, args[2], tonumber(args[3]), nil)
end

-- attempt_check is fleet.Attempts.Check of attempt n on the record at key
-- at now: 'replay' (the same attempt), 'refused' (a lower one, or any
-- after a STOP) or '' (decide it), and the record's fields attempt,
-- expiry, answer and verdict. A record written by policyd_attempt has no
-- verdict: its answer says whether it retried, packed (redisstore's
-- appendAnswer: the retry flag is its byte 2, 0 or 1) or, written before,
-- policy.Answer's JSON (its first byte '{').
local function attempt_check(key, n, now)
  local h = redis.call('HMGET', key, 'attempt', 'expiry', 'answer', 'verdict')
  if not h[1] then return '', h end
  local cur = tonumber(h[1])
  if cur == 0 or now >= tonumber(h[2]) * 1000 then return '', h end
  if n == cur then return 'replay', h end
  local retry
  if h[4] then
    retry = string.sub(h[4], 1, 1) == '1'
  elseif string.byte(h[3] or '', 1) == 123 then
    local ok, a = pcall(cjson.decode, h[3])
    retry = ok and type(a) == 'table' and a.Retry == true
  else
    retry = string.byte(h[3] or '', 2) == 1
  end
  if not retry or n < cur then return 'refused', h end
  return '', h
end

-- spread_hint is policy.SpreadHint: the wait h (ns) widened by a spread of
-- max(ratio * h, min_spread), u in [0, 1) choosing the point, h first
-- capped at max_hint (when > 0).
local function spread_hint(h, ratio, min_spread, max_hint, u)
  local function dur(v) if v > 0 then return math.floor(v) end return 0 end
  if h < 0 then h = 0 end
  if max_hint > 0 and h > max_hint then h = max_hint end
  local sp = dur(ratio * h)
  if sp < min_spread then sp = min_spread end
  if not (u > 0) then u = 0 elseif u > 1 then u = 1 end
  local r = dur(sp * u)
  if r > sp then r = sp end
  return h + r
end

-- until_ns is how long from now (µs) to a time given as Unix µs and a
-- remainder of ns, in ns; nil for the time 0 (none).
local function until_ns(t_us, t_rem, now)
  if t_us == 0 and t_rem == 0 then return nil end
  return (t_us - now) * 1000 + t_rem
end

-- policyd_nextdelay's numbers, one binary string read with struct.unpack
-- (redisstore's nextDelayNumbers writes it; its test checks these
-- formats against its own): little-endian, no padding, i8 a signed 64-bit
-- integer, d a double, B a byte (0 or 1). Lua's numbers are doubles, so
-- every i8 is exact below 2^53: times go as Unix µs (and the ns past
-- them), durations in ns are exact up to 2^53 ns (104 days; a longer one
-- rounds to a neighbouring ns, as its decimal did before), versions and
-- counters are far below. The head is read first: a replay reads nothing
-- else.
--
--   head    attempt i8, n (results carried) i8
--   fresh   cfg: mode i8, consecutive failures i8, failure rate d,
--           window µs i8, min calls i8, cool-down µs i8, half-open
--           probes i8, probe timeout µs i8;
--           result i8, the tenant's cap of breakers i8, the hint to
--           share ns i8 (0: none);
--           the stateless decision: retry B, delay ns i8, stop i8,
--           disposition i8;
--           the deadline µs i8 and ns past them i8 (0 0: none);
--           the attempt timeout ns i8;
--           pushback: spread ratio d, min spread ns i8, max hint ns i8;
--           the spread draw d;
--           budget: capacity d, deposit ratio d, floor per second d,
--           retry cost d, timeout cost d, dry run B;
--           timeout B, has run B;
--           the run's cut-off µs i8 and ns past them i8 (0 0: none);
--           cut binds B, the checks so far i8, keep (Unix ms) i8;
--           the spend's shares: bucket version seen i8, run version seen
--           i8, grace µs i8
--   tail    n results, a byte each
local ND_HEAD = '<i8i8'
local ND_FRESH = '<i8i8di8i8i8i8i8i8i8i8Bi8i8i8i8i8i8di8i8ddddddBBBi8i8Bi8i8i8i8i8'

-- nextdelay_numbers reads the numbers of a fresh decision from p, the
-- packed numbers, at pos (past the head): the breaker configuration
-- (c, as cfg_at), the budget (bg, as budget_at), the rest by name, and
-- pos past them. The numbers go to locals first and each table is made
-- whole by its constructor: filling the fields one by one grew the
-- tables again and again, and cost more than the unpacking.
local function nextdelay_numbers(p, pos)
  local mode, consecutive, rate, window_us, min_calls, cooldown_us, probes, probe_timeout,
    result, cap, share,
    retry, delay, stop, disp,
    deadline_us, deadline_ns,
    timeout,
    ratio, min_spread, max_hint,
    draw,
    bcap, bratio, per_second, cost, timeout_cost, dry_run,
    spend_timeout, has_run,
    cut_us, cut_ns,
    cut_binds, checks, keep,
    ack_k, ack_r, grace,
    after = struct.unpack(ND_FRESH, p, pos)
  return {
    c = {mode = mode, consecutive = consecutive, rate = rate, window = window_us, min_calls = min_calls,
      cooldown = cooldown_us, probes = probes, probe_timeout = probe_timeout},
    bg = {cap = bcap, ratio = bratio, per_second = per_second, cost = cost, timeout_cost = timeout_cost,
      dry_run = dry_run == 1},
    result = result, cap = cap, share = share,
    retry = retry, delay = delay, stop = stop, disp = disp,
    deadline_us = deadline_us, deadline_ns = deadline_ns,
    timeout = timeout,
    ratio = ratio, min_spread = min_spread, max_hint = max_hint,
    draw = draw,
    spend_timeout = spend_timeout, has_run = has_run,
    cut_us = cut_us, cut_ns = cut_ns,
    cut_binds = cut_binds, checks = checks, keep = keep,
    ack_k = ack_k, ack_r = ack_r, grace = grace,
    pos = after,
  }
end

-- nextdelay_results is the n results carried, read from p at pos, paired
-- with their permit ids, args[first] on, as record_on takes them.
local function nextdelay_results(p, pos, n, args, first)
  local results = {}
  for i = 0, n - 1 do
    results[#results + 1] = string.byte(p, pos + i)
    results[#results + 1] = args[first + i]
  end
  return results
end

-- nextdelay is a NextDelay decided in one step, for a call whose policy
-- has no fallback targets and whose attempt held no lease: the attempt
-- check (fleet.Attempts.Check: replay, refuse, or go on), the breaker's
-- record of the failure (record_on), the pushback cool-down shared
-- (cooldown_on), then for a retry fleet.GateRetry (an OPEN breaker, the
-- cool-down spread, the deadline), the spend (spend_on) and fleet.Spent,
-- then fleet.CutRun, and the attempt record written with the verdict
-- (fleet.Attempts.Decided, never rewound). The breaker's results a
-- replica held for its flush, reported before this failure, are counted
-- first, whatever the attempt check says; without them the attempt check
-- goes first, and a replay or refusal reads nothing but the head.
-- KEYS: attempt, breaker, events, index, bucket, run (a key of the
-- tenant with no run when has run is 0).
-- ARGV: the numbers, packed (ND_HEAD, ND_FRESH and the results above),
-- target, permit id or '', the answer so far (packed: appendAnswer), the
-- spend's replica id, the live replica ids (space-separated), then the n
-- carried results' permit ids ('' for none): 6 arguments and the n
-- permits (redisstore's nextDelayArgs).
-- Returns {now, 'replay' or 'refused', attempt, expiry, answer, verdict or
-- ''}, {now, 'permit', snapshot}, or {now, 'decided', verdict, asked,
-- granted, dry, event ids, snapshot, bucket share, its version, run
-- share, its version}; the verdict is "retry delay stop disposition
-- breaker checks tokens remaining spread".
local function nextdelay(keys, args, now)
  local p, target = args[1], args[2]
  local n, carried, pos = struct.unpack(ND_HEAD, p)
  local d, b, events = nil, nil, {}
  if carried > 0 then
    d = nextdelay_numbers(p, pos)
    b = load(keys[2], now)
    check_new(b, keys[4], d.cap)
    events = record_on(keys[2], keys[3], keys[4], target, b, d.c, now, nextdelay_results(p, d.pos, carried, args, 7))
  end
  local verdict, h = attempt_check(keys[1], n, now)
  if verdict ~= '' then
    return {now, verdict, h[1], h[2], h[3], h[4] or ''}
  end
  d = d or nextdelay_numbers(p, pos)
  local c, has_run = d.c, d.has_run == 1
  if has_run and redis.call('EXISTS', keys[6]) == 0 then return redis.error_reply('NOTFOUND run') end
  if not b then
    b = load(keys[2], now)
    check_new(b, keys[4], d.cap)
  end
  local evs, refused = record_on(keys[2], keys[3], keys[4], target, b, c, now, {d.result, args[3]})
  for _, ev in ipairs(evs) do events[#events + 1] = ev end
  if refused[1] == 1 then return {now, 'permit', snapshot(b, now)} end
  local retry, delay, stop, disp = d.retry == 1, d.delay, d.stop, d.disp
  if d.share > 0 and (not retry or b.state ~= OPEN) then
    for _, ev in ipairs(cooldown_on(keys[2], keys[3], keys[4], target, b, now, now + idiv(d.share, 1000))) do
      events[#events + 1] = ev
    end
  end
  local checks, spread, asked, granted, dry, tokens, remaining = d.checks, 0, 0, 0, 0, 0, 0
  local shares = {{hold = 0, v = 0}, {hold = 0, v = 0}}
  if retry then
    local left = until_ns(d.deadline_us, d.deadline_ns, now)
    if b.state == OPEN then
      retry, delay, stop, disp = false, 0, 6, 5
    else
      local wait = (b.cooldown - now) * 1000
      if b.cooldown > now and wait > delay then
        delay, spread = spread_hint(wait, d.ratio, d.min_spread, d.max_hint, d.draw), 1
      end
      if left and delay + math.max(d.timeout, 0) > left then
        retry, delay, stop, disp = false, 0, 4, 3
      end
    end
    if retry then
      checks = checks + 64
      if has_run then checks = checks + 128 end
      asked = 1
      local g, st, dd, tk, rem, dr, sh, rsh = spend_on(keys[5], keys[6], d.bg, d.spend_timeout == 1, has_run, now,
        share_new(args[5], d.ack_k, d.ack_r, args[6], d.grace))
      granted, tokens, remaining, dry, shares = g, tk, rem, dr, {sh, rsh}
      if g == 0 then retry, delay, stop, disp = false, 0, st, dd end
    end
  end
  if not retry then
    local cut = until_ns(d.cut_us, d.cut_ns, now)
    if cut and cut <= 0 and disp ~= 2 then
      disp = 4
    elseif stop == 4 and d.cut_binds == 1 then
      disp = 4
    end
  end
  -- one format for the verdict, not one a number (int, float): each
  -- string.format costs about what a Redis command does in here
  local v = string.format('%s %d %d %d %d %d %.17g %d %d', retry and '1' or '0', delay, stop, disp, b.state,
    checks, tokens, remaining, spread)
  attempt_store(keys[1], n, args[4], d.keep, v, h)
  -- now and the versions go as numbers (integers below 2^53: a reply makes
  -- each an integer, exact), the holds as text (doubles)
  return {now, 'decided', v, asked, granted, dry, events, snapshot(b, now),
    float(shares[1].hold), shares[1].v, float(shares[2].hold), shares[2].v}
end

-- read returns a breaker's snapshot at the call's time without
-- changing it. KEYS: breaker. Returns {now, snapshot} or NOTFOUND.
local function read(keys, _, now)
  if redis.call('EXISTS', keys[1]) == 0 then return redis.error_reply('NOTFOUND breaker') end
  return {int(now), snapshot(load(keys[1], now), now)}
end

-- read_many is read of every breaker under KEYS (one tenant's, so one
-- hash slot): {now, snapshots}, an empty snapshot for a key not stored,
-- so that listing a tenant's breakers is one call, not one per breaker.
local function read_many(keys, _, now)
  local out = {}
  for i, k in ipairs(keys) do
    if redis.call('EXISTS', k) == 1 then out[i] = snapshot(load(k, now), now) else out[i] = {} end
  end
  return {int(now), out}
end

-- attempts reads the attempt records under KEYS (one tenant's, so one
-- hash slot), each as HGETALL replies ({} for none): ReportOutcome's
-- final-disposition checks read a request's records of a tenant in one
-- call, not one round trip per outcome.
local function attempts(keys)
  local out = {}
  for i, k in ipairs(keys) do out[i] = redis.call('HGETALL', k) end
  return out
end

-- The audit trail of a tenant: a stream of entries, each a chunk of up
-- to 1024 records (fields n, their count, and b, the chunk as redisstore's
-- appendAuditChunk packs it; entries written before chunks hold one
-- record each), its meta hash and the ids of the chunks added lately
-- (a sorted set by the server's time, ms). Record i of an entry ms-seq
-- has the sequence ms-(seq+i): an entry of n records gets an id whose
-- sequence leaves the n-1 after it free (meta field next), so every
-- record has an id of its own, in order. The meta hash holds records (the
-- records kept), head (the first entry's id), headn (its records), skip
-- (of them, those the cap removed) and next.
local AUDIT_SEQ = 1048576 -- 2^20 sequences a millisecond, as redisstore's packID
-- what one call's trim reads at most (the next call goes on): entries,
-- and bytes of their fields; either is far more than a call adds
local AUDIT_WALK, AUDIT_WALK_BYTES = 4096, 4194304

-- audit_id splits an entry id into its milliseconds and sequence.
local function audit_id(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

-- audit_n is the records of an entry (its fields, as XRANGE gives them):
-- field n, or 1 for an entry written before chunks.
local function audit_n(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'n' then return tonumber(fields[i + 1]) end
  end
  return 1
end

-- audit_meta reads a stream's meta; a stream without one (written
-- before it: one record an entry) is counted once, here.
local function audit_meta(stream, meta)
  local h = redis.call('HMGET', meta, 'records', 'head', 'headn', 'skip', 'next')
  if h[1] and redis.call('EXISTS', stream) == 1 then
    return {records = tonumber(h[1]), head = h[2], headn = tonumber(h[3]), skip = tonumber(h[4]), next = h[5]}
  end
  local m = {records = redis.call('XLEN', stream), head = '', headn = 0, skip = 0, next = '0-0'}
  if m.records > 0 then
    local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
    local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
    m.head, m.headn = first[1], audit_n(first[2])
    local ms, seq = audit_id(last[1])
    m.next = int(ms) .. '-' .. int(seq + audit_n(last[2]))
  end
  return m
end

-- audit adds a chunk of a tenant's records as one entry of its stream,
-- unless its chunk id was added before (within APPLIED_TTL: a chunk sent
-- again after its answer was lost), then trims the stream from its head
-- to at most ARGV[1] records, exactly (the head entry's first records
-- skipped past the cap, whole entries removed), and to the entries of the
-- last ARGV[2] ms by the server's clock, walking only the entries that
-- go (each read once, as it becomes the head; at most AUDIT_WALK of them
-- and AUDIT_WALK_BYTES a call, so a cap lowered far is reached over a few
-- calls), then XTRIM MINID to the head. KEYS: the stream, its meta, its chunk ids. ARGV: max records,
-- retention (ms), chunk id ('' for none), the chunk's records, the chunk,
-- and its field: 'b' (the default) or 'z' (compressed by the replica;
-- auditentry.go). Returns the records added: 0 for a chunk added before.
local function audit(keys, args)
  local stream, meta, ids = keys[1], keys[2], keys[3]
  local cap, keep, id, n = tonumber(args[1]), tonumber(args[2]), args[3], tonumber(args[4])
  local field = args[6] or 'b'
  if field ~= 'b' and field ~= 'z' then
    return redis.error_reply('ERR policyd_audit: the chunk field must be b or z, got ' .. field)
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
  local m = audit_meta(stream, meta)
  local added = 0
  if id == '' or not redis.call('ZSCORE', ids, id) then
    local ms, seq = audit_id(m.next)
    if ms < now then ms, seq = now, 0 end
    if seq + n > AUDIT_SEQ then ms, seq = ms + 1, 0 end
    local eid = int(ms) .. '-' .. int(seq)
    local r = redis.pcall('XADD', stream, eid, 'n', int(n), field, args[5])
    if type(r) == 'table' and r.err then -- an entry after next (not ours): after it
      eid = redis.call('XADD', stream, '*', 'n', int(n), field, args[5])
      ms, seq = audit_id(eid)
    end
    m.next = int(ms) .. '-' .. int(seq + n)
    m.records = m.records + n
    if m.head == '' then m.head, m.headn, m.skip = eid, n, 0 end
    if id ~= '' then redis.call('ZADD', ids, now, id) end
    added = n
  end
  redis.call('ZREMRANGEBYSCORE', ids, '-inf', '(' .. int(now - APPLIED_TTL * 1000))
  local oldest = now - keep
  local read = 0
  for _ = 1, AUDIT_WALK do
    if m.head == '' or read > AUDIT_WALK_BYTES then break end
    local live = m.headn - m.skip
    local old = audit_id(m.head) < oldest
    if not old and m.records <= cap then break end
    if not old and m.records - cap < live then
      m.skip = m.skip + m.records - cap
      m.records = cap
      break
    end
    m.records = m.records - live
    local e = redis.call('XRANGE', stream, '(' .. m.head, '+', 'COUNT', 1)[1]
    if e then
      m.head, m.headn, m.skip = e[1], audit_n(e[2]), 0
      for i = 2, #e[2], 2 do read = read + #e[2][i] end
    else
      m.head, m.headn, m.skip = '', 0, 0
    end
  end
  redis.call('XTRIM', stream, 'MINID', m.head ~= '' and m.head or m.next)
  redis.call('HSET', meta, 'records', int(m.records), 'head', m.head, 'headn', int(m.headn), 'skip', int(m.skip),
    'next', m.next)
  return added
end

-- The idempotency ledger: fleet.KeyRecord in a hash per key (state,
-- lease, lease_until, expires, result), expiring with the record
-- (PEXPIREAT, rounded up to the millisecond), and the tenant's live keys
-- in a sorted set by expiry, for the per-tenant cap. States are policy's:
-- 1 NEW 2 IN_FLIGHT 3 SUCCEEDED 4 UNKNOWN; outcomes 1 SUCCEEDED 2 FAILED
-- 3 UNKNOWN. A lease id is drawn by the caller (crypto/rand); '' is none.
local KEY_NEW, KEY_IN_FLIGHT, KEY_SUCCEEDED, KEY_UNKNOWN = 1, 2, 3, 4

-- key_load reads an idempotency record, nil when there is none.
local function key_load(key)
  local h = redis.call('HMGET', key, 'state', 'lease', 'lease_until', 'expires', 'result')
  if not h[1] then return nil end
  return {state = tonumber(h[1]), lease = h[2] or '', lease_until = tonumber(h[3]),
    expires = tonumber(h[4]), result = h[5] or ''}
end

-- key_store writes r to key, its expiry, and its place in the index.
local function key_store(key, index, member, r)
  redis.call('HSET', key, 'state', int(r.state), 'lease', r.lease, 'lease_until', int(r.lease_until),
    'expires', int(r.expires), 'result', r.result)
  redis.call('PEXPIREAT', key, int(idiv(r.expires + 999, 1000)))
  redis.call('ZADD', index, int(r.expires), member)
end

-- key_claim is fleet.KeyRecord.Claim at the server's time; a record new
-- to the tenant (none, or one expired) beyond cap live ones (cap 0: no
-- cap) is an error KEYS_CAPACITY, once the expired ones left the index.
-- KEYS: record, the tenant's index. ARGV: idempotency key, lease id,
-- lease end, expiry (Unix µs), dedupes (0 or 1), cap.
-- Returns {now, state, lease id ('' unless the claim took it), lease end,
-- result reference, retry after (µs), reason}.
local function key_claim(keys, args, now)
  local lease, untl, expires, cap = args[2], tonumber(args[3]), tonumber(args[4]), tonumber(args[6])
  local r = key_load(keys[1])
  local function take(st, reason)
    local exp = expires
    if r then exp = math.max(expires, r.expires) end
    key_store(keys[1], keys[2], args[1], {state = KEY_IN_FLIGHT, lease = lease, lease_until = untl, expires = exp, result = ''})
    return {int(now), st, lease, int(untl), '', 0, reason}
  end
  if not r or now >= r.expires then
    redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', int(now))
    local n = redis.call('ZCARD', keys[2])
    if cap > 0 and n >= cap then
      error({err = 'KEYS_CAPACITY tenant has ' .. int(n) .. ' idempotency keys (cap ' .. int(cap) .. ')'})
    end
    r = nil
    return take(KEY_NEW, 'idempotency:new')
  end
  if r.state == KEY_NEW then
    return take(KEY_NEW, 'idempotency:new')
  elseif r.state == KEY_SUCCEEDED then
    return {int(now), KEY_SUCCEEDED, '', 0, r.result, 0, 'idempotency:succeeded'}
  elseif r.state == KEY_IN_FLIGHT and now < r.lease_until then
    return {int(now), KEY_IN_FLIGHT, '', 0, '', int(r.lease_until - now), 'idempotency:in_flight'}
  elseif args[5] == '1' then
    return take(KEY_UNKNOWN, 'idempotency:unknown_retry')
  end
  if r.state ~= KEY_UNKNOWN or r.lease ~= '' then
    r.state, r.lease, r.lease_until = KEY_UNKNOWN, '', 0
    key_store(keys[1], keys[2], args[1], r)
  end
  return {int(now), KEY_UNKNOWN, '', 0, '', 0, 'idempotency:unknown'}
end

-- key_view is a record as the engine reports it: {now, state, lease end,
-- expiry, result reference}.
local function key_view(now, r)
  return {int(now), r.state, int(r.lease_until), int(r.expires), r.result}
end

-- key_complete is fleet.KeyRecord.Complete at the server's time: an
-- unknown or expired record is an error NOTFOUND, a lease not the
-- record's current one an error LEASE.
-- KEYS: record, the tenant's index. ARGV: idempotency key, lease id,
-- outcome, result reference, expiry (Unix µs, 0 for none).
-- Returns the record's view (key_view).
local function key_complete(keys, args, now)
  local r = key_load(keys[1])
  if not r or now >= r.expires then return redis.error_reply('NOTFOUND idempotency key') end
  local lease, o = args[2], tonumber(args[3])
  if r.state ~= KEY_IN_FLIGHT or r.lease ~= lease or lease == '' then
    return redis.error_reply('LEASE not the current lease')
  end
  if o == 1 then
    r.state, r.result = KEY_SUCCEEDED, args[4]
  elseif o == 2 then
    r.state = KEY_NEW
  else
    r.state = KEY_UNKNOWN
  end
  r.lease, r.lease_until, r.expires = '', 0, math.max(r.expires, tonumber(args[5]))
  key_store(keys[1], keys[2], args[1], r)
  return key_view(now, r)
end

-- key_read returns a record's view at the server's time without changing
-- it, or an error NOTFOUND for none or an expired one. KEYS: record.
local function key_read(keys, _, now)
  local r = key_load(keys[1])
  if not r or now >= r.expires then return redis.error_reply('NOTFOUND idempotency key') end
  return key_view(now, r)
end

-- A run's call table (fleet.CallTable): one hash per run of call id ->
-- record, "1 disposition stop attempts first last" and the lengths of
-- target, classification, detail and triage reference, a newline, then
-- those four strings; a sorted set of the call ids (score 0) for listing
-- in id order; the run hash's calls_untracked counts the calls beyond the
-- cap.

local function call_decode(v)
  local nl = string.find(v, '\n', 1, true)
  local h = {}
  for n in string.gmatch(string.sub(v, 1, nl - 1), '%d+') do h[#h + 1] = tonumber(n) end
  local s, at = {}, nl + 1
  for i = 7, #h do
    s[#s + 1] = string.sub(v, at, at + h[i] - 1)
    at = at + h[i]
  end
  return {disposition = h[2], stop = h[3], attempts = h[4], first = h[5], last = h[6],
    target = s[1], class = s[2], detail = s[3], triage = s[4], primary = s[5] or ''}
end

-- call_encode writes version 1, or version 2 (one more length and string,
-- the primary target) for a call that ended on a fallback.
local function call_encode(c)
  local head = ' ' .. int(c.disposition) .. ' ' .. int(c.stop) .. ' ' .. int(c.attempts) .. ' ' .. int(c.first) ..
    ' ' .. int(c.last) .. ' ' .. int(#c.target) .. ' ' .. int(#c.class) .. ' ' .. int(#c.detail) .. ' ' ..
    int(#c.triage)
  if c.primary == '' then
    return '1' .. head .. '\n' .. c.target .. c.class .. c.detail .. c.triage
  end
  return '2' .. head .. ' ' .. int(#c.primary) .. '\n' .. c.target .. c.class .. c.detail .. c.triage .. c.primary
end

-- call_apply is fleet.CallRecord.Note: the attempt count never goes back;
-- first and last only widen; the classification follows the highest
-- attempt, the detail the latest note of the highest attempt or a final
-- disposition; a final disposition replaces the one kept; a non-empty
-- target or triage reference replaces the one kept, a target together with
-- its primary ('' when it is the primary). n.time 0 is none.
local function call_apply(c, n)
  local current = n.attempt >= c.attempts
  if n.attempt > c.attempts then c.attempts = n.attempt end
  if n.time ~= 0 then
    if c.first == 0 or n.time < c.first then c.first = n.time end
    c.last = math.max(c.last, n.time)
  end
  if current and n.class ~= '' then c.class = n.class end
  local final = n.disposition ~= 0
  if (current or final) and n.detail ~= '' then c.detail = n.detail end
  if final then c.disposition, c.stop = n.disposition, n.stop end
  if n.target ~= '' then c.target, c.primary = n.target, n.primary end
  if n.triage ~= '' then c.triage = n.triage end
end

-- note_call is fleet.CallTable.Note: a new call beyond cap is counted in
-- the run's calls_untracked, not kept.
-- KEYS: run, its call table, its call ids. ARGV: call id, cap, target,
-- triage reference, attempt, classification, detail, disposition, stop,
-- time (Unix µs, 0 for none), primary target ('' for none; absent from an
-- older caller).
-- Returns 1 when the table changed, else 0, or an error NOTFOUND.
local function note_call(keys, args)
  if redis.call('EXISTS', keys[1]) == 0 then return redis.error_reply('NOTFOUND run') end
  local call = args[1]
  local prev = redis.call('HGET', keys[2], call)
  local c
  if prev then
    c = call_decode(prev)
  else
    if redis.call('HLEN', keys[2]) >= tonumber(args[2]) then
      redis.call('HINCRBY', keys[1], 'calls_untracked', 1)
      return 0
    end
    c = {disposition = 0, stop = 0, attempts = 0, first = 0, last = 0, target = '', class = '', detail = '', triage = '',
      primary = ''}
  end
  call_apply(c, {target = args[3], triage = args[4], attempt = tonumber(args[5]), class = args[6],
    detail = args[7], disposition = tonumber(args[8]), stop = tonumber(args[9]), time = tonumber(args[10]),
    primary = args[11] or ''})
  local v = call_encode(c)
  if v == prev then return 0 end
  redis.call('HSET', keys[2], call, v)
  if not prev then redis.call('ZADD', keys[3], 0, call) end
  return 1
end

-- The fleet-wide ceilings of one breaker key (fleet.Flow, with the
-- adaptive limit fleet.AdaptiveLimit): a hash (stray, tat, alimit, adec,
-- asince, adecs: the decreases so far, which no rule reads) and the leases in a sorted set, member the lease id (hex),
-- score its expiry (µs), so taking, counting and returning a lease costs
-- O(log n) whatever the ceiling (up to policy.MaxCeiling). Reasons are
-- fleet's: concurrency:lease, concurrency:full, rate:limited. Signals are
-- policy's: 0 none, 1 success, 2 congestion.

-- flow_load reads a key's flow hash; fresh when it holds nothing yet.
local function flow_load(key)
  local h = redis.call('HMGET', key, 'stray', 'tat', 'alimit', 'adec', 'asince', 'adecs')
  return {stray = tonumber(h[1] or '0'), tat = tonumber(h[2] or '0'), alimit = tonumber(h[3] or '0'),
    adec = tonumber(h[4] or '0'), asince = tonumber(h[5] or '0'), adecs = tonumber(h[6] or '0'), fresh = not h[1]}
end

local function flow_store(key, f)
  redis.call('HSET', key, 'stray', int(f.stray), 'tat', int(f.tat), 'alimit', float(f.alimit),
    'adec', int(f.adec), 'asince', int(f.asince), 'adecs', int(f.adecs))
  f.fresh = false
end

-- bounds_at reads an adaptive ceiling's 5 arguments (policy.AdaptiveBounds:
-- min, max, decrease, increase, hold in µs) from args at i; max 0 is none.
local function bounds_at(args, i)
  return {min = tonumber(args[i]), max = tonumber(args[i + 1]), decrease = tonumber(args[i + 2]),
    increase = tonumber(args[i + 3]), hold = tonumber(args[i + 4])}, i + 5
end

-- limits_at reads policy.FlowLimits (ceiling, lease ttl, full wait,
-- interval, burst, times in µs, then the adaptive bounds) from args at i.
local function limits_at(args, i)
  local l = {ceiling = tonumber(args[i]), ttl = tonumber(args[i + 1]), wait = tonumber(args[i + 2]),
    interval = tonumber(args[i + 3]), burst = tonumber(args[i + 4])}
  l.adaptive, i = bounds_at(args, i + 5)
  return l, i
end

-- al_current is fleet.AdaptiveLimit.Current: max before the first use,
-- clamped when the bounds changed under it.
local function al_current(f, b)
  if f.alimit == 0 then return b.max end
  return math.min(math.max(f.alimit, b.min), b.max)
end

-- al_ceiling is fleet.AdaptiveLimit.Ceiling.
local function al_ceiling(f, b)
  return math.min(math.max(math.floor(al_current(f, b)), b.min), b.max)
end

-- al_succeeded is fleet.AdaptiveLimit.Succeeded.
local function al_succeeded(f, b)
  local cur = al_current(f, b)
  f.alimit = math.min(cur + b.increase / cur, b.max)
  f.asince = f.asince + 1
end

-- al_congested is fleet.AdaptiveLimit.Congested at now.
local function al_congested(f, b, now)
  local cur = al_current(f, b)
  if f.adec ~= 0 and (f.asince < math.floor(cur) or now - f.adec < b.hold) then
    f.asince = f.asince + 1
    return false
  end
  f.alimit = math.max(cur * b.decrease, b.min)
  f.adec, f.asince, f.adecs = now, 0, f.adecs + 1
  return true
end

-- rate_take is fleet.Rate.Take: ok, or the exact wait (µs).
local function rate_take(f, now, interval, burst)
  local tat = math.max(f.tat, now)
  local allow_at = tat - (math.max(burst, 1) - 1) * interval
  if now < allow_at then return false, allow_at - now end
  f.tat = tat + interval
  return true, 0
end

-- rate_refund is fleet.Rate.Refund.
local function rate_refund(f, now, interval)
  if f.tat <= now then return end
  f.tat = math.max(f.tat - interval, now)
end

-- pool_acquire is fleet.Pool.Acquire on the leases set: a lease id
-- expiring ttl after now while fewer than ceiling are live, else the
-- wait (µs) until asking again makes sense. Returns ok, wait, expiry.
local function pool_acquire(leases, now, ceiling, ttl, wait, id)
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', int(now))
  if redis.call('ZCARD', leases) < ceiling then
    redis.call('ZADD', leases, int(now + ttl), id)
    return true, 0, now + ttl
  end
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  if first[2] then wait = math.min(wait, tonumber(first[2]) - now) end
  return false, math.max(wait, 0), 0
end

-- pool_release is fleet.Pool.Release: true for a lease live at now; one
-- not held ('' is an id that did not parse) is counted in stray.
local function pool_release(leases, f, now, id)
  if id ~= '' then
    local exp = redis.call('ZSCORE', leases, id)
    if exp then
      redis.call('ZREM', leases, id)
      if tonumber(exp) > now then return true end
    end
  end
  f.stray = f.stray + 1
  return false
end

local function pool_live(leases, now)
  return redis.call('ZCOUNT', leases, '(' .. int(now), '+inf')
end

-- flow_admit is fleet.Flow.Admit, the concurrency ceiling being the
-- adaptive limit's when lim has one: a rate slot, then a lease, refusing
-- at the first that is out with nothing taken. Returns admitted, reason,
-- wait (µs), lease id ('' for none), lease expiry.
local function flow_admit(leases, f, now, lim, id)
  if lim.interval > 0 then
    local ok, wait = rate_take(f, now, lim.interval, lim.burst)
    if not ok then return false, 'rate:limited', wait, '', 0 end
  end
  local ceiling = lim.ceiling
  if lim.adaptive.max > 0 then ceiling = al_ceiling(f, lim.adaptive) end
  if ceiling <= 0 then return true, '', 0, '', 0 end
  local ok, wait, expiry = pool_acquire(leases, now, ceiling, lim.ttl, lim.wait, id)
  if not ok then
    if lim.interval > 0 then rate_refund(f, now, lim.interval) end
    return false, 'concurrency:full', wait, '', 0
  end
  return true, 'concurrency:lease', 0, id, expiry
end

-- admit_flow is redisstore's AdmitFlow in one call: fleet.Flow.Admit (a
-- rate slot, then a lease), then the breaker's admit; a breaker that
-- refuses gets both back (fleet.Flow.Undo), so a refused attempt holds
-- nothing. A ceiling that is out refuses without asking the breaker.
-- KEYS: breaker, events, index, flow, leases. ARGV: target, cfg (8),
-- permit id, the tenant's cap of breakers, lease id, limits (10).
-- Returns {now, admitted, reason, permit, retry_after, event id,
-- snapshot (11), lease id, lease expiry, adaptive limit}.
local function admit_flow(keys, args, now)
  local c = cfg_at(args, 2)
  local b = load(keys[1], now)
  check_new(b, keys[3], tonumber(args[11]))
  local lim = limits_at(args, 13)
  local f = flow_load(keys[4])
  local tat = f.tat
  local fok, freason, fwait, lease, expiry = flow_admit(keys[5], f, now, lim, args[12])
  local ok, reason, permit, after, ev = 0, freason, '', fwait, ''
  if fok then
    local e
    ok, reason, permit, after, e = breaker_admit(b, c, now, args[10])
    ev = settle(keys[1], keys[2], keys[3], args[1], b, now, e)
    if ok == 0 then
      if lease ~= '' then pool_release(keys[5], f, now, lease) end
      if lim.interval > 0 then rate_refund(f, now, lim.interval) end
      lease, expiry = '', 0
    end
  elseif b.fresh then
    store(keys[1], keys[3], args[1], b)
  end
  if f.fresh or f.tat ~= tat then flow_store(keys[4], f) end
  local out = {int(now), ok, reason, permit, int(after), ev}
  for _, v in ipairs(snapshot(b, now)) do out[#out + 1] = v end
  out[#out + 1] = lease
  out[#out + 1] = int(expiry)
  out[#out + 1] = float(f.alimit)
  return out
end

-- release_lease is fleet.Pool.Release and, with an adaptive ceiling, the
-- outcome's signal on fleet.AdaptiveLimit, in one call; the signal counts
-- also for a lease no longer held: the outcome happened either way. A key
-- without ceiling state (no AdmitFlow ever) only ignores the release.
-- KEYS: flow, leases. ARGV: lease id ('' for one that did not parse),
-- adaptive bounds (5), signal.
-- Returns {now, held (0 or 1), stray, live, adaptive limit}.
local function release_lease(keys, args, now)
  if redis.call('EXISTS', keys[1]) == 0 then return {int(now), 0, 0, 0, '0'} end
  local f = flow_load(keys[1])
  local held = pool_release(keys[2], f, now, args[1])
  local b = bounds_at(args, 2)
  local sig = tonumber(args[7])
  if b.max > 0 then
    if sig == 1 then al_succeeded(f, b) elseif sig == 2 then al_congested(f, b, now) end
  end
  flow_store(keys[1], f)
  local h = 0
  if held then h = 1 end
  return {int(now), h, int(f.stray), pool_live(keys[2], now), float(f.alimit)}
end

-- pool is a key's ceiling state at the call's time, unchanged (leases
-- past their expiry are not counted).
-- KEYS: flow, leases. Returns {now, live, stray, adaptive limit, its
-- decreases}.
local function pool(keys, _, now)
  local f = flow_load(keys[1])
  return {int(now), pool_live(keys[2], now), int(f.stray), float(f.alimit), int(f.adecs)}
end

-- register registers fn as a function of the library: every function's
-- first argument is the caller's clock ('' or Unix µs, see clock_us), taken
-- off before fn sees the rest, so no function can decide at another time
-- than the call's. fn gets keys, the other arguments and now.
local function register(name, fn, flags)
  redis.register_function{function_name = name, flags = flags, callback = function(keys, args)
    local now = clock_us(table.remove(args, 1))
    return fn(keys, args, now)
  end}
end

register('policyd_read', read, {'no-writes'})
register('policyd_read_many', read_many, {'no-writes'})
register('policyd_attempts', attempts, {'no-writes'})
register('policyd_audit', audit)
register('policyd_release_shares', release_shares)
register('policyd_admit', admit)
register('policyd_record', record)
register('policyd_cooldown', cooldown)
register('policyd_admin_breaker', admin)
register('policyd_spend', spend)
register('policyd_deposit', deposit)
register('policyd_charge', charge)
register('policyd_final', final)
register('policyd_outcomes', outcomes)
register('policyd_attempt', attempt)
register('policyd_nextdelay', nextdelay)
register('policyd_key_claim', key_claim)
register('policyd_key_complete', key_complete)
register('policyd_key_read', key_read, {'no-writes'})
register('policyd_note_call', note_call)
register('policyd_admit_flow', admit_flow)
register('policyd_release_lease', release_lease)
register('policyd_pool', pool, {'no-writes'})
