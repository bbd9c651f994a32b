"""Dev-memory tool (seed 002 section 6): run the model once on a prompt file and show its memory.

For prompt developers: renders a template, asks the model once, and prints the returned
JSON, the memory dict taken from it, and the prompt re-rendered with that memory::

    python -m pipeline.tools.dev_memory --prompt conf/templates/system_compact.txt \\
        model.name_or_path=data/policy/model sampling.do_sample=false
    python -m pipeline.tools.dev_memory --prompt my_prompt.txt --memory '{"plan": ["open Fridge_0"]}' \\
        --observation obs.json model.backend=openai model.base_url=http://localhost:8000/v1 \\
        model.api_model=Qwen2.5-0.5B-Instruct
    python -m pipeline.tools.dev_memory --prompt my_prompt.txt \\
        --response '{"action": "look", "target": null, "memory": {"notes": "try"}}'   # no model

Trailing ``key=value`` arguments are Hydra overrides of ``conf/`` (the model and sampling
groups: ``model.name_or_path``, ``model.backend``, ``sampling.*``, ...), composed as
``dvc exp run -S`` would. ``--memory``, ``--observation`` and ``--variables`` take JSON
text or a JSON file. Missing template variables are left in place with a warning (the
tool shows a prompt under development; the pipeline itself is strict).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from omegaconf import OmegaConf

from pipeline.core.conf_schema import Config
from pipeline.core.config import ConfigError, compose_text, project_root, validate
from pipeline.llm.backends import is_local, make_backend
from pipeline.prompts import (
    PromptOrganizer,
    PromptTemplateError,
    extract_json_object,
    load_template,
    observation_variables,
    system_prompt_interp,
)

GenerateFn = Callable[[str], str]

#: Stand-in values so any of conf/templates/*.txt renders out of the box (seed 004's scene).
SAMPLE_OBSERVATION = {
    "scene": "scene_0",
    "agent_location": "Kitchen",
    "agent_inventory": ["Key_1"],
    "visible_entities": ["Cabinet_0", "Drawer_1", "Apple_2", "Fridge_0"],
    "available_actions": ["go_to", "pick_up", "put", "open", "close", "examine", "wait"],
    "admissible_commands": ["open fridge_0", "open drawer_1", "take apple_2", "go west", "look"],
    "description": "-= Kitchen =- You see a Cabinet_0, a Drawer_1 and a Fridge_0. An Apple_2 is on the table.",
    "step": 0,
    "max_steps": 30,
}
SAMPLE_VARIABLES = {
    "objective": "Put Apple_2 in Fridge_0 and close it",
    "grounding_content": "None",
    "memory_slot": "",
}
DEFAULT_USER_MESSAGE = "Answer now: one short reasoning line, then the JSON action."


@dataclass
class DevMemoryResult:
    """What one dev-memory run produced."""

    prompt: str  # the prompt the model saw (rendered with the initial memory)
    output: str  # the model's raw text
    response: dict | None  # the first JSON object in the output
    memory_updated: bool  # did the response carry a memory object?
    memory: dict  # the memory dict after the response
    rerendered_prompt: str  # the prompt rendered again with that memory


def run_dev_memory(
    template: str,
    generate: GenerateFn,
    *,
    memory: Mapping[str, Any] | None = None,
    variables: Mapping[str, Any] | None = None,
    observation: Mapping[str, Any] | None = None,
    template_name: str = "<prompt>",
    organizer: PromptOrganizer | None = None,
) -> DevMemoryResult:
    """Render ``template``, call ``generate`` once, take the memory, re-render.

    Args:
        template: The prompt template text.
        generate: ``prompt -> generated text`` (a model backend, or a stub).
        memory: The initial memory dict (None: the organizer's configured defaults).
        variables: Template variables (defaults: :data:`SAMPLE_VARIABLES`).
        observation: Observation dict for the turn slots (default :data:`SAMPLE_OBSERVATION`).
        template_name: Shown in warnings.
        organizer: Carries the prompts config (memory defaults, renderer settings).
    """
    org = organizer or PromptOrganizer()
    org.set_memory_dict(dict(memory) if memory is not None else None)
    values = {**SAMPLE_VARIABLES, **observation_variables(observation or SAMPLE_OBSERVATION), **(variables or {})}

    def render() -> str:
        return system_prompt_interp(
            template, values, org.memory_dict, template_name=template_name, strict=False,
            missing_memory_value=org.missing_memory_value, empty_string_value=org.empty_string_value,
            max_depth=org.max_depth)

    prompt = render()
    output = generate(prompt)
    response = extract_json_object(output)
    updated = org.update_memory_from_response(response) if response is not None else False
    return DevMemoryResult(prompt=prompt, output=output, response=response, memory_updated=updated,
                           memory=org.memory_dict, rerendered_prompt=render())


def format_result(res: DevMemoryResult, *, show_prompt: bool = False) -> str:
    """The human-readable report the CLI prints."""

    def block(title: str, body: str) -> str:
        return f"===== {title} =====\n{body.rstrip()}\n"

    parts = []
    if show_prompt:
        parts.append(block("prompt (initial memory)", res.prompt))
    parts.append(block("model output", res.output or "(empty)"))
    parts.append(block("returned JSON", json.dumps(res.response, ensure_ascii=False, indent=2)
                       if res.response is not None else "(no JSON object in the output)"))
    note = "" if res.memory_updated else "(the response carried no memory object: memory unchanged)\n"
    parts.append(block("memory dict", note + json.dumps(res.memory, ensure_ascii=False, indent=2)))
    parts.append(block("prompt re-rendered with the memory", res.rerendered_prompt))
    return "\n".join(parts)


def _json_arg(value: str | None, what: str) -> Any:
    """JSON text or the path of a JSON file."""
    if value is None:
        return None
    text = value
    if not value.lstrip().startswith(("{", "[")) and Path(value).exists():
        text = Path(value).read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: --{what} {value!r}: not JSON text nor a JSON file ({exc})") from exc
    if not isinstance(obj, dict):
        raise SystemExit(f"error: --{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def backend_generate(cfg: Config, user_message: str = DEFAULT_USER_MESSAGE) -> GenerateFn:
    """A ``prompt -> text`` callable over the llm engineer's backends (``pipeline.llm``).

    The prompt is the system message; ``user_message`` asks for the answer.
    """
    backend = make_backend(cfg.model, cfg.sampling)

    def generate(prompt: str) -> str:
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": user_message}]
        gen = backend.generate([messages], seeds=[cfg.sampling.seed])[0]
        if gen.error:
            raise RuntimeError(f"generation failed: {gen.error}")
        return gen.text

    return generate


def _cli_generate(cfg: Config, response: str | None, user_message: str) -> GenerateFn | None:
    """The given ``--response`` (text or a file holding it), else the configured model.

    ``None`` after printing the error when no model is configured or it cannot be built.
    """
    if response is not None:
        reply = Path(response).read_text(encoding="utf-8") if Path(response).is_file() else response

        def generate(prompt: str) -> str:
            return reply

        return generate
    if is_local(cfg.model) and not cfg.model.name_or_path:
        print("error: no model: pass model.name_or_path=DIR (a local causal LM directory), "
              "model.backend=openai model.base_url=URL, or --response TEXT to try a reply", file=sys.stderr)
        return None
    try:
        return backend_generate(cfg, user_message)
    except Exception as exc:  # a backend that cannot be built: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.dev_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", required=True, help="prompt template file ($var, ${var}, $memory[key][sub])")
    parser.add_argument("--memory", help="initial memory dict: JSON text or file (default: prompts.memory_defaults)")
    parser.add_argument("--observation", help="observation dict: JSON text or file (default: a sample kitchen)")
    parser.add_argument("--variables", help="further template variables: JSON text or file")
    parser.add_argument("--grounding", help="grounding files for $grounding_content (comma-separated)")
    parser.add_argument("--response", help="skip the model: use this reply (text or a file holding it)")
    parser.add_argument("--user-message", default=DEFAULT_USER_MESSAGE, help="user turn sent after the prompt")
    parser.add_argument("--show-prompt", action="store_true", help="also print the prompt before the reply")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/, e.g. model.name_or_path=DIR")
    args = parser.parse_args(argv)

    root = project_root()
    try:
        cfg = validate(OmegaConf.create(compose_text(root, args.overrides)))
        template = load_template(args.prompt, Path.cwd())
    except (ConfigError, PromptTemplateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    org = PromptOrganizer.from_config(cfg, root=root)
    variables = _json_arg(args.variables, "variables") or {}
    if args.grounding:
        variables.setdefault("grounding_content", org.grounding_content(args.grounding))

    generate = _cli_generate(cfg, args.response, args.user_message)
    if generate is None:
        return 2
    try:
        res = run_dev_memory(template, generate, memory=_json_arg(args.memory, "memory"), variables=variables,
                             observation=_json_arg(args.observation, "observation"), template_name=args.prompt,
                             organizer=org)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(asdict(res), ensure_ascii=False, indent=2))
    else:
        print(format_result(res, show_prompt=args.show_prompt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
