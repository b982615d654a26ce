"""One command line from the config dataclasses, so that no setting is declared twice.

Every field of a config (TrainConfig, CapsNetConfig, FineTuneConfig) becomes an option named after it
(`lr_decay` -> `--lr-decay`) with the field's type and default; its help is the comment beside the field
in the class's source, so the dataclass stays the one place a setting is written and explained. A bool
gets `--name/--no-name`. A command may take a subset of fields and other defaults (the experiments'
shorter schedules, the fine-tune's augmentations); `build` turns the parsed options back into the config.
"""

import argparse
import dataclasses
import inspect
import re
import types
from collections.abc import Iterable, Mapping

FIELD = re.compile(r"^    (\w+): [^#]*?(?:#\s?(.*))?$")  # `    name: type = default  # help`
MORE = re.compile(r"^ {4,}# {2,}(\S.*)$")  # a comment whose text is indented continues the help above


def field_help(cls: type) -> dict[str, str]:
    """Each field's comment in cls's source, continuation lines joined."""
    helps, name = {}, None
    for line in inspect.getsource(cls).splitlines():
        if (field := FIELD.match(line)) and field.group(1) in {f.name for f in dataclasses.fields(cls)}:
            name = field.group(1)
            helps[name] = field.group(2) or ""
        elif name and (more := MORE.match(line)):
            helps[name] += " " + more.group(1)
        else:
            name = None
    return helps


def _type(annotation) -> type:
    """int, float, str or bool from a field's annotation (`str | None` -> str)."""
    if isinstance(annotation, types.UnionType):
        (annotation,) = [a for a in annotation.__args__ if a is not type(None)]
    return annotation


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    only: Iterable[str] | None = None,
    defaults: Mapping[str, object] | None = None,
    choices: Mapping[str, Iterable] | None = None,
) -> None:
    """An option for each field of cls (or only those named), with cls's defaults unless `defaults` says
    otherwise; `choices` lists the values a field may take."""
    helps, defaults, choices = field_help(cls), defaults or {}, choices or {}
    names = list(only) if only is not None else [f.name for f in dataclasses.fields(cls)]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(names) - set(fields) | set(defaults) - set(names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no option {', '.join(sorted(unknown))}")
    for name in names:
        f = fields[name]
        default = defaults.get(name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        kind, flag = _type(f.type), "--" + name.replace("_", "-")
        text = helps.get(name, "").replace("%", "%%") or None  # argparse formats help with %
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            parser.add_argument(
                flag, type=kind, default=default, help=text, choices=tuple(choices[name]) if name in choices else None
            )


def build(cls: type, args: argparse.Namespace, **overrides):
    """cls from the parsed options that are its fields (others are left to the command), then overrides."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **overrides})
