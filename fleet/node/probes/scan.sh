# fleet's holder scan (fleet/node/probes/procs.py): POSIX sh with GNU find and grep, run as
# `sh -c PROGRAM fleet-scan MAPS_RE GLOB...` (as root: reading other users' tables and map_files needs it).
# The start points are every thread's file table (/proc/PID/task/TID/fd: the shell lists /proc and each task
# folder, never a thread's other entries) and the map_files folder of each process whose maps has a line MAPS_RE
# matches (a superset of the globs: the links there are what the globs judge). A grep that could not run, or could not
# read MAPS_RE (not 0, 1, or 2 for a process that ended while it read) ends the scan with exit 3: never "no mapping".
# One record a hit, a table it may not read, and /proc/1's first thread, each ended by NUL (procs.py says which).
# Comment lines are dropped before the program is sent.
re=$1
shift
globs=$#
# grep's 2 is also a pattern it could not read: asked once of nothing first, so that 2 below is only a process that
# ended while it read
grep -E -q -e "$re" </dev/null; [ $? -eq 1 ] || exit 3
maps=$(grep -l -E -e "$re" /proc/[0-9]*/maps 2>/dev/null)
[ $? -le 2 ] || exit 3
set -- "$@" /proc/[0-9]*/task/[0-9]*/fd
for m in $maps; do set -- "$@" "${m%/maps}/map_files"; done
set -- "$@" -maxdepth 1 "(" "(" -path "/proc/*/fd/*" -o -path "/proc/*/map_files/*" ")" "("
while [ "$globs" -gt 0 ]; do
  set -- "$@" -lname "$1" -o
  shift
  globs=$((globs - 1))
done
exec find "$@" -false ")" -printf '%u\t%p\t%l\0' ")" -o "(" -path "/proc/*/fd/*" -o -path "/proc/*/map_files/*" ")" \
  -o "(" -readable -o -printf 'unreadable\t%u\t%p\0' -prune ")" "(" -path /proc/1/task/1/fd -printf 'init\0' -o -true ")"
