--- The session buffer: a scratch buffer that streams one session.
---
--- One view per session, kept in `M.views` until its buffer is wiped. The buffer is
--- hidden, not wiped, when its window closes, so it keeps streaming and `:AgentsAttach`
--- shows it again. A view owns a `agents.follow` (the subscription) and an
--- `agents.transcript` (the lines); it renders at most every `RENDER_DELAY_MS`.
---
--- A buffer shown in a window acknowledges what it shows (`agentSession.acknowledge`):
--- the user has seen it, so status bars stop flagging the session unseen.
---
--- The last line carries a status as virtual text (working, approval pending,
--- reconnecting, session deleted); it is not part of the transcript.
---
--- A view whose session is gone (deleted, or not found) is ended: its buffer says so
--- (a last notice line, `b:agents_ended` and `b:agents_ended_reason`), keeps what
--- it showed, and never follows again; wiping the buffer forgets it.
---
--- Buffer-local keys (see `config.keymaps`): accept / decline the approval under the
--- cursor (else the oldest pending one), choose any option with `vim.ui.select`, send
--- a prompt, interrupt the turn, close the window.

local config = require('agents.config')
local follow = require('agents.follow')
local transcript = require('agents.transcript')

local M = {}

local RENDER_DELAY_MS = 15 -- coalesces a burst of deltas into one redraw
local ACK_DELAY_MS = 300 -- coalesces acknowledgements of a streaming session into one
local NAMESPACE = vim.api.nvim_create_namespace('agents')

---@type table<string, agents.View>
M.views = {}

---@class agents.View
---@field session_id string
---@field buf integer
---@field transcript agents.Transcript
---@field follow agents.Follow
---@field ended string|nil why the session is gone (see `agents.follow`, Rule 4)
local View = {}
View.__index = View

local ACCEPT = { 'accept', 'allow', 'approve', 'yes' }
local DECLINE = { 'decline', 'deny', 'reject', 'no', 'cancel' }

--- The first word of an option, lower-cased: `acceptForSession` -> `accept`,
--- `No tests` -> `no`, `Node.js` -> `node`.
---@param option string
---@return string
local function first_word(option)
  return (option:match('^%a%l*') or ''):lower()
end

--- The option of `options` whose first word is one of `words` (the earlier word
--- wins, then the earlier option).
---@param options string[]
---@param words string[]
---@return string|nil
local function pick_option(options, words)
  for _, word in ipairs(words) do
    for _, option in ipairs(options) do
      if first_word(option) == word then
        return option
      end
    end
  end
  return nil
end
M.pick_option = pick_option

--- "a accept, d decline, ..." for the mapped keys among `names`; nil if none is.
---@param names string[]
---@return string|nil
local function describe_keys(names)
  local keys = config.options.keymaps or {}
  local parts = {}
  for _, name in ipairs(names) do
    if keys[name] then
      table.insert(parts, keys[name] .. ' ' .. name)
    end
  end
  return #parts > 0 and table.concat(parts, ', ') or nil
end

---@return string|nil
local function key_hint()
  local keys =
    describe_keys({ 'accept', 'decline', 'choose', 'send', 'prompt', 'diff', 'interrupt', 'close' })
  return keys and ('keys: ' .. keys)
end

---@return string|nil
local function approval_hint()
  local keys = describe_keys({ 'accept', 'decline', 'choose' })
  return keys and ('(' .. keys .. ')')
end

--- The view of `session_id`, made on first use; it follows the session (again, if
--- it had stopped) through `client`.
---@param client agents.Client
---@param session_id string
---@return agents.View
function M.get(client, session_id)
  local view = M.views[session_id]
  if not (view and vim.api.nvim_buf_is_valid(view.buf)) then
    view = setmetatable({ session_id = session_id, render_pending = false }, View)
    view.transcript =
      transcript.new(session_id, { hint = key_hint(), approval_hint = approval_hint() })
    view.buf = view:make_buffer()
    M.views[session_id] = view
  end
  if not view.ended and (not view.follow or view.follow.state == 'stopped') then
    view:start_follow(client, view.follow and view.follow.last_seq or 0)
  end
  view:render()
  return view
