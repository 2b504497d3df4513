--- Every session's status summary, for a statusline and the sessions picker.
---
--- Rule 1: one `agentSession.watch` per Neovim, started on first use: its snapshot,
--- then `agentSession.status` notifications (coalesced by the daemon), keep
--- `M.sessions` (session id -> summary) current. When the connection comes back the
--- watch is made again and its snapshot replaces what was known, so a session
--- deleted meanwhile disappears.
---
--- Rule 2: `statusline()` never waits and never fails: it shows what is known (an
--- empty string before the first snapshot) and asks for a redraw when it changes.
--- It costs a table walk, so a statusline may call it on every redraw.

local M = {}

---@type table<string, table>
M.sessions = {}

local state = {
  client = nil, ---@type agents.Client|nil
  watch_id = nil, ---@type string|nil
  started = false,
  asking = false, -- a watch request is on its way
}

local function redraw()
  vim.schedule(function()
    vim.cmd('redrawstatus!')
  end)
end

local function watch()
  local client = state.client
  state.asking = true
  client:request('agentSession.watch', vim.empty_dict(), function(err, result)
    state.asking = false
    if err then
      return -- the connection's 'connect' handler tries again
    end
    state.watch_id = result.watchId
    M.sessions = {}
    for _, summary in ipairs(result.sessions or {}) do
      M.sessions[summary.sessionId] = summary
    end
    redraw()
  end)
end

--- Start watching through `client` (once; later calls do nothing).
---@param client agents.Client
function M.start(client)
  if state.started and state.client == client then
    return
  end
  state.client, state.started = client, true
  client:hold(M) -- reconnect while watching
  client:on('notification', function(method, params)
    if method == 'agentSession.status' and params.watchId == state.watch_id then
      local summary = params.session or {}
      if params.deleted then
        M.sessions[summary.sessionId] = nil
      else
        M.sessions[summary.sessionId] = summary
      end
      redraw()
    end
  end)
  client:on('connect', function()
    -- A new connection has no watch: make one, unless the first is on its way.
    if state.client == client and not state.asking then
      watch()
    end
  end)
  watch()
end

--- Forget the watch (the connection is being dropped).
function M.stop()
  if state.client then
    state.client:release(M)
  end
  state.client, state.started, state.watch_id = nil, false, nil
  M.sessions = {}
end

--- What a summary says needs the user, in a few words.
---@param s table a SessionStatus
---@return string|nil
local function need(s)
  if s.approvals and #s.approvals > 0 then
    return 'approve: ' .. tostring(s.approvals[1].title)
  end
  if s.state == 'failed' then
    return 'failed: ' .. tostring(s.failure or s.outcome or 'the last turn')
  end
  return nil
end

--- One line of a summary (the sessions picker).
---@param s table a SessionStatus
---@return string
function M.describe(s)
  local state_word = s.phase == 'running' and s.state or (s.state ~= 'idle' and s.state or s.phase)
  local line = string.format(
    '%s %s  %-9s  %s',
    s.unseen and '*' or ' ',
    s.sessionId,
    state_word,
    s.title or s.provider
  )
  local wanted = need(s)
  if wanted then
    line = line .. '  [' .. wanted .. ']'
  elseif s.lastReply and s.lastReply ~= '' then
    line = line .. '  - ' .. s.lastReply:gsub('%s+', ' '):sub(1, 60)
  end
  return line
end

--- The summaries, those needing the user first, then the newest.
---@return table[]
function M.list()
  local out = vim.tbl_values(M.sessions)
  local rank = { attention = 0, failed = 1, working = 2, idle = 3 }
  table.sort(out, function(a, b)
    local ra, rb = rank[a.state] or 4, rank[b.state] or 4
    if ra ~= rb then
      return ra < rb
    end
    return (a.updatedAt or 0) > (b.updatedAt or 0)
  end)
  return out
end

--- A statusline component: the current session's state and what needs the user
--- across all sessions, e.g. `agents: working | 1 needs you | 2 unseen`. Empty when
--- there is nothing to say (Rule 2).
---@param current string|nil the current session's id
---@return string
--- How full the session's context is, as the agent last reported it: `ctx 42%`
--- (of its window), or the last turn's tokens when the agent gives no window.
---@param summary table
---@return string|nil
function M.context(summary)
  local tokens = type(summary.tokens) == 'table' and summary.tokens or nil
  if not tokens then
    return nil
  end
  local window, used = tokens.contextWindow, tokens.contextTokens
  if type(window) == 'number' and window > 0 and type(used) == 'number' then
    return string.format('ctx %d%%', math.floor(used * 100 / window + 0.5))
  end
  if type(tokens.turnTokens) == 'number' then
    return tokens.turnTokens .. ' tok'
  end
  return nil
end

function M.statusline(current)
  local parts = {}
  local mine = current and M.sessions[current]
  if mine then
    table.insert(parts, need(mine) or mine.state)
    local context = M.context(mine)
    if context then
      table.insert(parts, context)
    end
  end
  local attention, unseen = 0, 0
  for id, s in pairs(M.sessions) do
    if s.state == 'attention' and id ~= current then
      attention = attention + 1
    end
    if s.unseen then
      unseen = unseen + 1
    end
  end
  if attention > 0 then
    table.insert(parts, attention .. ' needs you')
  end
  if unseen > 0 then
    table.insert(parts, unseen .. ' unseen')
  end
  if #parts == 0 then
    return ''
  end
  return 'agents: ' .. table.concat(parts, ' | ')
end

return M
