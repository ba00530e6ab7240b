"""The Lua half of the gateway: body gate, body stamping, floor pick, shadow mirror, stream-gap watchdog.

Kept as a Python string so the renderer ships it next to haproxy.cfg (one source, no second copy).
Runs on HAProxy 3.0 (Lua 5.4; written for 2.6, whose constraints still hold): actions cannot rewrite an HTTP
body, so the rewrite is a request *filter*; per-gap stream timeouts are a response filter with
`filter.wake_time`, because a native server timeout set when the response headers arrive (3.0's
`http-response set-timeout`) would also bound the prefill: vLLM sends its headers before the first token.
"""

GATEWAY_LUA = r'''
-- Member names decoded (so "max\u005ftokens" cannot slip past).
-- One left-to-right pass, as a JSON parser reads it: an escaped backslash is consumed before what follows it
-- can be read as an escape ("max\\u005ftokens" is the name max\u005ftokens to the engine, not max_tokens; two
-- passes, \u first, read it as max_tokens and let the body past the cap unstamped).
local KEY_ESC = { n = "\n", t = "\t", r = "\r", b = "\b", f = "\f" }
local function decode_key(s)
  return (s:gsub("\\(.)(%x?%x?%x?%x?)", function(c, hex)
    if c == "u" then  -- the parser has checked four hex digits follow
      local n = tonumber(hex, 16)
      if n < 128 then return string.char(n) end
      return "\0"  -- non-ASCII never spells a key we care about; keep it distinct
    end
    return (KEY_ESC[c] or c) .. hex
  end))
end

-- A validating JSON parser (RFC 8259 grammar, UTF-8 checked up front): the engine must never
-- receive a body the gateway only half understood ('{...} xyz', '{"stream":tru}', '{...}{...}').
-- Cost is per token, not per byte: Lua's pattern matcher costs tens of ns per byte it scans (a character
-- class is tried at every position: ~240 us for an 11 KB chat body), plain string.find is memchr. So
-- string contents are skipped with plain finds of '"' and '\'; raw control characters (never valid
-- anywhere in JSON except tab, newline and carriage return as whitespace between tokens) are refused by
-- plain finds over the whole body once, and tab/newline/CR by their next positions, kept per parse, which
-- must not fall inside a string.
local MAX_DEPTH = 512  -- deeper nesting is refused (Python's json, in the engine, stops near 1000)
local ESC = { [34] = 2, [92] = 2, [47] = 2, [98] = 2, [102] = 2, [110] = 2, [114] = 2, [116] = 2 }
local find, byte, sub = string.find, string.byte, string.sub
local BAD_CTL = {}  -- control characters other than tab, newline, carriage return
for c = 0, 31 do
  if c ~= 9 and c ~= 10 and c ~= 13 then BAD_CTL[#BAD_CTL + 1] = string.char(c) end
end
-- the same characters as one class: one scan costs less than 29 plain finds' calls up to a few hundred bytes
local BAD_CTL_CLASS = "[\0-\8\11\12\14-\31]"
local SMALL_BODY = 256
local WS_CTL = { "\t", "\n", "\r" }
local ws_next = { 0, 0, 0 }  -- per parse: next position of each WS_CTL character at or after the scan point
local bs_next = 0  -- per parse: next backslash at or after the scan point (a body without one is scanned once)

-- does [j, q) hold a tab, newline or carriage return? (inside a string: invalid)
local function ws_ctl_before(s, j, q)
  for c = 1, 3 do
    local p = ws_next[c]
    if p < j then
      p = find(s, WS_CTL[c], j, true) or math.huge
      ws_next[c] = p
    end
    if p < q then return true end
  end
  return false
end

local function read_string(s, i, want_raw)
  -- s:byte(i) == '"'; returns the index after the closing quote (and, with want_raw, the raw inner text:
  -- a copy, so only member names ask for it), or nil
  local j = i + 1
  local q = find(s, '"', j, true)
  while true do
    if not q then return nil end
    local b = bs_next
    if b < j then
      b = find(s, "\\", j, true) or math.huge
      bs_next = b
    end
    if b > q then
      if ws_ctl_before(s, j, q) then return nil end
      if want_raw then return q + 1, sub(s, i + 1, q - 1) end
      return q + 1
    end
    if ws_ctl_before(s, j, b) then return nil end
    local e = byte(s, b + 1)
    if e == 117 then
      if not find(s, "^%x%x%x%x", b + 2) then return nil end
      j = b + 6
    elseif ESC[e] then
      j = b + 2
    else
      return nil
    end
    if j > q then q = find(s, '"', j, true) end  -- the quote was escaped (or inside \u....)
  end
end

-- most bodies are compact or single-spaced: a byte test first, the pattern (compiled per call) only on a run
local function skip_ws(s, i)
  local c = byte(s, i)
  if c ~= 32 and c ~= 9 and c ~= 10 and c ~= 13 then return c and i or #s + 1 end
  return find(s, "[^ \t\n\r]", i + 1) or #s + 1
end

local function skip_number(s, i)
  local _, e = find(s, "^-?0", i)
  if not e then _, e = find(s, "^-?[1-9]%d*", i) end
  if not e then return nil end
  local _, f = find(s, "^%.%d+", e + 1)
  if f then e = f end
  _, f = find(s, "^[eE][+-]?%d+", e + 1)
  if f then e = f end
  return e + 1
end

local parse_value

-- the top-level members the gate reads; no other member costs a table or a decode
local GATE_KEYS = { max_tokens = true, max_completion_tokens = true, stream = true, cache_salt = true, model = true }

-- Object at byte(s, i) == '{'. With `keys`, records each member the gate reads (GATE_KEYS): name
-- (decoded) -> { raw = value text (short values only: numbers, literals, small strings), dup = seen before }.
local function parse_object(s, i, depth, keys)
  i = skip_ws(s, i + 1)
  local count = 0
  if byte(s, i) == 125 then return i + 1, count end
  while true do
    if byte(s, i) ~= 34 then return nil end
    local j, raw = read_string(s, i, keys)
    if not j then return nil end
    i = skip_ws(s, j)
    if byte(s, i) ~= 58 then return nil end
    i = skip_ws(s, i + 1)
    local vstart = i
    i = parse_value(s, i, depth)
    if not i then return nil end
    count = count + 1
    local name = keys and (find(raw, "\\", 1, true) and decode_key(raw) or raw)
    if name and GATE_KEYS[name] then
      keys[name] = { raw = (i - vstart <= 64 or name == "model") and sub(s, vstart, i - 1) or "", dup = keys[name] ~= nil,
                     pos = vstart, len = i - vstart }
    end
    i = skip_ws(s, i)
    local c = byte(s, i)
    if c == 125 then return i + 1, count end
    if c ~= 44 then return nil end
    i = skip_ws(s, i + 1)
  end
end

local function parse_array(s, i, depth)
  i = skip_ws(s, i + 1)
  if byte(s, i) == 93 then return i + 1 end
  while true do
    i = parse_value(s, i, depth)
    if not i then return nil end
    i = skip_ws(s, i)
    local c = byte(s, i)
    if c == 93 then return i + 1 end
    if c ~= 44 then return nil end
    i = skip_ws(s, i + 1)
  end
end

parse_value = function(s, i, depth)
  local c = byte(s, i)
  if c == 34 then return (read_string(s, i)) end
  if c == 123 or c == 91 then
    if depth >= MAX_DEPTH then return nil end
    if c == 123 then return (parse_object(s, i, depth + 1)) end
    return parse_array(s, i, depth + 1)
  end
  if c == 116 then return find(s, "^true", i) and i + 4 or nil end
  if c == 102 then return find(s, "^false", i) and i + 5 or nil end
  if c == 110 then return find(s, "^null", i) and i + 4 or nil end
  return skip_number(s, i)
end

-- The whole body must be one JSON object (and nothing after it). Returns its top-level members
-- (see parse_object) and their count, or nil and the error to answer with.
local function top_level_keys(body)
  local i = skip_ws(body, 1)
  if byte(body, i) ~= 123 then return nil, "the request body must be a JSON object" end
  if not utf8.len(body) then return nil, "the request body is not valid UTF-8" end
  if #body <= SMALL_BODY then
    if find(body, BAD_CTL_CLASS) then return nil, "the request body is not valid JSON" end
  else
    for c = 1, #BAD_CTL do
      if find(body, BAD_CTL[c], 1, true) then return nil, "the request body is not valid JSON" end
    end
  end
  ws_next[1], ws_next[2], ws_next[3] = 0, 0, 0
  bs_next = 0
  local keys = {}
  local j, count = parse_object(body, i, 1, keys)
  if not j then return nil, "the request body is not valid JSON" end
  if skip_ws(body, j) <= #body then return nil, "the request body has data after its JSON object" end
  return keys, nil, i, count
end

local LIMIT_FIELDS = { "max_tokens", "max_completion_tokens" }
local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

-- '"cache_salt":"<the tenant's salt>"' from the salt's environment variable, built once per variable (the
-- environment does not change under a process)
local salt_members = {}
local function salt_member(env)
  local m = salt_members[env]
  if not m then
    m = '"cache_salt":' .. json_string(os.getenv(env) or "")
    salt_members[env] = m
  end
  return m
end

-- Idempotency keys in flight, per tenant: key -> expiry (ms). A request whose key is in flight
-- is refused (409) instead of starting a second generation; the llm filter releases the key when
-- its stream ends (end_analyze runs on every path, aborts included). The expiry (the gate's ttl) covers every
-- wait up to the response (queue, connection attempts, the server's first byte; idempotency_claim_ttl_ms in
-- gateway_config.py), and a stream's claim is renewed while the stream is alive (claim_renew, from the filter's
-- watch), so the expiry is only the backstop for a claim whose stream is gone without its release. At most `cap`
-- keys per tenant (the gateway's max_connections; HTTP/2 carries many requests per connection, so more can be in
-- flight: a claim past the cap is refused with 429), so memory stays bounded.
-- HAProxy's own retry (connection refused) happens inside the same stream, so it keeps the key.
-- Each claim has its own number, and a release or a renewal touches the key only while that claim holds it: a
-- request that outlives its expiry (a non-streamed response whose body trickles in past it) must not free, or
-- take back, the claim its client's retry took after the expiry, which would let a third copy start beside the retry.
-- HAProxy pauses an http-request action every tune.lua.forced-yield instructions (hlua_hook, 3.0.11) wherever it
-- is, and other requests' actions run meanwhile: a claim paused between its check and its write lets a second
-- request take the same key (both go upstream, and the count stays one too high for good), and one paused in the
-- sweep's pairs walk while others add and drop keys makes `next` raise. So claims and releases run in a coroutine
-- of their own (unpaused below), which HAProxy never pauses.
local idem = {}
local idem_serial = 0
local MAX_IDEM_KEY = 255
local function idem_drop(tb, key)  -- keys (expiry) and claim (its number) are kept in step
  tb.keys[key] = nil; tb.claim[key] = nil; tb.n = tb.n - 1
end
-- Runs f(...) to its end with no other request's Lua in between. A coroutine.wrap thread carries no HAProxy
-- context (Lua 5.4's lua_newthread copies the main state's extra space, where HAProxy keeps none), so hlua_hook
-- returns at once there (hlua.c 3.0.11, hlua_hook: no hlua, no yield): unlike HAProxy's own coroutine.create,
-- which it replaces and does pause. So f must not call anything of HAProxy's that yields (the idempotency
-- functions call nothing of HAProxy's but txn:set_var; the floor pick only sample fetches, which never yield), and
-- HAProxy's Lua timeouts are not checked there either, so f must be bounded: a sweep walks at most `cap` keys and
-- only once one may have expired (min_exp), the pick hashes at most KEY_HASH_BYTES and takes slots * slots steps.
-- An error in f propagates to the caller.
local function unpaused(f, ...)
  return coroutine.wrap(f)(...)
end
local function take_claim(txn, tenant, key, cap, ttl_ms, t)
  local tb = idem[tenant]
  -- min_exp: a lower bound of every key's expiry (renewals only move expiries later), so a tenant at its cap
  -- whose keys cannot have expired yet is refused without walking them
  if not tb then tb = { n = 0, keys = {}, claim = {}, min_exp = math.huge } idem[tenant] = tb end
  local exp = tb.keys[key]
  if exp and exp > t then return "busy" end
  if exp then idem_drop(tb, key) end
  if tb.n >= cap then
    if t < tb.min_exp then return "full" end
    local least = math.huge
    for k, e in pairs(tb.keys) do
      if e <= t then
        idem_drop(tb, k)  -- clearing a field during pairs is allowed: nothing runs in between
      elseif e < least then
        least = e
      end
    end
    tb.min_exp = least
    if tb.n >= cap then return "full" end
  end
  idem_serial = idem_serial + 1
  tb.keys[key] = t + ttl_ms
  tb.claim[key] = idem_serial
  tb.n = tb.n + 1
  if t + ttl_ms < tb.min_exp then tb.min_exp = t + ttl_ms end
  -- the request's mark of its claim, in the same unpaused step: set after it, a Lua timeout raised at the next
  -- pause point would leave the key claimed with nothing to release it (409 to every retry until it expires)
  txn:set_var("txn.idem", tenant .. "\n" .. idem_serial .. "\n" .. key)
  return nil
end
-- Claims `key` for the request (txn.idem set), or returns why not ("busy", "full")
local function idem_claim(txn, tenant, key, cap, ttl_ms, t)
  return unpaused(take_claim, txn, tenant, key, cap, ttl_ms, t)
end
local function idem_parse(claim)  -- txn.idem, "tenant\nnumber\nkey" -> the tenant's table, key, number
  local tenant, serial, key = claim:match("^([^\n]*)\n(%d+)\n(.*)$")
  return tenant and idem[tenant], key, tonumber(serial)
end
local function drop_claim(claim)
  local tb, key, serial = idem_parse(claim)
  if tb and tb.keys[key] and tb.claim[key] == serial then idem_drop(tb, key) end
end
local function idem_release(claim)
  return unpaused(drop_claim, claim)
end
-- http-request lua.llm_idem_release: frees the claim of a request that a later rule answers itself (it never
-- reaches the llm filter's end_analyze); unsets txn.idem so nothing releases it twice
core.register_action("llm_idem_release", { "http-req" }, function(txn)
  local claim = txn:get_var("txn.idem")
  if claim then
    idem_release(claim)
    txn:unset_var("txn.idem")
  end
end)

-- Floor replica choice: rendezvous (highest-random-weight) hashing of the session key over the
-- floor's server slots, taking the first replica in the key's order whose in-flight (served +
-- queued) is below the threshold. A session therefore stays on its replica (warm prefix cache)
-- until that replica is full; only then does it move, and when every replica is full the fetch
-- returns "" and the frontend routes to burst. Without a key: the least-loaded replica.
-- lua.llm_pick_floor(<backend>,<server prefix>,<slots>,<threshold>,<key header>)
-- Cost: one hash of the key, then per candidate three native fetches; usually the first has room.
local function mix32(h)
  h = h ~ (h >> 16); h = (h * 0x85ebca6b) & 0xffffffff
  h = h ~ (h >> 13); h = (h * 0xc2b2ae35) & 0xffffffff
  return h ~ (h >> 16)
end
-- FNV-1a over the key's first KEY_HASH_BYTES bytes: the pick runs unpaused (with no Lua timeout), so its work must
-- not grow with a client's header (a 200 KB X-Session-Id hashed in full took 35 ms of the one thread); session ids
-- are far shorter
local KEY_HASH_BYTES = 256
local function key_hash(key)
  local h = 0x811c9dc5
  for k = 1, math.min(#key, KEY_HASH_BYTES) do h = ((h ~ key:byte(k)) * 0x01000193) & 0xffffffff end
  return h
end
-- In-flight (served + queued) of slot i, nil when it is not up. Each fetch gets a freshly built
-- "backend/server" string: HAProxy writes a NUL over the '/' of the string it parses (hlua_lua2arg_check, 2.6 to
-- 3.0.11 at least), so one cannot be reused. Lua keeps one copy of each short string, so a request paused between
-- building the string and its fetch may find it cut by another request's fetch ("server doesn't exist"): from an
-- action (the gate) the pick runs unpaused; a sample fetch is never paused.
-- srv_is_up reaches Lua as the integer 0 or 1 (hlua_smp2lua pushes SMP_T_BOOL as an integer), and 0
-- is true in Lua: compare with 1, or a replica marked down by its health check would still be picked.
local function load_of(f, sep, i)
  if f:srv_is_up(sep .. i) ~= 1 then return nil end
  return (f:srv_conn(sep .. i) or 0) + (f:srv_queue(sep .. i) or 0)
end
local function pick_floor(f, backend, prefix, slots, threshold, header)
  local sep = backend .. "/" .. prefix
  local key = f:req_fhdr(header)
  if key and key ~= "" then
    local h = key_hash(key)
    local scores = {}
    for i = 1, slots do scores[i] = mix32(h ~ ((i * 0x9e3779b1) & 0xffffffff)) end
    for _ = 1, slots do  -- slots in the key's order, highest score first
      local best, bi = -1, 1
      for i = 1, slots do
        if scores[i] > best then best, bi = scores[i], i end
      end
      scores[bi] = -1
      local load = load_of(f, sep, bi)
      if load and load < threshold then return prefix .. bi end
    end
    return ""  -- a nil return would still set the variable; "" means "no replica has room"
  end
  local best, best_load = nil, threshold
  for i = 1, slots do
    local load = load_of(f, sep, i)
    if load and load < best_load then best, best_load = i, load end
  end
  return best and (prefix .. best) or ""
end
core.register_fetches("llm_pick_floor", function(txn, backend, prefix, slots_arg, threshold_arg, header)
  return pick_floor(txn.f, backend, prefix, tonumber(slots_arg), tonumber(threshold_arg), header)
end)

-- http-request lua.llm_gate <max_tokens> <salt env var or "-"> <endpoint/tenant: its Idempotency-Key table>
--   <idempotency cap> <ttl ms>
--   <non-streamed burst max_tokens, 0 = none> <floor backend> <server prefix> <slots> <threshold> <key header>
--   <the other tenants' adapter prefixes, comma-separated, or "-">
--   <the served model's name where vLLM's filesystem resolver serves LoRA adapters by name, or "-">
-- (the floor pick's arguments, "-" without a floor: an accepted request's pick is made here, saving the
-- llm_pick_floor call; HAProxy builds a transaction object per Lua call)
-- Validates the buffered body and prepares the prefix the llm filter inserts. With a non-streamed
-- cap it also prepares a second stamp for a non-streamed request that ends up on burst (Modal's web
-- request cap): max_tokens lowered to the cap, by replacing the value in place (txn.gate_*_b); the
-- burst backend marks such a request and the filter then applies that stamp instead.
local function gate(txn, max_tokens_arg, salt_env, tenant, cap, ttl, ns_cap_arg,
                    pick_be, pick_prefix, pick_slots, pick_threshold, pick_header, others, served)
  local body = txn.f:req_body() or ""
  local keys, err, _, count = top_level_keys(body)
  if not keys then txn:set_var("txn.gate_error", err) return end
  -- several tenants on one engine with LoRA: an adapter named <tenant>-… is that tenant's alone. vLLM's filesystem
  -- resolver loads any adapter a request names (the engine serves every tenant's) and the cache_salt keeps caches
  -- apart, not adapters: a name with another tenant's prefix is refused (`others`: their prefixes, comma-separated).
  -- And the resolver takes the name as a path under its folder (os.path.join(lora_cache_dir, lora_name), vLLM
  -- 0.10-0.13 filesystem_resolver.py, unchecked): "./globex-x", "acme-x/../globex-x" or an absolute path reach
  -- another tenant's adapter, or any adapter of the base on the engine's disk. An adapter is a folder's name:
  -- a name other than the served model's with a slash or backslash, or "." or "..", is refused
  local adapters = others and others ~= "-"
  local resolver = served and served ~= "-"
  if adapters or resolver then
    local m = keys["model"]
    if m and m.raw ~= "null" then
      if m.dup then txn:set_var("txn.gate_error", "model must appear once") return end
      local name = byte(m.raw, 1) == 34 and sub(m.raw, 2, -2) or ""
      if find(name, "\\", 1, true) then name = decode_key(name) end
      if resolver and name ~= served and (find(name, "/", 1, true) or find(name, "\\", 1, true)
                                          or name == "." or name == "..") then
        txn:set_var("txn.gate_error", "model names an adapter by a path; name the adapter itself")
        return
      end
      if adapters then
        for prefix in string.gmatch(others, "[^,]+") do
          if sub(name, 1, #prefix) == prefix then
            txn:set_var("txn.gate_error", "model is not one this API key may use")
            return
          end
        end
      end
    end
  end
  local max_tokens = tonumber(max_tokens_arg)
  local stamp_salt = salt_env ~= "-"
  if stamp_salt and keys["cache_salt"] then
    txn:set_var("txn.gate_error", "cache_salt is set by the gateway; remove it from the request")
    return
  end
  local has_limit = false
  for _, field in ipairs(LIMIT_FIELDS) do
    local k = keys[field]
    if k then
      local v = tonumber(k.raw)
      if k.raw ~= "null" then
        if not v or k.dup then
          txn:set_var("txn.gate_error", field .. " must be a single number")
          return
        end
        if v > max_tokens then
          txn:set_var("txn.gate_error", field .. " exceeds this endpoint's limit of " .. max_tokens_arg)
          return
        end
        has_limit = true
      end
    end
  end
  -- the engine's request model (pydantic, not strict) takes 1, "true" or "on" for true and streams; the gateway
  -- would treat such a request as not streamed (no gap limits or heartbeats, its Idempotency-Key never renewed)
  local s = keys["stream"]
  local streamed = s and s.raw == "true"
  if s and not streamed and s.raw ~= "false" and s.raw ~= "null" then
    txn:set_var("txn.gate_error", "stream must be true or false")
    return
  end
  -- refused before the Idempotency-Key claim below: a request refused after it would keep its key claimed (the 400
  -- answer frees nothing) and the client's corrected retry would get 409 until the claim expired
  local completion = txn.f:path() == "/v1/completions"
  local mt = keys["max_tokens"]
  if completion and mt and mt.dup then
    txn:set_var("txn.gate_error", "max_tokens must be a single number")
    return
  end
  local idem_key = txn.f:req_fhdr("idempotency-key")
  if idem_key and idem_key ~= "" then
    if #idem_key > MAX_IDEM_KEY then
      txn:set_var("txn.gate_error", "Idempotency-Key is longer than " .. MAX_IDEM_KEY .. " characters")
      return
    end
    local t = core.now()
    local refused = idem_claim(txn, tenant, idem_key, tonumber(cap), tonumber(ttl), t.sec * 1000 + t.usec // 1000)
    if refused then txn:set_var("txn.idem_refused", refused) return end
  end
  txn:set_var("txn.stream", streamed and 1 or 0)
  local salt_part
  if stamp_salt then salt_part = salt_member(salt_env) end
  local prefix = salt_part
  -- Without a limit of the client's: a chat request gets the endpoint's cap from the engine itself
  -- (--override-generation-config max_new_tokens: vLLM's get_max_tokens takes min(cap, max_model_len − prompt)),
  -- so nothing is stamped — a stamped cap made vLLM refuse every prompt longer than max_model_len − cap with a 400
  -- about a max_tokens the client never sent (_validate_input: prompt + max_tokens > max_model_len; vLLM 0.11.0
  -- serving_engine.py). A completion reads max_tokens alone (vLLM's request model has no max_completion_tokens),
  -- defaults it to 16 and asserts it is not null, so there the cap is stamped when absent and written over a null
  -- in place (a stamped second key would lose to it: the engine's parser keeps the last); vLLM's own check then
  -- refuses a prompt past max_model_len − cap, as it would the client's own max_tokens.
  local grow = 0
  if not has_limit or (completion and not (mt and mt.raw ~= "null")) then
    txn:set_var("txn.gate_max", max_tokens_arg)  -- for the quality record: the limit that applies
    if completion and mt then
      txn:set_var("txn.gate_edits", mt.pos .. ":" .. mt.len)
      txn:set_var("txn.gate_cap", max_tokens_arg)
      grow = #max_tokens_arg - mt.len
    elseif completion then
      prefix = (prefix and prefix .. "," or "") .. '"max_tokens":' .. max_tokens_arg
    end
  end
  if prefix and count > 0 then prefix = prefix .. "," end
  if prefix then txn:set_var("txn.gate_prefix", prefix) end
  if prefix or grow ~= 0 then txn:set_var("txn.gate_len", #body + #(prefix or "") + grow) end
  if pick_be ~= "-" then
    txn:set_var("txn.floor_server", unpaused(pick_floor, txn.f, pick_be, pick_prefix, tonumber(pick_slots),
                                                        tonumber(pick_threshold), pick_header))
  end
  local ns_cap = tonumber(ns_cap_arg) or 0
  if ns_cap <= 0 or streamed then return end
  -- the burst stamp: every limit above the cap (or null) rewritten to it, or the cap stamped when absent
  local edits, grow, limited = {}, 0, false
  local cap_text = tostring(ns_cap)
  for _, field in ipairs(LIMIT_FIELDS) do
    local k = keys[field]
    if k then
      -- a completion's limit is its max_tokens alone (above)
      if k.raw ~= "null" and (field == "max_tokens" or not completion) then limited = true end
      if k.raw == "null" or tonumber(k.raw) > ns_cap then
        edits[#edits + 1] = k.pos .. ":" .. k.len
        grow = grow + #cap_text - k.len
      end
    end
  end
  local prefix_b = salt_part
  if not limited then prefix_b = (prefix_b and prefix_b .. "," or "") .. '"max_tokens":' .. cap_text end
  if prefix_b and count > 0 then prefix_b = prefix_b .. "," end
  txn:set_var("txn.gate_prefix_b", prefix_b or "")
  txn:set_var("txn.gate_edits_b", table.concat(edits, ","))
  txn:set_var("txn.gate_cap_b", cap_text)
  txn:set_var("txn.gate_len_b", #body + #(prefix_b or "") + grow)
  if #edits > 0 or not limited then txn:set_var("txn.gate_max_b", cap_text) end
end
-- txn.gated marks a request the gate has finished with (accepted, or refused through txn.gate_error or
-- txn.idem_refused). After an action's runtime error HAProxy logs it and goes on with the next rules (hlua_action,
-- 3.0.11), which would send the request upstream unchecked and unstamped: the rule after the gate answers 500
-- to a POST without the mark.
core.register_action("llm_gate", { "http-req" }, function(txn, ...)
  gate(txn, ...)
  txn:set_var("txn.gated", 1)
end, 13)

local function now_ms()
  local t = core.now()
  return t.sec * 1000 + t.usec // 1000
end

-- Quality sampling (issue #16 item 6): a share of production exchanges per model version, recorded for
-- offline evaluation. The gateway is a tap, not a hop: the user's bytes take the same path as any other
-- request; for a sampled one the llm filter also keeps a bounded copy of the response as it is forwarded,
-- and when the exchange has ended a Lua task posts the copy (original request body + response bytes, with
-- the version, route, tenant and timestamps as headers; never the API key or the stamped cache_salt) to
-- the loopback quality frontend, which forwards it to the quality recorder. Nothing the user receives
-- waits for that post. Every limit drops a record and counts it (llm_gateway_quality_dropped_total):
-- captures in progress per endpoint, record posts in flight, the recorder's answer.
--
-- http-request lua.llm_quality <endpoint> <served version> <candidate version or -> <dst>
--   <capture bytes> <captures cap> <posts cap> <post timeout ms>
-- served: the version the stable track (floor, burst) serves; candidate: the canary's or shadow's version.
-- The per-request draws are native (`rand` in the config sets txn.q_user / txn.q_mirror), so this action
-- runs only for the sampled share: a Lua action costs a transaction object per call (hlua_txn_new, 2.6 and 3.0).
local quality_cfg = {}
local quality_posts = 0
local quality_counts = { sampled = {}, dropped = {} }  -- "endpoint\tversion" / "endpoint\treason" -> count
local function quality_count(kind, ep, label)
  local k = ep .. "\t" .. label
  quality_counts[kind][k] = (quality_counts[kind][k] or 0) + 1
end
core.register_action("llm_quality", { "http-req" }, function(txn, ep, served, candidate, dst, cap_bytes,
                                                             max_captures, max_posts, timeout_ms)
  local c = quality_cfg[ep]
  if not c then
    c = { served = served, candidate = candidate, dst = dst, cap = tonumber(cap_bytes), captures = 0,
          max_captures = tonumber(max_captures), max_posts = tonumber(max_posts), timeout = tonumber(timeout_ms) }
    quality_cfg[ep] = c
  end
  txn:set_var("txn.q_ep", ep)
  txn:set_var("txn.q_body", txn.f:req_body() or "")  -- as the client sent it: without the stamped cache_salt
  txn:set_var("txn.q_t0", now_ms())
  -- the client's id, else the gateway's (the %ID its log line carries: request_ids in gateway_config.py)
  local rid = txn.f:req_fhdr("x-request-id") or txn.f:unique_id() or ""
  txn:set_var("txn.q_rid", #rid > 128 and rid:sub(1, 128) or rid)
  txn:set_var("txn.q_path", txn.f:path() or "/")
end, 8)

local function quality_post(c, ep, version, route, txn_meta, status, body_req, body_resp, truncated, ended,
                             client_left)
  if quality_posts >= c.max_posts then quality_count("dropped", ep, "posts_full") return end
  local hdrs = {
    ["content-type"] = { "application/octet-stream" },
    ["x-quality-endpoint"] = { ep }, ["x-quality-version"] = { version }, ["x-quality-route"] = { route },
    ["x-quality-tenant"] = { txn_meta.tenant }, ["x-quality-request-id"] = { txn_meta.rid },
    ["x-quality-path"] = { txn_meta.path }, ["x-quality-status"] = { tostring(status) },
    ["x-quality-started-ms"] = { tostring(txn_meta.t0) }, ["x-quality-ended-ms"] = { tostring(ended) },
    ["x-quality-request-bytes"] = { tostring(#body_req) }, ["x-quality-truncated"] = { truncated and "1" or "0" },
    ["x-quality-gateway-max-tokens"] = { txn_meta.max_tokens },
    ["x-quality-client-left"] = { client_left and "1" or "0" },
  }
  quality_posts = quality_posts + 1
  core.register_task(function()
    local ok, r = pcall(function()
      return core.httpclient():post{ url = "http://quality/v1/records", dst = c.dst,
                                     body = body_req .. body_resp, headers = hdrs, timeout = c.timeout }
    end)
    quality_posts = quality_posts - 1
    if ok and r and r.status == 202 then quality_count("sampled", ep, version)
    else quality_count("dropped", ep, "post_failed") end
  end)
end

-- read from variables the action set: by the response's end the request's headers are gone
-- max_tokens: the limit the gateway set in what the engine got (the burst cap on a non-streamed request that
-- went to burst, else the endpoint's cap when the client gave none), "" when the client's own applied
local function quality_meta(txn)
  local capped = txn:get_var("txn.ns_capped") and txn:get_var("txn.gate_max_b")
  return { tenant = txn:get_var("txn.tenant") or "", rid = txn:get_var("txn.q_rid") or "",
           path = txn:get_var("txn.q_path") or "/", t0 = txn:get_var("txn.q_t0") or 0,
           max_tokens = tostring(capped or txn:get_var("txn.gate_max") or "") }
end

-- shadow: what the mirror task needs to record the candidate's answer (nil when the mirror is not sampled)
local function quality_mirror_sample(txn)
  if not txn:get_var("txn.q_mirror") then return nil end
  local ep = txn:get_var("txn.q_ep")
  local c = ep and quality_cfg[ep]
  if not c then return nil end
  return { c = c, ep = ep, meta = quality_meta(txn), body = txn:get_var("txn.q_body") or "" }
end

-- the user's exchange: a capture starts with the response headers and is posted when the exchange ends
local function quality_begin(txn, msg)
  local ep = txn:get_var("txn.q_ep")
  local c = ep and quality_cfg[ep]
  if not c then return nil end
  if c.captures >= c.max_captures then quality_count("dropped", ep, "captures_full") return nil end
  c.captures = c.captures + 1
  local st = msg:get_stline()
  return { c = c, ep = ep, parts = {}, size = 0, truncated = false, status = tonumber(st and st.code) or 0 }
end

local function quality_capture(q, msg, n)
  if n <= 0 or q.truncated then return end
  local take = n
  if q.size + take > q.c.cap then take, q.truncated = q.c.cap - q.size, true end
  if take > 0 then
    q.parts[#q.parts + 1] = msg:body(0, take)
    q.size = q.size + take
  end
end

local function quality_finish(q, txn, client_left)
  local c = q.c
  c.captures = c.captures - 1
  local route = txn:get_var("txn.route")
  local version = (route == "canary" and c.candidate ~= "-" and c.candidate)
    or ((route == "floor" or route == "burst") and c.served) or nil
  if not version then quality_count("dropped", q.ep, "no_model_route") return end
  quality_post(c, q.ep, version, route, quality_meta(txn), q.status, txn:get_var("txn.q_body") or "",
               table.concat(q.parts), q.truncated, now_ms(), client_left)
end

local function quality_record_mirror(sample, r)
  local c = sample.c
  if not r then quality_count("dropped", sample.ep, "mirror_failed") return end
  local resp = r.body or ""
  local truncated = #resp > c.cap
  if truncated then resp = resp:sub(1, c.cap) end
  quality_post(c, sample.ep, c.candidate, "shadow", sample.meta, r.status or 0, sample.body, resp, truncated, now_ms())
end

-- Prometheus text for the stats frontend (/metrics/quality): what the gateway sampled and dropped.
core.register_service("llm_quality_metrics", "http", function(applet)
  local out = {
    "# HELP llm_gateway_quality_sampled_total Exchanges handed to the quality recorder, per endpoint and model version.",
    "# TYPE llm_gateway_quality_sampled_total counter",
  }
  for k, v in pairs(quality_counts.sampled) do
    local ep, version = k:match("^(.-)\t(.*)$")
    out[#out + 1] = string.format('llm_gateway_quality_sampled_total{endpoint="%s",version="%s"} %d', ep, version, v)
  end
  out[#out + 1] = "# HELP llm_gateway_quality_dropped_total Sampled exchanges the gateway dropped, per endpoint and reason."
  out[#out + 1] = "# TYPE llm_gateway_quality_dropped_total counter"
  for k, v in pairs(quality_counts.dropped) do
    local ep, reason = k:match("^(.-)\t(.*)$")
    out[#out + 1] = string.format('llm_gateway_quality_dropped_total{endpoint="%s",reason="%s"} %d', ep, reason, v)
  end
  local text = table.concat(out, "\n") .. "\n"
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", tostring(#text))
  applet:start_response()
  applet:send(text)
end)

-- Shadow: http-request lua.llm_shadow <endpoint> <dst> <cap> <timeout ms>
-- Chosen per request natively (`rand` in the config: the action runs only for the mirrored share).
-- The action copies the request as the incumbent will receive it (stamped body, the gateway's
-- headers) and starts a Lua task that posts it to the loopback shadow frontend with HAProxy's own
-- HTTP client; the answer is read and dropped. The action returns at once: the user's request never waits for the mirror and its response never
-- passes through it. At most <cap> mirrors per endpoint in flight (this thread's Lua state; the
-- gateway runs one thread); above that a mirror is skipped, never queued.
local shadow_inflight = {}
local SHADOW_SKIP = { ["content-length"] = true, ["host"] = true, ["connection"] = true,
  ["transfer-encoding"] = true, ["expect"] = true, ["idempotency-key"] = true }
core.register_action("llm_shadow", { "http-req" }, function(txn, name, dst, cap, timeout_ms)
  local n = shadow_inflight[name] or 0
  if n >= tonumber(cap) then return end
  local body = txn.f:req_body() or ""
  local prefix = txn:get_var("txn.gate_prefix")
  local edit, cap = txn:get_var("txn.gate_edits"), txn:get_var("txn.gate_cap")
  if edit then  -- a completion's null max_tokens, rewritten to the cap as the user's request is (one span)
    local p, l = edit:match("(%d+):(%d+)")
    p, l = tonumber(p), tonumber(l)
    body = body:sub(1, p - 1) .. cap .. body:sub(p + l)
  end
  if prefix then
    local pos = body:find("{", 1, true)
    if pos then body = body:sub(1, pos) .. prefix .. body:sub(pos + 1) end
  end
  local hdrs = {}
  for k, v in pairs(txn.http:req_get_headers()) do
    if not SHADOW_SKIP[k] then
      local t = {}
      for i = 0, #v do t[#t + 1] = v[i] end
      hdrs[k] = t
    end
  end
  hdrs["x-gateway-shadow"] = { txn:get_var("txn.stream") == 1 and "stream" or "1" }
  -- no Content-Length: 3.0's Lua client streams the body chunked and drops it (hlua_httpclient_send); the
  -- engines' servers (uvicorn) and the recorder (aiohttp) read chunked bodies
  local url = "http://shadow" .. (txn.f:path() or "/")
  local timeout = tonumber(timeout_ms)
  local sample = quality_mirror_sample(txn)  -- nil unless this mirror was chosen for the evaluation sink
  shadow_inflight[name] = n + 1
  core.register_task(function()
    local ok, r = pcall(function()
      return core.httpclient():post{ url = url, dst = dst, body = body, headers = hdrs, timeout = timeout }
    end)
    shadow_inflight[name] = shadow_inflight[name] - 1
    if sample then quality_record_mirror(sample, ok and r or nil) end
  end)
end, 4)


-- One filter per stream, both directions (fewer Lua calls per request than two filters).
-- Request: inserts txn.gate_prefix right after the body's opening brace.
-- Response: per-gap limits on a streamed response. Until the first body byte the limit is
-- first_byte_ms from the request (covers queueing, prefill, a burst cold start); afterwards
-- inter_chunk_ms between chunks. On expiry it ends the stream with an SSE error event; HAProxy then
-- drops the unfinished upstream connection, which aborts the generation.
-- Cost: every callback builds a fresh transaction object (hlua_filter_callback, 2.6 and 3.0: fetch, converter, channel and
-- message tables), so the filter has no start_analyze and registers as a data filter (payload callbacks)
-- from http_headers, only on the side that needs one: the request only when there is something to stamp,
-- the response only when it streams or is sampled for quality. HAProxy skips a callback whose name does not
-- resolve to a function on the filter's instance (hlua_filter_callback checks before it builds anything),
-- so the request's http_headers shadows what this stream will not need with `false`: end_analyze unless an
-- Idempotency-Key was claimed (its release) or the exchange is sampled (quality_begin turns it back on), and
-- the response's http_headers when the response is neither streamed nor sampled. Every path that skips the
-- request's http_headers (a request the rules answer themselves) keeps both. A non-streamed request without a
-- stamp, key or sample costs one callback.
local Llm = { id = "llm", flags = filter.FLT_CFG_FL_HTX }
Llm.__index = Llm
local NEVER_MS = math.huge
Llm.renew_at = NEVER_MS  -- no Idempotency-Key claim to renew; http_headers sets it on a stream that has one
-- HAProxy calls new() on the per-declaration copy that holds the filter's arguments: inherit from it
function Llm:new()
  return setmetatable({ started = now_ms(), last = nil, active = false, ended = false, req_done = false, wake_at = 0 },
    { __index = self })
end
-- Whether the client has left: its leaving closes the request side's input, which an upstream cut leaves open
-- (watch_gaps says where this was measured)
local function client_gone(txn)
  local ok, open = pcall(function() return txn.req:may_recv() end)
  return ok and not open
end
function Llm:end_analyze(txn, chn)
  if chn:is_resp() then
    local claim = txn:get_var("txn.idem")
    if claim then idem_release(claim) end
    if self.q then
      local q = self.q
      self.q = nil
      -- a user who left a stream that ends by closing, or with more than the gap watch's 64 KB buffered, is not
      -- seen there: the request side's input is closed by now all the same
      quality_finish(q, txn, self.client_left or client_gone(txn))
    end
  end
  return filter.CONTINUE
end
-- Renews this stream's Idempotency-Key claim: its expiry again a claim's ttl ahead, the next renewal a third of it
-- later. The watch runs at least every heartbeat or gap limit (its wake-up 1 ms past it, plus scheduling), and the
-- ttl is at least twice the longer limit, so the next renewal comes by 1/3 + 1/2 of the ttl, a sixth of it (a third
-- of a gap limit) before the expiry; at half the ttl it could land just past it. So the claim lasts as long as the
-- stream; a stream that is gone stops renewing it. Only while this request's own claim holds the key: one that
-- lost it (expired and taken by a retry) never takes it back.
local function claim_renew(self, t)
  local tb, key = self.claim_tb, self.claim_key
  if tb.claim[key] == self.claim_serial then
    tb.keys[key] = t + self.args_claim
    self.renew_at = t + self.args_claim // 3
  else
    self.renew_at = NEVER_MS
  end
end
function Llm:http_headers(txn, msg)
  if not msg:is_resp() then
    -- after every http-request rule (wait-for-body among them): the first-byte clock starts here, so a client's
    -- slow upload is not counted against the engine (a stream whose body took longer than the first-byte limit
    -- was ended, and its generation aborted, before the engine could answer); the queue's wait still counts
    self.started = now_ms()
    -- llm_gate has decided the stamp (burst's ns cap included)
    if txn:get_var("txn.gate_prefix") or txn:get_var("txn.gate_edits") or txn:get_var("txn.ns_capped") then
      filter.register_data_filter(self, txn.req)
    else
      self.req_done = true
    end
    local claim = txn:get_var("txn.idem")
    if claim then self.claim = claim else self.end_analyze = false end
    self.active = txn:get_var("txn.stream") == 1
    self.sampled = txn:get_var("txn.q_user") ~= nil
    if not self.active and not self.sampled then self.http_headers = false end
    return filter.CONTINUE
  end
  self.req_done = true
  if self.sampled then
    self.q = quality_begin(txn, msg)
    if self.q then self.end_analyze = nil end  -- the class's: quality_finish posts the record
  end
  if self.active or self.q then filter.register_data_filter(self, txn.res) end
  if self.active then
    -- engines send headers before the first token: the first-byte clock keeps running, and a
    -- wake-up is needed because no payload callback comes while the upstream stays silent
    local t = now_ms()
    if self.claim then
      self.claim_tb, self.claim_key, self.claim_serial = idem_parse(self.claim)
      if self.claim_tb then claim_renew(self, t) end
    end
    local wake = math.max(self.started + self.args_first - t, 0)
    local beat = self.started + self.args_beat - t
    if beat < wake then wake = beat end
    filter.wake_time(math.max(wake, 0) + 1)
    -- not recorded in wake_at: when this callback returns, HAProxy ends the headers analyser and clears the
    -- channel's analyse_exp with it (handle_analyzer_result, 3.0.11), so the payload callback that follows
    -- at once must set it again
  end
  return filter.CONTINUE
end
local function stamp(txn, msg, n)
  local prefix, edits, cap = txn:get_var("txn.gate_prefix"), txn:get_var("txn.gate_edits"), txn:get_var("txn.gate_cap")
  if txn:get_var("txn.ns_capped") then  -- a non-streamed request on burst: the capped stamp
    prefix, edits = txn:get_var("txn.gate_prefix_b"), txn:get_var("txn.gate_edits_b")
    cap = txn:get_var("txn.gate_cap_b")
    if prefix == "" then prefix = nil end
    if edits == "" then edits = nil end
  end
  if not prefix and not edits then return n, true end
  if n == 0 then return n, false end
  local pos
  if prefix then
    pos = msg:body(0, n):find("{", 1, true)
    if not pos then return n, false end -- brace not buffered yet; wait-for-body makes this unreachable
  end
  if edits then
    -- values replaced from the last to the first, so the earlier offsets stay valid
    local spans = {}
    for p, l in edits:gmatch("(%d+):(%d+)") do spans[#spans + 1] = { tonumber(p), tonumber(l) } end
    table.sort(spans, function(a, b) return a[1] > b[1] end)
    for _, sp in ipairs(spans) do
      msg:set(cap, sp[1] - 1, sp[2])
      n = n + #cap - sp[2]
    end
  end
  if prefix then
    msg:insert(prefix, pos)
    n = n + #prefix
  end
  return n, true
end
local watch_gaps
function Llm:http_payload(txn, msg)
  local n = msg:input()
  if not self.req_done then
    local done
    n, done = stamp(txn, msg, n)
    self.req_done = done
    if done then filter.unregister_data_filter(self, txn.req) end
    return n
  end
  if self.active and not self.ended then n = watch_gaps(self, txn, msg, n) end
  if self.q then quality_capture(self.q, msg, n) end  -- what the client is sent, limits' events included
  return n
end
-- per-gap limits and heartbeats of a streamed response; returns the bytes to forward
local QUIET_WAKE_MS = 86400000  -- a wake-up pushed past any stream's life: see end_watch
-- Stops the watch. The last wake-up this filter asked for must not stay pending: once the message has
-- ended HAProxy no longer calls the payload callback, and an expired wake-up with the response still
-- being sent (a slow client) makes the stream spin until the watchdog aborts the whole process.
local function end_watch(self)
  self.ended = true
  filter.wake_time(QUIET_WAKE_MS)
end
-- Ends the stream with an SSE event when it fits in the buffer (the blank lines close an event the
-- upstream left half-written); when it does not fit yet, the next callback (50 ms at the latest) retries.
local function end_with_event(self, msg, event, t)
  if msg:append("\n\n" .. event) < 0 then
    filter.wake_time(50)
    self.wake_at = t + 50
    return
  end
  msg:set_eom()
  end_watch(self)
end
watch_gaps = function(self, txn, msg, n)
  if msg:eom() then end_watch(self) return n end
  local t = now_ms()
  if t >= self.renew_at then claim_renew(self, t) end  -- one comparison per callback; NEVER_MS without a claim
  -- the upstream ended the stream without its end of message (a crash: FIN or reset mid-body). 3.0 still
  -- calls this filter then (2.6's forwarder took its error branch first); the client gets an error
  -- event instead of a cut it cannot tell from an answer's end (the upstream's last bytes usually come
  -- with its close, so this is the callback that carries them). may_recv is false when the input is
  -- closed and also when the buffer has no room (hlua_http_msg_may_recv, channel_htx_may_recv in 3.0.11):
  -- full of output (a slow client), the event does not fit and is not sent (end_with_event) and room
  -- brings may_recv back; within the 1 KB rewrite reserve, the input is then nearly the whole buffer,
  -- which a crash's last read is not (SSE events are small): above 64 KB of input no event is sent.
  -- Only for a stream whose framing carries its length (a close-delimited one ends by closing).
  if not msg:may_recv() and msg:input() < 65536 and txn:get_var("txn.res_len") then
    -- unless the client left first: HAProxy then closes the server side too, and this branch saw an upstream cut
    -- (a sampled exchange's record said the serving version failed with 502 where its user had gone away). The
    -- stream's termination state is not set yet here ("--"), but the client's leaving closed the request's input,
    -- which an upstream cut leaves open (measured on 3.0.11: may_recv false and true; true also over HTTP/2, with
    -- pipelining, Connection: close, HTTP/1.0 and a client that half-closes after its request: HTTP/1 does not
    -- read the socket while the response is in progress, so that client still gets the event)
    if client_gone(txn) then
      self.client_left = true
      end_watch(self)
      return msg:input()
    end
    end_with_event(self, msg, 'event: error\ndata: {"error":{"message":"the upstream closed the ' ..
      'stream before it ended","type":"upstream_error","code":502}}\n\n', t)
    return msg:input()
  end
  if n > 0 then self.last = t end
  local limit, since, what
  if self.last then
    limit, since, what = self.args_inter, self.last, "between streamed chunks"
  else
    limit, since, what = self.args_first, self.started, "before the first streamed chunk"
  end
  local left = since + limit - t
  if left <= 0 then
    end_with_event(self, msg, 'event: error\ndata: {"error":{"message":"upstream sent nothing for ' ..
      limit .. ' ms ' .. what .. '","type":"gateway_timeout","code":504}}\n\n', t)
    return msg:input()
  end
  -- heartbeat: after args_beat ms with nothing sent to the client, an SSE comment line keeps idle
  -- timeouts on the path from closing the stream. Only after silence, so at an event boundary
  -- (engines write whole events). Per chunk this is two comparisons, no extra call.
  local quiet_since = self.last or self.started
  if self.beat and self.beat > quiet_since then quiet_since = self.beat end
  local beat_in = quiet_since + self.args_beat - t
  if beat_in <= 0 and msg:append(": keep-alive\n\n") >= 0 then
    self.beat = t
    n = msg:input()
    beat_in = self.args_beat
  end
  if beat_in < 1 then beat_in = 1 end
  if beat_in < left then left = beat_in end
  -- A wake-up stays pending until it fires (the channel's analyse_exp): one still ahead and not later than
  -- this deadline is kept, and when it fires early this callback sets the next. Most chunks move the
  -- deadline later, so most skip the call. One due within 2 ms is replaced: core.now() and HAProxy's tick
  -- clock may round a millisecond apart, and a fired wake-up left in place would wake the stream at once
  -- again until it is replaced.
  local at = t + left + 1
  if self.wake_at <= t + 2 or at < self.wake_at then
    self.wake_at = at
    filter.wake_time(left + 1)
  end
  return n
end
core.register_filter("llm", Llm, function(f, args)
  f.args_first = tonumber(args[1])
  f.args_inter = tonumber(args[2])
  f.args_beat = tonumber(args[3])
  f.args_claim = tonumber(args[4])  -- ms an Idempotency-Key claim lasts from a renewal
  return f
end)
'''