end

--- Follow the session after `after_seq` (what the transcript already shows).
---@param client agents.Client
---@param after_seq integer
function View:start_follow(client, after_seq)
  self.follow = follow.new(client, self.session_id, {
    event = function(event)
      self.transcript:apply(event)
      self:schedule_render()
    end,
    delta = function(params)
      self.transcript:delta(params.itemId, params.offset or 0, tostring(params.text or ''))
      self:schedule_render()
    end,
    state = function(state, detail)
      self.follow_state, self.follow_detail = state, detail
      self:schedule_render()
    end,
    gone = function(reason)
      self:mark_ended(reason)
    end,
  })
  self.follow:start(after_seq)
end

--- The session is gone: say so once, and mark the buffer ended.
---@param reason string
function View:mark_ended(reason)
  if self.ended then
    return
  end
  self.ended = reason
  if reason == 'session_not_found' then
    self.transcript:notice('[the session no longer exists]')
  else
    self.transcript:notice('[session deleted (reason: ' .. reason .. ')]')
  end
  if vim.api.nvim_buf_is_valid(self.buf) then
    vim.b[self.buf].agents_ended = true
    vim.b[self.buf].agents_ended_reason = reason
  end
  self:schedule_render()
end

---@return integer buf
function View:make_buffer()
  local name = 'agents://' .. self.session_id
  local old = vim.fn.bufnr(name)
  if old ~= -1 then
    vim.api.nvim_buf_delete(old, { force = true })
  end
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_name(buf, name)
  vim.bo[buf].buftype = 'nofile'
  vim.bo[buf].bufhidden = 'hide'
  vim.bo[buf].swapfile = false
  vim.bo[buf].modifiable = false
  vim.bo[buf].filetype = 'agents'
  vim.b[buf].agents_session_id = self.session_id
  vim.api.nvim_create_autocmd('BufWipeout', {
    buffer = buf,
    once = true,
    callback = function()
      if self.follow then
        self.follow:stop()
      end
      if M.views[self.session_id] == self then
        M.views[self.session_id] = nil
      end
    end,
  })
  self:map_keys(buf)
  return buf
end

-- What each `config.keymaps` entry does: its description and the View method.
local ACTIONS = {
  accept = { 'Accept the approval', 'accept' },
  decline = { 'Decline the approval', 'decline' },
  choose = { 'Answer the approval', 'choose' },
  send = { 'Send a prompt', 'prompt_send' },
  interrupt = { 'Interrupt the turn', 'interrupt' },
  close = { 'Close the window', 'close_window' },
  diff = { 'Review the edit in a diff', 'review_diff' },
  prompt = { 'Open the prompt buffer', 'open_prompt' },
}

---@param buf integer
function View:map_keys(buf)
  local keys = config.options.keymaps or {}
  for name, action in pairs(ACTIONS) do
    local lhs = keys[name]
    if lhs then
      local description, method = action[1], action[2]
      vim.keymap.set('n', lhs, function()
        self[method](self)
      end, { buffer = buf, nowait = true, silent = true, desc = 'agents: ' .. description })
    end
  end
end

--- Show the buffer: 'split', 'vsplit', 'tab' or 'current'.
---@param how string|nil
function View:show(how)
  local wins = vim.fn.win_findbuf(self.buf)
  if #wins > 0 then
    vim.api.nvim_set_current_win(wins[1])
    return
  end
  how = how or config.options.open
  if how == 'vsplit' then
    vim.cmd('vsplit')
  elseif how == 'tab' then
    vim.cmd('tabnew')
  elseif how ~= 'current' then
    vim.cmd('split')
  end
  vim.api.nvim_win_set_buf(0, self.buf)
  vim.wo.wrap = true
  vim.wo.linebreak = true
  self:follow_cursor(vim.api.nvim_get_current_win())
  self:acknowledge()
