"""The vocabulary that crosses layers (engine/metrics.py): the task and its objective, the cost keys, and the rule
that product code spells a metric key only through it."""

from __future__ import annotations

import ast
import math

from engine import metrics
from engine.metrics import Objective, Task, cost_key, readable_key
from engine.models import task_of
from tests.conftest import ROOT

# the keys the layers share (the generic words, ``epoch`` or ``cp``, also name other things)
KEYS = {metrics.ACCURACY, metrics.VAL_ACCURACY, metrics.PERPLEXITY, metrics.VAL_PERPLEXITY, metrics.TRAIN_BITOPS,
        metrics.TRAIN_TBITOPS, metrics.FP32_BITOPS, metrics.FW8BW8_BITOPS, metrics.CUM_CP, metrics.COST_PREFIX,
        metrics.EPOCH_COST_PREFIX}


def test_the_task_and_its_objective():
    assert task_of("resnet8") is Task.CLASSIFIER and task_of("transformer_tiny") is Task.LANGUAGE_MODEL
    assert Task.CLASSIFIER.objective == Objective("accuracy", "max")
    assert Task.LANGUAGE_MODEL.objective == ("perplexity", "min")
    assert Task.of_rows([{"accuracy": 0.9, "perplexity": math.nan}]) is Task.CLASSIFIER
    assert Task.of_rows([{"accuracy": 0.1}, {"accuracy": 0.2, "perplexity": 41.0}]) is Task.LANGUAGE_MODEL


def test_cost_keys_and_their_readable_companions():
    assert cost_key("bitops") == "train_bitops" and cost_key("table:h100") == "train_cost_table_h100"
    assert metrics.TRAIN_TBITOPS == readable_key("train_bitops") == "train_tbitops"
    assert readable_key("epoch_cost_energy") == "epoch_tcost_energy"
    assert [readable_key(k) for k in ("accuracy", "cum_gbitops", "train_cost_")] == [None, None, None]


def test_product_code_spells_the_shared_metric_keys_only_through_engine_metrics():
    """A key such as ``train_bitops`` written as a string literal outside engine/metrics.py (docstrings aside)
    would be a second definition of it."""
    found = []
    for pkg in ("engine", "orchestrator", "results", "dashboards", "search_spaces", "trainables"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == ROOT / "engine" / "metrics.py":
                continue
            tree = ast.parse(path.read_text())
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef) and n.body
                    and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            found += [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and n.value in KEYS and id(n) not in docs]
    assert found == []
