"""Typed experiment configs: YAML files and ``--set key.path=value`` overrides validated against frozen dataclasses.

Every error is a :class:`ConfigError` whose message names the field and the reason (unknown keys come
with the closest valid name), so the CLI can print one line and exit with status 2. A field read from a YAML
file is also located: the message ends with ``(FILE, line N)`` of its key (:class:`MarkedDict` keeps the
positions; a value given with ``--set`` has none).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

from fedarena.platform.errors import ConfigError

__all__ = ["ConfigError", "load_yaml", "parse_override", "apply_overrides", "build", "migrate", "merged", "to_dict", "dump_yaml",
           "describe"]


# ----------------------------------------------------------------------------- reading


class MarkedDict(dict):
    """A YAML mapping that remembers the file and the line of each of its keys (for error messages)."""

    source: str = ""
    lines: dict[Any, int]
    overridden: set[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines, self.overridden = {}, set()

    def where(self, key: Any) -> str:
        """`` (FILE, line N)`` of ``key``, `` (from --set)`` for a value given there, or ""."""
        if key in self.overridden:
            return " (from --set)"
        line = self.lines.get(key)
        return f" ({self.source}, line {line})" if line is not None and self.source else ""


class _MarkedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings are :class:`MarkedDict` with each key's line."""

    source = ""


def _construct_marked_mapping(loader: _MarkedLoader, node: yaml.MappingNode) -> MarkedDict:
    plain = loader.construct_mapping(node, deep=True)  # SafeLoader's checks (hashable keys, merge keys)
    out = MarkedDict(plain)
    out.source = loader.source
    for key_node, _ in node.value:
        try:
            key = loader.construct_object(key_node, deep=True)
            out.lines.setdefault(key, key_node.start_mark.line + 1)
        except (TypeError, yaml.YAMLError):  # pragma: no cover - construct_mapping rejected these already
            pass
    return out


_MarkedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_marked_mapping)


