--- Prompts written in Neovim: a prompt buffer, a selection as context, and the
--- `#buffer` / `@file` mentions codecompanion and avante users type.
---
--- Rule 1 (context): a prompt's mentions become context blocks after its text, in
--- the form the ACP bridge uses for an editor's embedded resources, so an agent sees
--- the same shape from either:
---
---     <context uri="file:///abs/path" lines="3-9">
---     ...the text...
---     </context>
---
--- `#buffer` is the buffer the prompt was written for (the one current when the
--- prompt buffer opened, or when `:AgentsSend` ran); `@path` is a file (relative
--- to Neovim's cwd, or absolute) that exists: the mention stays in the text as the
--- path, its content is attached. A mention that names nothing stays as typed. Each
--- block is cut at `MAX_CONTEXT_BYTES`, saying so. An `@path` of an image (`.png`,
--- `.jpg`, `.gif`, `.webp`) is attached as an image instead: the daemon reads its
--- bytes and the agent sees the picture.
---
--- Rule 2 (the prompt buffer): `:AgentsPrompt` opens one per session
--- (`agents-prompt://<id>`), multi-line, Markdown. `:w` or `<C-s>` sends it
--- (expanded, Rule 1) and empties it; nothing is sent when it holds only blanks.

local M = {}

local MAX_CONTEXT_BYTES = 256 * 1024 -- a big source file; the agent can read more itself

---@param path string
---@return string
local function uri(path)
  return 'file://' .. vim.fn.fnamemodify(path, ':p')
end

--- One context block (Rule 1).
---@param where string the uri
---@param text string
---@param lines string|nil "first-last"
---@return string
function M.block(where, text, lines)
  local cut = ''
  if #text > MAX_CONTEXT_BYTES then
    cut = string.format('\n[cut: %d bytes in all, the first %d shown]', #text, MAX_CONTEXT_BYTES)
    text = text:sub(1, MAX_CONTEXT_BYTES)
  end
  local attrs = string.format('uri="%s"', where)
  if lines then
    attrs = attrs .. string.format(' lines="%s"', lines)
  end
  return string.format('<context %s>\n%s%s\n</context>', attrs, text:gsub('\n$', ''), cut)
end

--- The text and uri of buffer `buf`.
---@param buf integer
---@return string|nil, string
local function buffer_text(buf)
  if not (buf and vim.api.nvim_buf_is_valid(buf)) then
    return nil, ''
  end
  local name = vim.api.nvim_buf_get_name(buf)
  local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  return text, name ~= '' and uri(name) or ('buffer://' .. buf)
end

--- Lines `first`..`last` (1-based) of `buf` as a context block.
---@param buf integer
---@param first integer
---@param last integer
---@return string
function M.selection(buf, first, last)
  local lines = vim.api.nvim_buf_get_lines(buf, first - 1, last, false)
  local name = vim.api.nvim_buf_get_name(buf)
  local where = name ~= '' and uri(name) or ('buffer://' .. buf)
  return M.block(where, table.concat(lines, '\n'), first .. '-' .. last)
end

--- `text` with its mentions expanded (Rule 1). `source` is the buffer `#buffer`
--- names.
---@param text string
---@param source integer|nil
---@return string, table[] the text, and the images `@path` named (content blocks)
function M.expand(text, source)
  local blocks, images = {}, {}
  local out = text:gsub('#buffer%f[^%w_]', function()
    local content, where = buffer_text(source)
    if not content then
      return nil -- names nothing: kept as typed
    end
    table.insert(blocks, M.block(where, content))
    return 'the buffer ' .. (where:gsub('^file://', ''))
  end)
  out = out:gsub('()@([%w%._%-/~]+)', function(at, path)
    if at > 1 and out:sub(at - 1, at - 1):match('[%w]') then
      return nil -- an e-mail address or a decorator, not a mention
    end
    local full = vim.fn.fnamemodify(vim.fn.expand(path), ':p')
    if vim.fn.filereadable(full) ~= 1 then
      return nil
    end
    if M.is_image(full) then
      table.insert(images, { type = 'image', path = full }) -- the daemon reads the bytes
      return path
    end
    local lines = vim.fn.readfile(full, 'b')
    table.insert(blocks, M.block(uri(full), table.concat(lines, '\n')))
    return path
  end)
  if #blocks == 0 then
    return out, images
  end
  return out .. '\n\n' .. table.concat(blocks, '\n\n'), images
end

local IMAGE_EXTENSIONS = { png = true, jpg = true, jpeg = true, gif = true, webp = true }

--- Whether `path` names an image the agent gets as an image (by its extension; the
--- daemon checks the bytes).
---@param path string
---@return boolean
function M.is_image(path)
  return IMAGE_EXTENSIONS[(path:match('%.(%w+)$') or ''):lower()] == true
end

-- The prompt buffer of each session, and the buffer `#buffer` means for it.
local buffers = {} ---@type table<string, { buf: integer, source: integer }>

--- Send what the prompt buffer of `session_id` holds, and empty it (Rule 2).
---@param session_id string
function M.submit(session_id)
  local entry = buffers[session_id]
  if not (entry and vim.api.nvim_buf_is_valid(entry.buf)) then
    return
  end
  local text = table.concat(vim.api.nvim_buf_get_lines(entry.buf, 0, -1, false), '\n')
  vim.bo[entry.buf].modified = false
  if not text:match('%S') then
    return
  end
  local expanded, images = M.expand(text, entry.source)
  require('agents').send(expanded, session_id, { images = images })
  vim.api.nvim_buf_set_lines(entry.buf, 0, -1, false, {})
  vim.bo[entry.buf].modified = false
end

--- Open (or show) the prompt buffer of `session_id` in a split below.
---@param session_id string
---@return integer buf
function M.open(session_id)
  local source = vim.api.nvim_get_current_buf()
  if vim.b[source].agents_session_id or vim.b[source].agents_prompt_session then
    source = vim.fn.bufnr('#') -- from a session or prompt buffer: the one before
  end
  local entry = buffers[session_id]
  if entry and vim.api.nvim_buf_is_valid(entry.buf) then
    entry.source = source
  else
    local buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(buf, 'agents-prompt://' .. session_id)
    vim.bo[buf].buftype = 'acwrite'
    vim.bo[buf].bufhidden = 'hide'
    vim.bo[buf].swapfile = false
    vim.bo[buf].filetype = 'markdown'
    vim.b[buf].agents_prompt_session = session_id
    vim.api.nvim_create_autocmd('BufWriteCmd', {
      buffer = buf,
      callback = function()
        M.submit(session_id)
      end,
    })
    for _, mode in ipairs({ 'n', 'i' }) do
      vim.keymap.set(mode, '<C-s>', function()
        M.submit(session_id)
      end, { buffer = buf, desc = 'agents: send the prompt' })
    end
    entry = { buf = buf, source = source }
    buffers[session_id] = entry
  end
  local wins = vim.fn.win_findbuf(entry.buf)
  if #wins > 0 then
    vim.api.nvim_set_current_win(wins[1])
  else
    vim.cmd('belowright split')
    vim.api.nvim_win_set_buf(0, entry.buf)
    vim.api.nvim_win_set_height(0, 8)
  end
  return entry.buf
end

return M
