"""LoRA adapters switched between calls: never a stale replay.

Every workflow users run to switch adapters (bench/lora_workflow.py: diffusers' PeftAdapterMixin on
tiny random SD3 and Flux transformers, peft's get_peft_model on a plain module), each step's next
two graphed calls against the model's own: on the CPU with the emulated backend (whose replay
returns what the capture wrote, so a step graphed missed returns the previous adapters' result, as
a stale device graph would) and bitwise on the GPU. A step that changes what the forward computes
with recaptures once; a hot-swap (tensors updated in place) replays without one.
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
peft = pytest.importorskip("peft")
lora_workflow = pytest.importorskip("lora_workflow")


def _check(results, replays_compute: bool) -> None:
    """Each step recaptured as it must and gave eager's output; without `replays_compute` (the
    emulated backend) an in-place step's output is the GPU test's to check, as the emulated
    replay returns what the capture wrote."""
    for result in results:
        wanted = 1 if result.expected_recapture else 0
        assert result.captures == wanted, (result.step, result.captures)
        if replays_compute or result.expected_recapture:
            assert result.bitwise, f"{result.step}: largest difference {result.largest_difference}"


@pytest.mark.parametrize("family", ["sd3", "flux", "peft"])
def test_every_lora_step_gives_eagers_output(emulated_backend, family):
    results = lora_workflow.run_workflow(family, torch.device("cpu"), backend=emulated_backend)
    _check(results, replays_compute=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["sd3", "flux", "peft"])
def test_every_lora_step_gives_eagers_output_bitwise_on_the_device(family):
    _check(lora_workflow.run_workflow(family, torch.device("cuda")), replays_compute=True)
