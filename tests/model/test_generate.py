"""generate(): the same tokens as transformers' XLNetLMHeadModel.generate (greedy, beam search, sampling), left padding,
end of sequence, and a cache that makes each step cost one position plus attention over the memory."""

import pytest
import torch
from model_helpers import TINY, randomise, twins
from torch.utils.flop_counter import FlopCounterMode

import xlnet_lite
from xlnet_lite.modeling_xlnet_lite import CACHE_NAME

PAD, EOS = 5, 2  # XLNetConfig's defaults, kept by the twins


def prompt(batch=3, length=7, seed=0):
    """Random ids that avoid the pad and end-of-sequence ids (generate() would infer padding from the pad id)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(6, 97, (batch, length), generator=gen)


def generate(model, ids, **settings):
    settings = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": PAD, "eos_token_id": None, **settings}
    with torch.no_grad():
        return model.generate(ids, output_scores=True, return_dict_in_generate=True, **settings)


def assert_same_generation(a, b):
    assert torch.equal(a.sequences, b.sequences)
    for x, y in zip(a.scores, b.scores, strict=True):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"mem_len": 6}, {"clamp_len": 3}, {"bi_data": True}],
    ids=["plain", "mem_len", "clamp_len", "bi_data"],
)
def test_greedy_equals_transformers(impl, overrides):
    hf, lite = twins(**overrides)
    lite.config._attn_implementation = impl
    ids = prompt(batch=4)
    assert lite.can_generate()
    assert_same_generation(generate(hf, ids), generate(lite, ids))


def test_generated_tokens_depend_on_the_weights():
    """The equality above is not vacuous: another model generates other tokens."""
    hf, _ = twins(seed=0)
    _, other = twins(seed=1)
    assert not torch.equal(generate(hf, prompt()).sequences, generate(other, prompt()).sequences)


def test_beam_search_equals_transformers():
    hf, lite = twins()
    settings = dict(num_beams=3, num_return_sequences=2, max_new_tokens=8)
    a, b = generate(hf, prompt(batch=2), **settings), generate(lite, prompt(batch=2), **settings)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.sequences_scores, b.sequences_scores, atol=1e-4, rtol=1e-4)


def test_sampling_equals_transformers_with_the_same_seed():
    hf, lite = twins()
    outputs = []
    for model in (hf, lite):
        torch.manual_seed(7)
        outputs.append(generate(model, prompt(), do_sample=True, top_k=20, temperature=1.5, max_new_tokens=12))
    assert_same_generation(*outputs)


def test_without_cache_equals_transformers_without_mems():
    """use_cache=False recomputes the whole sequence each step, as transformers' XLNet does with use_mems=False."""
    hf, lite = twins()
    a, b = generate(hf, prompt(), use_mems=False), generate(lite, prompt(), use_cache=False)
    assert_same_generation(a, b)
    cached = generate(lite, prompt())
    assert any(not torch.allclose(x, y, atol=1e-3) for x, y in zip(b.scores, cached.scores))  # bidirectional recompute


def test_uni_cache_equals_recomputing():
    """attn_type "uni": a position never sees later ones, so the cache and a full recompute agree exactly."""
    torch.manual_seed(0)
    lite = randomise(xlnet_lite.XLNetLiteLMHeadModel(xlnet_lite.XLNetLiteConfig(**TINY, attn_type="uni"))).eval()
    assert_same_generation(generate(lite, prompt()), generate(lite, prompt(), use_cache=False))


def test_left_padding_gives_each_row_what_it_gives_alone():
    _, lite = twins()
    long, short = prompt(batch=1, length=7, seed=1), prompt(batch=1, length=4, seed=2)
    batch = torch.cat([long, torch.cat([torch.full((1, 3), PAD), short], dim=1)])
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[1, :3] = 0
    together = generate(lite, batch, attention_mask=attention_mask)
    for row, alone in enumerate((generate(lite, long), generate(lite, short))):
        assert torch.equal(together.sequences[row, 7:], alone.sequences[0, -10:])
        for x, y in zip(together.scores, alone.scores):
            torch.testing.assert_close(x[row], y[0], atol=1e-4, rtol=1e-4)


