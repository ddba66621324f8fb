# Sourced by the native benchmark scripts.

# start_weft API_PORT LOG COMMAND...: runs COMMAND (a `weft serve`) in the background with
# its output in LOG, stops it when the script exits, and returns once its API answers on
# 127.0.0.1:API_PORT; the API starts last, after the data plane and the API token file.
# Sets WEFT_PID.
start_weft() {
    local api_port=$1 log=$2; shift 2
    "$@" > "$log" 2>&1 &
    WEFT_PID=$!
    # (|| true: under set -e a failing command in an EXIT trap becomes the script's status,
    # and weft may be gone already: a test kills it.)
    trap 'kill $WEFT_PID 2>/dev/null || true; wait $WEFT_PID 2>/dev/null || true' EXIT
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$api_port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "weft did not start within 10 s; see $log" >&2
    return 1
}

# bench_config TOML DATA_DIR PORT FILE: a weft configuration serving nqn.2026-11.io.weft:bench
# on 127.0.0.1:PORT (API on PORT + 1) with ns 1 = RAM 256 MiB and ns 2 = FILE.
bench_config() {
    cat > "$1" <<TOML
data_dir = "$2"
listen = ["127.0.0.1:$3"]
api_listen = "127.0.0.1:$(($3 + 1))"
[[subsystem]]
nqn = "nqn.2026-11.io.weft:bench"
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "256MiB"
[[subsystem.namespace]]
nsid = 2
backend = "file"
path = "$4"
TOML
}
