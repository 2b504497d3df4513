--- A JSON-RPC 2.0 client of agentsd over a libuv pipe (the daemon's Unix socket).
---
--- Rule 1: requests carry fresh integer ids and replies are matched by id alone; a
--- reply nobody waits for any more (its request timed out) is dropped.
---
--- Rule 2: the client connects lazily, on the first request. When the connection is
--- lost, requests in flight fail with `disconnected`, except those sent with
--- `retry = true` (reads, and mutations carrying a `clientOperationId`, which the
--- daemon replays instead of repeating): they are sent again after the reconnect,
--- until their own deadline.
---
--- Rule 3: while anything holds the client (`hold`), or a request waits for a
--- connection, a lost connection is re-established with a doubling delay; every
--- 'connect' handler then runs, so followers resubscribe where they stopped.
---
--- Rule 4: every libuv callback hops to the main loop with `vim.schedule` before it
--- touches any state, so handlers may call any Neovim API and run in arrival order.
---
--- Errors passed to callbacks are tables `{ code?, message, data = { kind, ... } }`:
--- the daemon's error object, or one made here with kind `daemon_unreachable`,
--- `disconnected`, `timeout` or `protocol_error`.

local codec = require('agents.codec')

local uv = vim.uv or vim.loop -- vim.uv from Neovim 0.10
local M = {}

---@class agents.Request
---@field id integer
---@field method string
---@field params table|nil
---@field callback fun(err: table|nil, result: any)
---@field retry boolean send again after a reconnect
---@field sent boolean written on some connection at least once
---@field timer userdata|nil

---@class agents.Client
local Client = {}
Client.__index = Client

--- A client error table.
---@param kind string
---@param message string
---@return table
local function local_error(kind, message)
  return { message = message, data = { kind = kind, retryable = kind ~= 'protocol_error' } }
end
M.local_error = local_error

--- A new client; nothing connects until the first request.
---@param opts { socket_path: fun(): string, timeout_ms: fun(): integer, reconnect: fun(): table }
---@return agents.Client
function M.new(opts)
  return setmetatable({
    opts = opts,
    state = 'idle', -- 'idle' | 'connecting' | 'connected' | 'closed'
    pipe = nil,
    decoder = nil,
    generation = 0, -- bumped per connection attempt: late callbacks of an old pipe are ignored
    next_id = 1,
    pending = {}, -- id -> request written on the current connection
    queue = {}, -- requests waiting for a connection, in submission order
    handlers = { notification = {}, connect = {}, disconnect = {} },
    holds = {},
    delay_ms = nil, -- next reconnect delay; nil after a successful connect
    reconnect_timer = nil,
    path = nil, -- socket of the current or last connection attempt
  }, Client)
end

--- Register `fn` for 'notification' (method, params), 'connect' () or 'disconnect'
--- (reason). Returns a function that removes it.
---@param event string
---@param fn function
---@return fun()
function Client:on(event, fn)
  local list = self.handlers[event]
  local entry = { fn = fn }
  table.insert(list, entry)
  return function()
    for i, e in ipairs(list) do
      if e == entry then
        table.remove(list, i)
        return
      end
    end
  end
end

function Client:emit(event, ...)
  -- A copy: a handler may remove itself (or others) while we iterate.
  for _, entry in ipairs(vim.list_slice(self.handlers[event])) do
    local ok, err = pcall(entry.fn, ...)
    if not ok then
      vim.notify('agents: ' .. event .. ' handler failed: ' .. tostring(err), vim.log.levels.ERROR)
    end
  end
end

--- Keep the connection up (reconnecting when lost) until `release(token)`.
---@param token any
function Client:hold(token)
  self.holds[token] = true
  if self.state == 'idle' and self.delay_ms then
    self:schedule_reconnect()
  end
end

---@param token any
function Client:release(token)
  self.holds[token] = nil
end

---@return boolean
function Client:is_connected()
  return self.state == 'connected'
end

function Client:wants_connection()
  return next(self.holds) ~= nil or #self.queue > 0
end

--- Send a request; `callback(err, result)` runs exactly once, on the main loop.
---@param method string
---@param params table|nil
---@param callback fun(err: table|nil, result: any)|nil
---@param opts { retry: boolean|nil, timeout_ms: integer|nil }|nil
---@return integer id
function Client:request(method, params, callback, opts)
  opts = opts or {}
  if self.state == 'closed' then
    vim.schedule(function()
      (callback or function() end)(local_error('disconnected', 'the client was closed'), nil)
    end)
    return 0
  end
  local id = self.next_id
  self.next_id = id + 1
  local request = {
    id = id,
    method = method,
    params = params,
    callback = callback or function() end,
    retry = opts.retry or false,
    sent = false,
  }
  local timeout_ms = opts.timeout_ms or self.opts.timeout_ms()
  request.timer = uv.new_timer()
  request.timer:start(
    timeout_ms,
    0,
    vim.schedule_wrap(function()
      if self:forget(request) then
        local message = string.format(
          'agentsd at %s did not answer %s within %d ms',
          self.path or '?',
          method,
          timeout_ms
        )
        request.callback(local_error('timeout', message), nil)
      end
    end)
  )
  if self.state == 'connected' then
    self:write_request(request)
  else
    table.insert(self.queue, request)
    self:connect()
  end
  return id
end

--- `request`, waiting for the reply (the event loop runs meanwhile).
---@return any result, table|nil err
function Client:request_sync(method, params, timeout_ms, opts)
  local done, err, result = false, nil, nil
  opts = vim.tbl_extend('force', opts or {}, { timeout_ms = timeout_ms })
  self:request(method, params, function(e, r)
    done, err, result = true, e, r
  end, opts)
  vim.wait(timeout_ms + 100, function()
    return done
  end, 10)
  if not done then
    return nil, local_error('timeout', method .. ' did not finish in time')
  end
  return result, err
end

--- Drop a request from the pending table or the queue; false if it already ended.
---@param request agents.Request
---@return boolean
function Client:forget(request)
  if request.timer then
    request.timer:stop()
    request.timer:close()
    request.timer = nil
  else
    return false -- already finished
  end
  self.pending[request.id] = nil
  for i, queued in ipairs(self.queue) do
    if queued == request then
      table.remove(self.queue, i)
      break
    end
  end
  return true
end

---@param request agents.Request
function Client:write_request(request)
  local message = { jsonrpc = '2.0', id = request.id, method = request.method }
  if request.params ~= nil then
    message.params = request.params
  end
  self.pending[request.id] = request
  request.sent = true
  self:write(codec.encode(message))
end

---@param data string
function Client:write(data)
  local generation = self.generation
  local function failed(err)
    vim.schedule(function()
      if generation == self.generation then
        self:lost('writing to agentsd failed: ' .. tostring(err))
      end
    end)
  end
  -- luv reports a write it could not even start by returning nil and an error.
  local started, err = self.pipe:write(data, function(werr)
    if werr then
      failed(werr)
    end
  end)
  if not started then
    failed(err)
  end
end

--- Start connecting unless connected or already trying.
function Client:connect()
  if self.state ~= 'idle' then
    return
  end
  if self.reconnect_timer then
    self.reconnect_timer:stop()
  end
  self.state = 'connecting'
  self.generation = self.generation + 1
  local generation = self.generation
  local path = self.opts.socket_path()
  self.path = path
  local pipe = uv.new_pipe(false)
  self.pipe = pipe
  local ok, err = pcall(pipe.connect, pipe, path, function(cerr)
    vim.schedule(function()
      if generation ~= self.generation then
        return
      end
      if cerr then
        self:lost(string.format('cannot connect to agentsd at %s: %s', path, cerr))
      else
        self:connected(pipe, generation)
      end
    end)
  end)
  if not ok then
    vim.schedule(function()
      if generation == self.generation then
        self:lost(string.format('cannot connect to agentsd at %s: %s', path, tostring(err)))
      end
    end)
  end
end

function Client:connected(pipe, generation)
  self.state = 'connected'
  self.decoder = codec.decoder()
  self.delay_ms = nil
  -- Kept on the client so reading can be paused and resumed (back-pressure tests).
  self.on_read = function(err, chunk)
    vim.schedule(function()
      if generation ~= self.generation then
        return
      end
      if err then
        self:lost('reading from agentsd failed: ' .. err)
      elseif chunk then
        self:receive(chunk)
      else
        self:lost('agentsd closed the connection')
      end
    end)
  end
  pipe:read_start(self.on_read)
  local queue = self.queue
  self.queue = {}
  for _, request in ipairs(queue) do
    self:write_request(request)
  end
  self:emit('connect')
end

---@param chunk string
function Client:receive(chunk)
  self.decoder:feed(chunk)
  while self.state == 'connected' do
    local message, err = self.decoder:next()
    if err then
      self:lost('agentsd sent something that is not JSON-RPC: ' .. err)
      return
    end
    if not message then
      return
    end
    if message[1] ~= nil then -- a batch (the daemon sends none today)
      for _, one in ipairs(message) do
        self:dispatch(one)
      end
    else
      self:dispatch(message)
    end
  end
end

---@param message table
function Client:dispatch(message)
  if message.method then
    if message.id ~= nil then
      -- The daemon sends no requests today; answer as any JSON-RPC peer must.
      local refusal = { code = -32601, message = 'Method not found: ' .. message.method }
      self:write(codec.encode({ jsonrpc = '2.0', id = message.id, error = refusal }))
    else
      self:emit('notification', message.method, message.params or {})
    end
    return
  end
  local request = message.id ~= nil and self.pending[message.id]
  if not request then
    if message.id == nil and message.error then
      -- The daemon could not read something we sent: nothing to match it to.
      vim.notify('agents: agentsd: ' .. tostring(message.error.message), vim.log.levels.ERROR)
    end
    return -- the answer to a request that timed out (Rule 1)
  end
  self:forget(request)
  if message.error then
    local e = message.error
    e.data = e.data or { kind = 'unknown' }
    request.callback(e, nil)
  else
    request.callback(nil, message.result)
  end
end

--- The connection (or an attempt) ended: settle requests, tell handlers, and
--- reconnect if wanted (Rules 2 and 3).
---@param reason string
function Client:lost(reason)
  if self.state == 'closed' then
    return
  end
  local was_connected = self.state == 'connected'
  self.generation = self.generation + 1
  if self.pipe and not self.pipe:is_closing() then
    self.pipe:close()
  end
  self.pipe, self.decoder, self.state = nil, nil, 'idle'

  local failed, retried = {}, {}
  local in_flight = vim.tbl_values(self.pending)
  table.sort(in_flight, function(a, b)
    return a.id < b.id
  end)
  self.pending = {}
  for _, request in ipairs(in_flight) do
    table.insert(request.retry and retried or failed, request)
  end
  local kept = {}
  for _, request in ipairs(self.queue) do
    -- New requests fail fast when the daemon is unreachable; retries of requests
    -- whose outcome is unknown keep trying until their deadline.
    table.insert(request.sent and request.retry and kept or failed, request)
  end
  self.queue = vim.list_extend(retried, kept)
  local kind = was_connected and 'disconnected' or 'daemon_unreachable'
  for _, request in ipairs(failed) do
    if self:forget(request) then
      request.callback(local_error(kind, reason), nil)
    end
  end
  if was_connected then
    self:emit('disconnect', reason)
  end
  if self:wants_connection() then
    self:schedule_reconnect()
  end
end

function Client:schedule_reconnect()
  local policy = self.opts.reconnect()
  local delay = self.delay_ms or policy.initial_ms
  self.delay_ms = math.min(delay * 2, policy.max_ms)
  self.reconnect_timer = self.reconnect_timer or uv.new_timer()
  self.reconnect_timer:stop()
  self.reconnect_timer:start(
    delay,
    0,
    vim.schedule_wrap(function()
      if self.state == 'idle' and self:wants_connection() then
        self:connect()
      end
    end)
  )
end

--- Close for good: every open request fails with `disconnected`.
function Client:close()
  if self.state == 'closed' then
    return
  end
  self:lost('the client was closed')
  self.state = 'closed'
  if self.reconnect_timer then
    self.reconnect_timer:stop()
    self.reconnect_timer:close()
    self.reconnect_timer = nil
  end
  for _, request in ipairs(self.queue) do
    if self:forget(request) then
      request.callback(local_error('disconnected', 'the client was closed'), nil)
    end
  end
  self.queue = {}
end

--- "agents: <what> failed: <message> [<kind>]", for vim.notify.
---@param what string
---@param err table
---@return string
function M.format_error(what, err)
  local kind = err.data and err.data.kind or 'unknown'
  return string.format('agents: %s failed: %s [%s]', what, tostring(err.message), kind)
end

---@param what string
---@param err table
function M.notify_error(what, err)
  vim.notify(M.format_error(what, err), vim.log.levels.ERROR)
end

return M
