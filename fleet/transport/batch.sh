# fleet's framed batch (fleet/transport/batch.py): POSIX sh, run as `sh -c PROGRAM fleet-batch T1 LINE1 [T2 LINE2 ...]`
# with TAG, the first line of its stdin (never in argv: any user on the node may read /proc/PID/cmdline).
# Runs each LINE (one argv, quoted once by fleet with shlex.join) one after the other, each bounded on its own
# by `timeout -k 1 T`, its stdin empty. What each prints is framed on both streams: before section I, a line
# "TAG I" on stdout and on stderr; after it, "\nTAG I STATUS" on stdout (its exit status) and "\nTAG I" on
# stderr. TAG is random for every batch and only root (and fleet) ever sees it, so no output can forge a frame;
# no TAG on stdin: nothing is run, nothing framed (no answer). Sections run one at a time, so no
# two outputs interleave; a section that fails or prints garbage is its own answer and the next one still
# runs. A section that its `timeout` had to end (124, 137: a wedged driver, a hung mount) ends the batch: the
# rest are not run, as a step stops at its first hung command. Comment lines are dropped before sending.
IFS= read -r tag || exit 2
[ -n "$tag" ] || exit 2
i=0
while [ "$#" -ge 2 ]; do
  bound=$1; line=$2
  shift 2
  printf '%s %s\n' "$tag" "$i"
  printf '%s %s\n' "$tag" "$i" >&2
  eval "timeout -k 1 $bound $line" </dev/null
  status=$?
  printf '\n%s %s %s\n' "$tag" "$i" "$status"
  printf '\n%s %s\n' "$tag" "$i" >&2
  case $status in 124 | 137) break ;; esac
  i=$((i + 1))
done
