-- luacheck --config clients/nvim/.luacheckrc clients/nvim tests/clients/nvim
std = 'luajit'
globals = { 'vim' } -- vim.g, vim.b, vim.bo, vim.env... are written to
max_line_length = 100
self = false -- methods keep `self` for a uniform call style even where unused
