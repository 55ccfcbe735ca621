# fleet's identity-checked signal (fleet/node/probes/procs.py): POSIX sh, run as `sh -c PROGRAM fleet-signal
# SIG PID START EXE USER [PID START EXE USER ...]`. SIG is TERM or KILL, or "-" to only say who is alive.
# Each process is signalled only if it is still the one fleet judged: the same start time (/proc/PID/stat
# field 22, clock ticks since boot), the same executable (when one was recorded) and the same owner,
# checked right before the signal, in this one command. EXE comes as `printf %b` escapes (ASCII: fleet writes
# every byte outside [A-Za-z0-9/._+-] as \0ooo) and is compared byte for byte with the link's target as
# readlink prints it (a path that is not UTF-8, or holds newlines, is still itself). One line a process:
# "<verdict> <pid>" where
# verdict is sent | alive | gone (no such process, or a zombie whose threads are all gone) | changed (the pid is
# someone else now) | denied (kill refused). A process whose leader thread exited while another of its threads
# lives on is alive (it still holds its files and memory): it is judged through a live thread (its executable and
# owner), and kill(2) of its pid signals the whole process. Comment lines are dropped before the program is sent.
sig=$1
shift
while [ "$#" -ge 4 ]; do
  pid=$1; start=$2; exe=$3; owner=$4
  shift 4
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "gone $pid"; continue; }
  # after the comm (which ends at the last ") "): state is field 3, starttime field 22
  read -r state _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ now _ <<FIELDS
${stat##*") "}
FIELDS
  task=/proc/$pid
  if [ "$state" = Z ]; then
    task=
    for t in "/proc/$pid/task/"*; do
      tstat=$(cat "$t/stat" 2>/dev/null) || continue
      read -r tstate _ <<FIELDS
${tstat##*") "}
FIELDS
      if [ "$tstate" != Z ]; then task=$t; break; fi
    done
    if [ -z "$task" ]; then echo "gone $pid"; continue; fi
  fi
  if [ "$now" != "$start" ]; then echo "changed $pid"; continue; fi
  if [ -n "$exe" ]; then
    # both read with a trailing "x" so that command substitution keeps a path's own final newlines
    want=$(printf '%bx' "$exe"); want=${want%x}
    link=$(readlink "$task/exe" 2>/dev/null && echo x) || link=
    link=${link%x}; link=${link%?}
    if [ -z "$link" ] || [ "${link% (deleted)}" != "$want" ]; then echo "changed $pid"; continue; fi
  fi
  # the owner as the scan recorded it: a name, or the uid of a user without one (find's %u)
  case "$owner" in
    "$(stat -c %U "$task/fd" 2>/dev/null)" | "$(stat -c %u "$task/fd" 2>/dev/null)") ;;
    *) echo "changed $pid"; continue ;;
  esac
  if [ "$sig" = - ]; then
    echo "alive $pid"
  elif kill -s "$sig" "$pid" 2>/dev/null; then
    echo "sent $pid"
  else
    echo "denied $pid"
  fi
done
