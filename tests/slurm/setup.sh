#!/bin/sh
# A single-node Slurm cluster on this machine (Debian's Slurm, munge; no
# systemd or cgroups needed), so that the tests can run a real `sbatch` and
# `srun`. Needs root. Idempotent: does nothing when a node is already idle.
# Exits non-zero if Slurm cannot run here; the tests that need it then skip
# and say why.
set -eu
if command -v sinfo >/dev/null 2>&1 && sinfo -h -o %t 2>/dev/null | grep -qx idle; then
  exit 0
fi
if ! command -v slurmctld >/dev/null 2>&1; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurmctld slurmd slurm-client munge
fi
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --force 2>/dev/null || /usr/sbin/create-munge-key -f
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
pgrep -x munged >/dev/null || su munge -s /bin/sh -c /usr/sbin/munged
host=$(hostname -s)
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
i=0
until sinfo -h -o %t 2>/dev/null | grep -qx idle; do
  i=$((i + 1))
  [ "$i" -gt 60 ] && { echo "slurm: no idle node after 30 s" >&2; exit 1; }
  sleep 0.5
done
echo "slurm: node $host idle"
