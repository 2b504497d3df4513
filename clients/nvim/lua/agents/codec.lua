--- Sans-IO codec for the agentsd wire: JSON-RPC 2.0 messages in Content-Length frames.
---
--- Rule 1: this module never touches a socket or the editor; it turns tables into
--- bytes (`encode`) and bytes into message tables (`Decoder:feed`, `Decoder:next`).
--- The libuv glue lives in `agents.rpc`.
---
--- Rule 2: however the byte stream is chunked, the same messages come out. After a
--- framing error the decoder is broken for good: the connection must be closed.
---
--- Rule 3: JSON null decodes to nil (Neovim's `vim.NIL` sentinel never escapes), so
--- callers test optional members with plain `if x then`.

local M = {}

local MAX_HEADER_BYTES = 4096 -- LSP headers are two short lines; the daemon uses the same bound
local MAX_FRAME_BYTES = 8 * 1024 * 1024 -- the daemon's own frame limit

--- Replace `vim.NIL` by nil, recursively (Neovim 0.7 has no `luanil` decode option).
---@param value any
---@return any
local function strip_nil(value)
  if value == vim.NIL then
    return nil
  end
  if type(value) == 'table' then
    for k, v in pairs(value) do
      value[k] = strip_nil(v)
    end
  end
  return value
end
M.strip_nil = strip_nil

--- One framed message, ready for the socket.
---@param message table a JSON-RPC message; use `vim.empty_dict()` for an empty object
---@return string
function M.encode(message)
  local body = vim.json.encode(message)
  return 'Content-Length: ' .. #body .. '\r\n\r\n' .. body
end

---@class agents.Decoder
---@field private buf string bytes received and not yet returned
---@field private body_len integer|nil length of the pending body, once its headers were read
---@field broken string|nil why the stream is unusable
local Decoder = {}
Decoder.__index = Decoder

---@return agents.Decoder
function M.decoder()
  return setmetatable({ buf = '', body_len = nil, broken = nil }, Decoder)
end

---@param data string
function Decoder:feed(data)
  self.buf = self.buf .. data
end

---@param reason string
---@return nil, string
function Decoder:fail(reason)
  self.broken = reason
  self.buf = ''
  return nil, reason
end

--- Parse one header block; returns the body length or nil and an error.
---@param block string
---@return integer|nil, string|nil
local function parse_headers(block)
  local length
  for line in (block .. '\r\n'):gmatch('(.-)\r\n') do
    local name, value = line:match('^([^:]+):%s*(.-)%s*$')
    if not name then
      return nil, 'malformed header line'
    end
    name = name:lower()
    if name == 'content-length' then
      if not value:match('^%d+$') or #value > 12 then
        return nil, 'invalid Content-Length'
      end
      length = tonumber(value)
    elseif name ~= 'content-type' then
      return nil, 'unknown header ' .. name
    end
  end
  if not length then
    return nil, 'missing Content-Length header'
  end
  if length > MAX_FRAME_BYTES then
    return nil, 'frame of ' .. length .. ' bytes is too large'
  end
  return length
end

--- The next complete message, nil when more bytes are needed, or nil and an error
--- string when the stream is broken (not a frame, or not JSON).
---@return table|nil, string|nil
function Decoder:next()
  if self.broken then
    return nil, self.broken
  end
  if not self.body_len then
    -- Tolerate whitespace between messages, as the daemon does.
    local start = self.buf:find('[^ \t\r\n]')
    if not start then
      self.buf = ''
      return nil
    end
    if start > 1 then
      self.buf = self.buf:sub(start)
    end
    local stop = self.buf:find('\r\n\r\n', 1, true)
    if not stop then
      if #self.buf > MAX_HEADER_BYTES then
        return self:fail('header block too long')
      end
      return nil
    end
    local length, err = parse_headers(self.buf:sub(1, stop - 1))
    if not length then
      return self:fail(err)
    end
    self.body_len = length
    self.buf = self.buf:sub(stop + 4)
  end
  if #self.buf < self.body_len then
    return nil
  end
  local body = self.buf:sub(1, self.body_len)
  self.buf = self.buf:sub(self.body_len + 1)
  self.body_len = nil
  local ok, message = pcall(vim.json.decode, body)
  if not ok or type(message) ~= 'table' then
    return self:fail('a frame that is not a JSON object')
  end
  return strip_nil(message)
end

return M