def test_end_of_sequence_stops_a_row_and_pads_it():
    hf, lite = twins()
    free = generate(lite, prompt()).sequences[:, 7:]
    eos = int(free[0, 3])  # the token row 0 makes at step 4
    a, b = generate(hf, prompt(), eos_token_id=eos), generate(lite, prompt(), eos_token_id=eos)
    assert torch.equal(a.sequences, b.sequences)
    first = int((b.sequences[0, 7:] == eos).nonzero()[0])
    assert first <= 3 and (b.sequences[0, 7 + first + 1 :] == PAD).all()


def test_predict_next_is_the_dummy_token_prediction():
    """predict_next=True gives what appending a dummy token hidden by perm_mask and read by target_mapping gives,
    with memory, padding and the uni masks (compared with XLNet-Lite's own two-stream path)."""
    for overrides in ({}, {"attn_type": "uni"}, {"attn_type": "uni", "same_length": True}, {"bi_data": True}):
        torch.manual_seed(0)
        lite = randomise(xlnet_lite.XLNetLiteLMHeadModel(xlnet_lite.XLNetLiteConfig(**{**TINY, **overrides}))).eval()
        ids = prompt(batch=4)
        attention_mask = torch.ones(4, 7)
        attention_mask[1, :2] = 0
        with torch.no_grad():
            mems = lite(prompt(batch=4, seed=3), use_mems=True).mems
            fast = lite(ids, attention_mask=attention_mask, mems=mems, predict_next=True).logits
            B, T = ids.shape
            perm_mask = torch.zeros(B, T + 1, T + 1)
            perm_mask[:, :, -1] = 1
            target_mapping = torch.zeros(B, 1, T + 1)
            target_mapping[:, 0, -1] = 1
            slow = lite(
                torch.cat([ids, torch.zeros(B, 1, dtype=torch.long)], 1),
                mems=mems,
                perm_mask=perm_mask,
                target_mapping=target_mapping,
                attention_mask=torch.cat([attention_mask, torch.ones(B, 1)], 1),
            ).logits
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_each_step_feeds_two_tokens_and_never_reprojects_the_memory():
    """The prompt is fed once; every later step feeds two tokens (the newest and the one before it). The matmul
    FLOPs of a step grow with the memory only by the attention over it: re-projecting the memory's keys and
    values would add 4 * H^2 FLOPs per memory position and layer; attention adds ~18 * H (3 rows)."""
    _, lite = twins()
    fed = []
    handle = lite.transformer.word_embedding.register_forward_pre_hook(lambda m, args: fed.append(args[0].shape[1]))
    generate(lite, prompt(length=9), max_new_tokens=6)
    handle.remove()
    assert fed == [9, 2, 2, 2, 2, 2]

    lite.requires_grad_(
        False
    )  # FlopCounterMode's module tracker trips on parameters passed to submodules under no_grad

    def step_flops(memory):
        ids = prompt(batch=2, length=memory + 1)
        with torch.no_grad():
            cache = lite(ids, predict_next=True, use_cache=True)[CACHE_NAME]
            cache.crop(-1)
            with FlopCounterMode(display=False) as counter:
                lite(ids[:, -2:], predict_next=True, cache=cache, use_cache=True, use_mems=False)
        return counter.get_total_flops()

    H, L, extra = 32, 2, 180
    per_position_and_layer = (step_flops(20 + extra) - step_flops(20)) / (2 * extra * L)  # batch of 2
    assert 0 < per_position_and_layer < 2 * H * H


def test_the_cache_is_returned_and_grows_by_one_a_step():
    _, lite = twins()
    out = generate(lite, prompt(length=9), max_new_tokens=6)
    cache = out[CACHE_NAME]
    assert isinstance(cache, xlnet_lite.XLNetLiteCache)
    assert cache.get_seq_length() == 9 + 6 - 1  # every position but the last generated token, which is never fed
    assert cache.seen_tokens == 9 + 2 * 5  # the prompt, then two tokens a step


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(inputs_embeds=torch.zeros(3, 7, 32)), "input_ids and attention_mask only"),
        (dict(token_type_ids=torch.zeros(3, 7, dtype=torch.long)), "input_ids and attention_mask only"),
    ],
)
def test_generate_refuses_what_it_cannot_use(kwargs, message):
    _, lite = twins()
    with pytest.raises(ValueError, match=message):
        generate(lite, prompt(), **kwargs)
