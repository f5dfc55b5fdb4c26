-- pcall_errors.lua SECONDS: calls f(i) under pcall for SECONDS seconds; f
-- raises a Lua error for every third i, which LuaJIT unwinds through the
-- system unwinder with its own personality routine. Checks every result
-- and prints "ready" first, then "done OK ERRORS bad=B".
local secs = tonumber(arg[1]) or 5
local function f(i)
  if i % 3 == 0 then error("boom " .. i) end
  return i * 2
end
io.write("ready\n")
io.flush()
local ok, errors, bad = 0, 0, 0
local deadline = os.time() + secs
while os.time() < deadline do
  for i = 1, 20000 do
    local s, r = pcall(f, i)
    if s then
      ok = ok + 1
      if r ~= i * 2 then bad = bad + 1 end
    else
      errors = errors + 1
      if not tostring(r):find("boom " .. i, 1, true) then bad = bad + 1 end
    end
  end
end
io.write(string.format("done %d %d bad=%d\n", ok, errors, bad))
