--- Test harness for agents.nvim, driven by tests/clients/test_nvim.py through
--- Neovim's RPC (`nvim_exec_lua`).
---
--- Every wait here is `vim.wait` with a deadline (the event loop keeps running, so
--- the plugin streams meanwhile); a timeout raises an error that carries what the
--- buffer showed, which the Python side reports as the test failure.

local M = {}

M.notifications = {} -- every vim.notify message, in order: { msg, level }

local POLL_MS = 10

--- Point the plugin at `socket`, capture vim.notify, and load the commands.
---@param socket string
---@param opts table|nil setup options
function M.setup(socket, opts)
  vim.g.agents_socket = socket
  require('agents').setup(vim.tbl_deep_extend('force', {
    open = 'current',
    reconnect = { initial_ms = 50, max_ms = 400 },
  }, opts or {}))
  vim.cmd('runtime! plugin/agents.lua')
  vim.notify = function(msg, level)
    table.insert(M.notifications, { msg = msg, level = level or vim.log.levels.INFO })
  end
end

local function view(session_id)
  local v = require('agents.view').views[session_id]
  if not v then
    error('no view of session ' .. tostring(session_id), 2)
  end
  return v
end

--- Wait for `predicate`; on timeout raise "<what>" with the session's lines.
local function wait(timeout_ms, predicate, what, session_id)
  if vim.wait(timeout_ms, predicate, POLL_MS) then
    return
  end
  local detail = ''
  local v = session_id and require('agents.view').views[session_id]
  if v then
    detail = '\n--- buffer ---\n'
      .. table.concat(vim.api.nvim_buf_get_lines(v.buf, 0, -1, false), '\n')
      .. '\n--- follow: '
      .. tostring(v.follow.state)
      .. ' '
      .. tostring(v.follow_detail)
  end
  local notes = {}
  for _, n in ipairs(M.notifications) do
    table.insert(notes, n.msg)
  end
  error(
    string.format(
      'timed out after %d ms waiting for %s%s\n--- notifications ---\n%s',
      timeout_ms,
      what,
      detail,
      table.concat(notes, '\n')
    ),
    0
  )
end

--- Run an Ex command (so the test goes through plugin/agents.lua).
function M.cmd(command)
  vim.cmd(command)
end

--- `:AgentsNew [provider]` (or `require('agents').new` with session options) and
--- wait until its buffer is the current one; returns the session id.
function M.new_session(provider, options, timeout_ms)
  provider = provider ~= vim.NIL and provider or nil -- Python's None arrives as vim.NIL
  options = options ~= vim.NIL and options or nil
  local before = vim.api.nvim_get_current_buf()
  if options then
    require('agents').new(provider, { options = options })
  else
    vim.cmd('AgentsNew ' .. (provider or ''))
  end
  wait(timeout_ms, function()
    local buf = vim.api.nvim_get_current_buf()
    return buf ~= before and vim.b[buf].agents_session_id ~= nil
  end, 'the new session buffer')
  local session_id = vim.b.agents_session_id
  wait(timeout_ms, function()
    return view(session_id).follow.state == 'live'
  end, 'the subscription', session_id)
  return session_id
end

function M.lines(session_id)
  return vim.api.nvim_buf_get_lines(view(session_id).buf, 0, -1, false)
end

--- Wait until the session buffer contains `text` (plain) `count` times (default
--- once, exactly: more is a failure too); returns the lines.
function M.wait_text(session_id, text, timeout_ms, count)
  count = count or 1
  local function occurrences()
    local n = 0
    for _, line in ipairs(M.lines(session_id)) do
      local from = 1
      while true do
        local at = line:find(text, from, true)
        if not at then
          break
        end
        n = n + 1
        from = at + #text
      end
    end
    return n
  end
  wait(timeout_ms, function()
    return occurrences() >= count
  end, string.format('%q in the buffer', text), session_id)
  local n = occurrences()
  if n ~= count then
    error(
      string.format(
        '%q is in the buffer %d times, not %d:\n%s',
        text,
        n,
        count,
        table.concat(M.lines(session_id), '\n')
      ),
      0
    )
  end
  return M.lines(session_id)
end

--- Wait until one line of the session buffer equals `line`; returns the lines.
function M.wait_line(session_id, line, timeout_ms)
  wait(timeout_ms, function()
    return vim.tbl_contains(M.lines(session_id), line)
  end, string.format('the line %q', line), session_id)
  return M.lines(session_id)
end

