" Highlighting of agents.nvim session buffers (filetype "agents").
if exists('b:current_syntax')
  finish
endif

syntax match agentsHeader /\%1l.*/
syntax match agentsKeys /^keys: .*/
syntax match agentsPrompt /^> .*/
syntax match agentsTool /^\[tool\] .*/
syntax match agentsApproval /^\[approval\] .*/
syntax match agentsPending /^  pending: .*/
syntax match agentsDecision /^  -> .*/
syntax match agentsError /^\[agent error\] .*/
syntax match agentsNotice /^\[\(turn\|agent exited\|not delivered\|delivery unknown\|truncated\|the session\|session deleted\).*\]$/

highlight default link agentsHeader Title
highlight default link agentsKeys Comment
highlight default link agentsPrompt Question
highlight default link agentsTool Function
highlight default link agentsApproval WarningMsg
highlight default link agentsPending WarningMsg
highlight default link agentsDecision Special
highlight default link agentsError ErrorMsg
highlight default link agentsNotice Comment

let b:current_syntax = 'agents'
