#!/bin/bash
# Host side of the kernel-interop test: runs weft and serves the guest's requests.
# harness/interop.sh starts it through vm-run.sh -H; vm-run.sh sends it SIGTERM when the
# VM has ended.
#
# Usage: harness/weft-supervisor.sh WEFT CONFIG PORT SHARE
# weft runs as `WEFT serve --config CONFIG` in its own session (so that vm-run.sh's kill of
# this process group does not reach it), stdout and stderr appended to SHARE/weft.log.
# It counts as up when 127.0.0.1:PORT accepts TCP connections. Files in SHARE/ctl:
#   weft-pid      pid of the running weft (written whenever it has come up)
#   start-failed  the first start failed (why)
#   restart       request from the guest: SIGTERM, wait for the exit, start again
#   kill9         request from the guest: SIGKILL, start again
#   <req>.done    answer: "ok ..." or "error: ..."
#   events        one line per unexpected event (weft exited by itself, did not stop
#                 on SIGTERM, did not come up); weft is started again after an exit
#   final         at the end: "alive-at-end yes|no" and "sigterm-exit <status> <seconds>"
set -uo pipefail
WEFT=$1 CONFIG=$2 PORT=$3 SHARE=$4
CTL=$SHARE/ctl
LOG=$SHARE/weft.log
STOP_TIMEOUT_S=30 START_TIMEOUT_S=60
PID='' START_ERROR='' STOP_RC='' STOP_S=''
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}

say() { echo "[supervisor $(date +%T.%N | cut -c1-12)] $*" | tee -a "$LOG" >&2; }
event() { say "EVENT: $*"; echo "$*" >> "$CTL/events"; }
put() { echo "$2" > "$CTL/.$1.tmp" && mv "$CTL/.$1.tmp" "$CTL/$1"; }   # atomic for the guest
port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
alive() { [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; }

elapsed() { awk -v t0="$1" -v t1="$EPOCHREALTIME" 'BEGIN { printf "%.1f", t1 - t0 }'; }

start_weft() { # start weft and wait until its port accepts connections; else set START_ERROR
    local t0=$EPOCHREALTIME
    say "starting $WEFT serve --config $CONFIG"
    setsid "$WEFT" serve --config "$CONFIG" >> "$LOG" 2>&1 < /dev/null &
    PID=$!
    while ! port_up; do
        if ! alive; then
            wait "$PID"
            START_ERROR="weft pid $PID exited with status $? before its port was up"
            PID=''
            return 1
        fi
        if [ "$(elapsed "$t0" | cut -d. -f1)" -ge "$START_TIMEOUT_S" ]; then
            stop_weft KILL
            START_ERROR="weft: port $PORT not up ${START_TIMEOUT_S} s after the start (killed)"
            return 1
        fi
        sleep 0.1
    done
    say "weft pid $PID is up on 127.0.0.1:$PORT after $(elapsed "$t0") s"
    put weft-pid "$PID"
}
stop_weft() { # SIGNAL: stop weft; sets STOP_RC (exit status, "timeout" if it needed a
              # SIGKILL after STOP_TIMEOUT_S) and STOP_S (seconds)
    local t0=$EPOCHREALTIME
    rm -f "$CTL/weft-pid"
    kill "-$1" "$PID"
    STOP_RC=timeout
    while [ "$(elapsed "$t0" | cut -d. -f1)" -lt "$STOP_TIMEOUT_S" ]; do
        if ! alive; then wait "$PID"; STOP_RC=$?; break; fi
        sleep 0.1
    done
    if [ "$STOP_RC" = timeout ]; then kill -KILL "$PID"; wait "$PID"; fi
    STOP_S=$(elapsed "$t0")
    PID=''
}
handle() { # restart|kill9
    local req=$1 sig old=$PID
    rm -f "$CTL/$req"
    case "$req" in restart) sig=TERM ;; kill9) sig=KILL ;; esac
    if [ -z "$PID" ]; then   # its last start failed
        put "$req.done" "error: weft is not running (see ctl/events)"
        return
    fi
    stop_weft "$sig"
    say "weft pid $old: SIG$sig -> exit status $STOP_RC after $STOP_S s"
    if [ "$sig" = TERM ] && [ "$STOP_RC" != 0 ]; then
        event "weft pid $old did not shut down cleanly on SIGTERM: exit status $STOP_RC after $STOP_S s"
        put "$req.done" "error: weft pid $old: exit status $STOP_RC after SIGTERM ($STOP_S s)"
        start_weft || event "$START_ERROR"
        return
    fi
    if start_weft; then
        put "$req.done" "ok: weft pid $old stopped by SIG$sig (exit status $STOP_RC, $STOP_S s), new pid $PID up"
    else
        event "$START_ERROR"
        put "$req.done" "error: $START_ERROR"
    fi
}
finish() { # vm-run.sh ended the VM: was weft alive until now, does it stop cleanly?
    if alive; then
        echo "alive-at-end yes" > "$CTL/final"
        stop_weft TERM
        say "end of run: SIGTERM -> exit status $STOP_RC after $STOP_S s"
        echo "sigterm-exit $STOP_RC $STOP_S" >> "$CTL/final"
    else
        echo "alive-at-end no" > "$CTL/final"
    fi
    exit 0
}

mkdir -p "$CTL"
trap finish TERM INT HUP
if ! start_weft; then
    event "$START_ERROR"
    put start-failed "$START_ERROR"
fi
while :; do
    for req in restart kill9; do
        if [ -e "$CTL/$req" ]; then handle "$req"; fi
    done
    if [ -n "$PID" ] && ! alive; then
        wait "$PID"
        event "weft pid $PID exited by itself with status $?; starting it again"
        rm -f "$CTL/weft-pid"
        start_weft || event "$START_ERROR"
    fi
    sleep 0.2
done
