# Sourced by benchmarks/gpu_check.sh (and its test): run a command under a hard time cap and leave
# nothing of it running afterwards.
#
#   run_capped SECONDS LOGFILE CMD...   -> CMD's exit status, or 124 when the cap killed it
#
# `timeout CMD` is not enough here: probes start in their own session (executors/local.py gives
# each one its own process group, so that its own timeout kills its data-loader workers), so a
# timeout that kills the step's process group leaves the probe training on the GPU, and the orphan
# skews the next step's tok/s and NVML figures. So each step runs with a token in its environment
# (GPU_CHECK_STEP_TOKEN, inherited by every descendant, whatever session or group it moves to, as
# the probe's environment is a copy of its parent's); at the cap, every process that carries the
# token is sent TERM, then KILL after a grace, and the call returns only once none is left.

_capped_token_pids() {  # TOKEN -> PIDs of live processes whose environment holds it
    local f pid
    # one grep over every process's environment (-z: NUL-separated entries, -l: names of matching files)
    for f in $(grep -lzx "GPU_CHECK_STEP_TOKEN=$1" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${f#/proc/}; pid=${pid%/environ}
        [ "$pid" = "$$" ] && continue
        # zombies have exited already (their parent reaps them)
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = "Z" ] || echo "$pid"
    done
}

_capped_kill_all() {  # TOKEN GRACE -> TERM, then KILL after GRACE s, every process with TOKEN; prints how many
    local token=$1 grace=$2 pids n end
    pids=$(_capped_token_pids "$token")
    n=$(echo $pids | wc -w)
    [ "$n" -eq 0 ] && { echo 0; return 0; }
    kill -TERM $pids 2>/dev/null
    end=$((SECONDS + grace))
    while [ $SECONDS -lt $end ]; do
        [ -z "$(_capped_token_pids "$token")" ] && { echo "$n"; return 0; }
        sleep 0.2
    done
    end=$((SECONDS + 10))
    while [ $SECONDS -lt $end ]; do
        pids=$(_capped_token_pids "$token")
        [ -z "$pids" ] && break
        kill -KILL $pids 2>/dev/null
        sleep 0.1
    done
    echo "$n"
}

run_capped() {
    local cap=$1 log=$2; shift 2
    local token="gc$$-$RANDOM$RANDOM-$SECONDS" pid rc start=$SECONDS killed
    GPU_CHECK_STEP_TOKEN=$token setsid "$@" >>"$log" 2>&1 </dev/null &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ $((SECONDS - start)) -ge "$cap" ]; then
            killed=$(_capped_kill_all "$token" "${CAPPED_GRACE_S:-3}")
            wait "$pid" 2>/dev/null
            echo "run_capped: cap of ${cap}s reached; ended $killed process(es) of the step" >>"$log"
            return 124
        fi
        sleep 0.2
    done
    wait "$pid"
    rc=$?
    # a step that exited on its own may still have left something running (a probe it never waited for)
    killed=$(_capped_kill_all "$token" "${CAPPED_GRACE_S:-3}")
    [ "$killed" -gt 0 ] && echo "run_capped: the step left $killed process(es) running; ended them" >>"$log"
    return $rc
}
