"""The FSDP2 actor and critic (one gloo rank, fp32) with padding-free forwards and dynamic batching vs the padded,
fixed-size micro-batch path: same log-probs / values, same loss, same gradients; entropy gets no gradient at
coefficient 0."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from easyrl.batch import Batch
from easyrl.config import ActorConfig

# measured on this CPU: log-probs max |diff| 9.5e-7 (text) / 1.9e-6 (VL); gradients max |diff| 2.8e-8 (max |grad| 2.5e-2)
ATOL = 1e-5


def _policy(model_path, padding_free: bool, dynamic_batching: bool, entropy_coeff: float = 0.0, budget=None,
            router_aux_loss_coef: float = 0.0, checkpointing: bool = False):
    from torch.distributed.device_mesh import init_device_mesh

    from easyrl.workers.policy import FSDPPolicy

    config = ActorConfig(padding_free=padding_free, dynamic_batching=dynamic_batching, entropy_coeff=entropy_coeff,
                         max_token_len_per_device=budget, use_kl_loss=False,
                         router_aux_loss_coef=router_aux_loss_coef)
    config.model.model_path = str(model_path)
    config.fsdp.param_dtype = "fp32"
    config.fsdp.enable_gradient_checkpointing = checkpointing
    config.optim.lr = 1e-3
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    return FSDPPolicy(str(model_path), config, mesh, "cpu", torch.device("cpu"), trainable=True,
                      offload=config.offload)


def _batch(prompts, responses, prompt_len, resp_len, mm=None):
    bsz = len(prompts)
    ids = torch.zeros(bsz, prompt_len + resp_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, prompt_len - len(p): prompt_len] = torch.tensor(p)
        ids[i, prompt_len: prompt_len + len(r)] = torch.tensor(r)
        mask[i, prompt_len - len(p): prompt_len + len(r)] = 1
    g = torch.Generator().manual_seed(5)
    resp_mask = mask[:, prompt_len:].clone()
    tensors = TensorDict({
        "input_ids": ids, "attention_mask": mask, "responses": ids[:, prompt_len:].clone(),
        "response_mask": resp_mask, "advantages": torch.randn(bsz, resp_len, generator=g) * resp_mask,
    }, batch_size=[bsz])
    return Batch(tensors, {"multi_modal_inputs": mm or [{} for _ in range(bsz)]})


def _text_batch():
    g = torch.Generator().manual_seed(0)
    plen, rlen = (7, 3, 11, 5, 9, 2), (5, 9, 1, 8, 3, 9)
    prompts = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in plen]
    responses = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in rlen]
    return _batch(prompts, responses, prompt_len=12, resp_len=9)


def _vl_batch(model_path):
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_path)
    texts = ["<|vision_start|><|image_pad|><|vision_end|>what is x?", "no image here",
             "a<|vision_start|><|image_pad|><|vision_end|>find y", "again text only, longer prompt"]
    sizes = [(56, 84), None, (112, 56), None]
    prompts, mm = [], []
    for text, size in zip(texts, sizes):
        images = [Image.new("RGB", size, (200, 30, 60))] if size else None
        out = processor(text=[text], images=images, return_tensors="pt")
        prompts.append(out["input_ids"][0].tolist())
        mm.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]} if size else {})
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in (5, 9, 1, 4)]
    return _batch(prompts, responses, prompt_len=max(map(len, prompts)) + 2, resp_len=9, mm=mm)


def _perturb(policy):
    """The tiny models' random init is near uniform: make log-probs and gradients informative (same in every run)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.02)


@pytest.mark.parametrize("arch", ["qwen2_5", "qwen2_5_vl", "qwen3_5", "qwen3_5_moe"])
def test_padding_free_log_probs_match_padded(process_group, tiny_model_path, arch):
    """Packed rows score as the padded batch; for Qwen3.5 (a Gated-DeltaNet layer: a convolution and a recurrent state
    over the sequence) only when each packed sequence runs through that layer on its own (#20)."""
    path = tiny_model_path(arch)
    data = _vl_batch(path) if arch == "qwen2_5_vl" else _text_batch()
    outs = []
    for padding_free, dynamic in ((False, False), (True, True)):
        policy = _policy(path, padding_free, dynamic, budget=40)  # 40 tokens: several dynamic micro-batches
        _perturb(policy)
        outs.append(policy.compute_log_probs(data, micro_batch_size=2, temperature=0.7))
        del policy
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=0)
    assert outs[0].abs().sum() > 1.0 and (outs[0][data["response_mask"] == 0] == 0).all()


