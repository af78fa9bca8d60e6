"""The frozen reference model of a trainer: a LoRA policy with its adapters disabled, else a frozen copy of the
initial policy, prepared like the policy (DeepSpeed / FSDP / plain) so it runs under the same launcher.

    ref = None if hasattr(model, "disable_adapter") else frozen_copy(trainer)
    with reference(ref, unwrapped_policy) as model: ...
"""

import copy
from contextlib import contextmanager


def frozen_copy(trainer):
    """A frozen, eval-mode copy of ``trainer.model``, prepared for the trainer's accelerator."""
    ref = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).eval().requires_grad_(False)
    if trainer.is_deepspeed_enabled:
        from trl.models.utils import prepare_deepspeed
        return prepare_deepspeed(ref, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        from trl.models.utils import prepare_fsdp
        return prepare_fsdp(ref, trainer.accelerator)
    return trainer.accelerator.prepare_model(ref, evaluation_mode=True)


@contextmanager
def reference(ref_model, policy):
    """``ref_model`` when there is one, else ``policy`` (unwrapped, a PEFT model) with its adapters disabled."""
    if ref_model is not None:
        yield ref_model
    else:
        with policy.disable_adapter():
            yield policy
