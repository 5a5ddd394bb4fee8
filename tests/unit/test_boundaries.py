"""Conventions that matter, checked by machine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"
BUDGET_COLUMNS = {
    "epsilon_spent",
    "delta_spent",
    "epsilon_total",
    "delta_total",
    "epsilon_cap",
    "delta_cap",
    "last_hash",
    "entries",
    "is_set",
}


def _py_files() -> list[Path]:
    return sorted(SERVICE.rglob("*.py"))


def test_only_the_ledger_writes_budget() -> None:
    """No module outside service/ledger updates Budget/Grant/LedgerEntry or their budget columns."""
    offenders = []
    for path in _py_files():
        if path.parent.name == "ledger" or path.name == "models.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {
                "update",
                "insert",
            }:
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Name) and arg.id in {"Budget", "Grant", "LedgerEntry"}:
                    offenders.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in BUDGET_COLUMNS:
                        offenders.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {
                "Budget",
                "LedgerEntry",
                "Grant",
            }:
                offenders.append(f"{path}:{node.lineno}")
    assert offenders == []


def test_no_fixed_seeds_in_service() -> None:
    pattern = re.compile(r"default_rng\(\s*\d|np\.random\.seed\(|random\.seed\(|RandomState\(\s*\d")
    hits = [str(p) for p in _py_files() if pattern.search(p.read_text())]
    assert hits == []


def test_no_seed_parameter_on_any_endpoint() -> None:
    from service.openapi import document

    text = str(document()).lower()
    assert "'seed'" not in text
    assert "random_state" not in text
