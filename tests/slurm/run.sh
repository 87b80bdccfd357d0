#!/usr/bin/env bash
# A real one-node SLURM on localhost, the tiny workflow submitted to it through
# snakemake-executor-plugin-slurm (profiles/slurm), and checks that the jobs went through SLURM
# and that GPU rules asked it for a GPU. Every daemon this script starts is stopped by PID.
#
#   tests/slurm/run.sh WORKDIR [PYTHON]
#
# Needs root and apt (Debian's slurmctld slurmd slurm-client munge are installed when missing).
# WORKDIR gets the workflow's results, the cluster's state and logs, and jobs.json (what SLURM
# recorded per job: rule, partition, GPUs requested, state). Traps: the
# jobstep plugin strips SLURM_CONF, so the config must sit at /etc/slurm/slurm.conf; without
# slurmdbd sacct fails, so job status comes from squeue (MinJobAge keeps finished jobs visible);
# a file-less GPU gres is dropped and the node drains, so the fake GPU is File=/dev/null.
set -euo pipefail

WORK=$(realpath -m "${1:?usage: run.sh WORKDIR [PYTHON]}")
PY=$(command -v "${2:-python3}")
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac  # absolute, not resolved (a venv's python is a link)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$WORK"/{state,spool,log}
PIDS=()

log() { echo "[slurm-test] $*"; }

cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    [ -f "$WORK/slurm.conf.backup" ] && mv "$WORK/slurm.conf.backup" /etc/slurm/slurm.conf || true
    [ -f "$WORK/gres.conf.backup" ] && mv "$WORK/gres.conf.backup" /etc/slurm/gres.conf || true
    [ -f "$WORK/installed-conf" ] && rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf "$WORK/installed-conf" || true
    log "stopped daemons: ${PIDS[*]:-none}"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ]; then echo "run.sh: needs root" >&2; exit 2; fi
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurmctld slurmd slurm-client munge >"$WORK/log/apt.log" 2>&1 \
        || { apt-get update -q >>"$WORK/log/apt.log" 2>&1 && apt-get install -y -q slurmctld slurmd slurm-client munge >>"$WORK/log/apt.log" 2>&1; }
fi

HOST=$(hostname -s)
CPUS=$(nproc)
# --- munge -------------------------------------------------------------------------------------
mkdir -p /run/munge /var/log/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid 2>"$WORK/log/munged.err" \
        || /usr/sbin/munged --force --pid-file=/run/munge/munged.pid
    for _ in $(seq 100); do munge_ok && break; sleep 0.1; done
    PIDS+=("$(cat /run/munge/munged.pid)")
    munge_ok || { echo "munged did not start" >&2; cat "$WORK/log/munged.err" >&2; exit 1; }
fi

# --- slurm config (at /etc/slurm: the jobstep plugin strips SLURM_CONF) ---------------------------
mkdir -p /etc/slurm
[ -f /etc/slurm/slurm.conf ] && cp /etc/slurm/slurm.conf "$WORK/slurm.conf.backup" || touch "$WORK/installed-conf"
[ -f /etc/slurm/gres.conf ] && cp /etc/slurm/gres.conf "$WORK/gres.conf.backup" || true
cat >/etc/slurm/slurm.conf <<EOF
ClusterName=vlsens-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/state/slurmctld.pid
SlurmdPidFile=$WORK/state/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MinJobAge=86400
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=16000 Gres=gpu:1 State=UNKNOWN
PartitionName=gpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=$HOST MaxTime=INFINITE State=UP
EOF
echo "NodeName=$HOST Name=gpu File=/dev/null Count=1" >/etc/slurm/gres.conf

/usr/sbin/slurmctld -i
for _ in $(seq 100); do [ -s "$WORK/state/slurmctld.pid" ] && break; sleep 0.1; done
PIDS+=("$(cat "$WORK/state/slurmctld.pid")")
/usr/sbin/slurmd
for _ in $(seq 100); do [ -s "$WORK/state/slurmd.pid" ] && break; sleep 0.1; done
PIDS+=("$(cat "$WORK/state/slurmd.pid")")
for _ in $(seq 60); do
    timeout 5 sinfo -h -N -o "%T" 2>/dev/null | grep -qE "^idle" && break
    sleep 0.5
done
sinfo -N -o "%N %P %T %G" | tee "$WORK/log/sinfo.txt"
grep -q idle "$WORK/log/sinfo.txt" || { echo "node did not come up" >&2; cat "$WORK/log/slurmd.log" >&2; exit 1; }

# --- the workflow, through the SLURM executor ---------------------------------------------------
cp "$REPO/config/config.yaml" "$WORK/config.yaml"
"$PY" - "$WORK/config.yaml" <<'EOF'
import sys, yaml
p = sys.argv[1]
c = yaml.safe_load(open(p))
c["vision"]["sizes"] = ["224x224"]
c["vision"]["variants"] = ["fp32", "fp16"]
c["text"]["enabled"] = False
c["cluster"] = {"gpu_partition": "gpu", "cpu_partition": "cpu", "mem_mb": {"default": 2000}, "runtime": {"default": 30}}
yaml.safe_dump(c, open(p, "w"), sort_keys=False)
EOF
TARGETS=(results/tiny/vision/224x224/fp16/model.onnx results/tiny/sensitivity/vision/224x224/fp32/shards/ort.0-of-2.csv)
log "submitting ${TARGETS[*]}"
set +e
(cd "$WORK" && "$PY" -m snakemake --snakefile "$REPO/Snakefile" --directory "$WORK" --configfile "$WORK/config.yaml" \
    --workflow-profile "$REPO/profiles/slurm" --slurm-status-command squeue \
    --slurm-init-seconds-before-status-checks 1 --slurm-logdir "$WORK/slurm_logs" \
    "${TARGETS[@]}" >"$WORK/log/snakemake.log" 2>&1)
