--- `:checkhealth agents`: the socket path, whether it exists, and what the daemon
--- says about itself (`daemon.status`).
---
--- Works with the health API of Neovim 0.7 (`require('health').report_*`), 0.8-0.9
--- (`vim.health.report_*`) and 0.10+ (`vim.health.start/ok/...`).

local M = {}

local STATUS_TIMEOUT_MS = 3000 -- a local daemon answers in milliseconds

local function reporter()
  local h = vim.health or require('health')
  return {
    start = h.start or h.report_start,
    ok = h.ok or h.report_ok,
    info = h.info or h.report_info,
    warn = h.warn or h.report_warn,
    error = h.error or h.report_error,
  }
end

function M.check()
  local report = reporter()
  local config = require('agents.config')

  report.start('agents: Neovim')
  if vim.fn.has('nvim-0.7') == 1 then
    report.ok('Neovim ' .. tostring(vim.version().major) .. '.' .. tostring(vim.version().minor))
  else
    report.error('Neovim 0.7 or later is required')
  end

  report.start('agents: socket')
  local path, source = config.socket_path()
  report.info('socket: ' .. path .. ' (from ' .. source .. ')')
  local stat = (vim.uv or vim.loop).fs_stat(path)
  local advice = {
    'Start the daemon: `agentsd` (or `systemctl --user start agentsd.socket`)',
    'Or point the plugin at its socket: `vim.g.agents_socket = "/path/to/agentsd.sock"`',
  }
  if not stat then
    report.error('the socket does not exist: ' .. path, advice)
    return
  end
  if stat.type ~= 'socket' then
    report.error('not a socket (' .. stat.type .. '): ' .. path, advice)
    return
  end
  report.ok('the socket exists')

  report.start('agents: daemon')
  local client = require('agents.rpc').new({
    socket_path = function()
      return path
    end,
    timeout_ms = function()
      return STATUS_TIMEOUT_MS
    end,
    reconnect = function()
      return config.options.reconnect
    end,
  })
  local status, err = client:request_sync('daemon.status', nil, STATUS_TIMEOUT_MS)
  client:close()
  if err then
    local kind = err.data and err.data.kind or 'unknown'
    report.error('daemon.status failed: ' .. tostring(err.message) .. ' [' .. kind .. ']', advice)
    return
  end
  report.ok(
    string.format(
      'agentsd %s is running (pid %s, up %ds)',
      status.version,
      status.pid,
      math.floor(status.uptimeS or 0)
    )
  )
  local sessions = status.sessions or {}
  report.info(
    string.format(
      'sessions: %d in all, %d running, %d working, %d waiting for an approval',
      sessions.total or 0,
      sessions.running or 0,
      sessions.working or 0,
      sessions.attention or 0
    )
  )
  report.info('state directory: ' .. tostring(status.stateDir))
  if status.recovery and status.recovery.summary and status.recovery.summary ~= '' then
    report.info('start-up recovery: ' .. status.recovery.summary)
  end
end

return M
