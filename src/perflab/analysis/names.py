"""Readable kernel names: one rule, used by every table that shows a kernel (analyze, profile, compare,
explain, ncu, the markdown reports). Torch-free, pandas-free.

The rule (``short_kernel_name``):

1. A name without C++ syntax (``nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT``, ``triton_red_fused_...``,
   ``sm80_xmma_gemm_...``, ``Memcpy DtoH (Device -> Pinned)``) is kept, less any argument list
   (``fmha_cutlassF_f32_aligned_64x64_rf_sm80(...::Params)`` → ``fmha_cutlassF_f32_aligned_64x64_rf_sm80``).
2. Otherwise drop the return type (``void``, ``std::enable_if<...>::type``), the argument list and the
   namespaces (``at::native::``, ``(anonymous namespace)::``), and keep the kernel's template head with only
   the template arguments that say which operation it runs (its *functor*):
   - plain types and values (``float``, ``c10::BFloat16``, ``128``, ``true``) and argument holders
     (tensor-list metadata, params, offset calculators, ``std::array``, ``OpaqueType``) are dropped;
   - a lambda stands for the function it is defined in
     (``masked_fill_kernel(...)::{lambda()#1}::...`` → ``masked_fill_kernel``);
   - a wrapper that only carries another functor is replaced by it (``gpu_kernel_impl_nocast<...>``,
     ``BinaryFunctor<float, float, float, MulFunctor<float>>``, ``ReduceOp<..., MeanOps<...>>``);
   - a functor keeps its own template arguments, without namespaces (``MulFunctor<float>``), unless they are
     longer than ``MAX_FUNCTOR_ARGS`` characters (``Name<…>``).
   So ``void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<
   float, float, float, at::native::binary_internal::MulFunctor<float> > >(...)::{lambda(int)#1}>(int, ...)``
   becomes ``elementwise_kernel<MulFunctor<float>>``.
3. A launcher template named only ``Kernel``/``Kernel2``/``device_kernel`` (cutlass) becomes what it launches
   (``cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>`` → ``cutlass_80_simt_sgemm_256x128_8x4_nn_align1``);
   a head that says nothing on its own (``kernel``, ``globalKernel``) keeps its enclosing name
   (``internal::gemvx::kernel<...>`` → ``gemvx::kernel``).
4. Never longer than ``MAX_SHORT_NAME`` (100) characters, so that a table cell holding one in backticks with
   its share beside it stays within 120: a longer result keeps its first two thirds and its last third around
   ``…`` (a cuBLAS name keeps its tile shape and its ``split_k``, a Triton name its kernel number).

Within one table (``short_names``), two kernels whose short names coincide are told apart by a suffix
``#2``, ``#3`` in the order given (callers give the busiest first); every table with short names is
followed by, or comes with, the full names.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable

MAX_SHORT_NAME = 100  # a cell `name` (42.4%) stays within 120 characters
MAX_FUNCTOR_ARGS = 60
ELLIPSIS = "…"

_ANONYMOUS = re.compile(r"\(anonymous namespace\)::|<unnamed>::")
_NAMESPACE = re.compile(r"\b(?:[A-Za-z_]\w*::)+(?=[A-Za-z_~])")
_NUMBER = re.compile(r"^(?:\([^()]*\))?-?\d+[uUlL]*$")  # 128, 2ul, -2, (at::native::ADAM_MODE)1
_PLAIN_TYPES = {
    "void", "bool", "char", "short", "int", "long", "float", "double", "unsigned", "signed", "true", "false",
    "half", "__half", "__nv_half", "__nv_bfloat16", "bfloat16", "BFloat16", "Half", "half_t", "bfloat16_t", "tfloat32_t",
    "size_t", "ptrdiff_t", "nullptr_t",
}
# Template arguments that hold data, not an operation (matched against the unqualified class name).
_HOLDERS = re.compile(r"Metadata|Params|Tensor|Calculator|WithCast|OpaqueType|^array$|ArrayRef|SizeStride|^Sm\d+$|Major$|Layout|^complex$")
# Wrappers whose only job is to carry the functor given to them: replaced by what they carry.
_WRAPPERS = re.compile(r"^(?:gpu_kernel_impl(?:_nocast)?|gpu_index_kernel|ReduceOp|func_wrapper_t|(?:A|B)?(?:Unary|Binary|Ternary)Functor)$")
# Launchers named for nothing: the name is what they launch.
_LAUNCHERS = {"Kernel", "Kernel2", "device_kernel"}
# Heads that say nothing alone: keep the enclosing name (gemvx::kernel).
_GENERIC = {"kernel", "kernel2", "globalkernel", "kernel_entry", "entry"}


def short_kernel_name(full: str) -> str:
    """The readable name of one kernel by the rule in this module's docstring (at most MAX_SHORT_NAME characters)."""
    return _short(str(full))


