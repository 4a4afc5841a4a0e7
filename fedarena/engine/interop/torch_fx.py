"""``from_torch``: a PyTorch ``nn.Module`` traced by ``torch.fx`` into an engine function and its parameters.

``torch.fx.symbolic_trace`` (Reed et al., 2022, "torch.fx: Practical Program Capture and
Transformation for Deep Learning in Python") turns the module's ``forward`` into a graph of
placeholder / get_attr / call_module / call_function / call_method nodes, with ``torch.nn`` layers kept
as leaf ``call_module`` nodes. Each node gets an engine rule from :mod:`.torch_rules` when the model is
converted (the first node without one stops the conversion with its op, target and module path); the
returned :class:`TorchFunction` evaluates the nodes in order with engine ops, so it runs eagerly and
traces under ``engine.jit`` / ``grad`` / ``vmap`` like any engine function.

Parameters are a flat dict keyed by PyTorch's ``state_dict`` names (``"features.0.weight"``), numpy
copies of the module's floating-point parameters and buffers that the graph reads. Buffers (batch
norm's running statistics) are read through ``ops.stop_gradient``: their gradient is zero, so a plain
optimizer step leaves them as they are, while federated averaging still averages them with the rest.
Tensors that are not floating point (e.g. integer index buffers) and tensor constants of the graph are
baked into the function as constants.
"""

from __future__ import annotations

import importlib
import os
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import ops
from ..core.ir import EngineError
from ..core.pytree import tree_flatten
from . import torch_rules
from .torch_rules import Unsupported


class TorchConversionError(EngineError):
    """A module ``torch.fx`` cannot trace, or a node the engine cannot run (the message names it)."""


@dataclass(frozen=True)
class _Ref:
    """A reference to an earlier node's value inside a node's argument template."""

    name: str


@dataclass(frozen=True)
class _Step:
    name: str
    op: str
    where: str  # "op target, module path" for error messages
    rule: Callable[..., Any]
    args: tuple
    kwargs: dict


def _fill(template: Any, env: Mapping[str, Any]) -> Any:
    if isinstance(template, _Ref):
        return env[template.name]
    if isinstance(template, tuple):
        return tuple(_fill(t, env) for t in template)
    if isinstance(template, list):
        return [_fill(t, env) for t in template]
    if isinstance(template, dict):
        return {k: _fill(v, env) for k, v in template.items()}
    if isinstance(template, slice):
        return slice(_fill(template.start, env), _fill(template.stop, env), _fill(template.step, env))
    return template


def _template(arg: Any, node_type: type) -> Any:
    if isinstance(arg, node_type):
        return _Ref(arg.name)
    if isinstance(arg, (tuple, list)):
        return type(arg)(_template(a, node_type) for a in arg)
    if isinstance(arg, dict):
        return {k: _template(v, node_type) for k, v in arg.items()}
    if isinstance(arg, slice):
        return slice(_template(arg.start, node_type), _template(arg.stop, node_type), _template(arg.step, node_type))
    return arg


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A numpy copy of a torch tensor (bfloat16 kept as ``ml_dtypes.bfloat16``)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


