# fleet's holder scan (fleet/node/probes/procs.py): POSIX sh with GNU find, grep and stat, run as
# `sh -c PROGRAM fleet-scan MAPS_RE DEVICES GLOB...` (as root: reading other users' tables and map_files needs it).
# A file is a GPU device by what it is, never by the text of its path: the files the globs name are looked at first
# (a character device by its number, major:minor; any other file by its inode, st_dev:st_ino), and the majors of
# the driver whose devices they are (every character major DEVICES, /proc/devices, names nvidia or nvidia-*, when a
# named device has one of them) count whole. So a bind mount, a copy made with mknod, a path in another mount
# namespace is still the device.
# The start points are every thread's file table (/proc/PID/task/TID/fd: the shell lists /proc and each task
# folder, never a thread's other entries) and the map_files folder of each process whose maps has a line that
# MAPS_RE, or a named device's st_dev and inode, matches (a superset: what is there is judged as any fd is).
# An entry whose link text a glob matches is a hit as it is; any other entry that is a character device (or, when a
# named device is not one, a regular file) goes to stat, in batches, and is a hit when it is a named device or of
# a driver major. A grep, stat or /proc/devices read that could not run ends the scan with exit 3, or prints
# `failed`: never "no holder".
# One record a hit, a named device, a table it may not read, and /proc/1's first thread, each ended by NUL and
# begun by its kind (procs.py says which). Comment lines are dropped before the program is sent.
re=$1
devs=$2
shift 2
globs=$*
# grep's 2 is also a pattern it could not read: asked once of nothing first, so that 2 below is only a process that
# ended while it read
grep -E -q -e "$re" </dev/null; [ $? -eq 1 ] || exit 3
# the named devices: the files the globs match (a glob holds no blank: procs.py refuses one), in the positional
# parameters; one stat of them all, a line each in their order (mode|rdev|dev:inode: the raw mode, major and minor
# in hex; S_IFCHR is 8192), and a record each (`id<TAB>MODE<TAB>c<major>:<minor><TAB>i<st_dev>:<st_ino><TAB>PATH`).
# A file gone between the glob and the stat (a driver reloading) ends the scan: its lines no longer say whose.
set -f
# shellcheck disable=SC2086 # one word a glob
set -- $globs
set +f
for g; do
  shift
  IFS=
  for f in $g; do [ -e "$f" ] && set -- "$@" "$f"; done
  unset IFS
done
ids=
tokens=
chars=
where=
if [ "$#" -gt 0 ]; then
  lines=$(stat -L -c '%f|%t:%T|%d:%i' -- "$@" 2>/dev/null) || exit 3
  {
    for f; do
      IFS='|' read -r mode rdev ino <&3 && [ -n "$ino" ] || exit 3
      printf 'id\t%s\tc%s\ti%s\t%s\0' "$mode" "$rdev" "$ino" "$f"
      d=${ino%%:*}
      where="$where $(((d >> 8 & 4095) | (d >> 32 & ~4095))) $((d & 255 | (d >> 12 & ~255))) ${ino#*:}"
      if [ $((0x$mode & 61440)) -eq 8192 ]; then
        ids="$ids c$rdev"
        chars="$chars m${rdev%%:*}"
        tokens="$tokens|^c$rdev "
      else
        ids="$ids i$ino"
        tokens="$tokens| i$ino "
      fi
    done
  } 3<<LINES
$lines
LINES
fi
# the driver's majors, whole, when a named character device is the driver's
if [ -n "$chars" ]; then
  [ -r "$devs" ] || exit 3
  section=
  driver=
  while read -r major name; do
    case $major in Character) section=c; continue ;; Block) section= ;; esac
    [ "$section" = c ] || continue
    case $name in nvidia | nvidia-*) driver="$driver $major" ;; esac
  done <"$devs"
  if [ -n "$driver" ]; then
    majors=$(printf ' m%x' $driver)
    for m in $chars; do
      case "$majors " in *" $m "*) ids="$ids$majors" tokens="$tokens$(printf '|^c%x:' $driver)"; break ;; esac
    done
  fi
fi
[ -z "$where" ] || re="$re$(printf '|[[:space:]]%02x:%02x %s[[:space:]]' $where)"
maps=$(grep -l -E -e "$re" /proc/[0-9]*/maps 2>/dev/null)
[ $? -le 2 ] || exit 3
case $ids in *" c"*) candidates="-xtype c" ;; *) candidates= ;; esac
case $ids in *" i"*) candidates="${candidates:+$candidates -o }-xtype f" ;; esac
set -f
# shellcheck disable=SC2086 # one word a glob
set -- $globs
set +f
globs=$#
set -- "$@" /proc/[0-9]*/task/[0-9]*/fd
for m in $maps; do set -- "$@" "${m%/maps}/map_files"; done
set -- "$@" -maxdepth 1 "(" "(" -path "/proc/*/fd/*" -o -path "/proc/*/map_files/*" ")" "(" "("
while [ "$globs" -gt 0 ]; do
  set -- "$@" -lname "$1" -o
  shift
  globs=$((globs - 1))
done
set -- "$@" -false ")" -printf 'hit\t%u\t%p\t%l\0'
# the filter: each batch's identities by one stat, the hits picked by one grep; a stat or grep that could not run
# prints `failed`
[ -z "$candidates" ] || set -- "$@" -o "(" $candidates ")" -exec sh -c '
ids=$1
tokens=$2
shift 2
out=$(stat -L -c "c%t:%T i%d:%i %n" -- "$@" 2>/dev/null)
[ $? -le 1 ] || { printf "failed\0"; exit 0; }
hits=$(printf "%s\n" "$out" | grep -E -e "$tokens")
[ $? -le 1 ] || { printf "failed\0"; exit 0; }
[ -n "$hits" ] || exit 0
while read -r c i p; do
  m=${c%%:*}
  case "$ids " in
    *" $c "* | *" m${m#c} "*) token=$c ;;
    *" $i "*) token=$i ;;
    *) continue ;;
  esac
  u=$(stat -c "%U %u" -- "$p" 2>/dev/null) || continue
  case $u in "UNKNOWN "*) u=${u#* } ;; *) u=${u%% *} ;; esac
  printf "dev\t%s\t%s\t%s\0" "$u" "$p" "$token"
done <<EOF
$hits
EOF
' fleet-identity "$ids" "${tokens#|}" "{}" +
# find's own complaints, one line an entry it could not read (a node whose pid 1 keeps thousands of descriptors
# from root makes 700 KB of them), reach stderr as their first 20 lines and a count of the rest: awk reads them all
# (find is never cut short by a closed pipe); the records on stdout are untouched, and find's status is the scan's.
exec 4>&1
status=$({ { find "$@" -o -true ")" ")" -o "(" -readable -o -printf 'unreadable\t%u\t%p\0' -prune ")" \
  "(" -path /proc/1/task/1/fd -printf 'init\0' -o -true ")" 2>&1 1>&4 4>&- 3>&-; echo "$?" >&3; } |
  awk 'NR <= 20 { print; next } END { if (NR > 20) print "fleet-scan: " NR - 20 " more lines of find'"'"'s not kept" }' \
    >&2 3>&- 4>&-; } 3>&1)
exit "${status:-3}"
