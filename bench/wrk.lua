-- wrk script of `make bench`: POST /orders with a small JSON body.
-- Usage: wrk -s bench/wrk.lua URL -- MODE NONCE
--   MODE new:    a new Idempotency-Key per request (NONCE-thread-counter)
--   MODE replay: one fixed key, NONCE (stored by the driver before the run)
--   MODE nokey:  no Idempotency-Key (pass-through)
-- done() prints one line "BENCH_JSON {...}" that bench/run.py parses.

local threads = {}
local body = '{"item":"book","quantity":2}'

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

function init(args)
  mode = args[1] or "nokey"
  nonce = args[2] or "bench"
  counter = 0
  wrk.method = "POST"
  wrk.path = "/orders"
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
  if mode == "replay" then
    wrk.headers["Idempotency-Key"] = nonce
  end
  fixed = wrk.format()
end

function request()
  if mode == "new" then
    counter = counter + 1
    local headers = {
      ["Content-Type"] = "application/json",
      ["Idempotency-Key"] = nonce .. "-" .. tid .. "-" .. counter,
    }
    return wrk.format(nil, nil, headers, body)
  end
  return fixed
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors_connect":%d,'
      .. '"errors_read":%d,"errors_write":%d,"errors_status":%d,"errors_timeout":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max))
end
