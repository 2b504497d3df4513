--- The transcript of one session: journal events and streaming deltas in, lines out.
---
--- Sans-IO: no buffers, no sockets. `agents.view` feeds it and writes what `flush`
--- returns into the session buffer.
---
--- Rule 1: the transcript is a list of entries (the header, a prompt, an agent
--- message, a tool call, an approval, a plan, a diff, a notice). Each entry renders
--- to its own lines followed by one blank line. Changing an entry marks it dirty;
--- `flush` returns the first changed line and every line from there on, so streaming
--- into the last entry rewrites only the last entry.
---
--- Rule 2 (streaming text): an item's text is the longest of what the journal and the
--- live deltas showed. `item.updated` is a snapshot of the whole text so far;
--- a delta says at which character `offset` its text starts, so the part a snapshot
--- (or an earlier delta) already showed is dropped. `item.completed` is final.
--- Offsets count characters (code points), as the daemon does.
---
--- Rule 3 (a prompt mid-turn): a prompt sent while an agent message streams comes
--- after what the message showed so far. The message entry keeps its text up to
--- there; the rest of that item's text (an agent that answers a steering prompt in
--- the same item, as the mock does) goes into a new entry after the prompt, so a
--- reply never flows back above the prompt it answers.
---
--- Event kinds it does not know are ignored, so a newer daemon never breaks it.

local render = require('agents.render')

local M = {}

local payload_text = render.payload_text
M.item_text = render.item_text -- an item's text (streamed pieces joined)

-- Plain Lua rather than vim.str_utfindex/str_byteindex, whose signatures changed in
-- Neovim 0.11: a character is a byte that is not a UTF-8 continuation byte, and the
-- ones that follow it.
local CHARACTER_START = '[^\128-\191]'
local STDERR_LINES = 8 -- of an agent's stderr tail: the lines that say why it ended

--- Characters (code points) in a UTF-8 string.
---@param s string
---@return integer
local function chars(s)
  local _, n = s:gsub(CHARACTER_START, '')
  return n
end

--- `s` without its first `n` characters.
---@param s string
---@param n integer
---@return string
local function drop_chars(s, n)
  if n <= 0 then
    return s
  end
  local seen = 0
  for at in s:gmatch('()' .. CHARACTER_START) do
    if seen == n then
      return s:sub(at)
    end
    seen = seen + 1
  end
  return ''
end

--- An entry's lines, rendered once per change (Rule 1).
local function rendered(entry)
  if not entry.lines then
    entry.lines = render.kinds[entry.kind](entry)
    if #entry.lines > 0 then -- an entry with nothing to show takes no line at all
      table.insert(entry.lines, '')
    end
  end
  return entry.lines
end

---@class agents.Transcript
local Transcript = {}
Transcript.__index = Transcript

--- A transcript with only its header.
---@param session_id string
---@param opts { hint: string|nil, approval_hint: string|nil }|nil
---@return agents.Transcript
function M.new(session_id, opts)
  opts = opts or {}
  local self = setmetatable({
    entries = {},
    starts = {}, -- starts[i]: first line (0-based) of entry i, valid below `dirty`
    dirty = 1, -- first entry whose lines must be rendered again; nil when clean
    items = {}, -- itemId -> entry
    approvals = {}, -- approvalId -> entry
    prompts = {}, -- clientMessageId -> entry
    turn_entries = {}, -- 'plan:<turnId>' / 'diff:<turnId>' -> entry
    approval_hint = opts.approval_hint,
    turn_running = false,
  }, Transcript)
  self.header = self:add({ kind = 'header', session_id = session_id, hint = opts.hint })
  return self
end

---@param entry table
---@return table entry
function Transcript:add(entry)
  table.insert(self.entries, entry)
  entry.index = #self.entries
  self:touch(entry)
  return entry
end

--- Mark `entry` changed.
function Transcript:touch(entry)
  entry.lines = nil
  if not self.dirty or entry.index < self.dirty then
    self.dirty = entry.index
  end
end

function Transcript:notice(text)
  return self:add({ kind = 'notice', text = text })
end

--- The entry of an item, made on first sight (a live-only subscription can see a
--- delta before anything else of its item). A `userMessage` item gets none: its
--- `submission` shows it already.
---@return table|nil
function Transcript:item(item_id, item_type)
  local entry = self.items[item_id]
  if not entry and item_type ~= 'userMessage' then
    if item_type == nil or item_type == 'agentMessage' then
      entry = self:add({ kind = 'message', text = '', pending = {}, chars = 0 })
    else
      entry = self:add({ kind = 'tool', body = { type = item_type } })
    end
    self.items[item_id] = entry
  end
  return entry
end

