-- Take `quantity` items out of stock, fenced by a redis-lock token.
--
--   EVALSHA <sha> 2 <lock key> <stock key> <token> <quantity>
--
-- KEYS[1]  the lock the writer holds (LOCK.ACQUIRE returned ARGV[1])
-- KEYS[2]  the stock: an integer string key
-- ARGV[1]  the writer's fencing token
-- ARGV[2]  how many items to take: a positive integer
--
-- Replies: the new stock (integer), or an error and nothing changed:
--   STALE ...     the token is not the live hold on KEYS[1] (released, expired,
--                 or granted to someone else since): the writer lost its lock
--   NOSTOCK ...   fewer than ARGV[2] items left; the stock never goes below zero
--   ERR ...       bad quantity, a stock that is not an integer, or a bad token
--                 (LOCK.FENCE's own error)
--
-- The check and the write run in one script, so no grant can slip in between:
-- a writer that paused past its lock's deadline cannot write any more, however
-- late its request arrives. In a cluster, give both keys the same hash tag:
-- {sku:42}:lock and {sku:42}:stock.

local quantity = tonumber(ARGV[2])
if not quantity or quantity < 1 or quantity ~= math.floor(quantity) then
    return redis.error_reply(
        'ERR quantity must be a positive integer, got ' .. tostring(ARGV[2]))
end

-- The token stays a string: tokens are above 2^53, beyond what a Lua number
-- holds exactly.
if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) ~= 1 then
    return redis.error_reply('STALE token ' .. ARGV[1] .. ' is not the live hold on ' .. KEYS[1])
end

local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
if not stock then
    return redis.error_reply('ERR stock at ' .. KEYS[2] .. ' is not an integer')
end
if stock < quantity then
    return redis.error_reply('NOSTOCK ' .. KEYS[2] .. ' has ' .. stock .. ', asked for ' .. quantity)
end
return redis.call('DECRBY', KEYS[2], quantity)
