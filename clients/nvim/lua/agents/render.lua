--- How each kind of transcript entry looks: one function per entry kind, from the
--- entry's fields to its lines. Pure: `agents.transcript` calls it for the entries
--- that changed.
---
--- Agent text is shown as it is; prompts are quoted with `> `; everything else starts
--- with a bracketed label (`[tool]`, `[command]`, `[edit]`, `[approval]`, `[plan]`,
--- `[diff]`), and a tool's output, a diff or an approval's detail is indented under it.

local M = {}

local OUTPUT_LINES = 8 -- lines of a tool's output shown; the rest is counted
local DIFF_LINES = 40 -- lines of a turn's diff shown
local SUMMARY_BYTES = 200 -- a tool's input on its header line

---@param text string
---@return string[]
local function split_lines(text)
  return vim.split(text, '\n', { plain = true })
end

--- Append `text`'s lines to `lines`, indented, at most `limit` of them.
local function append_block(lines, text, limit)
  if type(text) ~= 'string' or text == '' then
    return
  end
  local all = split_lines((text:gsub('\n$', '')))
  for i = 1, math.min(#all, limit) do
    table.insert(lines, '  ' .. all[i])
  end
  if #all > limit then
    table.insert(lines, string.format('  ... %d more lines', #all - limit))
  end
end

--- The text of a bounded payload (`{ text, byteLength, truncated }`) or a string.
---@param value any
---@return string|nil
local function payload_text(value)
  if type(value) == 'string' then
    return value
  end
  if type(value) == 'table' and type(value.text) == 'string' then
    return value.text
  end
  return nil
end

--- One line for a tool's input: its command, path or query if it has one, else JSON.
---@param input any
---@return string
local function summarize(input)
  if input == nil then
    return ''
  end
  local line
  if type(input) == 'string' then
    line = input
  elseif type(input) == 'table' then
    for _, key in ipairs({ 'command', 'file_path', 'path', 'pattern', 'url', 'query', 'text' }) do
      if type(input[key]) == 'string' then
        line = input[key]
        break
      end
    end
  end
  if not line then
    local ok, json = pcall(vim.json.encode, input)
    line = ok and json or tostring(input)
  end
  line = line:gsub('\n', ' ')
  if #line > SUMMARY_BYTES then
    line = line:sub(1, SUMMARY_BYTES) .. '...'
  end
  return line
end

--- An item's text. Streamed pieces wait in `pending` until the text is needed, so
--- n deltas cost O(n), not O(n^2).
---@param entry table
---@return string
local function item_text(entry)
  if entry.pending and #entry.pending > 0 then
    entry.text = entry.text .. table.concat(entry.pending)
    entry.pending = {}
  end
  return entry.text
end
M.item_text = item_text

M.payload_text = payload_text

local render = {}
M.kinds = render

function render.header(e)
  local lines = { 'agents session ' .. e.session_id }
  local about = {}
  if e.provider then
    table.insert(about, 'provider ' .. e.provider)
  end
  if e.cwd then
    table.insert(about, 'in ' .. e.cwd)
  end
  if #about > 0 then
    lines[1] = lines[1] .. ' (' .. table.concat(about, ', ') .. ')'
  end
  if e.title then
    table.insert(lines, 'title: ' .. e.title)
  end
  if e.hint then
    table.insert(lines, e.hint)
  end
  return lines
end

function render.prompt(e)
  local lines = {}
  for _, line in ipairs(split_lines(e.text)) do
    table.insert(lines, '> ' .. line)
  end
  if e.outcome == 'rejected' then
    table.insert(lines, '[not delivered: ' .. (e.reason or 'rejected') .. ']')
  elseif e.outcome == 'unknown' then
    table.insert(lines, '[delivery unknown: ' .. (e.reason or 'no answer from the agent') .. ']')
  end
  return lines
end

function render.message(e)
  local text = item_text(e)
  if text == '' and e.skip then
    return {} -- the rest of a split reply, empty so far (transcript Rule 3)
  end
  local lines = text == '' and { '...' } or split_lines(text)
  if e.truncated then
    table.insert(lines, string.format('[truncated: %d characters in all]', e.length or 0))
  end
  return lines
end

local LABELS = {
  toolCall = 'tool',
  mcpToolCall = 'tool',
  dynamicToolCall = 'tool',
  commandExecution = 'command',
  fileChange = 'edit',
}

--- Any item that is not an agent message: `[label] name: summary (status)`, then
--- its text, output, diff or error, each cut to `OUTPUT_LINES`.
function render.tool(e)
  local b = e.body
  local name = b.name or b.tool
  if b.server and b.tool then
    name = b.server .. '/' .. b.tool
  end
  local summary = b.command or summarize(b.input or payload_text(b.arguments))
  if type(b.changes) == 'table' and #b.changes > 0 then
    local paths = {}
    for _, change in ipairs(b.changes) do
      table.insert(paths, tostring(change.path))
    end
    summary = table.concat(paths, ', ')
  end
  local line = '[' .. (LABELS[b.type] or b.type or 'item') .. ']'
  if name then
    line = line .. ' ' .. name
  end
  if summary and summary ~= '' then
    line = line .. (name and ': ' or ' ') .. summary
  end
  local status = b.status or (e.completed and 'done' or 'running')
  if type(b.exitCode) == 'number' then
    status = status .. ', exit ' .. b.exitCode
  end
  local lines = { line .. ' (' .. status .. ')' }
  append_block(lines, b.text, OUTPUT_LINES)
  append_block(lines, payload_text(b.output) or payload_text(b.result), OUTPUT_LINES)
  append_block(lines, payload_text(b.diff), OUTPUT_LINES)
  append_block(lines, payload_text(b.error), OUTPUT_LINES)
  return lines
end

function render.approval(e)
  local lines = { '[approval] ' .. (e.title ~= '' and e.title or e.approval_kind or 'request') }
  append_block(lines, e.detail, math.huge)
  if e.decision then
    table.insert(lines, '  -> ' .. e.decision .. (e.by and (' (by ' .. e.by .. ')') or ''))
  else
    local options = table.concat(e.options or {}, ', ')
    table.insert(lines, '  pending: ' .. options .. (e.hint and ('  ' .. e.hint) or ''))
  end
  return lines
end

local PLAN_MARKS = { completed = '[x]', inProgress = '[>]', in_progress = '[>]' }

function render.plan(e)
  local lines = { '[plan]' .. (e.explanation and (' ' .. e.explanation) or '') }
  for _, step in ipairs(e.steps or {}) do
    if type(step) == 'table' then
      local mark = PLAN_MARKS[step.status] or '[ ]'
      table.insert(lines, '  ' .. mark .. ' ' .. tostring(step.step or step.content or ''))
    end
  end
  return lines
end

function render.diff(e)
  local lines = { '[diff]' }
  append_block(lines, e.text, DIFF_LINES)
  return lines
end

function render.notice(e)
  return split_lines(e.text)
end

--- Each hunk of a unified diff as its old and new text (context in both).
---@param diff string
---@return string, string
local function hunk_texts(diff)
  local old, new, seen = {}, {}, false
  for _, line in ipairs(split_lines(diff)) do
    if line:match('^@@') then
      if seen then
        table.insert(old, '...')
        table.insert(new, '...')
      end
      seen = true
    elseif seen and not line:match('^\\') then
      local mark, rest = line:sub(1, 1), line:sub(2)
      if mark == '-' then
        table.insert(old, rest)
      elseif mark == '+' then
        table.insert(new, rest)
      elseif mark == ' ' then
        table.insert(old, rest)
        table.insert(new, rest)
      end
    end
  end
  return table.concat(old, '\n'), table.concat(new, '\n')
end

--- The edits a tool item made, as `{ path, old, new }` (old `nil`: a new file), for
--- reviewing them side by side: a Codex file change per file (an added or deleted
--- file's content, an update's hunks), Claude Code's `Edit`, `MultiEdit` and
--- `Write` from their input. Empty for any other item. Pure.
---@param b table the item's fields
---@return table[]
function M.edits(b)
  local out = {}
  if b.type == 'fileChange' then
    for _, change in ipairs(type(b.changes) == 'table' and b.changes or {}) do
      local text = payload_text(change.diff)
      if type(change.path) == 'string' and text then
        if change.kind == 'add' then
          table.insert(out, { path = change.path, new = text })
        elseif change.kind == 'delete' then
          table.insert(out, { path = change.path, old = text, new = '' })
        else
          local old, new = hunk_texts(text)
          table.insert(out, { path = change.movePath or change.path, old = old, new = new })
        end
      end
    end
  elseif b.type == 'toolCall' and type(b.input) == 'table' and not b.inputTruncated then
    local input, path = b.input, b.input.file_path
    if type(path) ~= 'string' then
      return out
    end
    if b.name == 'Edit' and type(input.old_string) == 'string' then
      table.insert(out, { path = path, old = input.old_string, new = input.new_string or '' })
    elseif b.name == 'MultiEdit' and type(input.edits) == 'table' then
      for _, e in ipairs(input.edits) do
        if type(e) == 'table' and type(e.old_string) == 'string' then
          table.insert(out, { path = path, old = e.old_string, new = e.new_string or '' })
        end
      end
    elseif b.name == 'Write' and type(input.content) == 'string' then
      table.insert(out, { path = path, new = input.content })
    end
  end
  return out
end

return M
