-- Take the items of one order out of stock, fenced by redis-lock tokens: every
-- item or none.
--
--   EVALSHA <sha> 2n <lock 1> <stock 1> ... <lock n> <stock n> <token 1> <quantity 1> ... <token n> <quantity n>
--
-- KEYS     pairs: the lock of an item (held by the writer, e.g. all of them
--          from one LOCK.MACQUIRE) and its stock, an integer string key
-- ARGV     pairs: the writer's fencing token for that lock, and how many items
--          to take (a positive integer)
--
-- Replies: the new stock of each item (an array, in order), or an error and
-- nothing changed:
--   STALE ...     a token is not the live hold on its lock (released, expired,
--                 or granted to someone else since): the writer lost that lock
--   NOSTOCK ...   an item has fewer than asked for; stock never goes below zero
--   ERR ...       malformed pairs, a bad quantity, a stock listed twice, a stock
--                 that is not an integer, or a bad token (LOCK.FENCE's error)
--
-- Every check runs before the first write, and the whole script runs as one
-- step, so no grant can slip in between: a writer that paused past its locks'
-- deadline cannot write any more, however late its request arrives. In a
-- cluster, give every key the same hash tag: {shop}:sku:42:lock, ...

local n = #KEYS / 2
if #KEYS == 0 or #KEYS % 2 ~= 0 or #ARGV ~= #KEYS then
    return redis.error_reply(
        'ERR expected lock/stock key pairs, and a token and a quantity for each')
end

local quantities, seen = {}, {}
for i = 1, n do
    local lock, stock_key, token = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1]
    local quantity = tonumber(ARGV[2 * i])
    if not quantity or quantity < 1 or quantity ~= math.floor(quantity) then
        return redis.error_reply(
            'ERR quantity must be a positive integer, got ' .. tostring(ARGV[2 * i]))
    end
    if seen[stock_key] then
        return redis.error_reply('ERR ' .. stock_key .. ' is listed twice')
    end
    seen[stock_key] = true
    -- The token is passed on as the string the client sent: no conversion to a
    -- Lua number (exact anyway while tokens stay below 2^53, until 2109).
    if redis.call('LOCK.FENCE', lock, token) ~= 1 then
        return redis.error_reply('STALE token ' .. token .. ' is not the live hold on ' .. lock)
    end
    local stock = tonumber(redis.call('GET', stock_key) or '0')
    if not stock then
        return redis.error_reply('ERR stock at ' .. stock_key .. ' is not an integer')
    end
    if stock < quantity then
        return redis.error_reply(
            'NOSTOCK ' .. stock_key .. ' has ' .. stock .. ', asked for ' .. quantity)
    end
    quantities[i] = quantity
end

local left = {}
for i = 1, n do
    left[i] = redis.call('DECRBY', KEYS[2 * i], quantities[i])
end
return left
