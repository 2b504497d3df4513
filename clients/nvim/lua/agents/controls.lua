--- Mode, model and command pickers over the daemon's `agentSession.options` and
--- `agentSession.commands` (`vim.ui.select`, so any picker UI works).
---
--- A mode is what the agent may do without asking: Claude Code's `permissionMode`,
--- an ACP agent's `mode`, and for Codex a preset of `approvalPolicy` and `sandbox`
--- (`read-only`, `auto`, `full-access`, as the ACP bridge and Zed's codex-acp name
--- them). A choice goes to `agentSession.setOptions`; it applies as live as the
--- agent allows (the daemon says where in `appliesAt`).

local M = {}

M.CODEX_PRESETS = {
  { id = 'read-only', settings = { approvalPolicy = 'on-request', sandbox = 'read-only' } },
  { id = 'auto', settings = { approvalPolicy = 'on-request', sandbox = 'workspace-write' } },
  { id = 'full-access', settings = { approvalPolicy = 'never', sandbox = 'danger-full-access' } },
}
local CODEX_DEFAULTS = { approvalPolicy = 'on-request', sandbox = 'workspace-write' }

local function agents()
  return require('agents')
end

local function call(method, params, what, on_result)
  agents().client():request(method, params, function(err, result)
    if err then
      require('agents.rpc').notify_error(what, err)
    else
      on_result(result)
    end
  end)
end

local function by_key(result)
  local options = {}
  for _, o in ipairs(result.options or {}) do
    options[o.key] = o
  end
  return options
end

local function value_of(option)
  if option.value ~= nil and option.value ~= vim.NIL then
    return option.value
  end
  for _, c in ipairs(type(option.choices) == 'table' and option.choices or {}) do
    if c.default then
      return c.value
    end
  end
  return nil
end

--- The session's modes: `{ items = { {id, changes} }, current = id }`, or nil.
---@param options table<string, table>
function M.modes(options)
  if options.approvalPolicy and options.sandbox then
    local now = {}
    for key, default in pairs(CODEX_DEFAULTS) do
      now[key] = value_of(options[key]) or default
    end
    local items, current = {}, 'custom'
    for _, preset in ipairs(M.CODEX_PRESETS) do
      table.insert(items, { id = preset.id, changes = preset.settings })
      if vim.deep_equal(preset.settings, now) then
        current = preset.id
      end
    end
    return { items = items, current = current }
  end
  for _, key in ipairs({ 'permissionMode', 'mode' }) do
    local option = options[key]
    if option and type(option.choices) == 'table' and #option.choices > 0 then
      local items = {}
      for _, c in ipairs(option.choices) do
        table.insert(items, { id = c.value, changes = { [key] = c.value } })
      end
      return { items = items, current = value_of(option) or 'default' }
    end
  end
  return nil
end

local function set(id, changes, label)
  agents().mutate('agentSession.setOptions', {
    sessionId = id,
    changes = changes,
  }, 'setting ' .. label, function(result)
    local where = {}
    for key, at in pairs(result.appliesAt or {}) do
      table.insert(where, key .. ': ' .. at)
    end
    table.sort(where)
    vim.notify('agents: ' .. label .. ' (' .. table.concat(where, ', ') .. ')')
  end)
end

--- Pick the session's mode.
---@param id string
---@param choice string|nil picked without asking when given
function M.mode(id, choice)
  call('agentSession.options', { sessionId = id }, 'reading the options of ' .. id, function(result)
    local modes = M.modes(by_key(result))
    if not modes then
      vim.notify('agents: this session has no modes', vim.log.levels.WARN)
      return
    end
    local function apply(item)
      if item then
        set(id, item.changes, 'mode ' .. item.id)
      end
    end
    if choice then
      for _, item in ipairs(modes.items) do
        if item.id == choice then
          return apply(item)
        end
      end
      vim.notify('agents: no mode ' .. choice, vim.log.levels.ERROR)
      return
    end
    vim.ui.select(modes.items, {
      prompt = 'Mode (now ' .. modes.current .. ')',
      format_item = function(item)
        return (item.id == modes.current and '* ' or '  ') .. item.id
      end,
    }, apply)
  end)
end

--- Pick one of the values of option `key` (`model`, `effort`).
---@param id string
---@param key string
---@param choice string|nil
function M.option(id, key, choice)
  if choice then
    return set(id, { [key] = choice }, key .. ' ' .. choice)
  end
  call('agentSession.options', { sessionId = id }, 'reading the options of ' .. id, function(result)
    local option = by_key(result)[key]
    if not option or type(option.choices) ~= 'table' or #option.choices == 0 then
      vim.ui.input({ prompt = key .. ': ' }, function(input)
        if input and input ~= '' then
          set(id, { [key] = input }, key .. ' ' .. input)
        end
      end)
      return
    end
    local current = value_of(option)
    vim.ui.select(option.choices, {
      prompt = key .. (current and (' (now ' .. tostring(current) .. ')') or ''),
      format_item = function(c)
        return (c.value == current and '* ' or '  ')
          .. (c.label or c.value)
          .. (c.description and (' - ' .. c.description) or '')
      end,
    }, function(c)
      if c then
        set(id, { [key] = c.value }, key .. ' ' .. c.value)
      end
    end)
  end)
end

--- Run a command: `name` (and `args`) given, or picked from the session's commands.
---@param id string
---@param name string|nil
---@param args string|nil
function M.command(id, name, args)
  local function run(command_name, command_args)
    agents().mutate('agentSession.command', {
      sessionId = id,
      name = command_name,
      args = command_args,
    }, '/' .. command_name, function(result)
      if result.dispatch == 'rejected' then
        vim.notify(
          'agents: /' .. command_name .. ' refused: ' .. tostring(result.reason),
          vim.log.levels.WARN
        )
      end
    end)
  end
  if name then
    return run(name, args)
  end
  local what = 'listing the commands of ' .. id
  call('agentSession.commands', { sessionId = id }, what, function(result)
    vim.ui.select(result.commands or {}, {
      prompt = 'Command',
      format_item = function(c)
        return '/'
          .. c.name
          .. (c.hint and (' ' .. c.hint) or '')
          .. (c.description and (' - ' .. c.description) or '')
      end,
    }, function(c)
      if not c then
        return
      end
      if c.hint then
        vim.ui.input({ prompt = '/' .. c.name .. ' ' }, function(input)
          if input then
            run(c.name, input ~= '' and input or nil)
          end
        end)
      else
        run(c.name, nil)
      end
    end)
  end)
end

return M