def _update(policy, data, micro_batch_size=2):
    """One update; returns its metrics and the gradients the optimizer stepped with."""
    grads = {}
    step = policy.optimizer.step

    def recording_step(*args, **kwargs):
        grads.update({n: p.grad.full_tensor().clone() for n, p in policy.model.named_parameters()
                      if p.grad is not None})
        return step(*args, **kwargs)

    policy.optimizer.step = recording_step
    data = Batch(data.tensors.clone(), dict(data.extras))
    data["old_log_probs"] = policy.compute_log_probs(data, micro_batch_size, temperature=1.0)
    metrics = policy.update_policy(data, mini_batch_size=len(data), micro_batch_size=micro_batch_size)
    return metrics, grads


def test_padding_free_dynamic_update_matches_padded_fixed(process_group, tiny_model_path):
    """Padded fixed micro-batches of 2 = padding-free, dynamic token budgets, and micro-batches of 1: the same losses
    and gradients. The responses have unequal lengths (1-9 tokens), so a loss normalised per micro-batch instead of
    by the mini-batch's global token count would give different gradients."""
    path = tiny_model_path("qwen2_5")
    data = _text_batch()
    results = []
    for padding_free, dynamic, micro in ((False, False, 2), (True, True, 2), (True, False, 2), (False, False, 1)):
        policy = _policy(path, padding_free, dynamic, entropy_coeff=0.01, budget=40)
        _perturb(policy)
        results.append(_update(policy, data, micro_batch_size=micro))
        del policy
    (ref_metrics, ref_grads) = results[0]
    assert len(ref_grads) > 10 and max(g.abs().max() for g in ref_grads.values()) > 1e-4
    for metrics, grads in results[1:]:
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert metrics[key][0] == pytest.approx(ref_metrics[key][0], rel=1e-5, abs=1e-7), key
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def test_qwen3_5_packed_gradients_match_padded_under_checkpointing(process_group, tiny_model_path):
    """Qwen3.5's Gated-DeltaNet layer runs each packed sequence on its own also when gradient checkpointing
    recomputes it in the backward: packed and padded gradients agree (#20)."""
    path = tiny_model_path("qwen3_5")
    data = _text_batch()
    results = []
    for padding_free in (False, True):
        policy = _policy(path, padding_free, padding_free, budget=40, checkpointing=True)
        _perturb(policy)
        results.append(_update(policy, data)[1])
        del policy
    assert len(results[0]) > 10 and results[1].keys() == results[0].keys()
    for name, grad in results[1].items():
        torch.testing.assert_close(grad, results[0][name], atol=1e-6, rtol=1e-4, msg=name)


def test_no_entropy_gradient_at_coefficient_zero(process_group, tiny_model_path):
    """At entropy_coeff=0 the entropy is still logged but built without autograd (no vocabulary-wide backward)."""
    path = tiny_model_path("qwen2_5")
    data = _text_batch()
    for padding_free in (False, True):
        policy = _policy(path, padding_free, False)
        micro = data.select([0, 1])
        scores = policy._forward(micro, 1.0, with_entropy=True, entropy_grad=False)
        log_probs, entropy = scores.log_probs, scores.entropy
        assert log_probs.requires_grad and not entropy.requires_grad
        assert entropy.abs().sum() > 0
        entropy = policy._forward(micro, 1.0, with_entropy=True, entropy_grad=True).entropy
        assert entropy.requires_grad
        del policy