--- The entry that shows the latest `what` ('plan' or 'diff') of a turn.
function Transcript:turn_entry(what, turn_id)
  local key = what .. ':' .. tostring(turn_id)
  local entry = self.turn_entries[key]
  if not entry then
    entry = self:add({ kind = what })
    self.turn_entries[key] = entry
  end
  return entry
end

--- Set an item's text if `text` shows more than it has (Rule 2).
function Transcript:snapshot(entry, text)
  local n = chars(text)
  if n >= entry.chars then
    entry.text, entry.pending, entry.chars = text, {}, n
    self:touch(entry)
  end
end

--- Apply one journal event.
---@param event table `{ seq, ts, fence, kind, body }`
function Transcript:apply(event)
  local body = type(event.body) == 'table' and event.body or {}
  local handler = self['on_' .. event.kind:gsub('%.', '_')]
  if handler then
    handler(self, body, event)
  end
end

Transcript['on_session_created'] = function(self, body)
  self.header.provider, self.header.cwd, self.header.title = body.provider, body.cwd, body.title
  self:touch(self.header)
end

Transcript['on_session_updated'] = function(self, body)
  if body.title ~= nil then
    self.header.title = body.title
    self:touch(self.header)
  end
end

--- Rule 3: the agent messages still streaming, which a prompt now splits.
---@return table<string, table> itemId -> entry
function Transcript:streaming_messages()
  local out = {}
  for item_id, entry in pairs(self.items) do
    if entry.kind == 'message' and not entry.completed and entry.chars > 0 then
      out[item_id] = entry
    end
  end
  return out
end

--- Rule 3: each of `streaming` keeps what it showed; the rest of its item's text
--- goes to a new entry (after the prompt just added).
function Transcript:split(streaming)
  for item_id, entry in pairs(streaming) do
    entry.text = render.item_text(entry)
    entry.completed = true
    local rest = self:add({ kind = 'message', text = '', pending = {}, chars = 0 })
    rest.skip = entry.chars + (entry.skip or 0)
    self.items[item_id] = rest
  end
end

--- The part of an item's `text` an entry shows: all of it, or (after a split) what
--- follows the characters shown above the prompt (Rule 3).
local function own_text(entry, text)
  if entry.skip then
    return drop_chars(text, entry.skip)
  end
  return text
end

Transcript['on_submission'] = function(self, body)
  local streaming = self:streaming_messages()
  if body.continuesSeq then
    -- The daemon's request to carry on after a restart cut the turn off: not the
    -- user's words.
    self:notice(
      '[agentsd asked the agent to carry on with the turn cut off at #' .. body.continuesSeq .. ']'
    )
    self:split(streaming)
    return
  end
  local entry = self:add({ kind = 'prompt', text = tostring(body.text or '') })
  if body.clientMessageId then
    self.prompts[body.clientMessageId] = entry
  end
  self:split(streaming)
end

--- History of a conversation the session adopted: shown as it was.
Transcript['on_message_imported'] = function(self, body)
  local text = tostring(body.text or '')
  if body.role == 'user' then
    self:add({ kind = 'prompt', text = text })
  else
    self:add({ kind = 'message', text = text, pending = {}, chars = chars(text), completed = true })
  end
end

Transcript['on_command_run'] = function(self, body)
  self:notice('[/' .. tostring(body.name) .. (body.args and (' ' .. body.args) or '') .. ']')
end

Transcript['on_submission_dispatched'] = function(self, body)
  local entry = self.prompts[body.clientMessageId or '']
  if entry then
    entry.outcome, entry.reason = body.outcome, body.reason
    self:touch(entry)
  end
end

Transcript['on_turn_started'] = function(self)
  self.turn_running = true
end

Transcript['on_turn_completed'] = function(self, body)
  self.turn_running = false
  if body.outcome and body.outcome ~= 'completed' then
    self:notice('[turn ' .. body.outcome .. ']')
  end
end

Transcript['on_turn_plan'] = function(self, body)
  local entry = self:turn_entry('plan', body.turnId)
  entry.explanation = type(body.explanation) == 'string' and body.explanation or nil
  entry.steps = type(body.plan) == 'table' and body.plan or {}
  self:touch(entry)
end

Transcript['on_turn_diff'] = function(self, body)
  local entry = self:turn_entry('diff', body.turnId)
  entry.text = payload_text(body.diff)
  self:touch(entry)
end

Transcript['on_item_started'] = function(self, body)
  local entry = self:item(body.itemId, body.type)
  if entry and entry.kind == 'tool' then
    entry.body = vim.tbl_extend('force', entry.body, body)
    self:touch(entry)
  end
end

Transcript['on_item_updated'] = function(self, body)
  local entry = self:item(body.itemId)
  if not entry or entry.kind ~= 'message' then
    return
  end
  if type(body.text) == 'string' then
    self:snapshot(entry, own_text(entry, body.text))
  end
  if body.truncated then
    entry.truncated, entry.length = true, body.length
    self:touch(entry)
  end
