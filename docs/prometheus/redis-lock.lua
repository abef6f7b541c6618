-- redis-lock's INFO lock fields for oliver006/redis_exporter's `--script` option.
--
-- The exporter's `--include-modules-metrics` reads `INFO MODULES` but exports only the module
-- fields it knows by name (RediSearch's), and `INFO ALL` has no module section, so the lock
-- fields reach it through this script: it returns every `INFO lock` field whose value is one
-- number, as name/value pairs, and the exporter publishes each as
--   redis_script_values{key="lock_acquired",filename="..."} 42
-- (the `count=..,mean=..` summaries `lock_wait_ms` and `lock_hold_ms` are skipped: their
-- numbers are in the `_count`, `_sum` and `_le_*` fields). Read-only: run it with
-- `--lua-script-read-only` (EVAL_RO); the exporter's user needs `+eval_ro +info` (or `+eval`).
--
--   redis_exporter --redis.addr redis://HOST:6379 \
--     --script /path/to/redis-lock.lua --lua-script-read-only
local out = {}
for line in string.gmatch(redis.call('INFO', 'lock'), '[^\r\n]+') do
  local name, value = string.match(line, '^(lock_[%w_]+):(%-?%d+)$')
  if name then
    out[#out + 1] = name
    out[#out + 1] = value
  end
end
return out