--- The text of every agent message of the session, in order.
function M.messages(session_id)
  local out = {}
  for _, entry in ipairs(view(session_id).transcript.entries) do
    if entry.kind == 'message' then
      table.insert(out, require('agents.transcript').item_text(entry))
    end
  end
  return out
end

--- Wait until no turn runs and the subscription is live.
function M.wait_idle(session_id, timeout_ms)
  wait(timeout_ms, function()
    local v = view(session_id)
    return v.follow.state == 'live' and not v.transcript.turn_running
  end, 'the turn to end', session_id)
end

--- Wait until the session buffer has caught up to journal seq `seq` (and is live).
function M.wait_seq(session_id, seq, timeout_ms)
  wait(timeout_ms, function()
    local f = view(session_id).follow
    return f.last_seq >= seq and f.state == 'live'
  end, 'seq ' .. seq, session_id)
end

--- Wait for a pending approval; returns its id.
function M.wait_approval(session_id, timeout_ms)
  wait(timeout_ms, function()
    return #view(session_id).transcript:pending_approvals() > 0
  end, 'an approval', session_id)
  return view(session_id).transcript:pending_approvals()[1].approval_id
end

--- Type `keys` in the session buffer (its buffer-local mappings apply).
function M.press(session_id, keys)
  local v = view(session_id)
  v:show('current')
  vim.cmd('normal ' .. keys)
end

function M.follow_state(session_id)
  local v = view(session_id)
  return {
    state = v.follow.state,
    last_seq = v.follow.last_seq,
    subscription = v.follow.subscription_id,
    lagged = v.lagged or 0,
    disconnects = v.disconnects or 0,
    held = v.follow.client.holds[v.follow] ~= nil, -- the client reconnects for it
    ended = vim.b[v.buf].agents_ended or false,
    ended_reason = vim.b[v.buf].agents_ended_reason or vim.NIL,
    status = vim.b[v.buf].agents_status,
  }
end

function M.wait_follow_state(session_id, state, timeout_ms)
  wait(timeout_ms, function()
    return view(session_id).follow.state == state
  end, 'follow state ' .. state, session_id)
end

--- Record every distinct text the buffer showed for lines matching `prefix`,
--- so a test can tell that text streamed in (several partial versions).
function M.record_stream(session_id)
  local v = view(session_id)
  v.seen = {}
  vim.api.nvim_buf_attach(v.buf, false, {
    on_lines = function(_, buf, _, first, _, last_new)
      for _, line in ipairs(vim.api.nvim_buf_get_lines(buf, first, last_new, false)) do
        v.seen[line] = true
      end
    end,
  })
end

function M.seen_lines(session_id)
  return vim.tbl_keys(view(session_id).seen or {})
end

--- Count the lagged notifications the session's follow receives, and the times
--- the connection was lost.
function M.count_lagged(session_id)
  local v = view(session_id)
  v.lagged, v.disconnects = 0, 0
  v.follow.client:on('notification', function(method, params)
    if method == 'agentSession.lagged' and params.sessionId == session_id then
      v.lagged = v.lagged + 1
    end
  end)
  v.follow.client:on('disconnect', function()
    v.disconnects = v.disconnects + 1
  end)
end

--- Stop (or resume) reading the daemon's socket, as a stuck editor would.
function M.pause_reading()
  local client = require('agents').client()
  client.pipe:read_stop()
end

function M.resume_reading()
  local client = require('agents').client()
  client.pipe:read_start(client.on_read)
end

--- `:checkhealth agents`, as lines.
function M.checkhealth()
  vim.cmd('checkhealth agents')
  local lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.cmd('bwipeout!')
  return lines
end

--- Wait for a vim.notify message containing `text`; returns it.
function M.wait_notification(text, timeout_ms)
  local found
  wait(timeout_ms, function()
    for _, n in ipairs(M.notifications) do
      if n.msg:find(text, 1, true) then
        found = n.msg
        return true
      end
    end
    return false
  end, 'a notification containing ' .. text)
  return found
end

--- Replace vim.ui.select: record the items shown and pick the one for which
--- `pick(formatted)` contains `choose` (plain), or none.
function M.stub_select(choose)
  M.selected = nil
  vim.ui.select = function(items, opts, on_choice)
    local shown = {}
    local picked
    for _, item in ipairs(items) do
      local text = opts.format_item and opts.format_item(item) or tostring(item)
      table.insert(shown, text)
      if not picked and choose and text:find(choose, 1, true) then
        picked = item
      end
    end
    M.selected = shown
    on_choice(picked)
  end
end

