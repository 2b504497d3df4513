--- Options of the agents plugin and where the daemon's socket is.
---
--- `require('agents').setup(opts)` merges `opts` over `defaults`; every option has
--- a default, so calling setup is optional. The socket path is resolved at every
--- connect, so changing `vim.g.agents_socket` takes effect at the next reconnect.

local M = {}

M.defaults = {
  -- Path of the daemon's socket. nil: `vim.g.agents_socket`, else `$AGENTSD_SOCKET`,
  -- else the daemon's own default (see `socket_path`).
  socket = nil,
  -- Provider of `:AgentsNew` without an argument (`vim.g.agents_provider` overrides).
  provider = 'mock',
  -- Open the new session's buffer after `:AgentsNew`.
  attach_on_new = true,
  -- How `:AgentsAttach` shows the session buffer: 'split', 'vsplit', 'tab' or 'current'.
  open = 'split',
  -- How long a request may wait for its reply (and retry across a reconnect).
  request_timeout_ms = 30000,
  -- Reconnect delays after the daemon went away: doubling from `initial` up to `max`.
  reconnect = { initial_ms = 100, max_ms = 2000 },
  -- Buffer-local keys of a session buffer; set one to false to leave it unmapped.
  keymaps = {
    accept = 'a', -- accept the approval under the cursor, else the oldest pending one
    decline = 'd', -- decline it
    choose = '<CR>', -- pick any of the approval's options with vim.ui.select
    send = 'i', -- prompt for text and send it
    interrupt = '<C-c>', -- interrupt the running turn
    close = 'q', -- close the window (the session keeps running)
    diff = 'gd', -- review the edit under the cursor in a diff tab
    prompt = 'p', -- open the prompt buffer (multi-line; :w or <C-s> sends it)
  },
}

M.options = vim.deepcopy(M.defaults)

---@param opts table|nil
function M.setup(opts)
  M.options = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
end

---@return string
function M.provider()
  local g = vim.g.agents_provider
  if type(g) == 'string' and g ~= '' then
    return g
  end
  return M.options.provider
end

--- The daemon's default socket when nothing is configured; it mirrors
--- `agentsd_protocol.paths.default_socket_path` so the two agree without talking.
---@return string
local function daemon_default()
  local runtime = vim.env.XDG_RUNTIME_DIR
  if runtime and runtime ~= '' then
    return runtime .. '/agentsd/agentsd.sock'
  end
  local state = vim.env.AGENTSD_STATE_DIR
  if not state or state == '' then
    local xdg_state = vim.env.XDG_STATE_HOME
    if xdg_state and xdg_state ~= '' then
      state = xdg_state .. '/agentsd'
    else
      state = (vim.env.HOME or vim.fn.expand('~')) .. '/.local/state/agentsd'
    end
  end
  return state .. '/run/agentsd.sock'
end

--- The socket path and where it came from (for `:checkhealth agents`).
---@return string path, string source
function M.socket_path()
  if type(M.options.socket) == 'string' and M.options.socket ~= '' then
    return vim.fn.expand(M.options.socket), 'setup({ socket = ... })'
  end
  local g = vim.g.agents_socket
  if type(g) == 'string' and g ~= '' then
    return vim.fn.expand(g), 'vim.g.agents_socket'
  end
  local env = vim.env.AGENTSD_SOCKET
  if env and env ~= '' then
    return env, '$AGENTSD_SOCKET'
  end
  if vim.env.XDG_RUNTIME_DIR and vim.env.XDG_RUNTIME_DIR ~= '' then
    return daemon_default(), 'default ($XDG_RUNTIME_DIR)'
  end
  return daemon_default(), 'default (no $XDG_RUNTIME_DIR: the state directory)'
end

return M
