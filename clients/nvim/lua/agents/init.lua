--- agents.nvim: drive agentsd sessions (AI coding agents kept alive by a daemon)
--- from Neovim.
---
--- The public API behind the `:Agents*` commands. Every function is asynchronous:
--- it returns at once and reports failures with `vim.notify` (the message ends with
--- the daemon's `data.kind` in brackets). Functions that take an optional
--- `session_id` default to the current session: the session of the current buffer
--- if it is a session buffer, else the one last created or attached.
---
--- Mutations carry a fresh `clientOperationId`, so the client resends them after a
--- reconnect and the daemon answers a resent one without doing it twice.

local config = require('agents.config')
local rpc = require('agents.rpc')

local uv = vim.uv or vim.loop -- vim.uv from Neovim 0.10

local M = {}

local state = {
  client = nil, ---@type agents.Client|nil
  current = nil, ---@type string|nil
}

--- Configure the plugin (optional; see `agents.config` for every option).
---@param opts table|nil
function M.setup(opts)
  config.setup(opts)
end

--- The shared connection to the daemon, made on first use.
---@return agents.Client
function M.client()
  if not state.client then
    state.client = rpc.new({
      socket_path = function()
        return (config.socket_path())
      end,
      timeout_ms = function()
        return config.options.request_timeout_ms
      end,
      reconnect = function()
        return config.options.reconnect
      end,
    })
    local lost = false
    state.client:on('disconnect', function(reason)
      if next(state.client.holds) then
        lost = true
        vim.notify('agents: lost agentsd (' .. reason .. '); reconnecting', vim.log.levels.WARN)
      end
    end)
    state.client:on('connect', function()
      if lost then
        lost = false
        vim.notify('agents: reconnected to agentsd')
      end
    end)
  end
  return state.client
end

--- Drop the connection and stop following; the next request connects again (to
--- the socket configured then), and `attach` resumes a buffer where it stopped.
function M.disconnect()
  if state.client then
    local views = require('agents.view').views
    for _, view in pairs(views) do
      if view.follow then
        view.follow:stop()
      end
    end
    require('agents.status').stop()
    state.client:close()
    state.client = nil
  end
end

--- A fresh operation id for one mutation.
---@return string
local function operation_id()
  local ok, bytes = pcall(uv.random, 12)
  if not ok or not bytes then
    bytes = tostring(uv.hrtime()) .. tostring(math.random())
  end
  return 'nvim-'
    .. (bytes:gsub('.', function(c)
      return string.format('%02x', c:byte())
    end)):sub(1, 24)
end

--- Call a mutation: retried across a reconnect under one `clientOperationId`.
---@param method string
---@param params table
---@param what string for the error message
---@param on_result fun(result: any)|nil
---@param on_error fun(err: table): boolean|nil return true when it handled the error
local function mutate(method, params, what, on_result, on_error)
  params.clientOperationId = operation_id()
  M.client():request(method, params, function(err, result)
    if err then
      if not (on_error and on_error(err)) then
        rpc.notify_error(what, err)
      end
    elseif on_result then
      on_result(result)
    end
  end, { retry = true })
end

M.mutate = mutate

--- The session commands act on when none is named.
---@return string|nil
function M.current_session()
  local from_buffer = vim.b.agents_session_id
  if type(from_buffer) == 'string' then
    return from_buffer
  end
  return state.current
end

---@param session_id string|nil
---@return string|nil
local function resolve(session_id)
  local id = session_id or M.current_session()
  if not id then
    vim.notify(
      'agents: no current session; use :AgentsNew or :AgentsAttach first',
      vim.log.levels.WARN
    )
  end
  return id
end

--- Create a session in the current working directory and (by default) attach to it.
--- `opts`: `title`, `options` (the provider's session options), and `callback`,
--- called with the new session's id.
---@param provider string|nil default `config.provider()`
---@param opts { title: string|nil, options: table|nil, callback: fun(session_id: string)|nil }|nil
function M.new(provider, opts)
  provider = provider or config.provider()
  opts = opts or {}
  local params = { provider = provider, cwd = uv.cwd(), title = opts.title }
  if opts.options and next(opts.options) then
    params.options = opts.options
  end
  mutate('agentSession.create', params, 'creating a ' .. provider .. ' session', function(result)
    state.current = result.sessionId
    vim.notify('agents: created session ' .. result.sessionId .. ' (' .. provider .. ')')
    if config.options.attach_on_new then
      M.attach(result.sessionId)
    end
    if opts.callback then
      opts.callback(result.sessionId)
    end
  end)
end

--- One line describing a session (for lists and completion).
---@param s table a SessionInfo
---@return string
function M.describe(s)
  local status = s.phase == 'running' and s.status or s.phase
  return string.format('%s  %-6s  %-9s  %s', s.sessionId, s.provider, status, s.title or s.cwd)
end

--- Every session, newest first, to `callback(sessions)`.
---@param callback fun(sessions: table[])
function M.sessions(callback)
  M.client():request('agentSession.list', vim.empty_dict(), function(err, result)
    if err then
      rpc.notify_error('listing sessions', err)
      return
    end
    local sessions = result.sessions or {}
    table.sort(sessions, function(a, b)
      return (a.updatedAt or 0) > (b.updatedAt or 0)
    end)
    callback(sessions)
  end, { retry = true })
end

--- Pick a session with `vim.ui.select`; `on_choice(session)` (default: attach).
---@param on_choice fun(session: table)|nil
function M.list(on_choice)
  M.sessions(function(sessions)
    if #sessions == 0 then
      vim.notify('agents: no sessions (create one with :AgentsNew)')
      return
    end
    vim.ui.select(
      sessions,
      { prompt = 'agents sessions', format_item = M.describe },
      function(choice)
        if choice then
          (on_choice or function(s)
            M.attach(s.sessionId)
          end)(choice)
        end
      end
    )
  end)
end

--- Show the session's buffer (streaming it from the start of its journal).
--- Without an id: pick one with `vim.ui.select`. An id the daemon does not know is
--- an error (`[session_not_found]`), and no buffer is made for it; a session whose
--- buffer exists is shown at once (an ended one says so).
---@param session_id string|nil
---@param how string|nil 'split', 'vsplit', 'tab' or 'current' (default `config.open`)
function M.attach(session_id, how)
  if not session_id then
    M.list()
    return
  end
  local views = require('agents.view').views
  local known = views[session_id]
  local function show()
    state.current = session_id
    require('agents.view').get(M.client(), session_id):show(how)
  end
  if known and vim.api.nvim_buf_is_valid(known.buf) then
    show()
    return
  end
  M.client():request('agentSession.get', { sessionId = session_id }, function(err)
    if err then
      rpc.notify_error('attaching ' .. session_id, err)
      return
    end
    show()
  end, { retry = true })
end

--- Send a prompt. Without text: ask for it with `vim.ui.input`. `opts.range`
--- (`{ buf, first, last }`, 1-based lines) attaches those lines as context;
--- `#buffer` and `@file` mentions are expanded (see `agents.prompt`); `opts.images`
--- (`{ type = 'image', path = ... }` content blocks) go with the text.
---@param text string|nil
---@param session_id string|nil
---@param opts { range: table|nil, source: integer|nil, images: table[]|nil }|nil
function M.send(text, session_id, opts)
  local id = resolve(session_id)
  if not id then
    return
  end
  opts = opts or {}
  if not text or text == '' then
    vim.ui.input({ prompt = 'Send to ' .. id .. ': ' }, function(input)
      if input and input ~= '' then
        M.send(input, id, opts)
      end
    end)
    return
  end
  if opts.source or opts.range then
    local prompt = require('agents.prompt')
    local source = opts.source
    if source and vim.b[source].agents_session_id then
      source = vim.fn.bufnr('#') -- from a session buffer, #buffer is the one before
    end
    local images
    text, images = prompt.expand(text, source)
    opts.images = vim.list_extend(vim.list_extend({}, opts.images or {}), images)
    if opts.range then
      local r = opts.range
      text = text .. '\n\n' .. prompt.selection(r.buf, r.first, r.last)
    end
  end
  local params = { sessionId = id, text = text }
  if opts.images and #opts.images > 0 then
    params.content = opts.images
  end
  mutate('agentSession.send', params, 'sending to ' .. id, function(result)
    if result.dispatch == 'rejected' then
      vim.notify('agents: not delivered: ' .. tostring(result.reason), vim.log.levels.WARN)
    end
  end)
end

--- Answer an approval; a later answer than the winning one is reported, not an error.
---@param session_id string
---@param approval_id string
---@param decision string
function M.respond(session_id, approval_id, decision)
  local params = { sessionId = session_id, approvalId = approval_id, decision = decision }
  mutate('agentSession.respond', params, 'answering ' .. approval_id, nil, function(err)
    if err.data and err.data.kind == 'already_resolved' then
      vim.notify('agents: ' .. tostring(err.message), vim.log.levels.INFO)
      return true
    end
    return false
  end)
end

--- Interrupt the running turn.
---@param session_id string|nil
function M.interrupt(session_id)
  local id = resolve(session_id)
  if not id then
    return
  end
  mutate('agentSession.interrupt', { sessionId = id }, 'interrupting ' .. id, function(result)
    if not result.interrupted then
      vim.notify('agents: nothing to interrupt: ' .. tostring(result.reason or 'no turn running'))
    end
  end)
end

--- End the session's agent; the record and journal stay, the next send resumes it.
---@param session_id string|nil
function M.close(session_id)
  local id = resolve(session_id)
  if not id then
    return
  end
  mutate('agentSession.close', { sessionId = id }, 'closing ' .. id, function()
    vim.notify('agents: closed session ' .. id)
  end)
end

--- Delete the session: its record, its journal and its agent. Asks first with
--- `vim.ui.select` unless `force`.
---@param session_id string|nil
---@param force boolean|nil
function M.delete(session_id, force)
  local id = resolve(session_id)
  if not id then
    return
  end
  local function delete()
    mutate('agentSession.delete', { sessionId = id }, 'deleting ' .. id, function()
      if state.current == id then
        state.current = nil
      end
      vim.notify('agents: deleted session ' .. id)
    end)
  end
  if force then
    delete()
    return
  end
  vim.ui.select({ 'Delete', 'Keep' }, {
    prompt = 'Delete session ' .. id .. ' and its history?',
  }, function(choice)
    if choice == 'Delete' then
      delete()
    end
  end)
end

--- Open the prompt buffer of the session (multi-line; `:w` or `<C-s>` sends it).
---@param session_id string|nil
function M.prompt(session_id)
  local id = resolve(session_id)
  if id then
    require('agents.prompt').open(id)
  end
end

--- The providers the daemon knows (its agents' programs, and the built-in mock),
--- for completion; the built-in ones when it does not answer in time.
---@return string[]
function M.providers()
  local result = M.client():request_sync('daemon.status', vim.empty_dict(), 500)
  local programs = result and result.agentEnv and result.agentEnv.programs
  if type(programs) ~= 'table' then
    return { 'claude', 'codex', 'mock' }
  end
  local out = { 'mock' }
  for _, program in ipairs(programs) do
    if not vim.tbl_contains(out, program.provider) then
      table.insert(out, program.provider)
    end
  end
  table.sort(out)
  return out
end

--- Pick the session's mode (`agents.controls`), or set `choice`.
---@param choice string|nil
---@param session_id string|nil
function M.mode(choice, session_id)
  local id = resolve(session_id)
  if id then
    require('agents.controls').mode(id, choice)
  end
end

--- Pick the session's model (or another option: `key`), or set `choice`.
---@param choice string|nil
---@param session_id string|nil
---@param key string|nil default `model`
function M.model(choice, session_id, key)
  local id = resolve(session_id)
  if id then
    require('agents.controls').option(id, key or 'model', choice)
  end
end

--- Run a command (`compact`, `clear`, the agent's own), or pick one.
---@param name string|nil
---@param args string|nil
---@param session_id string|nil
function M.command(name, args, session_id)
  local id = resolve(session_id)
  if id then
    require('agents.controls').command(id, name, args)
  end
end

--- A statusline component: the current session's state, and how many sessions
--- need you or have news you have not seen (`agents.status`). Starts watching on
--- first call; never waits. Use as `%{v:lua.require'agents'.statusline()}`.
---@return string
function M.statusline()
  local status = require('agents.status')
  status.start(M.client())
  return status.statusline(M.current_session())
end

--- Pick a session from the status summaries (state, title, what needs you, the
--- start of the last reply; unseen ones marked `*`) and attach to it.
function M.pick()
  local status = require('agents.status')
  status.start(M.client())
  local function show()
    local sessions = status.list()
    if #sessions == 0 then
      vim.notify('agents: no sessions (create one with :AgentsNew)')
      return
    end
    vim.ui.select(sessions, { prompt = 'agents', format_item = status.describe }, function(s)
      if s then
        M.attach(s.sessionId)
      end
    end)
  end
  if next(status.sessions) then
    show()
  else -- the first snapshot is on its way
    vim.wait(1000, function()
      return next(status.sessions) ~= nil
    end, 10)
    show()
  end
end

--- Session ids for command-line completion (asks the daemon, briefly).
---@param lead string
---@return string[]
function M.complete_sessions(lead)
  local result = M.client():request_sync('agentSession.list', vim.empty_dict(), 500)
  local out = {}
  for _, s in ipairs(result and result.sessions or {}) do
    if vim.startswith(s.sessionId, lead or '') then
      table.insert(out, s.sessionId)
    end
  end
  return out
end

return M