class TorchFunction:
    """``fn(params, *inputs)``: the converted module's forward pass written in engine ops.

    ``params`` is the dict :func:`from_torch` returned (or any dict with the same keys, shapes and
    dtypes, e.g. trained ones); inputs are numpy arrays (or engine tracers) in PyTorch's layouts. The
    output has the structure ``forward`` returns (an array, or a tuple / list / dict of them).
    """

    def __init__(self, steps: Sequence[_Step], inputs: Sequence[tuple[str, Any]], output: Any,
                 parameter_names: Sequence[str], buffer_names: Sequence[str], graph_text: str) -> None:
        self._steps = tuple(steps)
        self._inputs = tuple(inputs)  # (placeholder name, default or _NO_DEFAULT)
        self._output = output
        self.parameter_names = tuple(parameter_names)
        """the trainable tensors' ``state_dict`` names"""
        self.buffer_names = tuple(buffer_names)
        """the buffers' ``state_dict`` names (read with their gradient stopped)"""
        self.graph_text = graph_text
        """the ``torch.fx`` graph the function evaluates, as fx prints it"""

    def __call__(self, params: Mapping[str, Any], *inputs: Any) -> Any:
        if len(inputs) > len(self._inputs):
            raise TypeError(f"expected at most {len(self._inputs)} inputs, got {len(inputs)}")
        env: dict[str, Any] = {}
        for i, (name, default) in enumerate(self._inputs):
            if i < len(inputs):
                env[name] = inputs[i]
            elif default is _NO_DEFAULT:
                raise TypeError(f"missing input {name!r} (input {i})")
            else:
                env[name] = default
        leaf = _Leaves(params, frozenset(self.buffer_names))
        for step in self._steps:
            try:
                env[step.name] = step.rule(leaf, *_fill(step.args, env), **_fill(step.kwargs, env))
            except Unsupported as e:
                raise TorchConversionError(f"from_torch: node {step.name!r} ({step.where}): {e}") from None
            except Exception as e:
                e.add_note(f"in torch node {step.name!r} ({step.where})")
                raise
        return _fill(self._output, env)

    def state_dict(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` as torch tensors (copies), for ``module.load_state_dict(..., strict=False)``."""
        import torch

        return {k: torch.from_numpy(np.array(v)) for k, v in params.items()}


class _Leaves:
    """Reads the parameters of one call: a buffer comes back with its gradient stopped."""

    def __init__(self, params: Mapping[str, Any], buffers: frozenset) -> None:
        self.params, self.buffers = params, buffers

    def __call__(self, name: str) -> Any:
        try:
            v = self.params[name]
        except KeyError:
            raise KeyError(f"params has no entry {name!r} (the dict from_torch returned has it)") from None
        return ops.stop_gradient(v) if name in self.buffers else v


class _NoDefault:
    def __repr__(self) -> str:
        return "<no default>"


_NO_DEFAULT = _NoDefault()


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of the failure outside torch (the user's forward)."""
    import torch

    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)
              and not f.filename.startswith(os.path.dirname(__file__))]
    if not frames:
        return ""
    f = frames[-1]
    code = (f.line or "").strip()
    return f" at {f.filename}:{f.lineno}" + (f" ({code})" if code else "")


def _trace(torch: Any, module: Any) -> Any:
    """The fx graph of ``module``; a failure names the module being traced and the last node recorded."""
    fx = torch.fx

    class PathTracer(fx.Tracer):
        def __init__(self) -> None:
            super().__init__()
            self.failed_in: str | None = None  # (fx.Tracer keeps its own module_stack)
            self.last_node: Any = None

        def call_module(self, m: Any, forward: Any, args: Any, kwargs: Any) -> Any:
            path = self.path_of_module(m)
            try:
                return super().call_module(m, forward, args, kwargs)
            except Exception:
                if self.failed_in is None:  # the innermost module sees the failure first
                    self.failed_in = path
                raise

        def create_node(self, *args: Any, **kwargs: Any) -> Any:
            node = super().create_node(*args, **kwargs)
            self.last_node = node
            return node

    tracer = PathTracer()
    try:
        return tracer.trace(module)
    except Exception as e:
        path = tracer.failed_in or ""
        sub = module.get_submodule(path) if path else module
        after = f", after node {tracer.last_node.name!r}" if tracer.last_node is not None else ""
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise TorchConversionError(
            f"from_torch: torch.fx cannot trace module {path or '<root>'!r} ({type(sub).__name__}){after}"
            f"{_user_frame(e)}: {type(e).__name__}: {msg}") from None


def _qualified(target: Any) -> str:
    if isinstance(target, str):
        return target
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{mod}.{name}" if mod else name


def _fetch(root: Any, target: str) -> Any:
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _inplace(node: Any, module: Any) -> bool:
    if node.op == "call_module":
        return bool(getattr(module, "inplace", False))
    return bool(node.kwargs.get("inplace", False))


def _read_later(node: Any) -> bool:
    """Whether the input an in-place node overwrites is read by a node after it (PyTorch would then see
    the overwritten values, the engine's pure ops the old ones)."""
    if not node.args or not hasattr(node.args[0], "users"):
        return False
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return any(order[u] > order[node] for u in node.args[0].users if u is not node)


class _Parameters:
    """The module's tensors as the graph reads them: float parameters and buffers become entries of the
    ``state_dict``-named parameter dict (a shared tensor once, under its first name), others constants."""

    def __init__(self, module: Any) -> None:
        self.names: dict[int, str] = {}
        self.buffers: set[str] = set()
        for name, t in module.named_parameters():
            self.names.setdefault(id(t), name)
        for name, t in module.named_buffers():
            if id(t) not in self.names:
                self.names[id(t)] = name
                self.buffers.add(name)
        self.arrays: dict[str, np.ndarray] = {}

    def source(self, t: Any) -> tuple[str, Any]:
        """("param", state_dict name) for a float parameter/buffer; ("const", array or None) otherwise."""
        if t is None:
            return ("const", None)
        if id(t) in self.names and t.is_floating_point():
            name = self.names[id(t)]
            self.arrays.setdefault(name, tensor_to_numpy(t))
            return ("param", name)
        return ("const", tensor_to_numpy(t))


def _module_rule(sub: Any, prepare: Callable[[Any], Any], tensors: _Parameters) -> Callable[..., Any]:
    apply = prepare(sub)  # checks the layer's configuration (raises Unsupported)
    # a leaf module's own tensors and its children's (MultiheadAttention's "out_proj.weight"), by local name
    local = {n: tensors.source(t) for n, t in [*sub.named_parameters(), *sub.named_buffers()]}

    def rule(leaf: Any, *args: Any, **kwargs: Any) -> Any:
        def get(name: str) -> Any:
            kind, v = local.get(name, ("const", None))
            return leaf(v) if kind == "param" else v
        return apply(get, *args, **kwargs)

    return rule


def _node_rule(node: Any, module: Any, rules: tuple[dict, dict], tensors: _Parameters) -> Callable[..., Any]:
    """The evaluation rule ``rule(leaf, *args, **kwargs)`` of one get_attr / call_* node."""
    module_rules, function_rules = rules
    sub = module.get_submodule(node.target) if node.op == "call_module" else None
    if node.op == "get_attr":
        kind, v = tensors.source(_fetch(module, node.target))
        return (lambda leaf: leaf(v)) if kind == "param" else (lambda leaf: v)
    if node.op == "call_module":
        prepare = module_rules.get(type(sub))
        if prepare is None:
            raise Unsupported(f"no engine rule for {type(sub).__module__}.{type(sub).__name__}")
        rule = _module_rule(sub, prepare, tensors)
    elif node.op == "call_function":
        fn = function_rules.get(node.target)
        if fn is None:
            raise Unsupported("no engine rule for this function")
        rule = lambda leaf, *a, **k: fn(*a, **k)  # noqa: E731
    elif node.op == "call_method":
        fn = torch_rules.METHOD_RULES.get(node.target)
        if fn is None:
            raise Unsupported(f"no engine rule for the tensor method {node.target!r}")
        rule = lambda leaf, *a, **k: fn(*a, **k)  # noqa: E731
    else:  # pragma: no cover - fx has no other node kinds
        raise Unsupported("unknown node kind")
    if node.op != "call_method" and _inplace(node, sub) and _read_later(node):
        raise Unsupported("an in-place operation whose input is read again later (PyTorch would see the "
                          "overwritten values)")
    return rule


def from_torch(module: Any, example_inputs: Any, *, check: bool = True) -> tuple[TorchFunction, dict[str, np.ndarray]]:
    """Convert ``module`` (a ``torch.nn.Module``) into ``(fn, params)`` with ``fn(params, *inputs)``.

    ``example_inputs`` (a tensor or a tuple of tensors) are run through the converted function once
    (so a shape the engine refuses is reported at conversion); with ``check`` the result must match
    the module's own output on them (within 1e-3 of the output's scale). Convert batch norm and
    dropout in eval mode (``module.eval()``). Raises :class:`TorchConversionError` naming the first
    node ``torch.fx`` cannot trace or the engine cannot run.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch: module must be a torch.nn.Module, got {type(module).__name__}")
    examples = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    graph = _trace(torch, module)
    rules = (torch_rules.module_rules(torch), torch_rules.function_rules(torch))
    tensors = _Parameters(module)
    steps: list[_Step] = []
    inputs: list[tuple[str, Any]] = []
    output: Any = None
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        path = node.target if node.op == "call_module" else (list(stack)[-1] if stack else "")
        where = f"{node.op} {_qualified(node.target)}, module {path or '<root>'!r}"
        args, kwargs = _template(node.args, torch.fx.Node), _template(dict(node.kwargs), torch.fx.Node)
        try:
            if node.op == "placeholder":
                if node.target.startswith("*"):
                    raise Unsupported("variadic forward arguments are not supported")
                inputs.append((node.name, node.args[0] if node.args else _NO_DEFAULT))
            elif node.op == "output":
                output = args[0]
            else:
                steps.append(_Step(node.name, node.op, where, _node_rule(node, module, rules, tensors), args, kwargs))
        except Unsupported as e:
            raise TorchConversionError(f"from_torch: unsupported node {node.name!r} ({where}): {e}") from None
    params = tensors.arrays
    fn = TorchFunction(steps, inputs, output, [n for n in params if n not in tensors.buffers],
                       [n for n in params if n in tensors.buffers], str(graph))
    _check_examples(torch, module, fn, params, examples, check)
    return fn, params


def _check_examples(torch: Any, module: Any, fn: TorchFunction, params: dict, examples: tuple, check: bool) -> None:
    arrays = [tensor_to_numpy(x) if isinstance(x, torch.Tensor) else x for x in examples]
    try:
        ours = fn(params, *arrays)
    except TorchConversionError:
        raise
    except Exception as e:
        notes = "; ".join(getattr(e, "__notes__", []))
        raise TorchConversionError(f"from_torch: running the converted function on example_inputs failed"
                                   f" ({notes}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    if not check:
        return
    with torch.no_grad():
        theirs = module(*examples)
    flat_o, _ = tree_flatten(ours)
    flat_t = [theirs] if isinstance(theirs, torch.Tensor) else tree_flatten(
        theirs if not isinstance(theirs, tuple) else list(theirs))[0]
    if len(flat_o) != len(flat_t):
        raise TorchConversionError(f"from_torch: the converted function returns {len(flat_o)} arrays, the module "
                                   f"{len(flat_t)}")
    for i, (o, t) in enumerate(zip(flat_o, flat_t)):
        t = tensor_to_numpy(t).astype(np.float64) if isinstance(t, torch.Tensor) else np.asarray(t, np.float64)
        o = np.asarray(o, np.float64)
        if o.shape != t.shape:
            raise TorchConversionError(f"from_torch: output {i} has shape {o.shape}, the module's {t.shape}")
        scale = 1.0 + float(np.max(np.abs(t))) if t.size else 1.0
        err = float(np.max(np.abs(o - t))) if t.size else 0.0
        if not err <= 1e-3 * scale:
            raise TorchConversionError(f"from_torch: output {i} differs from the module's on example_inputs by "
                                       f"{err:.3g} (scale {scale:.3g}); a node's rule does not match PyTorch")


def load_torch_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``"torch:<module.path>:<factory>"`` (how configs name a torch model).

    This imports ``<module.path>``, which runs its code: a config naming a module is code, to be run only
    when trusted (docs/security.md, "Checkpoints and configs").
    """
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != "torch" or not parts[1] or not parts[2]:
        raise ValueError(f"expected 'torch:<module.path>:<factory>', got {spec!r}")
    try:
        mod = importlib.import_module(parts[1])
    except ImportError as e:
        raise ValueError(f"cannot import module {parts[1]!r}: {e}") from None
    factory = getattr(mod, parts[2], None)
    if not callable(factory):
        raise ValueError(f"module {parts[1]!r} has no callable {parts[2]!r}")
    return factory
