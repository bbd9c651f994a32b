"""The decode loop's batch cache (:func:`pipeline.llm.kvcache.growing_cache`): buffers that grow in
place must give the model exactly what transformers' ``DynamicCache`` gives it, so that no byte of
an evaluation depends on which one ran (the default run's outputs were checked equal to the
committed lock with it; these tests keep that true on any machine)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from pipeline.llm.kvcache import GROWTH_TOKENS, growing_cache


@pytest.fixture(scope="module")
def llama():
    """A random two-layer Llama of the default model's shape family (tiny, seeded)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def _left_padded(lengths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    attn = torch.zeros((len(lengths), width), dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(1, vocab, (n,), generator=g)
        attn[b, width - n:] = 1
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def _decode(model, cache, lengths: list[int], steps: int, drop: dict[int, int]) -> list[torch.Tensor]:
    """Greedy decode of left-padded random prompts; at step ``s`` in ``drop``, the batch row
    ``drop[s]`` leaves (as a finished row leaves the decode loop). Every step's logits."""
    ids, attn, pos = _left_padded(lengths, model.config.vocab_size)
    seen = []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True)
        last = pos[:, -1]
        for step in range(steps):
            logits = out.logits[:, -1].float()
            seen.append(logits.clone())
            nxt = logits.argmax(-1)
            if step in drop:
                keep = torch.tensor([b for b in range(len(nxt)) if b != drop[step]])
                cache.batch_select_indices(keep)
                attn, last, nxt = attn[keep], last[keep], nxt[keep]
            attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
            last = last + 1
            out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last[:, None],
                        past_key_values=cache, use_cache=True)
    return seen


@pytest.mark.parametrize("steps", [12, GROWTH_TOKENS + 40])  # the second outgrows its first buffer
def test_growing_cache_gives_the_bytes_of_transformers_cache(llama, steps):
    lengths = [30, 7, 19]
    grown = growing_cache(2)
    a = _decode(llama, grown, lengths, steps, drop={5: 1})
    b = _decode(llama, DynamicCache(config=llama.config), lengths, steps, drop={5: 1})
    assert len(a) == len(b) == steps
    for step, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"step {step}: logits differ by {(x - y).abs().max().item()}"
    layer = grown.layers[0]
    assert layer.keys.shape == (2, 4, 30 + steps, 8) and grown.get_seq_length() == 30 + steps
    assert layer._k.shape[-2] >= layer.keys.shape[-2]  # the view is the filled part of its buffer
    if steps > GROWTH_TOKENS:
        assert layer._k.shape[-2] == (30 + GROWTH_TOKENS + 1) + GROWTH_TOKENS  # grown once, at the token past its room


def test_growing_cache_filled_from_data_equals_a_filled_dynamic_cache(llama):
    """The prompt cache's path: the batch cache starts from cached keys and values."""
    torch.manual_seed(2)
    data = [(torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)) for _ in range(2)]
    grown = growing_cache(2, data)
    plain = DynamicCache(ddp_cache_data=data)
    assert grown.get_seq_length() == plain.get_seq_length() == 9
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    attn = torch.ones((2, 12), dtype=torch.long)
    pos = torch.arange(9, 12)[None, :].expand(2, 3)
    with torch.inference_mode():
        x = llama(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=grown, use_cache=True).logits
        y = llama(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=plain, use_cache=True).logits
    assert torch.equal(x, y)
    for g, p in zip(grown.layers, plain.layers):
        assert torch.equal(g.keys, p.keys) and torch.equal(g.values, p.values)


def test_growing_cache_refuses_what_the_decode_loop_never_does():
    cache = growing_cache(1, [(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))])
    with pytest.raises(NotImplementedError, match="crop"):
        cache.layers[0].crop(-1)
    cache.layers[0].reset()
    assert cache.get_seq_length() == 0
