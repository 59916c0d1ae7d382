"""Routing replay (``easyrl.models.router_replay``) on the registry's MoE families at tiny size (2 decoder layers, 4
experts, top-2, transformers' real classes, fp32): a replayed MoE block equals the block run with hand-computed
weights over the replayed experts; replaying a model's own routing changes nothing, a shifted routing does."""

from __future__ import annotations

import pytest
import torch

from easyrl.models.families import FAMILIES
from easyrl.models.router_replay import NO_EXPERT, RouterReplay
from easyrl.testing.tiny_families import TINY_FAMILIES, tiny_family_config

MOE_TYPES = [t for t in TINY_FAMILIES if FAMILIES[t].moe]


def _model(model_type: str):
    import transformers

    torch.manual_seed(0)
    config = tiny_family_config(model_type)
    config.vocab_size = 512  # the routers do not care about the vocabulary
    return getattr(transformers, TINY_FAMILIES[model_type].model_class)._from_config(config, dtype=torch.float32).eval()


def _own_routing(model, input_ids) -> torch.Tensor:
    """``(tokens, layers, k)`` of the routers' own choices in a plain forward."""
    chosen = {}
    kind = FAMILIES[model.config.model_type].router
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    hooks = [m.register_forward_hook(lambda mod, a, out, i=i: chosen.__setitem__(i, dict(zip(kind.outputs, out))["experts"]))
             for i, m in enumerate(routers)]
    with torch.no_grad():
        model(input_ids=input_ids)
    for hook in hooks:
        hook.remove()
    return torch.stack([chosen[i] for i in sorted(chosen)], dim=1)


def _hand_weights(model_type, router, hidden, experts):
    """The replayed experts' weights as the family's modeling code would weigh them, written out."""
    logits = hidden @ router.weight.T
    if model_type == "granitemoe":
        return torch.softmax(logits.gather(-1, experts), dim=-1)
    probs = torch.softmax(logits, dim=-1).gather(-1, experts)
    renormalised = {"qwen3_moe": True, "mixtral": True, "olmoe": False}[model_type]  # the tiny configs' norm_topk_prob
    return probs / probs.sum(-1, keepdim=True) if renormalised else probs


