#!/bin/bash
# test stub for DRIVER_SCRIPT: join the cluster like the driver does and report what it sees
exec "$PYTHON" -c "
import os, sys
sys.path.insert(0, os.getcwd())
from megatron_dapo.launch.placement import start_ray
info = start_ray()
nodes = sorted(k for k in info['resources'] if k.startswith('slurm_node:'))
print('DRIVER', os.environ['RAY_ADDRESS'], os.environ['MASTER_ADDR'], os.environ['NNODES'], os.environ['GPUS_PER_NODE'],
      nodes, info['resources'].get('GPU'), 'ARGS', ' '.join(sys.argv[1:]))
" "$@"
