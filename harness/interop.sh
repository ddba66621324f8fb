#!/bin/bash
# Kernel-interop test of weft, host side: the Linux NVMe/TCP host of a QEMU guest (Debian
# bookworm, kernel 6.1; see harness/vm/) against weft running on this machine.
#
# Usage (as root): harness/interop.sh [--weft PATH] [--port N] [--target weft|nvmet]
#   --weft PATH      weft binary (default target/release/weft)
#   --port N         weft listens on 127.0.0.1:N (default 14430); the guest reaches it
#                    as 10.0.2.2:N through qemu's user-mode network
#   --target nvmet   reference run: the same guest checks against the guest kernel's
#                    nvmet-tcp target, configured alike (no weft involved)
#   --steps LIST     only these guest steps, comma-separated (e.g. i-volumes; default all)
# What it does: builds or reuses the guest image (harness/vm/build-image.sh); writes a fresh
# .cache/interop/ with weft's data dir and config (subsystem nqn.2026-11.io.weft:default
# with ns1 = 512 MiB file, ns2 = 64 MiB ram; nqn.2026-11.io.weft:second with ns1 = 32 MiB
# ram); boots the guest with harness/weft-supervisor.sh on the host (vm-run.sh -H), which
# runs weft and restarts it on the guest's requests; runs harness/guest/interop.sh in the
# guest (steps a-h, see there); then checks on the host that weft never exited by itself,
# was alive at the end and exits 0 on SIGTERM, that weft.log has no panic, and that the
# file namespace was created with its configured size. Prints a PASS/FAIL summary and
# exits non-zero on any failure. About 5-8 minutes under TCG.
# The VM gets its own share directory, .cache/interop/share (not vm-run.sh's default
# .cache/vm-share, which other VM runs in this checkout overwrite while the guest still
# reads its script from there); one interop run at a time (lock .cache/interop.lock).
# Output: console in .cache/interop/run.log; weft's output and the supervisor's lines in
# .cache/interop/share/weft.log; fio JSON in .cache/interop/share/interop/.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

WEFT=target/release/weft PORT=14430 TARGET=weft API_PORT=14440 STEPS=
TIMEOUT_S=1500
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --weft) WEFT=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --target) TARGET=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "interop: unknown argument $1" >&2; usage ;;
    esac
done
die() { echo "interop: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (qemu, kernel modules in the guest image build)"
case "$TARGET" in weft|nvmet) ;; *) die "--target must be weft or nvmet" ;; esac

echo "interop: guest image $(harness/vm/build-image.sh)"
[ "$TARGET" = weft ] && echo "interop: CSI tools in $(harness/csi-tools.sh)"

exec 9> "$REPO/.cache/interop.lock"
flock -n 9 || die "another interop run is active (.cache/interop.lock)"
WORK=$REPO/.cache/interop
SHARE=$WORK/share
rm -rf "$WORK"
mkdir -p "$WORK/data" "$SHARE/ctl"
: > "$SHARE/weft.log"
VM_ARGS=(-s "$SHARE" -c 2 -t "$TIMEOUT_S" -e "WEFT_PORT=$PORT" -e "WEFT_TARGET=$TARGET"
         -e "WEFT_API_PORT=$API_PORT" -e "WEFT_POOL_DIR=$WORK" -e "INTEROP_STEPS=$STEPS")
if [ "$TARGET" = weft ]; then
    [ -x "$WEFT" ] || die "no weft binary at $WEFT (cargo build --release, or --weft PATH)"
    WEFT=$(realpath "$WEFT")
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then die "something already listens on 127.0.0.1:$PORT"; fi
    # The key-encryption key of step i's encrypted volume (mode 600, as weft asks).
    (umask 077 && python3 -c "import secrets; print(secrets.token_hex(32))" > "$WORK/kek")
    cat > "$WORK/weft.toml" <<EOF
# written by harness/interop.sh
data_dir = "$WORK/data"
listen = ["127.0.0.1:$PORT"]
api_listen = "127.0.0.1:$API_PORT"
api_token_file = "$SHARE/api-token"
kek_file = "$WORK/kek"

