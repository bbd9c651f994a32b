"""``evaluate_reader`` stage: the reader plays the eval quests with one condition's system prompts.

    python -m pipeline.stages.evaluate_reader --condition C2_oracle   # what `dvc repro evaluate_reader@C2_oracle` runs

The ``evaluate`` stage with ``agent=reader`` (:mod:`pipeline.agents.reader`): the same
tasks, seeds and rendered prompts as ``evaluate@C``, played by a rule agent that acts on
exactly what its prompt states. Its success is the condition's information ceiling; the
``compare`` stage sets the model's differences beside the reader's (utilisation). A rule
agent: seconds per condition, no model loaded.

Writes ``data/eval_reader/<condition>/{episodes,turns}.parquet`` and
``metrics/eval_reader/<condition>.json``; with ``experiment.reader=false`` only a
``SKIPPED.json`` marker in that folder (and metrics saying so), which ``compare`` reads as
"no reader". The body is the ``evaluate`` stage's (:func:`pipeline.stages.evaluate.evaluate`).
"""

from __future__ import annotations

import sys
from functools import partial

from pipeline.llm.backends import BackendError
from pipeline.stages.common import run_stage
from pipeline.stages.evaluate import condition_argument, evaluate


def main(argv: list[str] | None = None) -> int:
    return run_stage("evaluate_reader", partial(evaluate, reader=True), argv, doc=__doc__,
                     arguments=condition_argument, expected=(BackendError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
