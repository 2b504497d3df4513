--- Unit checks of the plugin's sans-IO modules (codec, transcript, option picking),
--- run inside headless Neovim by tests/clients/test_nvim.py. `run()` returns the
--- failures as strings; an empty list means every check passed.

local codec = require('agents.codec')
local transcript = require('agents.transcript')

local M = {}

local failures

local function check(cond, what)
  if not cond then
    table.insert(failures, what)
  end
end

local function eq(got, want, what)
  check(
    vim.deep_equal(got, want),
    string.format('%s: got %s, want %s', what, vim.inspect(got), vim.inspect(want))
  )
end

--- Every way of cutting a stream into two chunks, and byte by byte, gives the same
--- messages (the codec's Rule 2).
local function codec_rechunking()
  local messages = {
    { jsonrpc = '2.0', id = 1, result = { text = 'héllo ✓', n = 3 } },
    { jsonrpc = '2.0', method = 'agentSession.delta', params = { text = '\r\n\r\n' } },
    { jsonrpc = '2.0', id = 2, result = vim.NIL },
  }
  local stream = ''
  for _, m in ipairs(messages) do
    -- Stray whitespace between frames is tolerated.
    stream = stream .. codec.encode(m) .. (m.id == 2 and '' or '\r\n')
  end
  local want = {
    { jsonrpc = '2.0', id = 1, result = { text = 'héllo ✓', n = 3 } },
    { jsonrpc = '2.0', method = 'agentSession.delta', params = { text = '\r\n\r\n' } },
    { jsonrpc = '2.0', id = 2 }, -- null decodes to nil
  }
  local function decode(chunks)
    local d = codec.decoder()
    local out = {}
    for _, chunk in ipairs(chunks) do
      d:feed(chunk)
      while true do
        local m, err = d:next()
        if err then
          return { err = err }
        end
        if not m then
          break
        end
        table.insert(out, m)
      end
    end
    return out
  end
  for cut = 0, #stream do
    eq(decode({ stream:sub(1, cut), stream:sub(cut + 1) }), want, 'codec cut at ' .. cut)
  end
  local bytes = {}
  for i = 1, #stream do
    bytes[i] = stream:sub(i, i)
  end
  eq(decode(bytes), want, 'codec byte by byte')
  local header =
    'content-length: 2\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{}'
  eq(decode({ header }), { {} }, 'codec header names are case-insensitive')
  for _, garbage in ipairs({
    'Content-Length: x\r\n\r\n',
    'X-Other: 1\r\n\r\n',
    'Content-Length: 3\r\n\r\nabc',
  }) do
    local got = decode({ garbage })
    check(got.err ~= nil, 'codec should refuse ' .. vim.inspect(garbage))
  end
end

local function message_text(t)
  for _, e in ipairs(t.entries) do
    if e.kind == 'message' then
      return transcript.item_text(e)
    end
  end
end

--- Deltas and snapshots reconcile by character offset, whatever order they take.
local function transcript_streaming()
  local t = transcript.new('s1')
  t:apply({ seq = 1, kind = 'item.started', body = { itemId = 'm', type = 'agentMessage' } })
  t:delta('m', 0, 'hé')
  t:delta('m', 2, 'llo ')
  eq(message_text(t), 'héllo ', 'deltas append')
  t:apply({ seq = 2, kind = 'item.updated', body = { itemId = 'm', text = 'héllo wö' } })
  eq(message_text(t), 'héllo wö', 'a longer snapshot replaces')
  t:delta('m', 6, 'wörld') -- overlaps the snapshot by two characters (one of them two bytes)
  eq(message_text(t), 'héllo wörld', 'a delta overlapping the snapshot is trimmed')
  t:delta('m', 0, 'hé') -- a replay of what was seen
  t:apply({ seq = 3, kind = 'item.updated', body = { itemId = 'm', text = 'héllo' } })
  eq(message_text(t), 'héllo wörld', 'old snapshots and deltas change nothing')
  t:apply({
    seq = 4,
    kind = 'item.completed',
    body = { itemId = 'm', type = 'agentMessage', text = 'final\ntext' },
  })
  t:delta('m', 11, 'late')
  eq(message_text(t), 'final\ntext', 'the completed text is final')
  local lines = t:lines()
  check(
    vim.tbl_contains(lines, 'final') and vim.tbl_contains(lines, 'text'),
    'message lines split on newlines'
  )

  -- Offsets count code points: a four-byte character is one.
  local e = transcript.new('s3')
  e:apply({ seq = 1, kind = 'item.updated', body = { itemId = 'm', text = 'a😀b' } })
  e:delta('m', 2, 'bc😀')
  eq(message_text(e), 'a😀bc😀', 'a delta after a four-byte character')

  -- A delta first, with no item.started (a live-only subscription).
  local u = transcript.new('s2')
  u:delta('x', 0, 'abc')
  eq(message_text(u), 'abc', 'an unknown item is created by its first delta')
end

--- flush returns only what changed, from the first changed line to the end.
local function transcript_flush()
  local t = transcript.new('s1', { hint = 'keys' })
  local start, lines = t:flush()
  eq(start, 0, 'first flush starts at 0')
  eq(lines, { 'agents session s1', 'keys', '' }, 'header lines')
  eq({ t:flush() }, {}, 'nothing changed')
  t:apply({ seq = 1, kind = 'submission', body = { clientMessageId = 'c1', text = 'hi\nthere' } })
  start, lines = t:flush()
  eq(start, 3, 'a new entry starts after the header')
  eq(lines, { '> hi', '> there', '' }, 'prompt lines')
  t:apply({
    seq = 2,
    kind = 'approval.requested',
    body = {
      approvalId = 'ap',
      title = 'Run it',
      detail = 'why',
      options = { 'accept', 'decline' },
    },
  })
  t:flush()
  eq(#t:pending_approvals(), 1, 'one pending approval')
  check(t:entry_at(6) and t:entry_at(6).kind == 'approval', 'entry_at finds the approval')
  t:apply({
    seq = 3,
    kind = 'submission.dispatched',
    body = { clientMessageId = 'c1', outcome = 'rejected', reason = 'no agent' },
  })
  t:apply({
    seq = 4,
    kind = 'approval.resolved',
    body = { approvalId = 'ap', decision = 'accept', by = 'client' },
  })
  start, lines = t:flush()
  eq(start, 3, 'an earlier change re-renders from its entry')
  eq(lines, {
    '> hi',
    '> there',
    '[not delivered: no agent]',
    '',
    '[approval] Run it',
    '  why',
    '  -> accept (by client)',
    '',
  }, 'later entries follow')
  eq(#t:pending_approvals(), 0, 'no pending approval')
end

--- Items other than agent messages: one header line, then their output, cut short.
local function transcript_items()
  local t = transcript.new('s1')
  t:apply({ seq = 1, kind = 'item.started', body = { itemId = 'u', type = 'userMessage' } })
  t:apply({ seq = 2, kind = 'item.started', body = { itemId = 'c', type = 'commandExecution' } })
  t:apply({
    seq = 3,
    kind = 'item.completed',
    body = {
      itemId = 'c',
      type = 'commandExecution',
      command = 'make test',
      status = 'completed',
      exitCode = 2,
      output = {
        text = table.concat({ '1', '2', '3', '4', '5', '6', '7', '8', '9', '10' }, '\n') .. '\n',
        byteLength = 21,
        truncated = false,
      },
    },
  })
  t:apply({
    seq = 4,
    kind = 'item.completed',
    body = {
      itemId = 'f',
      type = 'fileChange',
      status = 'completed',
      changes = { { path = 'a.py' }, { path = 'b.py' } },
    },
  })
  t:apply({
    seq = 5,
    kind = 'item.completed',
    body = {
      itemId = 'r',
      type = 'toolCall',
      name = 'Read',
      input = { file_path = '/x/y.lua' },
      status = 'failed',
    },
  })
  t:apply({
    seq = 6,
    kind = 'turn.plan',
    body = {
      turnId = 't',
      explanation = 'Steps',
      plan = { { step = 'one', status = 'completed' }, { step = 'two', status = 'inProgress' } },
    },
  })
  t:apply({ seq = 7, kind = 'agent.warning', body = { message = 'careful' } })
  t:apply({ seq = 8, kind = 'some.future.kind', body = { x = 1 } })
  local _, lines = t:flush()
  eq(vim.list_slice(lines, 3), {
    '[command] make test (completed, exit 2)',
    '  1',
    '  2',
    '  3',
    '  4',
    '  5',
    '  6',
    '  7',
    '  8',
    '  ... 2 more lines',
    '',
    '[edit] a.py, b.py (completed)',
    '',
    '[tool] Read: /x/y.lua (failed)',
    '',
    '[plan] Steps',
    '  [x] one',
    '  [>] two',
    '',
    '[agent warning] careful',
    '',
  }, 'item lines (no entry for the userMessage or the unknown kind)')
end

local function option_picking()
  local pick = require('agents.view').pick_option
  eq(pick({ 'accept', 'decline' }, { 'decline', 'deny' }), 'decline', 'decline')
  eq(pick({ 'allow', 'deny' }, { 'accept', 'allow' }), 'allow', 'allow')
  eq(
    pick({ 'acceptForSession', 'accept' }, { 'accept' }),
    'acceptForSession',
    'first match in option order'
  )
  eq(pick({ 'maybe' }, { 'accept' }), nil, 'no match')
  eq(pick({ 'Node.js', 'No tests', 'decline' }, { 'decline', 'no' }), 'decline', 'word order')
  eq(pick({ 'Node.js', 'deny' }, { 'no', 'deny' }), 'deny', 'a word that only starts like no')
end

local function socket_path()
  local config = require('agents.config')
  local saved = { vim.g.agents_socket, vim.env.AGENTSD_SOCKET, vim.env.XDG_RUNTIME_DIR }
  vim.g.agents_socket = nil
  vim.env.AGENTSD_SOCKET = '/tmp/from-env.sock'
  eq(config.socket_path(), '/tmp/from-env.sock', '$AGENTSD_SOCKET')
  vim.env.AGENTSD_SOCKET = nil
  vim.env.XDG_RUNTIME_DIR = '/run/user/7'
  eq(config.socket_path(), '/run/user/7/agentsd/agentsd.sock', '$XDG_RUNTIME_DIR default')
  vim.g.agents_socket = '/tmp/from-g.sock'
  eq(config.socket_path(), '/tmp/from-g.sock', 'vim.g.agents_socket wins')
  vim.g.agents_socket, vim.env.AGENTSD_SOCKET, vim.env.XDG_RUNTIME_DIR =
    saved[1], saved[2], saved[3]
end

--- A failed agent's stderr tail and a superseded conversation show as notices.
local function transcript_exit_and_supersede()
  local t = transcript.new('s1')
  t:apply({
    seq = 1,
    kind = 'thread.superseded',
    body = { previousHandle = 'th-1', handle = 'th-2', reason = 'never saved' },
  })
  t:apply({
    seq = 2,
    kind = 'child.exited',
    body = { cause = 'failed', returncode = 1, stderrTail = 'warming up\n\nError: bad flag\n' },
  })
  eq(t:lines(), {
    'agents session s1',
    '',
    '[new conversation th-2 in place of th-1: never saved]',
    '',
    '[agent exited: failed, code 1]',
    '',
    '[its stderr ends]',
    '  | warming up',
    '  | Error: bad flag',
    '',
  }, 'exit and supersede lines')
end

--- The edits a tool item made, for the diff review (render.edits).
local function edits_of_tool_items()
  local edits = require('agents.render').edits
  eq(
    edits({
      type = 'fileChange',
      changes = {
        {
          path = '/w/a.py',
          kind = 'update',
          diff = { text = '@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n@@ -9 +9 @@\n-x\n+y\n' },
        },
        { path = '/w/new.txt', kind = 'add', diff = { text = 'hello\n' } },
      },
    }),
    {
      { path = '/w/a.py', old = 'two\nthree\nfour\n...\nx', new = 'two\nTHREE\nfour\n...\ny' },
      { path = '/w/new.txt', new = 'hello\n' },
    },
    'a codex file change'
  )
  eq(
    edits({
      type = 'toolCall',
      name = 'Edit',
      input = { file_path = '/w/b.py', old_string = 'a = 1', new_string = 'a = 2' },
    }),
    { { path = '/w/b.py', old = 'a = 1', new = 'a = 2' } },
    "claude's Edit"
  )
  eq(edits({ type = 'toolCall', name = 'Bash', input = { command = 'ls' } }), {}, 'no edit')
end

--- #buffer and @file mentions become context blocks after the text.
local function prompt_mentions()
  local prompt = require('agents.prompt')
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir, 'p')
  vim.fn.writefile({ 'print(1)' }, dir .. '/a.py')
  local buf = vim.api.nvim_create_buf(true, false)
  vim.api.nvim_buf_set_name(buf, dir .. '/b.lua')
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { 'local x = 1', 'return x' })
  local text = prompt.expand('fix @' .. dir .. '/a.py using #buffer, mail me@host', buf)
  eq(
    text,
    'fix '
      .. dir
      .. '/a.py using the buffer '
      .. dir
      .. '/b.lua, mail me@host\n\n'
      .. '<context uri="file://'
      .. dir
      .. '/b.lua">\nlocal x = 1\nreturn x\n</context>\n\n'
      .. '<context uri="file://'
      .. dir
      .. '/a.py">\nprint(1)\n</context>',
    'mentions expanded'
  )
  eq(prompt.expand('see @no/such/file', buf), 'see @no/such/file', 'a mention of nothing')
  eq(
    prompt.selection(buf, 2, 2),
    '<context uri="file://' .. dir .. '/b.lua" lines="2-2">\nreturn x\n</context>',
    'a selection'
  )
  vim.api.nvim_buf_delete(buf, { force = true })
  vim.fn.delete(dir, 'rf')
end

--- A prompt in the middle of a streaming message splits it (transcript Rule 3).
local function transcript_prompt_mid_turn()
  local t = transcript.new('s1')
  t:apply({ seq = 1, kind = 'submission', body = { clientMessageId = 'm1', text = 'first' } })
  t:apply({ seq = 2, kind = 'item.started', body = { itemId = 'i', type = 'agentMessage' } })
  t:delta('i', 0, 'Hello ')
  t:apply({ seq = 3, kind = 'submission', body = { clientMessageId = 'm2', text = 'second' } })
  t:delta('i', 0, 'Hello wor') -- overlaps what the first entry shows
  t:delta('i', 9, 'ld')
  t:apply({ seq = 4, kind = 'item.completed', body = { itemId = 'i', type = 'agentMessage', text = 'Hello world!' } })
  eq(t:lines(), {
    'agents session s1',
    '',
    '> first',
    '',
    'Hello ',
    '',
    '> second',
    '',
    'world!',
    '',
  }, 'the reply after the prompt')
end

function M.run()
  failures = {}
  for name, fn in pairs({
    codec_rechunking = codec_rechunking,
    transcript_streaming = transcript_streaming,
    transcript_flush = transcript_flush,
    transcript_items = transcript_items,
    transcript_exit_and_supersede = transcript_exit_and_supersede,
    option_picking = option_picking,
    socket_path = socket_path,
    edits_of_tool_items = edits_of_tool_items,
    prompt_mentions = prompt_mentions,
    transcript_prompt_mid_turn = transcript_prompt_mid_turn,
  }) do
    local ok, err = pcall(fn)
    if not ok then
      table.insert(failures, name .. ' raised: ' .. tostring(err))
    end
  end
  return failures
end

return M
