#!/usr/bin/env bash
# Why this exists: proof that the README's commands work on a FRESH Debian machine (12 or 13), not
# only on one where things were installed by hand. It bootstraps a minimal Debian chroot once, and
# on every call runs, in a throw-away layer over it and in fresh clones of the checkout's committed
# HEAD (or REV), the runs FRESH_MACHINE_RUNS names (by default `bash scripts/test.sh` and then
# `CI=true bash .ci/run`), each as root with a clean environment, and reports each run's closing
# lines, wall time and exit code.
#
# Usage (as root): bash scripts/fresh_machine.sh [DIR [REV]]
#   DIR  the chroot (default: build/fresh-debian12, or build/fresh-debian13 for trixie, in this
#        checkout; must be git-ignored there). Bootstrapped once with debootstrap and then left as
#        bootstrapped; each call runs in a copy-on-write layer (DIR.run, an overlay over DIR), so
#        every call starts from the same fresh machine and the next call can skip the bootstrap.
#   REV  the commit to test (default HEAD); uncommitted changes are never tested.
# Environment: FRESH_MACHINE_SUITE: bookworm (Debian 12, the default) or trixie (Debian 13); the
#              host's debootstrap must know the suite (Debian 12's does).
#              FRESH_MACHINE_TORCH=2.14.1 makes the install runs' `pip install torch` take that
#              release (a pip constraint, PIP_CONSTRAINT, in the run's environment, as a user's
#              pip configuration would); by default it takes what pip picks, the newest.
#              FRESH_MACHINE_KEEP=1 keeps DIR.run (the used machine) after the call for a look;
#              by default it is removed (it holds virtualenvs with torch, about 15 GB).
#              FRESH_MACHINE_RUNS names the runs, in order (default "test ci"); a name may repeat
#              (a second run on the used machine, as a user's second call):
#                test     `bash scripts/test.sh` in the clone /root/graphed
#                demo     `bash scripts/demo.sh` in the same clone (so "demo test" times the tests
#                         after the demo, as a newcomer runs them)
#                ci       `CI=true bash .ci/run` in a clone of its own (what CI does)
#                install  the README's "Install into your environment" bash block, word for word
#                         (extracted from the clone's README.md), as root (a fresh Debian has no
#                         sudo, and none is faked), in a clone of its own, then a check that
#                         `python -m graphed` passes and the installed graphed has its CUDA backend
#                install-user  the same block as a user with sudo (this machine gets Debian's sudo
#                         package and a user "newcomer" who may use it without a password), in a
#                         clone in that user's home
#                none     only bootstraps DIR
# Outputs: DIR/../fresh-logs/debian12 (or debian13): debootstrap, base, and one log per run with
#          setup.sh's logs;
#          exit status 0 only when every run passed.
#
# What the fresh machine shares with the host: the Debian mirror the host's apt uses, and the
# host's pip configuration (its files, the files they name, and read-only binds of the local
# package directories they name), so that pip reaches the same package sources as on the host.
# Nothing else: what setup.sh (or the README's install block) does not install is not there.
set -euo pipefail

SUITE=${FRESH_MACHINE_SUITE:-bookworm}
RUN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# A bare "Debian with Python" as a user has it (a cloud image, a container): minbase plus the
# interpreter, git to clone the project and the CA certificates to reach https. Not its venv
# module (python3-venv), which such images lack too. Everything else (compilers, cmake,
# GoogleTest, clang, torch, ...) is the job of scripts/setup.sh or of the README's install block,
# and testing that is the point.
BASE_PACKAGES=(python3 git ca-certificates)

log() { printf '[fresh] %s\n' "$*"; }
die() {
  printf '[fresh] error: %s\n' "$*" >&2
  exit 1
}

((EUID == 0)) || die "run as root (debootstrap, chroot and mount need it)"
for tool in debootstrap chroot mount umount findmnt git python3 realpath; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "$tool is missing (apt-get install debootstrap util-linux git python3)"
done

case $SUITE in
  bookworm) DEBIAN=12 ;;
  trixie) DEBIAN=13 ;;
  *) die "FRESH_MACHINE_SUITE: '$SUITE' is not bookworm (Debian 12) or trixie (Debian 13)" ;;