[[subsystem]]
nqn = "nqn.2026-11.io.weft:default"
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "$WORK/ns1.img"
size = "512MiB"
[[subsystem.namespace]]
nsid = 2
backend = "ram"
size = "64MiB"

[[subsystem]]
nqn = "nqn.2026-11.io.weft:second"
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "32MiB"
EOF
    VM_ARGS+=(-n slirp -H "exec $(printf '%q ' harness/weft-supervisor.sh "$WEFT" "$WORK/weft.toml" "$PORT" "$SHARE")")
else
    VM_ARGS+=(-n none)
fi

echo "interop: target $TARGET$([ "$TARGET" = nvmet ] || echo " $WEFT"), port $PORT; console -> $WORK/run.log"
set +e
harness/vm/vm-run.sh "${VM_ARGS[@]}" harness/guest/interop.sh 2>&1 9>&- | tee "$WORK/run.log"
GUEST_RC=${PIPESTATUS[0]}
set -e

RESULTS=()
check() { # WHAT WHY_IF_NOT CMD [ARGS...]: record "PASS WHAT" or "FAIL WHAT: WHY_IF_NOT"
    local what=$1 why=$2; shift 2
    if "$@"; then RESULTS+=("PASS $what"); else RESULTS+=("FAIL $what${why:+: $why}"); fi
}
case "$GUEST_RC" in
    0) why='' ;;
    124) why="VM timed out after ${TIMEOUT_S}s" ;;
    125) why="the guest reported no exit code (kernel crash?)" ;;
    *) why="exit status $GUEST_RC, see the FAIL lines above" ;;
esac
check "guest checks (harness/guest/interop.sh)" "$why" [ "$GUEST_RC" = 0 ]
if [ "$GUEST_RC" = 0 ]; then
    check "guest summary says PASS" "no 'interop: PASS' line from the guest" grep -q '^interop: PASS' "$SHARE/.lab/console.log"
fi
if [ "$TARGET" = weft ]; then
    CTL=$SHARE/ctl
    check "weft: no unexpected exit, unclean SIGTERM or failed start" "$(paste -sd';' "$CTL/events" 2>/dev/null)" \
        [ ! -s "$CTL/events" ]
    alive=$(sed -n 's/^alive-at-end //p' "$CTL/final" 2>/dev/null)
    why="it was not running when the VM ended"
    [ -e "$CTL/final" ] || why="the supervisor did not report (no ctl/final)"
    check "weft alive at the end" "$why" [ "$alive" = yes ]
    if [ "$alive" = yes ]; then
        read -r rc secs < <(sed -n 's/^sigterm-exit //p' "$CTL/final")
        check "weft exits 0 on SIGTERM at the end" "exit status $rc after $secs s" [ "$rc" = 0 ]
    fi
    # a pid left in ctl/weft-pid means the supervisor did not stop weft: end it (by pid)
    pid=$(cat "$CTL/weft-pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe")" = "$WEFT" ]; then
        kill -KILL "$pid"
        check "weft stopped after the run" "pid $pid was still running, killed it" false
    fi
    panics=$(grep -nE "panicked at|stack backtrace:|^fatal runtime error" "$SHARE/weft.log" | head -5 || true)
    check "no panic in weft.log" "$panics" [ -z "$panics" ]
    if [ -e "$WORK/ns1.img" ]; then
        size=$(stat -c %s "$WORK/ns1.img")
        echo "ns1.img: $size bytes, $(du -m "$WORK/ns1.img" | cut -f1) MiB allocated"
        check "file namespace created with 512 MiB" "$WORK/ns1.img has $size bytes" [ "$size" = 536870912 ]
    else
        check "file namespace created with 512 MiB" "no $WORK/ns1.img" false
    fi
fi

echo; echo "=== interop summary (target $TARGET)"
printf '%s\n' "${RESULTS[@]}"
if printf '%s\n' "${RESULTS[@]}" | grep -q '^FAIL'; then echo "interop: FAIL"; exit 1; fi
echo "interop: PASS"
