# fleet's Xid summary (fleet/node/probes/kernel_log.py): POSIX awk only (mawk, gawk, busybox), read-only, run with
# LC_ALL=C (bytes). Fed `journalctl -a -o short-unix --show-cursor` and, last, the line "fleet-journalctl-exit
# STATUS" (kernel_log.sh). An entry is a line that starts with its timestamp and the lines after it that start
# with a space (journalctl indents a message's further lines to its first line's prefix): the entry's message is
# its lines joined by newlines, each further line less that indent. An Xid entry's message starts "NVRM: Xid (" (a
# name the kernel prints inside another message, a thread's or a process's, cannot make one). Its group:
# the address between "NVRM: Xid (" and "): ", the code after it, and the pid of a ", pid=N" right after the code
# ("-" when there is none, as in pid='<unknown>'); an address and code keep at most `pids` pids apart, the lines
# of any further pid go to one group whose pid is "*". At most `groups` groups are kept; the lines of any further
# group are only counted (lost). Each entry kept is cut at `width` bytes, then every byte outside printable ASCII
# and every backslash is written \xNN (so a thread name comes back as the kernel wrote it, whatever its bytes).
# So the output is bounded whatever the boot logged: a storm of one Xid is one group. An entry journalctl could not
# print ("[N blob data]", what it prints without -a) or a further line with no entry before it is counted as
# unread: the read is then no answer.
# Prints, per group in the order first met, "first COUNT PID LINE" and, when COUNT > 1, "last COUNT PID LINE";
# then journalctl's "-- cursor: ..." line, when it printed one; then "end STATUS XIDLINES LOSTLINES UNREAD".
# Exits with journalctl's status (125 when its status line never came: the read was cut).
# Comment lines are dropped before the program is sent.
BEGIN {
  pids = 8; groups = 256; width = 512; status = ""; kept = 0; seen = 0; lost = 0; unread = 0; cursor = ""; entry = ""
  for (i = 1; i < 256; i++) code_of[sprintf("%c", i)] = i
}
function escaped(s,    out, i, c, n) {
  out = ""
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1); n = code_of[c]
    out = out ((n < 32 || n > 126 || n == 92) ? sprintf("\\x%02x", n) : c)
  }
  return out
}
function flush(    rest, cut, addr, code, pid, tail, where, key, line) {
  if (entry == "") return
  line = entry; entry = ""
  if (line ~ /^[0-9]+\.[0-9]+ [^ ]* [^ ]*: \[[0-9.]+[KMGTPE]?B blob data\]$/) { unread++; return }
  if (substr(line, indent + 1, 11) != "NVRM: Xid (") return
  seen++
  rest = substr(line, indent + 12)
  cut = index(rest, "): ")
  addr = "?"; code = "?"; pid = "-"
  if (cut > 0) {
    addr = substr(rest, 1, cut - 1)
    tail = substr(rest, cut + 3)
    if (match(tail, /^[0-9]+/)) code = substr(tail, 1, RLENGTH)
    if (match(tail, /^[0-9]+, pid=[0-9]+/)) { pid = substr(tail, 1, RLENGTH); sub(/^[0-9]+, pid=/, "", pid) }
  }
  where = addr SUBSEP code
  key = where SUBSEP pid
  if (!(key in count) && pid != "-") {
    if (npids[where] >= pids) { pid = "*"; key = where SUBSEP pid } else npids[where]++
  }
  if (!(key in count)) {
    if (kept >= groups) { lost++; return }
    order[++kept] = key; first[key] = escaped(substr(line, 1, width)); pidof[key] = pid
  }
  count[key]++
  last[key] = escaped(substr(line, 1, width))
}
/^fleet-journalctl-exit [0-9]+$/ { flush(); status = $2; next }
/^-- cursor: / { flush(); cursor = $0; next }
/^ / {
  if (entry == "") { unread++; next }
  if (length(entry) <= width) entry = entry "\n" substr($0, indent + 1)
  next
}
{ flush(); entry = $0; indent = index($0, ": ") + 1 }
END {
  flush()
  for (i = 1; i <= kept; i++) {
    k = order[i]
    print "first " count[k] " " pidof[k] " " first[k]
    if (count[k] > 1) print "last " count[k] " " pidof[k] " " last[k]
  }
  if (cursor != "") print cursor
  print "end " (status == "" ? "-" : status) " " seen " " lost " " unread
  exit (status == "" ? 125 : status + 0)
}
