"""`seal train --help`: the config groups and the main settings, read from configs/.

Groups are the folders of the config directory, options its YAML files, the
default the root config's defaults list; setting values come from the
composed config, so the help cannot drift from what a run uses. Hydra's
compose is the only import that costs anything (well under a second).
"""

from __future__ import annotations

import argparse

from omegaconf import OmegaConf

# The settings a newcomer reaches for first; their values are read, their meanings are not in the YAML.
KNOBS = (
    ("n", "rollouts per group (GRPO)"),
    ("trainer.steps", "learner steps this run"),
    ("trainer.groups_per_step", "groups (prompts) per learner step"),
    ("trainer.mode", "async (generation overlaps learning) | sync"),
    ("trainer.max_staleness", "async: policy versions a group may lag"),
    ("trainer.filter_groups", "zero_variance (set aside equal-reward groups) | none"),
    ("learner.cfg.lr", "learning rate"),
    ("learner.cfg.old_logprobs", "PPO old policy: recompute | behaviour"),
    ("cluster.env_actors", "env actors (change it live: seal scale RUN_DIR env=N)"),
    ("run_dir", "run directory (null: runs/<timestamp>)"),
    ("resume", "a run directory to continue from its last checkpoint"),
    ("seed", "seed of sampling, task order and learner"),
    ("limit", "first N tasks of the split (null: all)"),
    ("split", "train | test | all"),
)


def config_groups(root) -> list[tuple[str, list[str], str | None, str | None]]:
    """(group, options, default option or None, the group its default follows or None) for every
    folder of the config directory. A default written ``${env}`` picks the option named like the
    env group's choice (evaluation: each env's own settings); shown is what the default env gives."""
    import yaml

    defaults: dict[str, str | None] = {}
    for entry in yaml.safe_load((root / "config.yaml").read_text()).get("defaults", []):
        if isinstance(entry, dict):
            defaults.update(entry)
    groups = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        if options:
            default = defaults.get(folder.name)
            follows = (
                default[2:-1]
                if isinstance(default, str) and default.startswith("${") and default.endswith("}")
                else None
            )
            groups.append((folder.name, options, defaults.get(follows) if follows else default, follows))
    return groups


def describe() -> str:
    from seal.config import compose, config_dir

    root = config_dir()
    lines = ["", "config groups (GROUP=OPTION; * marks the default, from configs/config.yaml):"]
    for group, options, default, follows in config_groups(root):
        listed = " ".join(o + ("*" if o == default else "") for o in options)
        note = (
            f"   (default: the {follows} group's choice)"
            if follows
            else ("" if default in options else "   (default: none)")
        )
        lines.append(f"  {group:<18}{listed}" + note)
    cfg = compose([])
    lines += ["", "main settings (KEY=VALUE, defaults as composed):"]
    for key, meaning in KNOBS:
        value = OmegaConf.select(cfg, key)
        shown = "null" if value is None else str(value)
        lines.append(f"  {key:<26}{shown:<16}{meaning}")
    lines += [
        "",
        "every other key of `seal train --cfg` takes KEY=VALUE too; --cfg prints the resolved config and exits",
    ]
    return "\n".join(lines)


class TrainHelp(argparse.Action):
    """-h/--help of `seal train`: the usual usage text, then groups and settings."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        text = parser.format_help()
        try:
            text += describe()
        except (OSError, ValueError, RuntimeError) as exc:  # a broken configs/ must not hide the usage text
            text += f"\n(config groups unavailable: {exc})"
        print(text)
        parser.exit()