def short_names(names: Iterable[str]) -> dict[str, str]:
    """Full name → short name for the kernels of one table, one-to-one: a short name that two or more kernels
    share gets ``#2``, ``#3``, ... on the second and later (in the order given; duplicates in ``names`` count once)."""
    namer = KernelNames()
    for full in names:
        namer(full)
    return namer.legend()


class KernelNames:
    """Short names handed out one at a time, one-to-one over everything named so far: a report names each
    kernel as its tables reach it (so the first to appear keeps the bare name) and prints ``legend()`` under
    them. ``short_names`` is this over a list."""

    def __init__(self) -> None:
        self._short: dict[str, str] = {}
        self._taken: set[str] = set()
        self._count: dict[str, int] = {}

    def __call__(self, full: str) -> str:
        full = str(full)
        if full in self._short:
            return self._short[full]
        base = short_kernel_name(full)
        n = self._count.get(base, 0) + 1
        name = base if n == 1 else _with_suffix(base, n)
        while name in self._taken:  # a kernel whose own short name ends in " #2"
            n += 1
            name = _with_suffix(base, n)
        self._count[base] = n
        self._taken.add(name)
        self._short[full] = name
        return name

    def legend(self) -> dict[str, str]:
        """Full name → short name, in the order named."""
        return dict(self._short)


def _with_suffix(base: str, n: int) -> str:
    suffix = f" #{n}"
    return _cap(base, MAX_SHORT_NAME - len(suffix)) + suffix


@lru_cache(maxsize=None)
def _short(full: str) -> str:
    text = _ANONYMOUS.sub("", full.strip())
    if text.startswith(("Memcpy", "Memset")):
        return _cap(text)
    if "<" not in text and "::" not in text and not text.startswith("void "):
        return _cap(text.split("(", 1)[0].strip() or text)
    text = _drop_arguments(text)
    head, args = _split_template(text)
    qualified = _last_word(head)
    parts = [p for p in qualified.split("::") if p]
    base = parts[-1] if parts else qualified
    items = [item for arg in _split_args(args) for item in _functors(arg)] if args is not None else []
    if base in _LAUNCHERS and items:
        return _cap(", ".join(items))
    if base.lower() in _GENERIC and len(parts) > 1:
        base = "::".join(parts[-3:] if parts[-2] in ("impl", "detail") and len(parts) > 2 else parts[-2:])
    return _cap(f"{base}<{', '.join(items)}>" if items else base)


def _cap(text: str, limit: int = MAX_SHORT_NAME) -> str:
    if len(text) <= limit:
        return text
    keep = limit - len(ELLIPSIS)
    head = (2 * keep + 2) // 3  # two thirds before the cut (the tile shape of a cuBLAS name), one third after
    return text[:head] + ELLIPSIS + text[len(text) - (keep - head):]