def test_on_policy_update_without_old_log_prob_pass(process_group, tiny_model_path):
    """No old_log_probs (one epoch, one mini-batch): the update uses its own detached log-probs as the old ones, so
    it steps with the same gradients as with an old-log-prob pass, and hands those log-probs back."""
    path = tiny_model_path("qwen2_5")
    data = _text_batch()
    policy = _policy(path, True, True, budget=40)
    _perturb(policy)
    old = policy.compute_log_probs(data, 2, temperature=1.0)
    with_old = _update(policy, data)[1]
    del policy
    policy = _policy(path, True, True, budget=40)
    _perturb(policy)
    grads = {}
    step = policy.optimizer.step
    policy.optimizer.step = lambda: (grads.update({n: p.grad.full_tensor().clone() for n, p in
                                                   policy.model.named_parameters() if p.grad is not None}), step())
    policy.update_policy(data, mini_batch_size=len(data), micro_batch_size=2)
    torch.testing.assert_close(policy.on_policy_log_probs, old, atol=ATOL, rtol=0)
    assert grads.keys() == with_old.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, with_old[name], atol=1e-6, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="old_log_probs are needed"):
        policy.update_policy(data, mini_batch_size=len(data) // 2, micro_batch_size=2)
    # the weight-sync check on the update's own log-probs, before its optimizer step: a correct engine passes, one
    # whose log-probs are off by 0.3 nats stops the update with every weight unchanged
    from easyrl.workers.weight_sync import WeightSyncError

    data["rollout_log_probs"] = policy.compute_log_probs(data, 2, temperature=1.0) + 1e-4
    policy.update_policy(data, mini_batch_size=len(data), micro_batch_size=2, sync_threshold=0.1)
    weights = {n: p.full_tensor().clone() for n, p in policy.model.named_parameters()}
    data["rollout_log_probs"] = policy.compute_log_probs(data, 2, temperature=1.0) - 0.3
    with pytest.raises(WeightSyncError, match="rollout/log_prob_diff_median = 0.3"):
        policy.update_policy(data, mini_batch_size=len(data), micro_batch_size=2, sync_threshold=0.1)
    assert all(torch.equal(p.full_tensor(), weights[n]) for n, p in policy.model.named_parameters())


# the text MoE families share transformers' load-balancing loss; Granite 3 MoE names its router differently (Qwen3-MoE,
# Mixtral and OLMoE pass too, measured at 40-50 s each on a busy machine: left out to keep the suite short)
@pytest.mark.parametrize("arch", ["qwen3_vl_moe", "granitemoe"])
def test_router_aux_loss_of_an_moe_actor(arch, process_group, tiny_model_path):
    """MoE (tiny Qwen3-VL-MoE and Granite 3 MoE, text prompts, one micro-batch): with ``router_aux_loss_coef``
    > 0 the update logs the router's load-balancing loss, equal to the model's own over the batch's non-padding tokens
    in both layouts, and its gradient is ``coef x`` the aux loss's own; at 0 it is neither computed nor logged."""
    path = tiny_model_path(arch)
    data = _text_batch()
    coef = 0.5
    results = {}
    for padding_free, c in ((True, 0.0), (True, coef), (False, coef)):
        policy = _policy(path, padding_free, False, router_aux_loss_coef=c)
        policy.config.max_grad_norm = 1e9  # no clipping: the gradients add up exactly
        _perturb(policy)
        if c == 0.0:
            # the model's own loss on the padded batch (_run_model arms the VL hooks that FSDP needs); + 0 x logits:
            # FSDP2 re-gathers a layer's weights for backward when a gradient reaches the layer's output, which the
            # router logits (recorded inside the layer) alone never do
            out = policy._run_model(data, lambda model, inputs: model(
                input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, output_router_logits=True,
                use_cache=False))
            aux = out.aux_loss
            (aux + 0.0 * out.logits.sum()).backward()
            aux_grads = {n: p.grad.full_tensor().clone() for n, p in policy.model.named_parameters()
                         if p.grad is not None}
            policy.model.zero_grad(set_to_none=True)
        results[padding_free, c] = _update(policy, data, micro_batch_size=len(data))
        del policy
    assert aux.item() > 1.0  # transformers: top-k (2 here) at perfect balance, more when unbalanced: a real value
    assert "actor/router_aux_loss" not in results[True, 0.0][0]
    for padding_free in (True, False):
        assert results[padding_free, coef][0]["actor/router_aux_loss"][0] == pytest.approx(aux.item(), rel=1e-5)
    router = [n for n in aux_grads if n.endswith(("mlp.gate.weight", "router.weight"))]
    assert router and max(aux_grads[n].abs().max() for n in router) > 1e-3
    without, with_aux = results[True, 0.0][1], results[True, coef][1]
    for name in router:
        torch.testing.assert_close(with_aux[name] - without[name], coef * aux_grads[name], atol=1e-6, rtol=1e-3,
                                   msg=name)


def test_router_aux_loss_on_a_dense_model_is_a_config_error(process_group, tiny_model_path):
    from easyrl.errors import ConfigError

    with pytest.raises(ConfigError, match="router_aux_loss_coef=0.1 .* not a mixture-of-experts"):
        _policy(tiny_model_path("qwen2_5"), True, True, router_aux_loss_coef=0.1)


def test_attention_implementation_choice():
    from easyrl.models.packed_attention import PACKED_SDPA
    from easyrl.workers.policy_forward import attention_implementation

    def choice(device, padding_free, dtype, flash, windowed=False):
        return attention_implementation(device, padding_free, dtype, flash, windowed)

    assert choice("cuda", True, "bf16", True) == "flash_attention_2"
    assert choice("cuda", True, "fp32", True) == PACKED_SDPA  # flash-attention has no fp32 kernels
    assert choice("cuda", False, "bf16", True) == "sdpa"  # padded batches keep their mask
    assert choice("cuda", True, "bf16", False) == PACKED_SDPA
    assert choice("npu", True, "bf16", False) == "flash_attention_2"  # npu_fusion_attention
    assert choice("npu", True, "fp32", False) == PACKED_SDPA
    assert choice("cpu", True, "bf16", True) == PACKED_SDPA
    assert choice("cuda", True, "bf16", True, windowed=True) == "flash_attention_2"  # flash-attn takes window_size
    # no flash kernel takes Llama 4's attention chunks (transformers refuses flash past one chunk)
    assert attention_implementation("cuda", True, "bf16", True, False, chunked=True) == PACKED_SDPA
    assert attention_implementation("npu", True, "bf16", False, False, chunked=True) == PACKED_SDPA
    assert attention_implementation("cuda", False, "bf16", True, False, chunked=True) == "sdpa"


def test_chunked_attention_as_transformers_reads_the_config():
    from transformers import CONFIG_MAPPING

    from easyrl.models.families import attends_in_chunks

    assert attends_in_chunks(CONFIG_MAPPING["llama4_text"]()) and attends_in_chunks(CONFIG_MAPPING["llama4"]())
    assert not attends_in_chunks(CONFIG_MAPPING["llama"]()) and not attends_in_chunks(CONFIG_MAPPING["gemma3_text"]())


@pytest.mark.parametrize("model_type, windowed", [("gemma3_text", True), ("mistral", True), ("qwen3", False),
                                                   ("llama", False), ("phi3", False), ("glm4", False)])
def test_npu_sliding_window_families_take_the_packed_sdpa(model_type, windowed):
    """transformers' NPU flash_attn_varlen_func has no window_size: the flash path would drop Gemma 3's and Mistral's
    windows (device review 2026-12-02, S1-N1), so on NPUs their configs take the per-sequence SDPA with its band."""
    from easyrl.models.families import FAMILIES, attends_in_windows
    from easyrl.models.packed_attention import PACKED_SDPA
    from easyrl.testing.tiny_families import tiny_family_config
    from easyrl.workers.policy_forward import attention_implementation

    config = tiny_family_config(model_type)
    assert attends_in_windows(config) == windowed == FAMILIES[model_type].sliding_window
    expected = PACKED_SDPA if windowed else "flash_attention_2"
    assert attention_implementation("npu", True, "bf16", False, attends_in_windows(config)) == expected


def test_windows_as_transformers_reads_the_configs():
    """Qwen2/Qwen3 keep their 4096 window only with use_sliding_window; a Phi-3 config with a window (Phi-3-mini's
    2047) counts; a Qwen-VL config is read through its text config. Of the released configs in
    easyrl/model_configs only Gemma 3's windows (Mistral v0.3, Mixtral, Qwen: sliding_window null)."""
    from transformers import Phi3Config, Qwen2_5_VLConfig, Qwen2Config

    from easyrl.models.families import attends_in_windows

    assert not attends_in_windows(Qwen2Config())
    assert attends_in_windows(Qwen2Config(use_sliding_window=True, max_window_layers=0))
    assert attends_in_windows(Phi3Config(sliding_window=2047))
    assert not attends_in_windows(Qwen2_5_VLConfig())
    assert attends_in_windows(Qwen2_5_VLConfig(text_config=dict(use_sliding_window=True, max_window_layers=0)))
    from pathlib import Path

    from transformers import AutoConfig

    folders = sorted(p.parent for p in (Path(__file__).parents[1] / "easyrl/model_configs").glob("*/config.json"))
    windowed = {f.name for f in folders if attends_in_windows(AutoConfig.from_pretrained(f))}
    assert len(folders) > 20 and windowed == {"gemma-3-1b-it"}


def test_flash_attention_warning_only_where_the_varlen_kernel_is_lost():  # W02
    """#20: an H100 without flash_attn silently took the per-sequence fallback; now the start-up says so."""
    from easyrl.workers.policy_forward import flash_attention_warning

    message = flash_attention_warning("cuda", True, "bf16", False)
    assert message.startswith("flash_attn is not installed") and "pip install flash-attn" in message
    assert flash_attention_warning("cuda", True, "bf16", True) is None
    assert flash_attention_warning("cuda", True, "fp32", False) is None  # no fp32 flash kernels anyway
    assert flash_attention_warning("cuda", False, "bf16", False) is None
    assert flash_attention_warning("npu", True, "bf16", False) is None  # npu_fusion_attention
    assert flash_attention_warning("cpu", True, "bf16", False) is None


def _recording_step(trained, grads: dict):
    """``trained.optimizer.step`` that first copies the full gradients into ``grads``."""
    step = trained.optimizer.step

    def record():
        grads.update({n: p.grad.full_tensor().clone() for n, p in trained.model.named_parameters()
                      if p.grad is not None})
        return step()

    return record


def _critic(model_path, padding_free: bool, dynamic_batching: bool):
    from torch.distributed.device_mesh import init_device_mesh

    from easyrl.config import CriticConfig
    from easyrl.workers.critic import FSDPCritic

    config = CriticConfig(padding_free=padding_free, dynamic_batching=dynamic_batching, max_token_len_per_device=40,
                          cliprange_value=0.05)
    config.model.model_path = str(model_path)
    config.fsdp.param_dtype = "fp32"
    config.fsdp.enable_gradient_checkpointing = False
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    return FSDPCritic(str(model_path), config, mesh, "cpu", torch.device("cpu"), training_steps=1)


def test_sharded_critic_starts_at_zero_and_packed_matches_padded(process_group, tiny_model_path):
    """The FSDP2 critic: its values start at 0 (zero value head), and once the head is non-zero the padding-free,
    dynamic micro-batch path gives the padded, fixed-size path's values, value loss and gradients."""
    path = tiny_model_path("qwen2_5")
    data = _text_batch()
    results = []
    for padding_free, dynamic in ((False, False), (True, True)):
        critic = _critic(path, padding_free, dynamic)
        assert not hasattr(critic, "fused_head")  # its output embedding is the value head: no log-prob head
        torch.testing.assert_close(critic.compute_values(data, 2), torch.zeros(data["response_mask"].shape))
        torch.manual_seed(1)
        with torch.no_grad():
            for p in critic.model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        values = critic.compute_values(data, 2)
        batch = Batch(data.tensors.clone(), dict(data.extras))
        batch["values"] = values
        batch["returns"] = values + torch.linspace(-0.1, 0.1, values.shape[1]) * data["response_mask"]
        grads = {}
        critic.optimizer.step = _recording_step(critic, grads)
        metrics = critic.update_critic(batch, mini_batch_size=len(batch), micro_batch_size=2)
        results.append((values, metrics, grads))
        del critic
    (values, metrics, grads), (values_pf, metrics_pf, grads_pf) = results
    mask = data["response_mask"]
    assert values.abs().sum() > 0.1 and (values[mask == 0] == 0).all()
    torch.testing.assert_close(values_pf, values, atol=1e-5, rtol=0)
    # the loss is on the rollout's own values (no clipping at the first step): 0.5 * mean((V - R)^2) over valid tokens
    expected = 0.5 * ((torch.linspace(-0.1, 0.1, values.shape[1]) * mask) ** 2).sum() / mask.sum()
    for m in (metrics, metrics_pf):
        assert m["critic/vf_loss"][0] == pytest.approx(expected.item(), rel=1e-4)
        assert m["critic/vf_clipfrac"][0] == 0.0 and len(m["critic/grad_norm"]) == 1
    assert grads.keys() == grads_pf.keys() and "lm_head.bias" in grads
    for name, grad in grads.items():
        torch.testing.assert_close(grads_pf[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_critic_checkpoint_round_trip(process_group, tiny_model_path, tmp_path):
    """save_role / load_role of the critic restore the critic's weights, optimizer state and schedule; a checkpoint without a
    critic is refused with the reason."""
    from easyrl.workers.checkpoint import CRITIC_DIR, load_role, save_role

    path = tiny_model_path("qwen2_5")
    data = _text_batch()
    critic = _critic(path, True, True)
    batch = Batch(data.tensors.clone(), dict(data.extras))
    batch["values"] = critic.compute_values(data, 2)
    batch["returns"] = data["response_mask"].float()
    critic.update_critic(batch, mini_batch_size=len(batch), micro_batch_size=2)
    save_role(critic, str(tmp_path), 0, CRITIC_DIR)
    saved = critic.compute_values(data, 2)
    assert saved.abs().sum() > 0  # the update moved the zero head
    critic.update_critic(batch, mini_batch_size=len(batch), micro_batch_size=2)
    assert not torch.allclose(critic.compute_values(data, 2), saved)
    load_role(critic, str(tmp_path), 0, CRITIC_DIR)
    torch.testing.assert_close(critic.compute_values(data, 2), saved)
    assert critic.num_updates == 1 and critic.lr_scheduler.last_epoch == 1
    with pytest.raises(FileNotFoundError, match="adv_estimator=gae"):
        load_role(critic, str(tmp_path / "none"), 0, CRITIC_DIR)