RC=$?
set -e
tail -n 30 "$WORK/log/snakemake.log"

# --- what SLURM recorded --------------------------------------------------------------------------
scontrol -o show job >"$WORK/log/jobs.txt" || true
"$PY" - "$WORK/log/jobs.txt" "$WORK/jobs.json" <<'EOF'
import json, re, sys
jobs = []
for line in open(sys.argv[1]):
    f = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))
    if not f.get("JobId"):
        continue
    m = re.match(r"rule_([A-Za-z0-9_]+?)_wildcards", f.get("Comment", "")) or re.match(r"rule_(\w+)", f.get("Comment", ""))
    jobs.append({"id": f["JobId"], "rule": m.group(1) if m else f.get("Comment", ""), "state": f.get("JobState"),
                 "partition": f.get("Partition"), "tres_per_job": f.get("TresPerJob", ""),
                 "tres": f.get("TRES", ""), "cpus": f.get("NumCPUs"), "comment": f.get("Comment", "")})
json.dump(jobs, open(sys.argv[2], "w"), indent=1)
print(f"{len(jobs)} SLURM jobs recorded")
for j in jobs:
    print(j["id"], j["rule"], j["state"], j["partition"], j["tres_per_job"] or "-")
EOF
log "snakemake exit code $RC"

# --- integrity through SLURM (the test reads these files) ----------------------------------------
# every job recorded its outputs on the node; the planning process checks them; a job that fails on
# the node leaves the previous output in place (onerror runs in the planning process)
if [ "$RC" = 0 ]; then
    SMK=("$PY" -m snakemake --snakefile "$REPO/Snakefile" --directory "$WORK" --configfile "$WORK/config.yaml"
         --workflow-profile "$REPO/profiles/slurm" --slurm-status-command squeue
         --slurm-init-seconds-before-status-checks 1 --slurm-logdir "$WORK/slurm_logs")
    FP16=results/tiny/vision/224x224/fp16/model.onnx
    CSV=results/tiny/sensitivity/vision/224x224/fp32/shards/ort.0-of-2.csv
    set +e
    (cd "$WORK" && "$PY" -m vlsens.core.records results/tiny >"$WORK/log/records.txt" 2>&1; echo "rc=$?" >>"$WORK/log/records.txt")
    sha256sum "$WORK/$FP16" "$WORK/$FP16.data" >"$WORK/log/fp16-before.sha"
    (cd "$WORK" && VLSENS_FAULT=fp16:publish "${SMK[@]}" --forcerun "$FP16" -- "$FP16" >"$WORK/log/fault.log" 2>&1; echo "rc=$?" >>"$WORK/log/fault.log")
    sha256sum "$WORK/$FP16" "$WORK/$FP16.data" >"$WORK/log/fp16-after.sha" 2>&1
    (cd "$WORK" && "${SMK[@]}" -n "$FP16" >"$WORK/log/after-fault.log" 2>&1; echo "rc=$?" >>"$WORK/log/after-fault.log")
    cp -p "$WORK/$CSV" "$WORK/log/csv.orig"
    "$PY" - "$WORK/$CSV" <<'EOF2'
import os, sys
p = sys.argv[1]
st = os.stat(p)
s = open(p).read()
open(p, "w").write(s.replace("0.", "1.", 1))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
EOF2
    (cd "$WORK" && "${SMK[@]}" -n "${TARGETS[@]}" >"$WORK/log/tamper.log" 2>&1; echo "rc=$?" >>"$WORK/log/tamper.log")
    # an upgrade through SLURM (torch's recorded version changed): the jobs that run torch go through
    # SLURM in phases, what reads only outputs that came out equivalent is dated, not submitted
    cp -p "$WORK/log/csv.orig" "$WORK/$CSV"
    (cd "$WORK" && VLSENS_VERSION_OVERRIDES=torch=99.0 VLSENS_WORKFLOW="$REPO" "$PY" -m vlsens.cli upgrade \
        "${TARGETS[@]}" --dir "$WORK" --config "$WORK/config.yaml" --profile "$REPO/profiles/slurm" -- \
        --slurm-status-command squeue --slurm-init-seconds-before-status-checks 1 --slurm-logdir "$WORK/slurm_logs" \
        >"$WORK/log/upgrade.log" 2>&1; echo "rc=$?" >>"$WORK/log/upgrade.log")
    (cd "$WORK" && VLSENS_VERSION_OVERRIDES=torch=99.0 "${SMK[@]}" -n "${TARGETS[@]}" >"$WORK/log/after-upgrade.log" 2>&1)
    set -e
fi
exit $RC
