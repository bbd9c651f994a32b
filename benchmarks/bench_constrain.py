"""Constrained decoding: the project's token table against llguidance, per turn (issue 17).

The constraint of one turn is the admissible actions' JSON texts (``pipeline.llm.constrain``).
Both engines walk the same texts token by token (the canonical tokenization of one chosen
action), computing the allowed-token mask at every step as the decode loop would:

- ``table``: :class:`pipeline.llm.constrain.ActionConstraint` (prefix lookups in a
  table of token texts, built once per tokenizer);
- ``llguidance``: a Lark grammar of the literal alternatives compiled per turn (the set
  changes every turn) into an ``LLMatcher``, ``fill_next_token_bitmask`` per step.

Turns come from synthetic household observations with 10-60 admissible actions; the
tokenizer is a byte-level BPE trained here (no download). Reported: milliseconds per turn
(mask work only, model excluded) and the ratio. llguidance is optional: without it the
benchmark reports only the table.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

VERBS = ("take", "open", "close", "examine", "go_to", "put", "unlock", "drop")
KINDS = ("Apple", "Mug", "Cup", "Key", "Soap", "Bowl", "Cabinet", "Drawer", "Fridge", "Table", "Shelf")


def _turns(n: int, rng: random.Random) -> list[list[dict]]:
    turns = []
    for _ in range(n):
        acts = []
        for _ in range(rng.randint(10, 60)):
            verb = rng.choice(VERBS)
            a: dict[str, Any] = {"action": verb, "target": f"{rng.choice(KINDS)}_{rng.randint(0, 12)}"}
            if verb in ("put", "take") and rng.random() < 0.5:
                a["receptacle"] = f"{rng.choice(KINDS[6:])}_{rng.randint(0, 3)}"
            if verb == "unlock":
                a["key"] = f"Key_{rng.randint(0, 3)}"
            acts.append(a)
        turns.append(acts)
    return turns


def _tokenizer(vocab_size: int) -> Any:
    from pipeline.llm.tiny import train_tokenizer

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts = []
    for acts in _turns(200, rng):
        for a in acts:
            words = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(12))
            texts.append(f"Plan: {words}.\n" + json.dumps(a) + f', "memory": {{"plan": "{words}", "notes": "visited"}}}}')
    return train_tokenizer(texts, vocab_size=vocab_size)


def run(quick: bool) -> dict[str, Any]:
    from pipeline.llm.constrain import CLOSE, ActionConstraint, TokenTexts, action_texts

    tok = _tokenizer(2048 if quick else 8192)
    t0 = time.perf_counter()
    table = TokenTexts(tok)
    build_s = time.perf_counter() - t0
    rng = random.Random(1)
    turns = _turns(20 if quick else 100, rng)
    walks = []
    for acts in turns:
        text = rng.choice(action_texts(acts))[0] + CLOSE
        walks.append((acts, text, tok(text, add_special_tokens=False)["input_ids"]))

    steps = 0
    t0 = time.perf_counter()
    import torch

    bias = torch.zeros(len(tok))
    for acts, _, ids in walks:
        c = ActionConstraint(table, acts)
        for i in ids:
            allowed = c.allowed()
            bias.fill_(float("-inf"))  # the mask as the decode loop applies it
            bias[torch.tensor(allowed)] = 0.0
            assert i in allowed
            c.advance(table.texts[i])
            steps += 1
        assert c.done
    ours = (time.perf_counter() - t0) / len(walks)
    out: dict[str, Any] = {"table_ms_per_turn": ours * 1e3, "steps_per_turn": steps / len(walks),
                           "table_build_s": build_s, "vocab": len(tok), "turns": len(walks)}
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch as lgt
    except ImportError:
        out["llguidance"] = "not installed (pip install llguidance)"
        return out
    lltok = llguidance.hf.from_tokenizer(tok)
    mask = lgt.allocate_token_bitmask(1, lltok.vocab_size)
    warm = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark('start: "{}"\n'))  # builds its token trie
    lgt.fill_next_token_bitmask(warm, mask, 0)
    t0 = time.perf_counter()
    compile_s = 0.0
    for acts, _, ids in walks:
        alts = " | ".join(json.dumps(t + CLOSE) for t, _ in action_texts(acts))
        tc = time.perf_counter()
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(f"start: {alts}\n"))
        compile_s += time.perf_counter() - tc
        for i in ids:
            lgt.fill_next_token_bitmask(m, mask, 0)
            logits = torch.zeros((1, len(tok)))
            lgt.apply_token_bitmask_inplace(logits, mask)
            assert m.consume_token(i), m.get_error()
        assert m.is_accepting()
    theirs = (time.perf_counter() - t0) / len(walks)
    out.update(llguidance_ms_per_turn=theirs * 1e3, llguidance_compile_ms_per_turn=compile_s / len(walks) * 1e3, llguidance_version=llguidance.get_version()
               if hasattr(llguidance, "get_version") else None)
    return out
