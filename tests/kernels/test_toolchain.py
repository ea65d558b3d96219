"""The toolchain is part of the bits: it is named, and no launch leaves FMA contraction to its default."""
from __future__ import annotations

import ast
from pathlib import Path

import torch
import triton

import kernels

KERNELS = Path(kernels.__file__).parent


def test_toolchain_names_the_compilers_and_on_the_cpu_its_vector_width_and_threads():
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert kernels.toolchain(torch.device("cpu")) == (
                f"torch {torch.__version__}, triton {triton.__version__}, "
                f"cpu {torch.backends.cpu.get_cpu_capability()}, {n} threads")
    finally:
        torch.set_num_threads(threads)


def _launches(tree: ast.AST):
    """Each `launch(name_kernel, grid, ...)` or `Launch(name_kernel, grid, ...)` call, with the keywords of the
    dicts it unpacks (`**shape`)."""
    dicts = {node.targets[0].id: {k.arg for k in node.value.keywords}
             for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
             and isinstance(node.value.func, ast.Name) and node.value.func.id == "dict"
             and isinstance(node.targets[0], ast.Name)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("launch", "Launch")
                and isinstance(node.args[0], ast.Name) and node.args[0].id.endswith("_kernel")):
            named = {k.arg for k in node.keywords if k.arg}
            for k in node.keywords:
                if k.arg is None and isinstance(k.value, ast.Name):
                    named |= dicts.get(k.value.id, set())
            yield node.args[0].id, named


def test_every_launch_names_its_fma_contraction():
    # Triton 3.10 turns the default off: a launch that leaves it unnamed would change bits on upgrade.
    launches = [(path.name, name, named) for path in sorted(KERNELS.glob("*.py"))
                for name, named in _launches(ast.parse(path.read_text()))]
    assert len(launches) >= 24
    assert [f"{file}: {name}" for file, name, named in launches if "enable_fp_fusion" not in named] == []
