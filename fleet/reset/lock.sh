# fleet's reset lock (fleet/reset/lock.py): POSIX sh with coreutils' stat, run as
# `sh -c PROGRAM fleet-lock LOCK WAIT RUN OWNER` by the user that resets the node (root, with `become`).
# Nothing is opened until the lock's folder is known to be that user's own: a real folder (not a link), owned by
# it, mode 0700, created so when missing, and every folder above it (as the links resolve) owned by root or that
# user and writable by no one else (a sticky one, /tmp's mode 1777, excepted: no one else may replace what is in
# it). Then no other user can create, replace or link anything in it, nor in the path to it.
# The lock file must be a regular file of that user (created with O_EXCL when missing, never through a link);
# one of another user's, or one another user's process holds, fails at once (exit 77), naming the file, its
# owner and the holding pids. The holders: when /proc/locks has a lock on the file's inode, the pid it names if
# that process still has the file open, else every process with the file open (flock(1) on an fd exits, its
# shell holds on). A folder or file fleet must not use: exit 76; a folder this user may not create: exit 78.
# Then: flock on fd 9, at once when no one holds it (no scan); else the holders are looked for once (another
# user's: exit 77), then flock waits WAIT s (exit 75, the holders on stderr). The owner file is removed and written
# anew with O_EXCL (set -C), "locked" printed, and the lock held until EOF on stdin.
# Comment lines are dropped before the program is sent.
lock=$1 wait=$2 run=$3 owner=$4 dir=${1%/*}
me=$(id -u) || exit 76
refuse() { printf '%s\n' "$2" >&2; exit "$1"; }
holders() {
  pids=$(awk -v i=":$ino" '$2 != "->" && substr($6, length($6) - length(i) + 1) == i { print $5 }' /proc/locks)
  [ -n "$pids" ] || return 0
  pids=$(find -L /proc/[0-9]*/fd -maxdepth 1 -samefile "$lock" 2>/dev/null | awk -F/ -v self=$$ -v named=" $(echo $pids) " '
    $3 != self && !seen[$3]++ { all[++n] = $3; if (index(named, " " $3 " ")) own[++m] = $3 }
    END { for (k = 1; k <= (m ? m : n); k++) printf "/proc/%s ", (m ? own[k] : all[k]) }')
  [ -z "$pids" ] || stat -c '%n %u %U' $pids 2>/dev/null
}
[ -L "$dir" ] && refuse 76 "reset lock folder $dir is a symbolic link: fleet uses only a folder of its own"
# (a folder above that is missing: nothing to check, the lock's folder cannot be made, which says so below)
above=$(cd -P -- "${dir%/*}/" 2>/dev/null && pwd -P) || above=
while [ -n "$above" ]; do
  set -- $(stat -c '%u %a %U' -- "$above")
  case $1 in 0 | "$me") ;; *) refuse 76 "reset lock folder $dir: $above above it is owned by $3 (uid $1): its owner could replace the lock's folder" ;; esac
  [ $((0$2 & 022)) -eq 0 ] || [ $((0$2 & 01000)) -ne 0 ] || refuse 76 \
    "reset lock folder $dir: $above above it (mode $2) may be written by others: they could replace the lock's folder"
  [ "$above" = / ] && break
  above=${above%/*}; above=${above:-/}
done
# A refusal to create says as whom, and why (mkdir's or the shell's last words: "Permission denied", ...).
who="uid $me ($(id -un 2>/dev/null))"
last_words() { printf '%s\n' "$1" | sed -n '$s/.*: //p'; }
# A folder in a parent this user may not write to: exit 78 (not root, or sudo is needed), whatever the locale.
[ -e "$dir" ] || why=$(mkdir -m 0700 -- "$dir" 2>&1) || [ -d "$dir" ] || {
  [ ! -d "${dir%/*}/" ] || [ -w "${dir%/*}/" ] || refuse 78 "cannot create the reset lock folder $dir as $who: $(last_words "$why")"
  refuse 76 "cannot create the reset lock folder $dir as $who: $(last_words "$why")"; }
set -- $(stat -c '%u %a %U' -- "$dir")
[ "$1 $2" = "$me 700" ] && [ -d "$dir" ] && [ ! -L "$dir" ] || refuse 76 \
  "reset lock folder $dir (owner $3, uid $1, mode $2) must be a folder of uid $me's own, mode 0700, not a link"
if [ -L "$lock" ] || { [ -e "$lock" ] && [ ! -f "$lock" ]; }; then
  refuse 76 "reset lock $lock is not a regular file: $(stat -c %F -- "$lock")"
fi
[ -e "$lock" ] || why=$( (set -C; : > "$lock") 2>&1) || [ -f "$lock" ] ||
  refuse 76 "cannot create the reset lock $lock as $who: $(last_words "$why")"
set -- $(stat -c '%u %U %i' -- "$lock")
ino=$3
named() { echo "$1" | awk 'NF { n++; printf " pid %s (%s)", substr($1, 7), $3 } END { if (!n) printf " no process" }'; }
[ "$1" = "$me" ] || refuse 77 "reset lock $lock is owned by $2 (uid $1), not uid $me; held by:$(named "$(holders)")"
exec 9< "$lock" || refuse 76 "cannot open the reset lock $lock"
[ /dev/fd/9 -ef "$lock" ] || refuse 76 "reset lock $lock changed while it was opened"
if ! flock -n 9; then
  held=$(holders 9<&-)
  echo "$held" | awk -v me="$me" 'NF && $2 != me { f = 1 } END { exit !f }' &&
    refuse 77 "reset lock $lock (owner $2) is held by another user's process:$(named "$held")"
  flock -w "$wait" -E 75 9 || { status=$?; [ "$status" = 75 ] && echo "held by:$(named "$held")" >&2; exit "$status"; }
fi
rm -f -- "$owner" && (set -C; printf '%s\n' "$run" > "$owner") || refuse 76 "cannot write the lock's owner file $owner"
echo locked
exec cat >/dev/null
