# fleet's lineage walk (fleet/node/probes/lineage.py): POSIX awk only (mawk, gawk, busybox), read-only.
# Operands are where the walks start: "self" (this awk: its ancestors are fleet's own session), then
# each pid given. For each, read /proc/PID/stat, print "pid<TAB>ppid<TAB>starttime<TAB>comm" (starttime:
# field 22, clock ticks since boot: with the pid, who the process is) and go on with the
# parent, at most `depth` steps from each start. A process already read is not read or printed
# again: the walk goes on through its parent as read then (so a walk that meets another's chain
# still reaches the top, and one that met its own loop ends at `depth`). A walk ends at pid 0 (the
# top), at `depth`, or where a stat cannot be read (the process vanished): fleet tells a walk that
# reached the top from one that was cut by the last parent it names (fleet/node/probes/lineage.py).
# comm may hold spaces and parentheses, so it ends at the *last* ") "; it may hold newlines too (its owner
# chooses it), so a stat is read whole, and comm is printed escaped: every byte outside printable ASCII, and
# the backslash, as \ooo (run in the C locale: bytes, not characters). For "self", also print "self<TAB>pid".
# Comment lines are dropped before the program is sent.
function esc(s,    out, i, c) {
  out = ""
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c ~ /[!-~]/ && c != "\\") out = out c
    else out = out sprintf("\\%03o", byte[c])
  }
  return out
}
BEGIN {
  for (i = 1; i < 256; i++) byte[sprintf("%c", i)] = i
  for (i = 1; i < ARGC; i++) {
    pid = ARGV[i]
    for (step = 0; step < depth && pid != "0"; step++) {
      if (pid in parent) { pid = parent[pid]; continue }
      file = "/proc/" pid "/stat"; line = ""; n = 0
      while ((getline part < file) > 0) line = (n++ ? line "\n" : "") part
      close(file)
      if (!n || !match(line, /.*\) /)) break
      open = index(line, " ("); me = substr(line, 1, open - 1)
      split(substr(line, RLENGTH + 1), rest, " ")
      if (rest[2] !~ /^[0-9]+$/ || rest[20] !~ /^[0-9]+$/) break
      if (pid == "self") print "self\t" me
      parent[me] = rest[2]
      print me "\t" rest[2] "\t" rest[20] "\t" esc(substr(line, open + 2, RLENGTH - open - 3))
      pid = rest[2]
    }
  }
  exit
}