esac
[[ -f /usr/share/debootstrap/scripts/$SUITE ]] ||
  die "this debootstrap does not know $SUITE; install a newer one (Debian's debootstrap package)"

CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=$(realpath -m -- "${1:-$CHECKOUT/build/fresh-debian$DEBIAN}")
REV=${2:-HEAD}
RUN=$DIR.run              # the per-call copy-on-write layer and its mount point
ROOT=$RUN/root            # where each call's machine is mounted
LOGS=$(dirname "$DIR")/fresh-logs/debian$DEBIAN   # one folder per Debian release
OWNER_MARK=.fresh-machine-owner   # this script made the directory and may empty it
BASE_MARK=.fresh-machine-base     # the bootstrap and the base packages completed

FRESH_TORCH=${FRESH_MACHINE_TORCH:-}
[[ -z $FRESH_TORCH || $FRESH_TORCH =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] ||
  die "FRESH_MACHINE_TORCH: '$FRESH_TORCH' is not a release such as 2.14.1"
[[ $DIR =~ ^[A-Za-z0-9_./+-]+$ ]] || die "DIR '$DIR': use letters, digits and _./+- only"
(($(tr -cd / <<<"$DIR" | wc -c) >= 2)) || die "DIR '$DIR' is too close to / to be a chroot"
if [[ $DIR == "$CHECKOUT"/* ]] && ! git -C "$CHECKOUT" check-ignore -q "$DIR"; then
  die "$DIR is inside the checkout but not git-ignored (.gitignore should list build/)"
fi
COMMIT=$(git -C "$CHECKOUT" rev-parse --verify "$REV^{commit}") || die "no commit '$REV'"
read -r -a RUNS <<<"${FRESH_MACHINE_RUNS:-test ci}"
for label in "${RUNS[@]}"; do
  [[ $label =~ ^(test|demo|ci|install|install-user|none)$ ]] ||
    die "FRESH_MACHINE_RUNS: '$label' is not one of test, demo, ci, install, install-user, none"
done

# -- guards: every rm -rf and umount goes through these ------------------------------------------
# Succeeds when path $1 is $2 or lies under it.
is_within() {
  local path base
  path=$(realpath -m -- "$1")
  base=$(realpath -m -- "$2")
  [[ $path == "$base" || $path == "$base"/* ]]
}
is_ours() { is_within "$1" "$DIR" || is_within "$1" "$RUN"; }
# The mount points at or under $1, deepest first.
mounts_under() {
  local base
  base=$(realpath -m -- "$1")
  findmnt -rn -o TARGET | awk -v p="$base" '$0 == p || index($0, p "/") == 1' |
    awk '{ print length($0), $0 }' | sort -rn | cut -d' ' -f2-
}
# Ends the processes (started by this script's chroot commands) whose root is $1.
end_processes_in() {
  local root pid signal
  root=$(realpath -m -- "$1")
  for signal in TERM KILL; do
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
      [[ $(readlink "/proc/$pid/root" 2>/dev/null) == "$root" ]] &&
        kill "-$signal" "$pid" 2>/dev/null
    done
    sleep 1
  done
  return 0
}
safe_umount() {
  local target=$1
  is_ours "$target" || die "refusing to unmount $target: not inside $DIR or $RUN"
  umount -- "$target" 2>/dev/null || umount -l -- "$target" || die "could not unmount $target"
}
unmount_all_under() {
  local target
  while read -r target; do
    [[ -n $target ]] && safe_umount "$target"
  done < <(mounts_under "$1")
  [[ -z $(mounts_under "$1") ]] || die "mounts are still left under $1"
}
# Removes a directory tree this script made: only inside DIR or RUN, only with the owner mark,
# only with nothing mounted under it (checked with findmnt), and never across file systems.
safe_rm_tree() {
  local tree
  tree=$(realpath -m -- "$1")
  is_ours "$tree" || die "refusing to remove $tree: not inside $DIR or $RUN"
  [[ -e $tree ]] || return 0
  [[ -f $tree/$OWNER_MARK ]] ||
    die "refusing to remove $tree: it has no $OWNER_MARK (not made here)"
  [[ -z $(mounts_under "$tree") ]] || die "refusing to remove $tree: something is mounted under it"
  rm -rf --one-file-system -- "$tree"
}

# Binds the kernel's file systems into the chroot $1 (unmounted by cleanup); /dev/shm too where
# the host mounts it apart from /dev (Python's multiprocessing and torch's shared memory use it).
mount_kernel_fs() {
  local root=$1 fs
  for fs in proc sys dev dev/pts dev/shm; do
    [[ $fs == dev/shm ]] && ! findmnt -rn /dev/shm >/dev/null && continue
    mkdir -p "$root/$fs"
    mount --bind "/$fs" "$root/$fs"
  done
}

cleanup() {
  local rc=$?
  set +e
  for root in "$ROOT" "$DIR"; do
    [[ -d $root ]] && end_processes_in "$root"
  done
  [[ -d $RUN ]] && (unmount_all_under "$RUN")
  [[ -d $DIR ]] && (unmount_all_under "$DIR")
  if [[ -d $RUN && ${FRESH_MACHINE_KEEP:-0} != 1 && -z $(mounts_under "$RUN") ]]; then
    (safe_rm_tree "$RUN") && log "removed the used machine $RUN"
  fi
  [[ -n $(mounts_under "$RUN") || -n $(mounts_under "$DIR") ]] &&
    printf '[fresh] error: mounts left under %s or %s; see findmnt\n' "$RUN" "$DIR" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$LOGS"

# -- the host's Debian sources -------------------------------------------------------------------
# Prints "URI SUITE COMPONENT..." for each enabled deb entry of the host's apt sources (one-line
# .list files and deb822 .sources files).
host_apt_entries() {
  python3 - /etc/apt/sources.list /etc/apt/sources.list.d/* <<'EOF'
import sys
from pathlib import Path

for name in sys.argv[1:]:
    path = Path(name)
    if not path.is_file():
        continue
    text = path.read_text(errors="replace")
    if path.suffix == ".list" or path.name == "sources.list":
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] != ["deb"]:
                continue
            words = words[1:]
            if words and words[0].startswith("["):
                while words and not words[0].endswith("]"):
                    words.pop(0)
                words = words[1:]
            if len(words) >= 2:
                print(words[0], words[1], *words[2:])
    elif path.suffix == ".sources":
        for stanza in text.split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.split()
            if "deb" not in fields.get("types", []):
                continue
            if fields.get("enabled", ["yes"])[0].lower() == "no":
                continue
            for uri in fields.get("uris", []):
                for suite in fields.get("suites", []):
                    print(uri, suite, *fields.get("components", ["main"]))
EOF
}

# Picks from the host's entries the Debian mirror and the security mirror (by the host's own
# codename, so that a host of another release still names its mirrors) and prints the chroot's
# sources.list for $SUITE.
chroot_sources_list() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-$SUITE}")
  host_apt_entries | awk -v host="$codename" -v want="$SUITE" '
    $2 == host && !main { main = $1; mcomp = $3 }
    $2 == host "-security" && !sec { sec = $1; scomp = $3 }
    END {
      if (!main) exit 1
      print "deb " main " " want " " mcomp
      print "deb " main " " want "-updates " mcomp
      if (sec) print "deb " sec " " want "-security " scomp
    }'
}

# -- bootstrap (once) ----------------------------------------------------------------------------
bootstrap() {
  local sources mirror started
  sources=$(chroot_sources_list) ||
    die "no Debian entry for this host's release in /etc/apt/sources.list{,.d/*}"
  mirror=$(awk 'NR == 1 { print $2 }' <<<"$sources")
  if [[ -e $DIR && -n $(ls -A "$DIR") ]]; then
    log "removing the incomplete bootstrap in $DIR"
    unmount_all_under "$DIR"
    safe_rm_tree "$DIR"
  fi
  mkdir -p "$DIR"
  touch "$DIR/$OWNER_MARK"

  log "debootstrap --variant=minbase $SUITE from $mirror (log: $LOGS/debootstrap.log)"
  started=$SECONDS
  if ! debootstrap --variant=minbase "$SUITE" "$DIR" "$mirror" >"$LOGS/debootstrap.log" 2>&1; then
    tail -n 30 "$LOGS/debootstrap.log" >&2
    die "debootstrap failed"
  fi
  log "debootstrap took $((SECONDS - started)) s"

  printf '%s\n' "$sources" >"$DIR/etc/apt/sources.list"
  # As in Debian's container images: package scripts never start services in here.
  printf '#!/bin/sh\nexit 101\n' >"$DIR/usr/sbin/policy-rc.d"
  chmod 755 "$DIR/usr/sbin/policy-rc.d"

  log "installing ${BASE_PACKAGES[*]} (log: $LOGS/base.log)"
  started=$SECONDS
  cp -L /etc/resolv.conf "$DIR/etc/resolv.conf"
  mount_kernel_fs "$DIR"
  if ! chroot "$DIR" /usr/bin/env -i HOME=/root PATH=$RUN_PATH DEBIAN_FRONTEND=noninteractive \
    /bin/bash -c 'apt-get update -q && apt-get install -y -q --no-install-recommends "$@" &&
      apt-get clean && rm -rf /var/lib/apt/lists/*' bash "${BASE_PACKAGES[@]}" \
    >"$LOGS/base.log" 2>&1 </dev/null; then
    tail -n 30 "$LOGS/base.log" >&2
    die "installing the base packages failed"
  fi
  unmount_all_under "$DIR"
  log "base packages took $((SECONDS - started)) s"
  printf 'suite %s\nmirror %s\npackages %s\nmade %s\n' "$SUITE" "$mirror" "${BASE_PACKAGES[*]}" \
    "$(date -u +%FT%TZ)" >"$DIR/$BASE_MARK"
}

# A bootstrap of another suite or with other base packages (this script changed) is made again.
if [[ -f $DIR/$BASE_MARK ]] && grep -qxF "suite $SUITE" "$DIR/$BASE_MARK" &&
  grep -qxF "packages ${BASE_PACKAGES[*]}" "$DIR/$BASE_MARK"; then
  log "reusing the bootstrapped $DIR ($(paste -sd, "$DIR/$BASE_MARK"))"
else
  bootstrap
fi
log "the bootstrapped chroot uses $(du -sxh "$DIR" | cut -f1)"
if [[ ${RUNS[*]} == none ]]; then
  exit 0
fi

# -- this call's machine: a fresh copy-on-write layer over DIR ------------------------------------
if [[ -e $RUN ]]; then
  unmount_all_under "$RUN"
  safe_rm_tree "$RUN"
fi
mkdir -p "$RUN/upper" "$RUN/work" "$ROOT"
touch "$RUN/$OWNER_MARK"
if ! mount -t overlay overlay -o "lowerdir=$DIR,upperdir=$RUN/upper,workdir=$RUN/work" "$ROOT"; then
  log "note: no overlay mount here; copying $DIR instead"
  cp -a -- "$DIR/." "$ROOT/"
fi
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
mount_kernel_fs "$ROOT"

# -- the host's pip configuration ----------------------------------------------------------------
# Reads `pip config debug` and `pip config list` and prints what the chroot needs:
#   CONFIG <host path> <chroot path>  a config file (a user's file goes to the chroot's /root)
#   FILE <path>                       a file a setting names (cert, constraint, requirement)
#   DIR <path>                        a local package directory (find-links, a file:// index, and
#                                     the directories a local index's pages link their files in)
#   NOTE <text>
pip_carry_plan() {
  local debug listing
  debug=$(python3 -m pip config debug 2>/dev/null) || return 0
  listing=$(python3 -m pip config list 2>/dev/null) || listing=
  python3 - "$debug" "$listing" "$HOME" <<'EOF'
import os
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

debug, listing, home = sys.argv[1:]
FILE_KEYS = {"cert", "client-cert", "constraint", "constraints", "requirement", "requirements"}
DIR_KEYS = {"index-url", "extra-index-url", "find-links"}

variant = None
for line in debug.splitlines():
    if not line.startswith(" ") and line.endswith(":"):
        variant = line[:-1]
        continue
    match = re.fullmatch(r"  (\S.*), exists: True", line)
    if not match:
        continue
    path = match.group(1)
    if variant == "global":
        print("CONFIG", path, path)
    elif variant == "user":
        inside = "/root/" + os.path.relpath(path, home) if path.startswith(home + "/") else path
        print("CONFIG", path, inside)
    else:
        print("NOTE", f"{variant} config {path} is not carried (the run's environment is clean)")

settings = []  # (origin, key, value)
for line in listing.splitlines():
    match = re.fullmatch(r"(:env:|[\w-]+)\.([\w-]+)='(.*)'", line)
    if match:
        settings.append(match.groups())
from_files = {(key, value) for origin, key, value in settings if origin != ":env:"}
for origin, key, value in settings:
    if origin == ":env:" and (key, value) not in from_files:
        name = "PIP_" + key.upper().replace("-", "_")
        print("NOTE", f"{name} is set only in the host's environment; not carried")


def local_path(item):
    if item.startswith("file:"):
        return unquote(urlparse(item).path)
    if "://" not in item and item.startswith("/"):
        return item
    return None


def linked_dirs(index_dir):
    """The directories a local PEP 503 index's project pages link their files in."""
    found = set()
    for page in Path(index_dir).glob("*/index.html"):
        for href in re.findall(r'href="([^"#]+)', page.read_text(errors="replace")):
            target = local_path(href) if ":" in href else os.path.normpath(page.parent / href)
            if target and not href.endswith("/"):
                found.add(os.path.dirname(target))
    return found


dirs, files = set(), set()
for origin, key, value in settings:
    for item in value.split():
        path = local_path(item)
        if path is None or not os.path.exists(path):
            continue
        if key in FILE_KEYS and os.path.isfile(path):
            files.add(path)
        elif key in DIR_KEYS:
            where = path if os.path.isdir(path) else os.path.dirname(path)
            dirs.add(where)
            if key != "find-links":
                dirs |= linked_dirs(where)
for path in sorted(files):
    print("FILE", path)
kept = []
for path in sorted(os.path.realpath(p) for p in dirs if os.path.isdir(p)):
    if not any(path == k or path.startswith(k + "/") for k in kept):
        kept.append(path)
for path in kept:
    print("DIR", path)
EOF
}

carry_pip_config() {
  local kind a b
  while read -r kind a b; do
    case $kind in
      CONFIG)
        log "pip config: $a -> $b"
        mkdir -p "$ROOT$(dirname "$b")"
        cp -L -- "$a" "$ROOT$b"
        ;;
      FILE)
        log "pip config names $a: copied"
        mkdir -p "$ROOT$(dirname "$a")"
        cp -L -- "$a" "$ROOT$a"
        ;;
      DIR)
        # A bind over a non-empty directory would hide the chroot's own files: refused.
        if [[ -d $ROOT$a && -n $(ls -A "$ROOT$a") ]]; then
          log "note: not binding $a: the chroot has its own $a"
          continue
        fi
        log "pip config names $a: bound read-only"
        mkdir -p "$ROOT$a"
        mount --bind "$a" "$ROOT$a"
        mount -o remount,bind,ro "$ROOT$a"
        ;;
      NOTE) log "note: $a $b" ;;
    esac
  done < <(pip_carry_plan)
}
carry_pip_config

