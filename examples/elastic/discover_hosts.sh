#!/usr/bin/env bash
# A host discovery script for horarun's elastic mode: prints the hosts available now, one "host:slots" per line.
#
# This one offers this machine with 2 slots and with 1 slot in turn, switching every FLIP_SECONDS (default 5),
# as a pool of spot instances might: the job shrinks and grows while it trains. A real script would ask the
# cluster manager (Kubernetes, a cloud autoscaling group, a Slurm allocation) which hosts are up.
period=${FLIP_SECONDS:-5}
if (( $(date +%s) / period % 2 == 0 )); then
    echo "localhost:2"
else
    echo "localhost:1"
fi
