# fleet's framed batch (fleet/transport/batch.py): POSIX sh, run as `sh -c PROGRAM fleet-batch T1 LINE1 [T2 LINE2 ...]`
# with TAG, the first line of its stdin (never in argv: any user on the node may read /proc/PID/cmdline).
# Runs each LINE (one argv, quoted once by fleet with shlex.join) one after the other, each bounded on its own
# by `timeout -k 1 T`, its stdin empty. What each prints is framed on both streams: before section I, a line
# "TAG I" on stdout and on stderr; after it, "\nTAG I STATUS RAN" on stdout (its exit status, and the
# centiseconds it ran by /proc/uptime: empty where that cannot be read) and "\nTAG I" on stderr. TAG is random
# for every batch and only root (and fleet) ever sees it, so no output can forge a frame; no TAG on stdin:
# nothing is run, nothing framed (no answer). Sections run one at a time, so no two outputs interleave; a
# section that fails or prints garbage is its own answer and the next one still runs. A section that its
# `timeout` had to end (124; 137 once it ran its bound T, given as N.N: SIGTERM ignored, SIGKILL a second
# later: a wedged driver, a hung mount) ends the batch: the rest are not run, as a step stops at its first hung
# command. A 137 before T is a SIGKILL from elsewhere (the OOM killer): its own answer, the next one runs.
# Comment lines are dropped before sending.
IFS= read -r tag || exit 2
[ -n "$tag" ] || exit 2
i=0
while [ "$#" -ge 2 ]; do
  bound=$1; line=$2
  shift 2
  printf '%s %s\n' "$tag" "$i"
  printf '%s %s\n' "$tag" "$i" >&2
  read -r t0 _ 2>/dev/null </proc/uptime || t0=
  eval "timeout -k 1 $bound $line" </dev/null
  status=$?
  read -r t1 _ 2>/dev/null </proc/uptime || t1=
  ran=
  case $t0/$t1 in *.*/*.*) ran=$(((${t1%.*} - ${t0%.*}) * 100 + 1${t1#*.} - 1${t0#*.})) ;; esac
  printf '\n%s %s %s %s\n' "$tag" "$i" "$status" "$ran"
  printf '\n%s %s\n' "$tag" "$i" >&2
  case $status in
    124) break ;;
    137) [ -n "$ran" ] && [ "$ran" -lt $((${bound%.*} * 100 + ${bound#*.} * 10)) ] || break ;;
  esac
  i=$((i + 1))
done