# -- the runs ----------------------------------------------------------------------------------
# Fresh clone of $COMMIT at $1 inside the chroot, with no remote pointing back at the host; a
# clone already there (an earlier run of this call) is kept, as a user keeps their checkout.
clone_into_chroot() {
  local target=$ROOT$1
  is_within "$target" "$ROOT" || die "clone target $target is outside the chroot"
  [[ -d $target/.git ]] && return 0
  git clone --quiet --no-hardlinks --no-checkout "$CHECKOUT" "$target"
  git -C "$target" cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
    git -C "$target" fetch --quiet "$CHECKOUT" "$COMMIT"
  git -C "$target" checkout --quiet --detach "$COMMIT"
  git -C "$target" remote remove origin
}

# Prefixes each line with the time since the run started ([mm:ss]).
stamp_lines() {
  local line start=$SECONDS
  while IFS= read -r line || [[ -n $line ]]; do
    printf '[%02d:%02d] %s\n' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)) "$line"
  done
}

# Each run's name (its label, with -2, -3, ... for a repeat), exit code and wall time, in order.
RUN_NAMES=()
declare -A RUN_RC RUN_TIME
# Runs command $3... in clone $2 inside the chroot with a clean environment, as root, or as
# RUN_AS (a user made by make_sudo_user) when that is set; name $1. RUN_ENV adds NAME=value words
# to the environment.
RUN_AS=""
RUN_ENV=()
run_in_chroot() {
  local name=$1 workdir=$2
  shift 2
  local logfile=$LOGS/$name.log started rc home=/root user=() who=root
  if [[ -n $RUN_AS ]]; then
    home=/home/$RUN_AS
    who=$RUN_AS
    user=(--userspec="$RUN_AS:$RUN_AS")
  fi
  log "$name: as $who in $workdir: ${RUN_ENV[*]} $* (log: $logfile)"
  started=$SECONDS
  set +e
  chroot "${user[@]}" "$ROOT" /usr/bin/env -i HOME="$home" USER="$who" LOGNAME="$who" \
    PATH=$RUN_PATH CI=true "${RUN_ENV[@]}" \
    /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$workdir" "$@" </dev/null 2>&1 |
    stamp_lines >"$logfile"
  rc=${PIPESTATUS[0]}
  set -e
  RUN_NAMES+=("$name")
  RUN_RC[$name]=$rc
  RUN_TIME[$name]=$((SECONDS - started))
  # setup.sh's own logs (apt, pip, the build) go with this run's log.
  local extra
  for extra in "$ROOT$workdir"/build/setup-logs/*.log; do
    [[ -f $extra ]] && cp -- "$extra" "$LOGS/$name.$(basename "$extra")"
  done
  log "$name: exit $rc after ${RUN_TIME[$name]} s; phases (time since start):"
  # setup.sh's steps, test.sh's sections, the install block's commands (set -x) and its check.
  local phases='\[setup\] (apt-get install|pip install|building|ready)|== |\[install\]'
  phases+='|\+ (\$SUDO|sudo|apt-get|python3?|pip|xargs|\.) '
  grep -E "^\[[0-9:]+\] ($phases)" "$logfile" | sed 's/^/    /' || true
  log "$name: closing lines:"
  tail -n 15 "$logfile" | sed 's/^/    /'
}

# The README's "Install into your environment" section's first bash block, from README $1: what a
# user pastes. Printed as it stands; empty when the section or its block is missing.
readme_install_block() {
  awk '
    /^## / { in_section = ($0 == "## Install into your environment") }
    in_section && !done && /^```bash$/ { in_block = 1; next }
    in_block && /^```$/ { in_block = 0; done = 1; next }
    in_block { print }
  ' "$1"
}

# Writes, at $1 inside the chroot, a script that runs the README block of clone $2 as a user
# pastes it (each command echoed, stopping at the first that fails; nothing stands in for a
# command the machine lacks, sudo included) and then checks, from outside the checkout, that
# `python -m graphed` passes and that the graphed it installed has the CUDA backend built in.
write_install_run() {
  local script=$ROOT$1 block
  block=$(readme_install_block "$ROOT$2/README.md")
  [[ -n $block ]] ||
    die "README.md of $COMMIT has no bash block under '## Install into your environment'"
  {
    echo '# Written by fresh_machine.sh: the README install block of the commit under test.'
    echo 'set -ex -o pipefail'
    printf '%s\n' "$block"
    cat <<'CHECK'
set +x
cd /
echo "[install] $(id -un) on Debian $(cat /etc/debian_version); python -m graphed:"
python -m graphed | sed 's/^/[install]   /'
python - <<'PY'
import sys
from importlib import metadata

import torch

import graphed
import graphed._build_info as info

built = ", ".join(info.backends) or "none"
print(f"[install] torch {torch.__version__}; graphed requires {metadata.requires('graphed')}")
print(f"[install] graphed {graphed.__version__} from {graphed.__file__}")
print(f"[install] backends built in: {built}; backend at load: {graphed.backend()[0]}")
if "cuda" not in info.backends:
    sys.exit("[install] FAIL: the CUDA backend was not built (python -m graphed says why)")
print("[install] PASS: the README's install block built graphed with its CUDA backend")
PY
CHECK
  } >"$script"
  log "install: the README block under test:"
  printf '%s\n' "$block" | sed 's/^/    /'
}

# Makes user $1 on this call's machine, with Debian's sudo package and a sudoers entry that lets the
# user run anything as root without a password (as a cloud image's default user may), and the
# host's pip configuration carried into the user's home as it was into root's.
make_sudo_user() {
  local user=$1
  [[ -d $ROOT/home/$user ]] && return 0
  log "making user $user with sudo (log: $LOGS/user.log)"
  chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=$RUN_PATH DEBIAN_FRONTEND=noninteractive \
    /bin/bash -c 'apt-get update -q && apt-get install -y -q --no-install-recommends sudo &&
      apt-get clean && rm -rf /var/lib/apt/lists/* && useradd -m -s /bin/bash "$1" &&
      printf "%s ALL=(ALL:ALL) NOPASSWD: ALL\n" "$1" >"/etc/sudoers.d/$1" &&
      chmod 440 "/etc/sudoers.d/$1"' bash "$user" >"$LOGS/user.log" 2>&1 </dev/null ||
    { tail -n 30 "$LOGS/user.log" >&2; die "making the sudo user $user failed"; }
  if [[ -d $ROOT/root/.config/pip ]]; then
    mkdir -p "$ROOT/home/$user/.config"
    cp -a "$ROOT/root/.config/pip" "$ROOT/home/$user/.config/"
  fi
  chown -R "$(chroot "$ROOT" id -u "$user"):$(chroot "$ROOT" id -g "$user")" "$ROOT/home/$user"
}

# FRESH_MACHINE_TORCH: a constraint file that every pip of the install runs reads.
TORCH_ENV=()
if [[ -n $FRESH_TORCH ]]; then
  printf 'torch==%s\n' "$FRESH_TORCH" >"$ROOT/etc/fresh-machine-torch.txt"
  TORCH_ENV=(PIP_CONSTRAINT=/etc/fresh-machine-torch.txt)
  log "install runs: pip takes torch==$FRESH_TORCH (PIP_CONSTRAINT)"
fi

log "testing commit $COMMIT on Debian $DEBIAN ($SUITE)"
declare -A SEEN
for label in "${RUNS[@]}"; do
  [[ $label == none ]] && continue
  SEEN[$label]=$((${SEEN[$label]:-0} + 1))
  name=$label
  ((SEEN[$label] == 1)) || name=$label-${SEEN[$label]}
  case $label in
    test | demo)
      clone_into_chroot /root/graphed
      run_in_chroot "$name" /root/graphed bash "scripts/$label.sh"
      ;;
    ci)
      clone_into_chroot /root/graphed-ci
      run_in_chroot "$name" /root/graphed-ci bash .ci/run
      ;;
    install)
      clone_into_chroot /root/graphed-install
      write_install_run /root/install-run.sh /root/graphed-install
      RUN_ENV=("${TORCH_ENV[@]}")
      run_in_chroot "$name" /root/graphed-install bash /root/install-run.sh
      RUN_ENV=()
      ;;
    install-user)
      make_sudo_user newcomer
      clone_into_chroot /home/newcomer/graphed-install
      chown -R "$(chroot "$ROOT" id -u newcomer):$(chroot "$ROOT" id -g newcomer)" \
        "$ROOT/home/newcomer/graphed-install"
      write_install_run /home/newcomer/install-run.sh /home/newcomer/graphed-install
      RUN_AS=newcomer RUN_ENV=("${TORCH_ENV[@]}")
      run_in_chroot "$name" /home/newcomer/graphed-install bash /home/newcomer/install-run.sh
      RUN_AS="" RUN_ENV=()
      ;;
  esac
done

log "disk used by this call's machine (the layer over $DIR): $(du -sxh "$RUN/upper" | cut -f1)"
status=0
for name in "${RUN_NAMES[@]}"; do
  log "$name: exit ${RUN_RC[$name]}, ${RUN_TIME[$name]} s"
  ((RUN_RC[$name] == 0)) || status=1
done
if ((status == 0)); then
  log "PASS: ${RUNS[*]} passed on a fresh Debian $DEBIAN ($SUITE)"
else
  log "FAIL: see $LOGS"
fi
exit "$status"