end

Transcript['on_item_completed'] = function(self, body)
  local entry = self:item(body.itemId, body.type)
  if not entry then
    return
  end
  if entry.kind == 'message' then
    if type(body.text) == 'string' then
      local text = own_text(entry, body.text)
      entry.text, entry.pending, entry.chars = text, {}, chars(text)
    end
  else
    entry.body = vim.tbl_extend('force', entry.body, body)
  end
  entry.completed = true
  self:touch(entry)
end

Transcript['on_approval_requested'] = function(self, body)
  local entry = self:add({
    kind = 'approval',
    approval_id = body.approvalId,
    approval_kind = body.approvalKind,
    title = tostring(body.title or ''),
    detail = body.detail,
    options = body.options or { 'accept', 'decline' },
    hint = self.approval_hint,
  })
  self.approvals[body.approvalId] = entry
end

Transcript['on_approval_resolved'] = function(self, body)
  local entry = self.approvals[body.approvalId]
  if entry then
    entry.decision, entry.by = tostring(body.decision), body.by
    self:touch(entry)
  end
end

Transcript['on_agent_error'] = function(self, body)
  self:notice('[agent error] ' .. tostring(body.message or ''))
end

Transcript['on_agent_warning'] = function(self, body)
  self:notice('[agent warning] ' .. tostring(body.message or ''))
end

Transcript['on_child_exited'] = function(self, body)
  local cause = tostring(body.cause or 'unknown')
  self.turn_running = false
  local text = '[agent exited: ' .. cause
  if body.returncode and cause ~= 'requested' and cause ~= 'shutdown' then
    text = text .. ', code ' .. body.returncode
  end
  self:notice(text .. ']')
  -- Why it failed, in its own words: the end of what it wrote to stderr.
  if type(body.stderrTail) == 'string' and body.stderrTail ~= '' then
    local shown = { '[its stderr ends]' }
    for line in body.stderrTail:gmatch('[^\n]+') do
      if line:match('%S') then
        table.insert(shown, '  | ' .. line)
      end
    end
    while #shown > STDERR_LINES + 1 do
      table.remove(shown, 2)
    end
    self:notice(table.concat(shown, '\n'))
  end
end

Transcript['on_thread_superseded'] = function(self, body)
  self:notice(
    string.format(
      '[new conversation %s in place of %s: %s]',
      tostring(body.handle),
      tostring(body.previousHandle),
      tostring(body.reason or '')
    )
  )
end

--- Apply one `agentSession.delta` (Rule 2).
---@param item_id string
---@param offset integer
---@param text string
function Transcript:delta(item_id, offset, text)
  local entry = self:item(item_id)
  if not entry or entry.completed or entry.kind ~= 'message' then
    return -- the final text is in already
  end
  offset = offset - (entry.skip or 0) -- Rule 3: offsets count the item's whole text
  if offset < 0 then
    text = drop_chars(text, -offset)
    offset = 0
  end
  local n = chars(text)
  if offset + n <= entry.chars then
    return -- shown already
  end
  if offset < entry.chars then
    text = drop_chars(text, entry.chars - offset)
    n = chars(text)
  end
  -- offset > chars means a gap (deltas lost before a live-only subscription);
  -- the next snapshot or the completed item repairs it.
  table.insert(entry.pending, text)
  entry.chars = entry.chars + n
  self:touch(entry)
end

--- Approvals still waiting for an answer, oldest first.
---@return table[]
function Transcript:pending_approvals()
  local out = {}
  for _, entry in ipairs(self.entries) do
    if entry.kind == 'approval' and not entry.decision then
      table.insert(out, entry)
    end
  end
  return out
end

--- The entry shown at 0-based `line`, as of the last flush.
---@param line integer
---@return table|nil
function Transcript:entry_at(line)
  for i = #self.starts, 1, -1 do
    if self.starts[i] <= line then
      return self.entries[i]
    end
  end
  return nil
end

--- What changed since the last flush: the first changed line (0-based) and every
--- line from there to the end; nil when nothing changed (Rule 1).
---@return integer|nil, string[]|nil
function Transcript:flush()
  local first = self.dirty
  if not first then
    return nil, nil
  end
  self.dirty = nil
  local start = 0
  if first > 1 then
    start = self.starts[first - 1] + #rendered(self.entries[first - 1])
  end
  local out, line = {}, start
  for i = first, #self.entries do
    local lines = rendered(self.entries[i])
    self.starts[i] = line
    line = line + #lines
    vim.list_extend(out, lines)
  end
  return start, out
end

--- The whole transcript as lines (for tests); what the next `flush` returns is
--- unaffected.
---@return string[]
function Transcript:lines()
  local out = {}
  for _, entry in ipairs(self.entries) do
    vim.list_extend(out, rendered(entry))
  end
  return out
end

return M
