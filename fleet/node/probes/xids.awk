# fleet's Xid summary (fleet/node/probes/kernel_log.py): POSIX awk only (mawk, gawk, busybox), read-only. Fed
# `journalctl -o short-unix --show-cursor` and, last, the line "fleet-journalctl-exit STATUS" (kernel_log.sh).
# An Xid line holds "NVRM: Xid (". Its group: the address between "NVRM: Xid (" and "): ", the code after it, and
# the pid of a ", pid=N" right after the code ("-" when there is none, as in pid='<unknown>'); an address and
# code keep at most `pids` pids apart, the lines of any further pid go to one group whose pid is "*". At most
# `groups` groups are kept; the lines of any further group are only counted (lost). Each line kept is cut at
# `width` characters. So the output is bounded whatever the boot logged: a storm of one Xid is one group.
# Prints, per group in the order first met, "first COUNT PID LINE" and, when COUNT > 1, "last COUNT PID LINE";
# then journalctl's "-- cursor: ..." line, when it printed one; then "end STATUS XIDLINES LOSTLINES".
# Exits with journalctl's status (125 when its status line never came: the read was cut).
# Comment lines are dropped before the program is sent.
BEGIN { pids = 8; groups = 256; width = 512; status = ""; kept = 0; seen = 0; lost = 0; cursor = "" }
/^fleet-journalctl-exit [0-9]+$/ { status = $2; next }
/^-- cursor: / { cursor = $0; next }
index($0, "NVRM: Xid (") == 0 { next }
{
  seen++
  rest = substr($0, index($0, "NVRM: Xid (") + 11)
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
    if (kept >= groups) { lost++; next }
    order[++kept] = key; first[key] = substr($0, 1, width); pidof[key] = pid
  }
  count[key]++
  last[key] = substr($0, 1, width)
}
END {
  for (i = 1; i <= kept; i++) {
    k = order[i]
    print "first " count[k] " " pidof[k] " " first[k]
    if (count[k] > 1) print "last " count[k] " " pidof[k] " " last[k]
  }
  if (cursor != "") print cursor
  print "end " (status == "" ? "-" : status) " " seen " " lost
  exit (status == "" ? 125 : status + 0)
}