def _load_marked(text: str, source: str) -> Any:
    loader = _MarkedLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def plain(x: Any) -> Any:
    """``x`` with every :class:`MarkedDict` turned into a plain dict (for YAML/JSON writers)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path``; missing files and bad YAML become :class:`ConfigError`."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file not found: {p}")
    if p.is_dir():
        raise ConfigError(f"config path is a directory, not a YAML file: {p}")
    try:
        data = _load_marked(p.read_text(encoding="utf-8"), str(p))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"malformed YAML in {p}{where}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML in {p}: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file is not UTF-8 text: {p}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of keys to values, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value`` (value in YAML syntax: ``3``, ``0.5``, ``true``, ``[1, 2]``, ``null``)."""
    if "=" not in text:
        raise ConfigError(f"bad --set '{text}': expected key.path=value")
    key, _, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not part or not part.replace("_", "a").replace("-", "a").isalnum() for part in parts):
        raise ConfigError(f"bad --set '{text}': '{key}' is not a dotted key path like section.field")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"bad --set '{text}': the value '{raw}' is not valid YAML") from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``key.path=value`` override applied."""
    out = _deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = MarkedDict()
            elif not isinstance(child, dict):
                path = ".".join(parts[: i + 1])
                raise ConfigError(f"bad --set '{text}': '{path}' is a value, not a section")
            node = child
        node[parts[-1]] = value
        if isinstance(node, MarkedDict):  # the value now comes from --set, not from the file
            node.lines.pop(parts[-1], None)
            node.overridden.add(parts[-1])
    return out


def _deepcopy(x: Any) -> Any:
    if isinstance(x, MarkedDict):
        out = MarkedDict({k: _deepcopy(v) for k, v in x.items()})
        out.source, out.lines, out.overridden = x.source, dict(x.lines), set(x.overridden)
        return out
    if isinstance(x, dict):
        return {k: _deepcopy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deepcopy(v) for v in x]
    return x


# ----------------------------------------------------------------------------- building


def build(schema: type, data: Mapping[str, Any], path: str = "") -> Any:
    """Build the frozen dataclass ``schema`` from ``data``, checking every key and type."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping of fields, got {_show(data)}")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    kwargs = {}
    where = data.where if isinstance(data, MarkedDict) else (lambda key: "")
    moved = getattr(schema, "MOVED", {})
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if key in moved and (key not in fields or (dataclasses.is_dataclass(hints[key])
                                                   and not isinstance(value, Mapping))):
            new = moved[key][1:] if moved[key].startswith("/") else _join(path, moved[key])  # "/": from the top
            raise _located(ConfigError(f"{full}: moved to {new} (`fedarena show --migrate "
                                       f"FILE` prints an old flat config in the nested layout)"), where(key))
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{_join(path, close[0])}'?" if close else f"; valid keys: {', '.join(fields)}"
            raise _located(ConfigError(f"unknown config key '{full}'{hint}"), where(key))
        try:
            kwargs[key] = _coerce(hints[key], value, full)
        except ConfigError as e:
            raise _located(e, where(key)) from None
    missing = [
        name
        for name, f in fields.items()
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required config key '{_join(path, missing[0])}'")
    try:
        return schema(**kwargs)
    except (ValueError, TypeError) as e:  # __post_init__ validation; its message starts with the field's name
        field_name = str(e).split(":", 1)[0].split("[", 1)[0].split(".", 1)[0].strip()
        # a message that names a field of this schema gets the schema's path in front: the field's dotted path
        message = (_join(path, str(e)) if field_name in fields else f"{path or 'config'}: {e}")
        raise _located(ConfigError(message), where(field_name)) from None


def _located(error: ConfigError, where: str) -> ConfigError:
    """``error`` with `` (FILE, line N)`` appended, once (the innermost key that has a position wins)."""
    if where and not getattr(error, "located", False):
        error = ConfigError(f"{error}{where}")
        error.located = True  # type: ignore[attr-defined]
    return error


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return plain(value)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(arg, value, path)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {_show(value)}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        choices = [str(a) for a in typing.get_args(tp)]
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {_show(value)}{hint}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{path}: expected null, got {_show(value)}")
    if dataclasses.is_dataclass(tp):
        if value is None:
            raise ConfigError(f"{path}: expected a mapping for section {tp.__name__}, got null")
        return build(tp, value, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {_show(value)}")
        args = typing.get_args(tp)
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            if len(args) != len(value):
                raise ConfigError(f"{path}: expected {len(args)} items ({_type_name(tp)}), got {len(value)}")
            return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
        _, vt = typing.get_args(tp) or (str, Any)
        return {str(k): _coerce(vt, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected bool (true/false), got {_show(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path}: expected int, got {_show(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected float, got {_show(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: expected str, got {_show(value)}")
    raise ConfigError(f"{path}: unsupported field type {_type_name(tp)}")


def migrate(schema: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every key of ``schema.MOVED`` (an old flat key -> its dotted path now) moved to its path
    (``{"aggregation": "krum"}`` -> ``{"strategy": {"aggregation": "krum"}}``); other keys stay where they are,
    in their order, and the sections appear where their first key stood. A schema whose data holds other configs
    (a sweep's base and variants) migrates itself: its ``migrate(data)`` classmethod, when it has one."""
    if callable(getattr(schema, "migrate", None)):
        return schema.migrate(data)
    moved = getattr(schema, "MOVED", {})
    hints = typing.get_type_hints(schema)
    out: dict[str, Any] = {}
    for key, value in data.items():
        current = key in hints and not (dataclasses.is_dataclass(hints[key]) and not isinstance(value, Mapping))
        if key not in moved or current:
            if isinstance(out.get(key), dict) and isinstance(value, Mapping):  # a section also filled by moved keys
                out[key] = {**plain(value), **out[key]}
            else:
                out[key] = plain(value)
            continue
        node = out
        *sections, last = moved[key].split(".")
        for part in sections:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: cannot move to {moved[key]}: '{part}' is a value, not a section")
        node[last] = plain(value)
    return out


# ----------------------------------------------------------------------------- writing


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` applied section by section (a mapping in both is merged, key by key)."""
    out = dict(base)
    for k, v in changes.items():
        out[k] = merged(out[k], v) if isinstance(out.get(k), Mapping) and isinstance(v, Mapping) else v
    return out


def to_dict(config: Any) -> Any:
    """Plain data (dicts, lists, scalars) for a config dataclass, in field order."""
    if dataclasses.is_dataclass(config):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (list, tuple)):
        return [to_dict(v) for v in config]
    if isinstance(config, dict):
        return {k: to_dict(v) for k, v in config.items()}
    return config


def dump_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)


def describe(schema: type, values: Any = None, indent: str = "") -> list[str]:
    """One line per field for ``fedarena show --docs``: name, the config's value, type, default and the doc.

    With ``values`` (a built config of ``schema``) each line shows the value in use and, where it differs,
    the default beside it (``default: ...``); without, the defaults.
    """
    lines = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        doc = f.metadata.get("doc", "")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{indent}{f.name}:  # {doc}")
            lines.extend(describe(tp, None if values is None else getattr(values, f.name), indent + "  "))
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "<required>"
        )
        shown = to_dict(default)
        if values is None:
            lines.append(f"{indent}{f.name}: {shown!r}  # {_type_name(tp)}; {doc}")
            continue
        value = to_dict(getattr(values, f.name))
        note = "default" if value == shown else f"default: {shown!r}"
        lines.append(f"{indent}{f.name}: {value!r}  # {note}; {_type_name(tp)}; {doc}")
    return lines
