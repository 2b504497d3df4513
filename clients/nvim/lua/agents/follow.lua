--- Following one session's journal: subscribe, catch up, stay live, resume.
---
--- Rule 1 (exactly once, in order): the follow remembers the last seq it handed on
--- (`last_seq`); an event at or below it is a duplicate and is dropped, so overlapping
--- subscriptions (a resubscribe racing an old one) never show anything twice.
---
--- Rule 2 (resume): after `agentSession.lagged`, or when the connection comes back
--- (a daemon restart), the follow subscribes again with `afterSeq = last_seq`; the
--- daemon replays what was missed from its journal, then goes live.
---
--- Rule 3: deltas are ephemeral and carry no seq; they are passed on as they come and
--- the consumer reconciles them by their offset (see `agents.transcript`).
---
--- Rule 4 (the end): `agentSession.ended` (the session was deleted) stops the follow
--- at once; nothing is resubscribed. A deletion it was not told of (it happened while
--- disconnected) shows as `session_not_found` when subscribing again, which stops
--- it the same way. Either way `gone` is called once and the client is let go.
---
--- A follow holds the client (it reconnects while any follow is active) and lets go
--- in `stop()`.

local M = {}

---@class agents.Follow
---@field client agents.Client
---@field session_id string
---@field last_seq integer
---@field subscription_id string|nil
---@field state string 'idle' | 'subscribing' | 'live' | 'stopped'
local Follow = {}
Follow.__index = Follow

--- Handlers (all optional, all run on the main loop):
--- `event(journal_event)`, `delta(params)`, `state(state, detail)` on every change of
--- `state`, and `gone(reason, err)` when the session no longer exists (the follow
--- stops; Rule 4): `reason` is the daemon's from `agentSession.ended` (`deleted`), or
--- `session_not_found` with the error `err` of the subscribe that found no session.
---@param client agents.Client
---@param session_id string
---@param handlers table
---@return agents.Follow
function M.new(client, session_id, handlers)
  return setmetatable({
    client = client,
    session_id = session_id,
    handlers = handlers,
    last_seq = 0,
    subscription_id = nil,
    state = 'idle',
    attempt = nil, -- identifies the subscribe request whose reply still matters
    offs = {},
  }, Follow)
end

function Follow:call(name, ...)
  local fn = self.handlers[name]
  if fn then
    fn(...)
  end
end

function Follow:set_state(state, detail)
  self.state = state
  self:call('state', state, detail)
end

--- Start following from `after_seq` (default 0: the whole journal).
---@param after_seq integer|nil
function Follow:start(after_seq)
  self.last_seq = after_seq or self.last_seq
  self.client:hold(self)
  table.insert(
    self.offs,
    self.client:on('notification', function(method, params)
      self:notification(method, params)
    end)
  )
  table.insert(
    self.offs,
    self.client:on('connect', function()
      self:subscribe()
    end)
  )
  table.insert(
    self.offs,
    self.client:on('disconnect', function(reason)
      if self.state ~= 'stopped' then
        self.subscription_id, self.attempt = nil, nil
        self:set_state('idle', reason)
      end
    end)
  )
  self:subscribe()
end

--- Subscribe after `last_seq` unless a subscription is live or being made.
function Follow:subscribe()
  if self.state == 'stopped' or self.state == 'subscribing' or self.state == 'live' then
    return
  end
  local attempt = {}
  self.attempt = attempt
  self:set_state('subscribing')
  local params = { sessionId = self.session_id, afterSeq = self.last_seq }
  self.client:request('agentSession.subscribe', params, function(err, result)
    if self.attempt ~= attempt then
      -- Superseded (stopped, or the connection dropped meanwhile).
      if result and self.state == 'stopped' then
        self:unsubscribe(result.subscriptionId)
      end
      return
    end
    self.attempt = nil
    if not err then
      self.subscription_id = result.subscriptionId
      self:set_state('live')
      return
    end
    local kind = err.data and err.data.kind
    if kind == 'session_not_found' then
      self:stop()
      self:call('gone', 'session_not_found', err)
    elseif kind == 'disconnected' or kind == 'daemon_unreachable' then
      -- The 'connect' handler subscribes again once the daemon is back.
      self:set_state('idle', err.message)
    else
      self:set_state('idle', err.message)
      require('agents.rpc').notify_error('following session ' .. self.session_id, err)
    end
  end)
end

function Follow:unsubscribe(subscription_id)
  if subscription_id and self.client:is_connected() then
    self.client:request('agentSession.unsubscribe', { subscriptionId = subscription_id })
  end
end

---@param method string
---@param params table
function Follow:notification(method, params)
  if params.sessionId ~= self.session_id or self.state == 'stopped' then
    return
  end
  if method == 'agentSession.event' then
    local event = params.event
    if type(event) ~= 'table' or type(event.seq) ~= 'number' or event.seq <= self.last_seq then
      return -- Rule 1
    end
    self.last_seq = event.seq
    self:call('event', event)
  elseif method == 'agentSession.delta' then
    self:call('delta', params)
  elseif method == 'agentSession.lagged' then
    if params.subscriptionId == self.subscription_id then
      -- The daemon ended that subscription; resume from what we have (Rule 2).
      self.subscription_id = nil
      self:set_state('idle', 'lagged')
      self:subscribe()
    end
  elseif method == 'agentSession.ended' then
    -- Whichever subscription it names, the session is gone; the daemon has ended
    -- its subscriptions already, so there is nothing to unsubscribe (Rule 4).
    self.subscription_id = nil
    self:stop()
    self:call('gone', tostring(params.reason or 'deleted'))
  end
end

--- Stop following (idempotent): unsubscribe and release the client.
function Follow:stop()
  if self.state == 'stopped' then
    return
  end
  local subscription_id = self.subscription_id
  self.subscription_id, self.attempt = nil, nil
  self:set_state('stopped')
  for _, off in ipairs(self.offs) do
    off()
  end
  self.offs = {}
  self:unsubscribe(subscription_id)
  self.client:release(self)
end

return M
