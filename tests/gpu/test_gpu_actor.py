"""1-GPU smoke tests of the actor path, without vLLM or Ray: FSDP2 actor and reference with offload on and off, bf16
mixed precision, gradient checkpointing, one update, and the weight-sync gather compared with the actor's weights."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import ActorConfig, OffloadConfig

pytestmark = pytest.mark.gpu


def _config(path) -> ActorConfig:
    config = ActorConfig()
    config.model.model_path = str(path)
    config.fsdp.param_dtype = "bf16"
    config.fsdp.enable_gradient_checkpointing = True
    config.optim.lr = 1e-3
    return config


def _batch(bsz: int = 4, prompt_len: int = 8, resp_len: int = 6) -> Batch:
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 5000, (bsz, prompt_len), generator=gen)
    responses = torch.randint(100, 5000, (bsz, resp_len), generator=gen)
    input_ids = torch.cat([prompts, responses], dim=1)
    mask = torch.ones(bsz, resp_len, dtype=torch.long)
    return Batch(TensorDict({
        "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "responses": responses,
        "response_mask": mask, "advantages": torch.randn(bsz, resp_len, generator=gen),
    }, batch_size=[bsz]), {"multi_modal_inputs": [{}] * bsz})


@pytest.mark.parametrize("offload", [False, True])
def test_actor_and_reference_update_and_weight_sync_on_one_gpu(nccl_group, tiny_model_path, offload):
    from torch.distributed.device_mesh import init_device_mesh

    from easyrl.workers.policy import FSDPPolicy
    from easyrl.workers.fsdp_model import gather_full
    from easyrl.workers.weight_sync import iter_full_weights

    path = tiny_model_path("qwen2_5")
    device = torch.device("cuda", 0)
    mesh = init_device_mesh("cuda", (1,))
    config = _config(path)
    actor = FSDPPolicy(str(path), config, mesh, "cuda", device, trainable=True, offload=OffloadConfig(offload))
    ref = FSDPPolicy(str(path), config, mesh, "cuda", device, trainable=False, offload=OffloadConfig(True),
                     init_from=actor)
    param = next(actor.model.parameters())
    assert param.to_local().device.type == ("cpu" if offload else "cuda")
    assert all(b.device.type == "cuda" for b in actor.model.buffers())  # buffers on the device, whatever offload
    assert all(p.dtype == torch.bfloat16 for p in ref.model.parameters())

    batch = _batch()
    batch["old_log_probs"] = actor.compute_log_probs(batch, 2, 1.0)
    batch["ref_log_probs"] = ref.compute_log_probs(batch, 2, 1.0)
    torch.testing.assert_close(batch["old_log_probs"], batch["ref_log_probs"], atol=0.05, rtol=0)  # bf16 copy
    before = {k: gather_full(v, device).float().cpu() for k, v in actor.model.state_dict().items()}
    metrics = actor.update_policy(batch, mini_batch_size=4, micro_batch_size=2)
    assert all(torch.isfinite(torch.tensor(v)).all() for v in metrics.values())
    after = {k: gather_full(v, device).float().cpu() for k, v in actor.model.state_dict().items()}
    assert max((after[k] - before[k]).abs().max().item() for k in after) > 0  # the update moved the weights

    synced = {k: v.cpu() for k, v in iter_full_weights(actor.model.state_dict(), device, torch.bfloat16, 2**20)}
    assert synced.keys() == after.keys()
    for name, value in synced.items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, after[name].to(torch.bfloat16)), name