@pytest.mark.parametrize("model_type", MOE_TYPES)
def test_replayed_block_equals_hand_computed_router(model_type):
    model = _model(model_type)
    replay = RouterReplay(model, FAMILIES[model_type].router)
    assert replay.layers == [0, 1]
    layer = model.model.layers[1]
    block = layer.block_sparse_moe if model_type == "granitemoe" else layer.mlp
    router = next(m for m in block.modules() if type(m).__name__.endswith("TopKRouter"))
    torch.manual_seed(1)
    hidden = torch.randn(1, 6, model.config.hidden_size)
    experts = torch.tensor([[3, 0], [1, 2], [2, 3], [0, 1], [3, 1], [NO_EXPERT, NO_EXPERT]])
    routing = torch.full((6, 2, 2), NO_EXPERT)
    routing[:, 1] = experts
    with torch.no_grad():
        replay.arm(None)
        plain = block(hidden)
        replay.arm(routing)
        replayed = block(hidden)
        flat = hidden.reshape(6, -1)
        own = _own_routing_of_block(model_type, router, flat)
        used = torch.where(experts >= 0, experts, own)
        weights = _hand_weights(model_type, router, flat, used)
        expected = block.experts(flat, used, weights.to(flat.dtype)).reshape(1, 6, -1)
    torch.testing.assert_close(replayed, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(replayed[:, 5], plain[:, 5])  # NO_EXPERT: the router's own choice
    assert not torch.allclose(replayed[:, :5], plain[:, :5])  # the replayed experts were not the router's


def _own_routing_of_block(model_type, router, flat):
    logits = flat @ router.weight.T
    return logits.topk(router.top_k, dim=-1).indices  # softmax keeps the order: the same top-k either way


@pytest.mark.parametrize("model_type", ["qwen3_moe", "granitemoe"])
def test_replaying_own_routing_is_exact_and_a_shift_is_not(model_type):
    model = _model(model_type)
    ids = torch.randint(0, 512, (1, 12))
    own = _own_routing(model, ids)
    replay = RouterReplay(model, FAMILIES[model_type].router)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        replay.arm(own)
        same = model(input_ids=ids).logits
        assert replay.agreement() == 1.0
        replay.arm(torch.roll(own, 1, dims=0))  # a planted off-by-one in the token positions
        shifted = model(input_ids=ids).logits
        assert replay.agreement() < 0.9
    torch.testing.assert_close(same, plain, rtol=0, atol=0)
    assert (shifted - plain).abs().max() > 1e-3


def test_replay_keeps_the_routers_gradient_and_refuses_bad_shapes():
    model = _model("qwen3_moe").train()
    ids = torch.randint(0, 512, (1, 8))
    replay = RouterReplay(model, FAMILIES["qwen3_moe"].router)
    replay.arm(_own_routing(model, ids).flip(-1))  # the same experts, the other order
    model(input_ids=ids).logits.sum().backward()
    router = model.model.layers[0].mlp.gate
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    replay.arm(torch.zeros(7, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="saw 8 tokens"):
        model(input_ids=ids)


def test_a_dense_model_has_no_router_to_replay():
    import transformers

    config = tiny_family_config("qwen3")
    config.vocab_size = 512
    with pytest.raises(ValueError, match="mixture-of-experts"):
        RouterReplay(transformers.Qwen3ForCausalLM(config), FAMILIES["qwen3_moe"].router)


def test_routing_batch_lays_each_sample_out_as_input_ids():
    import numpy as np

    from easyrl.trainer.rollout import routing_batch

    prompt_mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    first = np.arange(4 * 2).reshape(4, 1, 2)  # 2 prompt tokens + 2 of its 3 response tokens (the last never ran)
    second = np.arange(100, 100 + 6 * 2).reshape(6, 1, 2)  # 3 + 3: cut at R = 3
    out = routing_batch(prompt_mask, 3, [first, second])
    assert out.shape == (2, 7, 1, 2) and out.dtype == torch.int16
    assert out[0, :2].eq(NO_EXPERT).all() and out[0, 6].eq(NO_EXPERT).all()
    assert out[0, 2:6].flatten().tolist() == list(range(8))
    assert out[1, 1:7].flatten().tolist() == list(range(100, 112))
    with pytest.raises(ValueError, match="sample 1: the engine's routing covers 2 positions, its prompt has 3"):
        routing_batch(prompt_mask, 3, [first, second[:2]])


class _Runner:
    """What ``routing_capture`` reads of vLLM's model runner in one step: the batch's requests, their token
    offsets and positions."""

    def __init__(self):
        import numpy as np
        from types import SimpleNamespace

        self.input_batch = SimpleNamespace(num_reqs=0, req_ids=[], num_computed_tokens_cpu=np.zeros(4, dtype=int))
        self.query_start_loc = SimpleNamespace(np=np.zeros(5, dtype=int))

    def step(self, capture, requests: dict[str, tuple[int, list[int]]]) -> None:
        """One forward: ``{request: (first position, experts of its tokens)}`` (one layer, top-1)."""
        batch = self.input_batch
        batch.num_reqs, batch.req_ids = len(requests), list(requests)
        offsets = [0]
        for i, (start, experts) in enumerate(requests.values()):
            batch.num_computed_tokens_cpu[i] = start
            offsets.append(offsets[-1] + len(experts))
        self.query_start_loc.np[: len(offsets)] = offsets
        ids = torch.tensor([e for _, experts in requests.values() for e in experts]).view(-1, 1)
        capture.forward(lambda: capture.capture(0, ids))


def test_capture_maps_each_forward_row_to_its_request_and_position():
    from types import SimpleNamespace

    from easyrl.workers.routing_capture import _Capture, take_routing

    runner = _Runner()
    capture = _Capture(runner, layers=2, top_k=1)
    runner._easyrl_routing_capture = capture
    runner.step(capture, {"easyrl-0-ab12cd34": (0, [3, 1, 2]), "easyrl-1-ef56ab78": (0, [0, 0])})  # prefills
    runner.step(capture, {"easyrl-1-ef56ab78": (2, [1]), "easyrl-0-ab12cd34": (3, [2])})  # one decode step each
    runner.step(capture, {"easyrl-0-ab12cd34": (0, [0, 0, 0, 0])})  # recomputed (preempted): the first run wins
    first, second, never = take_routing(SimpleNamespace(model_runner=runner), ["easyrl-0", "easyrl-1", "easyrl-2"])
    assert first[:, 0, 0].tolist() == [3, 1, 2, 2] and (first[:, 1] == NO_EXPERT).all()  # layer 1 is dense
    assert second[:, 0, 0].tolist() == [0, 0, 1]
    assert never is None and not capture.chunks  # taken routing is forgotten


def test_padded_and_packed_forwards_replay_the_same_routing():
    """``response_scores`` lays the batch's ``routed_experts`` out as each layout feeds its routers: a replay of
    other experts than the model's own gives the same log-probs padded and packed."""
    from easyrl.models.fused_head import FusedLogProbHead
    from easyrl.models.packed_attention import PACKED_SDPA
    from easyrl.workers.policy_forward import ModelInputs, response_scores

    model = _model("qwen3_moe")
    replay = RouterReplay(model, FAMILIES["qwen3_moe"].router)
    prompt_lens, resp_lens, width_p, width_r = [3, 5], [4, 2], 5, 4
    ids = torch.zeros(2, width_p + width_r, dtype=torch.long)
    mask = torch.zeros_like(ids)
    routed = torch.full((2, width_p + width_r, 2, 2), NO_EXPERT, dtype=torch.int16)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        cols = list(range(width_p - p, width_p + r))
        ids[i, cols] = torch.randint(3, 512, (len(cols),))
        mask[i, cols] = 1
        routed[i, cols] = torch.flip(_own_routing(model, ids[i:i + 1, cols]), dims=[0]).to(torch.int16)  # others'
    response_mask = mask[:, width_p:]
    inputs = ModelInputs(ids, mask, response_mask, {}, None, routed)
    scores = {}
    with torch.no_grad():
        for layout in ("packed", "padded"):
            model.set_attn_implementation(PACKED_SDPA if layout == "packed" else "sdpa")
            head = FusedLogProbHead(model) if layout == "packed" else None
            scores[layout] = response_scores(model, inputs, 1.0, False, False, fused_head=head, replay=replay)
            scores[f"{layout} own"] = response_scores(model, inputs._replace(routed_experts=None), 1.0, False, False,
                                                      fused_head=head, replay=replay)
    torch.testing.assert_close(scores["packed"].log_probs, scores["padded"].log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(scores["packed own"].log_probs, scores["padded own"].log_probs, atol=1e-5, rtol=0)
    assert (scores["packed"].log_probs - scores["packed own"].log_probs).abs().max() > 1e-3


def test_the_recorded_routing_replays_exactly_in_both_layouts():
    """R2: the old-log-prob pass records the routers' choices (``record=True``), laid out as ``input_ids`` whatever
    the layout; the update's replay of them gives the recording pass's log-probs exactly."""
    from easyrl.models.fused_head import FusedLogProbHead
    from easyrl.models.packed_attention import PACKED_SDPA
    from easyrl.workers.policy_forward import ModelInputs, response_scores

    model = _model("qwen3_moe")
    replay = RouterReplay(model, FAMILIES["qwen3_moe"].router)
    ids = torch.randint(3, 512, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    mask[1, -2:] = 0  # a short response
    inputs = ModelInputs(ids, mask, mask[:, 5:], {}, None)
    recorded = {}
    with torch.no_grad():
        for layout in ("packed", "padded"):
            model.set_attn_implementation(PACKED_SDPA if layout == "packed" else "sdpa")
            head = FusedLogProbHead(model) if layout == "packed" else None
            old = response_scores(model, inputs, 1.0, False, False, fused_head=head, replay=replay, record=True)
            recorded[layout] = old.routing
            replayed = response_scores(model, inputs._replace(routed_experts=old.routing), 1.0, False, False,
                                       fused_head=head, replay=replay)
            assert replay.agreement() == 1.0
            torch.testing.assert_close(replayed.log_probs, old.log_probs, rtol=0, atol=0)
    assert recorded["packed"].shape == (2, 9, 2, 2) and recorded["packed"].dtype == torch.int16
    torch.testing.assert_close(recorded["packed"], recorded["padded"], rtol=0, atol=0)
    assert (recorded["packed"][mask == 0] == NO_EXPERT).all() and (recorded["packed"][mask == 1] >= 0).all()
    replay.arm(None)
    torch.testing.assert_close(recorded["packed"][1, :7], _own_routing(model, ids[1:, :7]).to(torch.int16))


def test_a_trajectory_takes_each_positions_experts_from_the_first_turn_that_ran_it():
    import numpy as np

    from easyrl.trainer.rollout import trajectory_routing

    first = np.array([[[0]], [[1]], [[2]]])  # turn 1: its prompt (2 tokens) and response (the last never ran)
    second = np.array([[[9]], [[-1]], [[5]], [[6]], [[7]]])  # turn 2: prompt + turn 1 + tool token + response
    merged = trajectory_routing([first, None, second], positions=6)
    assert merged.dtype == np.int16
    assert merged[:, 0, 0].tolist() == [0, 1, 2, 6, 7, -1]  # position 1: turn 2's prefix-cache hit keeps turn 1's
    assert trajectory_routing([None], positions=3) is None


def test_the_request_stream_rollout_lays_out_each_samples_routing():
    """Split placements and partial rollouts: ``StreamingRollout`` places each finished sample's routing (the 4th
    field of the stream's samples) like the colocated rollout does."""
    import numpy as np
    from tensordict import TensorDict

    from easyrl.batch import Batch
    from easyrl.trainer.request_stream import StreamingRollout

    class Stream:  # the finished samples a RequestStream hands back: (ids, log_probs, versions, routing)
        def submit(self, prompts, overrides):
            return 0

        def wait(self, sid):
            return [([5, 6], None, [0, 1], np.arange(3).reshape(3, 1, 1)),
                    ([7], None, [1], np.arange(2).reshape(2, 1, 1) + 10)]

    prompts = Batch(TensorDict({"prompts": torch.tensor([[0, 1, 2], [0, 0, 3]]),
                                "prompt_mask": torch.tensor([[0, 1, 1], [0, 0, 1]])}, batch_size=[2]),
                    {"uid": ["a", "b"]})
    batch, _ = StreamingRollout(Stream, response_length=2, pad_id=0).generate(prompts, None)
    assert batch["routed_experts"][:, :, 0, 0].tolist() == [[-1, 0, 1, 2, -1], [-1, -1, 10, 11, -1]]


def test_the_expert_load_of_a_collapsed_routing():
    model = _model("qwen3_moe")
    experts = model.config.num_experts
    ids = torch.randint(0, 512, (1, 10))
    replay = RouterReplay(model, FAMILIES["qwen3_moe"].router)
    with torch.no_grad():
        replay.arm(_own_routing(model, ids))
        model(input_ids=ids)
        assert 1.0 <= replay.expert_load() < experts / 2
        assert replay.expert_load() is None  # reset by the read
        replay.arm(torch.tensor([0, 1]).expand(10, 2, 2))  # every token to experts 0 and 1 in both layers
        model(input_ids=ids)
    assert replay.expert_load() == pytest.approx(experts / 2)


def test_a_rollout_dump_keeps_the_routing_for_an_r3_replay(tmp_path):
    from tensordict import TensorDict

    from easyrl.batch import Batch
    from easyrl.trainer.rollout_dump import read_step, replay_inputs, write_step

    routed = torch.randint(-1, 8, (4, 6, 3, 2), dtype=torch.int16)
    batch = Batch(TensorDict({"routed_experts": routed, "response_mask": torch.ones(4, 3, dtype=torch.long)},
                             batch_size=[4]), {"uid": list("aabb")})
    write_step(str(tmp_path), 1, batch)
    back = replay_inputs(read_step(str(tmp_path), 1))
    assert back["routed_experts"].dtype == torch.int16 and torch.equal(back["routed_experts"], routed)