end

function View:close_window()
  if #vim.api.nvim_list_wins() > 1 then
    vim.api.nvim_win_close(0, false)
  else
    vim.cmd('enew')
  end
end

function View:schedule_render()
  if self.render_pending then
    return
  end
  self.render_pending = true
  vim.defer_fn(function()
    self.render_pending = false
    self:render()
  end, RENDER_DELAY_MS)
end

---@param win integer
function View:follow_cursor(win)
  local last = vim.api.nvim_buf_line_count(self.buf)
  vim.api.nvim_win_set_cursor(win, { last, 0 })
end

--- Write what changed into the buffer; windows whose cursor sat on the last line
--- keep following the end.
function View:render()
  if not vim.api.nvim_buf_is_valid(self.buf) then
    return
  end
  local start, lines = self.transcript:flush()
  if start then
    local last = vim.api.nvim_buf_line_count(self.buf)
    local following = {}
    for _, win in ipairs(vim.fn.win_findbuf(self.buf)) do
      if vim.api.nvim_win_get_cursor(win)[1] >= last then
        table.insert(following, win)
      end
    end
    vim.bo[self.buf].modifiable = true
    vim.api.nvim_buf_set_lines(self.buf, start, -1, false, lines)
    vim.bo[self.buf].modifiable = false
    for _, win in ipairs(following) do
      self:follow_cursor(win)
    end
  end
  self:render_status()
  self:acknowledge()
end

--- The user sees what a window shows: record it (`agentSession.acknowledge`, up to
--- the last event shown), so the session is not flagged unseen for what they saw.
--- A hidden buffer acknowledges nothing. At most one request per `ACK_DELAY_MS`.
function View:acknowledge()
  local seq = self.follow and self.follow.last_seq or 0
  if self.ended or self.ack_pending or seq <= (self.acked_seq or 0) then
    return
  end
  if #vim.fn.win_findbuf(self.buf) == 0 then
    return
  end
  self.ack_pending = true
  vim.defer_fn(function()
    self.ack_pending = false
    local upto = self.follow and self.follow.last_seq or seq
    if self.ended or #vim.fn.win_findbuf(self.buf) == 0 then
      return
    end
    self.acked_seq = upto
    local params = { sessionId = self.session_id, seq = upto }
    require('agents').client():request('agentSession.acknowledge', params, function(err)
      if err then
        self.acked_seq = 0 -- say it again with the next render
      end
    end)
  end, ACK_DELAY_MS)
end

--- One line saying what the session is doing now.
---@return string, string text and highlight group
function View:status()
  if self.ended then
    local text = self.ended == 'session_not_found' and 'session not found' or 'session deleted'
    return text, 'WarningMsg'
  end
  local state, detail = self.follow_state, self.follow_detail
  if state == 'stopped' then
    return '', 'Comment'
  end
  if state == 'idle' and detail then
    return 'disconnected (' .. detail .. '); reconnecting...', 'WarningMsg'
  end
  if state ~= 'live' then
    return 'connecting...', 'Comment'
  end
  local pending = #self.transcript:pending_approvals()
  if pending > 0 then
    return string.format('waiting for approval %s', approval_hint() or ''), 'WarningMsg'
  end
  if self.transcript.turn_running then
    return 'working...', 'Comment'
  end
  return '', 'Comment'
end

function View:render_status()
  local text, group = self:status()
  vim.b[self.buf].agents_status = text
  vim.api.nvim_buf_clear_namespace(self.buf, NAMESPACE, 0, -1)
  if text ~= '' then
    local last = vim.api.nvim_buf_line_count(self.buf) - 1
    vim.api.nvim_buf_set_extmark(self.buf, NAMESPACE, last, 0, { virt_text = { { text, group } } })
  end
end

