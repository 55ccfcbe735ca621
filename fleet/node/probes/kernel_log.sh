# fleet's kernel-log read (fleet/node/probes/kernel_log.py): POSIX sh, read-only, run as
# `sh -c PROGRAM fleet-kernel-log AWK [CURSOR]`. journalctl prints this boot's kernel messages (all of them, or
# those after CURSOR) and the cursor of the last one; no --grep, so a journalctl built without pattern matching
# reads them too. The awk program AWK (xids.awk) keeps the Xid lines, summarised and bounded, and journalctl's
# cursor line. `-a`: every message as the bytes journald keeps (without it journalctl prints one that is not
# printable UTF-8, such as an Xid naming a thread whose name the kernel cut mid-character, as `[N blob data]`);
# awk reads them as bytes (LC_ALL=C). journalctl's exit status follows its output down the pipe, so the summary ends with it and the
# command exits with it: a read that did not run to its end never looks like one that did.
# Comment lines are dropped before the program is sent.
prog=$1
shift
if [ "$#" -gt 0 ]; then set -- "--after-cursor=$1"; fi
{ journalctl -k -b -a -o short-unix --no-pager --show-cursor "$@"; echo "fleet-journalctl-exit $?"; } |
  LC_ALL=C awk "$prog"