def _opening(text: str, closers: str, openers: str) -> int:
    """The index of the bracket that opens the one ``text`` ends with (nested brackets of every kind counted); -1 if none."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch in closers:
            depth += 1
        elif ch in openers:
            depth -= 1
            if depth == 0:
                return i
    return -1


def _drop_arguments(text: str) -> str:
    """The name without its trailing top-level argument list ``(...)``."""
    text = text.rstrip()
    if not text.endswith(")"):
        return text
    i = _opening(text, ")>}", "(<{")
    return text[:i].rstrip() if i >= 0 and text[i] == "(" else text


def _split_template(text: str) -> tuple[str, str | None]:
    """(name, its template argument text) for ``name<args>``; (text, None) when it does not end in ``>``."""
    text = text.rstrip()
    if not text.endswith(">"):
        return text, None
    i = _opening(text, ">)}", "<({")
    return (text[:i], text[i + 1:-1]) if i >= 0 else (text, None)


def _top_level(text: str, sep: str, openers: str = "<({", closers: str = ">)}"):
    """The indices of ``sep`` in ``text`` outside every bracket of ``openers``/``closers``."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in openers:
            depth += 1
        elif ch in closers:
            depth -= 1
        elif ch == sep and depth == 0:
            yield i


def _last_word(text: str) -> str:
    """The last top-level whitespace-separated word: the name after any return type."""
    spaces = list(_top_level(text, " "))
    return text[spaces[-1] + 1 if spaces else 0:].strip()


def _split_args(text: str | None) -> list[str]:
    if not text:
        return []
    cuts = [-1, *_top_level(text, ","), len(text)]
    return [a for a in (text[i + 1:j].strip() for i, j in zip(cuts, cuts[1:])) if a]


def _first_paren(text: str) -> int:
    """Index of the first ``(`` outside template brackets, -1 if none."""
    return next(_top_level(text, "(", "<", ">"), -1)


def _functors(arg: str) -> list[str]:
    """The items of one template argument that name the operation (see the module docstring)."""
    arg = arg.strip()
    if _plain(arg):
        return []
    paren = _first_paren(arg)
    if paren > 0 and "{lambda" in arg[paren:]:  # f(...)::{lambda()#1}::...: the lambda stands for f
        arg = re.sub(r"::operator$", "", arg[:paren].strip())
    elif paren >= 0:
        return []  # a function type or a cast: no operation named
    name, targs = _split_template(arg)
    base = name.split("::")[-1].strip()
    if not re.fullmatch(r"[A-Za-z_]\w*", base) or _HOLDERS.search(base) or base in _PLAIN_TYPES:
        return []
    if targs is not None and _WRAPPERS.match(base):
        return [item for a in _split_args(targs) for item in _functors(a)]
    if targs is None:
        return [base]
    inner = ", ".join(_unqualified(a) for a in _split_args(targs))
    return [f"{base}<{inner}>" if len(inner) <= MAX_FUNCTOR_ARGS else f"{base}<{ELLIPSIS}>"]


def _plain(arg: str) -> bool:
    """A plain type or value: ``float``, ``unsigned int``, ``c10::BFloat16 const*``, ``128``, ``2ul``, ``true``."""
    bare = re.sub(r"\b(?:const|volatile)\b|[*&]", " ", arg).strip()
    if _NUMBER.match(bare.replace(" ", "")):
        return True
    words = [w.split("::")[-1] for w in bare.split()]
    return bool(words) and all(w in _PLAIN_TYPES or re.fullmatch(r"u?int\d+_t|Float8_\w+|__nv_fp8\w*|float\d+_t", w) for w in words)


def _unqualified(text: str) -> str:
    """``at::native::OpaqueType<4> `` → ``OpaqueType<4>``: no namespaces, no space inside ``> >``."""
    text = _NAMESPACE.sub("", _ANONYMOUS.sub("", text))
    return re.sub(r">\s+>", ">>", re.sub(r">\s+>", ">>", text.strip()))