--- The approval the keys act on: the pending one under the cursor, else the oldest.
---@return table|nil
function View:target_approval()
  if vim.api.nvim_get_current_buf() == self.buf then
    local line = vim.api.nvim_win_get_cursor(0)[1] - 1
    local entry = self.transcript:entry_at(line)
    if entry and entry.kind == 'approval' and not entry.decision then
      return entry
    end
  end
  return self.transcript:pending_approvals()[1]
end

--- Answer the target approval with its accepting (or declining) option.
---@param which string 'accept' | 'decline'
function View:answer(which)
  local entry = self:target_approval()
  if not entry then
    vim.notify('agents: no approval is pending', vim.log.levels.INFO)
    return
  end
  local options = entry.options or {}
  local decision
  if entry.approval_kind == 'question' then
    -- Its options are the agent's answer labels: accepting means choosing one.
    if which == 'accept' then
      self:choose()
      return
    end
    decision = pick_option(options, { 'decline' }) or 'cancel'
  else
    decision = pick_option(options, which == 'accept' and ACCEPT or DECLINE)
    if not decision then
      decision = which == 'accept' and options[1] or options[#options]
    end
  end
  require('agents').respond(self.session_id, entry.approval_id, decision or which)
end

function View:accept()
  self:answer('accept')
end

function View:decline()
  self:answer('decline')
end

function View:interrupt()
  require('agents').interrupt(self.session_id)
end

--- Pick any option of the target approval with `vim.ui.select`.
function View:choose()
  local entry = self:target_approval()
  if not entry then
    vim.notify('agents: no approval is pending', vim.log.levels.INFO)
    return
  end
  vim.ui.select(entry.options or {}, { prompt = entry.title or 'Approval' }, function(choice)
    if choice then
      require('agents').respond(self.session_id, entry.approval_id, choice)
    end
  end)
end

--- Review the edit of the tool entry under the cursor: a new tab with its old and
--- new text side by side in diff mode (scratch buffers; the file is not touched).
--- An item with several edits shows them one after another in both buffers.
---@return boolean shown
function View:review_diff()
  local line = vim.api.nvim_win_get_cursor(0)[1] - 1
  local entry = self.transcript:entry_at(line)
  local edits = entry and entry.kind == 'tool' and require('agents.render').edits(entry.body)
    or {}
  if #edits == 0 then
    vim.notify('agents: no edit under the cursor', vim.log.levels.INFO)
    return false
  end
  local old, new, paths = {}, {}, {}
  for _, e in ipairs(edits) do
    -- A file's last newline ends its last line; it is not a line of its own.
    vim.list_extend(old, vim.split((e.old or ''):gsub('\n$', ''), '\n', { plain = true }))
    vim.list_extend(new, vim.split((e.new:gsub('\n$', '')), '\n', { plain = true }))
    paths[e.path] = true
  end
  local name = table.concat(vim.tbl_keys(paths), ', ')
  local item = tostring(entry.body.itemId or entry.index)
  vim.cmd('tabnew')
  local function side(lines, label)
    local buf = vim.api.nvim_get_current_buf()
    vim.bo[buf].buftype = 'nofile'
    vim.bo[buf].bufhidden = 'wipe'
    vim.bo[buf].swapfile = false
    vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
    vim.bo[buf].modifiable = false
    pcall(vim.api.nvim_buf_set_name, buf, 'agents-diff://' .. item .. '/' .. label)
    vim.b[buf].agents_diff_path = name
    vim.cmd('diffthis')
  end
  side(old, 'before')
  vim.cmd('vertical rightbelow new')
  side(new, 'after')
  return true
end

function View:open_prompt()
  require('agents.prompt').open(self.session_id)
end

function View:prompt_send()
  vim.ui.input({ prompt = 'Send to ' .. self.session_id .. ': ' }, function(text)
    if text and text ~= '' then
      require('agents').send(text, self.session_id)
    end
  end)
end

return M
