-- agents.nvim: the :Agents* commands. Everything else loads on first use
-- (`require('agents')`), so starting Neovim costs nothing more than these definitions.

if vim.g.loaded_agents or vim.fn.has('nvim-0.7') == 0 then
  return
end
vim.g.loaded_agents = 1

local function command(name, fn, opts)
  vim.api.nvim_create_user_command(name, fn, opts)
end

local function optional(args)
  return args ~= '' and args or nil
end

local function complete_sessions(lead)
  return require('agents').complete_sessions(lead)
end

command('AgentsNew', function(o)
  require('agents').new(optional(o.args))
end, {
  nargs = '?',
  desc = 'Create an agent session in the current directory',
  complete = function(lead)
    return vim.tbl_filter(function(p)
      return vim.startswith(p, lead)
    end, require('agents').providers())
  end,
})

command('AgentsList', function()
  require('agents').list()
end, { nargs = 0, desc = 'Pick a session to attach to' })

command('AgentsAttach', function(o)
  require('agents').attach(optional(o.args))
end, { nargs = '?', complete = complete_sessions, desc = 'Show a session in a buffer' })

command('AgentsSend', function(o)
  local opts = { source = vim.api.nvim_get_current_buf() }
  if o.range > 0 then
    opts.range = { buf = opts.source, first = o.line1, last = o.line2 }
  end
  require('agents').send(optional(o.args), nil, opts)
end, {
  nargs = '*',
  range = true,
  desc = 'Send a prompt (with a range: those lines as context; #buffer, @file expand)',
})

command('AgentsPrompt', function(o)
  require('agents').prompt(optional(o.args))
end, { nargs = '?', complete = complete_sessions, desc = 'Open the prompt buffer' })

command('AgentsSessions', function()
  require('agents').pick()
end, { nargs = 0, desc = 'Pick a session by its status (what needs you first)' })

command('AgentsDelete', function(o)
  require('agents').delete(optional(o.args), o.bang)
end, {
  nargs = '?',
  bang = true,
  complete = complete_sessions,
  desc = 'Delete a session and its history (! without asking)',
})

command('AgentsMode', function(o)
  require('agents').mode(optional(o.args))
end, { nargs = '?', desc = 'Pick the session mode (what the agent may do without asking)' })

command('AgentsModel', function(o)
  require('agents').model(optional(o.args))
end, { nargs = '?', desc = "Pick the session's model" })

command('AgentsEffort', function(o)
  require('agents').model(optional(o.args), nil, 'effort')
end, { nargs = '?', desc = "Pick the session's reasoning effort" })

command('AgentsCommand', function(o)
  local name, args = (o.args or ''):match('^/?(%S+)%s*(.*)$')
  require('agents').command(name, args ~= '' and args or nil)
end, { nargs = '*', desc = 'Run a command (compact, clear, the agent\'s own), or pick one' })

command('AgentsCompact', function()
  require('agents').command('compact')
end, { nargs = 0, desc = 'Compact the conversation to free context' })

command('AgentsInterrupt', function(o)
  require('agents').interrupt(optional(o.args))
end, { nargs = '?', complete = complete_sessions, desc = "Interrupt the session's turn" })

command('AgentsClose', function(o)
  require('agents').close(optional(o.args))
end, { nargs = '?', complete = complete_sessions, desc = "End the session's agent" })