--- The items the stubbed vim.ui.select showed, once a picker showed them (pickers
--- that ask the daemon first show them later).
function M.wait_selected(timeout_ms)
  wait(timeout_ms, function()
    return M.selected ~= nil
  end, 'a picker')
  return M.selected
end

--- Replace vim.ui.input: answer with `text`.
function M.stub_input(text)
  vim.ui.input = function(_, on_confirm)
    on_confirm(text)
  end
end

function M.current_buffer_session()
  return vim.b.agents_session_id
end

--- The names of every global, sorted (a test compares them before and after the
--- plugin ran, to catch a leaked global).
function M.globals()
  local names = {}
  for k in pairs(_G) do
    table.insert(names, k)
  end
  table.sort(names)
  return names
end

--- Command-line completions of `line` (as typed after ':').
function M.completions(line)
  return vim.fn.getcompletion(line, 'cmdline')
end

--- Names of listed or unlisted buffers starting with `prefix`.
function M.buffers_named(prefix)
  local out = {}
  for _, buf in ipairs(vim.api.nvim_list_bufs()) do
    local name = vim.api.nvim_buf_get_name(buf)
    if vim.startswith(name, prefix) then
      table.insert(out, name)
    end
  end
  return out
end

--- Open a file buffer with `lines` (written to `path`) and make it current.
function M.edit_file(path, lines)
  vim.fn.writefile(lines, path)
  vim.cmd('edit ' .. vim.fn.fnameescape(path))
  return vim.api.nvim_get_current_buf()
end

--- Fill the current buffer (a prompt buffer) with `lines`.
function M.set_lines(lines)
  vim.api.nvim_buf_set_lines(0, 0, -1, false, lines)
end

function M.current_lines()
  return vim.api.nvim_buf_get_lines(0, 0, -1, false)
end

--- Put the cursor of the session's window on the first line containing `text`, and
--- type `keys` there (normal mode, buffer-local mappings apply).
function M.press_on(session_id, text, keys)
  local v = view(session_id)
  v:show('current')
  for i, line in ipairs(vim.api.nvim_buf_get_lines(v.buf, 0, -1, false)) do
    if line:find(text, 1, true) then
      vim.api.nvim_win_set_cursor(0, { i, 0 })
      vim.cmd('normal ' .. keys)
      return i
    end
  end
  error('no line contains ' .. text .. ':\n' .. table.concat(M.lines(session_id), '\n'), 0)
end

--- The windows of the current tab: each one's buffer name, lines and 'diff'.
function M.tab_windows()
  local out = {}
  for _, win in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    local buf = vim.api.nvim_win_get_buf(win)
    table.insert(out, {
      name = vim.api.nvim_buf_get_name(buf),
      lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false),
      diff = vim.wo[win].diff,
    })
  end
  return out
end

--- The statusline component, once `predicate(text)` holds for it (a Lua pattern
--- it must match), else a timeout.
function M.wait_statusline(pattern, timeout_ms)
  local text
  wait(timeout_ms, function()
    text = require('agents').statusline()
    return text:find(pattern) ~= nil
  end, 'a statusline matching ' .. pattern)
  return text
end

--- Wait until an agent message of the session has shown some of its text while
--- its turn still runs.
function M.wait_streaming(session_id, timeout_ms)
  wait(timeout_ms, function()
    local t = view(session_id).transcript
    for _, entry in ipairs(t.entries) do
      if entry.kind == 'message' and not entry.completed and entry.chars > 0 then
        return t.turn_running
      end
    end
    return false
  end, 'a reply streaming', session_id)
end

--- Wait until the status summary of `session_id` shows a completed turn and says
--- `unseen` is `want`.
function M.wait_unseen(session_id, want, timeout_ms)
  wait(timeout_ms, function()
    require('agents').statusline() -- starts the watch
    local summary = require('agents.status').sessions[session_id]
    return summary ~= nil and summary.outcome == 'completed' and summary.unseen == want
  end, 'unseen = ' .. tostring(want) .. ' for ' .. session_id, session_id)
end

--- Wait until the current buffer shows session `session_id`.
function M.wait_current_session(session_id, timeout_ms)
  wait(timeout_ms, function()
    return vim.b.agents_session_id == session_id
  end, 'the buffer of ' .. session_id, session_id)
end

--- The line index (1-based) of the first line equal to `line`, or nil.
function M.line_index(session_id, line)
  for i, l in ipairs(M.lines(session_id)) do
    if l == line then
      return i
    end
  end
  return nil
end

return M
