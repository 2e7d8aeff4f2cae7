"""Run a recipe under accelerate's FSDP on CPU processes: `torchrun ... tests/fsdp_on_cpu.py SCRIPT ARGS` with
ACCELERATE_USE_FSDP=true (and FSDP_VERSION=2) in the environment, as `accelerate launch` with an FSDP config sets them.

accelerate turns a multi-process run into FSDP only on accelerators (AcceleratorState does it for MULTI_GPU and its
kin, not MULTI_CPU); this launcher makes the same switch, in the same way, for CPU processes, so that the recipes'
own code under FSDP2 (fully_shard over gloo: sharded parameters, gathered saves, sharded checkpoints) runs where no GPU
is. What it leaves out is the GPU's side: NCCL and the device."""

import os
import runpy
import sys

from accelerate import state
from accelerate.utils import DistributedType

_init = state.AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_FSDP") == "true":
        plugin = kwargs.get("fsdp_plugin")  # what AcceleratorState's MULTI_GPU branch does with it
        if self._mixed_precision != "no" and plugin is not None:
            plugin.set_mixed_precision(self._mixed_precision)
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = plugin
        state.PartialState._shared_state["distributed_type"] = self.distributed_type


state.AcceleratorState.__init__ = _init_with_fsdp_on_cpu

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
