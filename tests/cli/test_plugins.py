"""A model of the user's own, outside the package: registered by its module, which every
command imports first (``seqrec --import MODULE_OR_FILE``, ``SEQREC_IMPORT``)."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor, nn

from seqrec.batch import ModelOutput, SeqBatch
from seqrec.models import ModelConfig, ScoringRecommender, register_model
from seqrec.registry import Registry
from seqrec.training.loop import train_one_epoch
from tests.cli.helpers import run_seqrec, tiny_raw, write_yaml

PLUGIN = textwrap.dedent(
    """
    from dataclasses import dataclass
    from typing import ClassVar

    from torch import nn

    from seqrec.batch import PAD_ID, ModelOutput
    from seqrec.models import ScoringRecommender, register_model
    from seqrec.models.objective import ItemLossConfig, dot_product_loss


    @dataclass(frozen=True, kw_only=True)
    class LastItemConfig(ItemLossConfig):
        name: ClassVar[str] = "test-plugin-last-item"
        hidden_size: int = 8


    @register_model
    class LastItem(ScoringRecommender):
        config_class = LastItemConfig

        def __init__(self, config):
            super().__init__(config)
            self.inputs = nn.Embedding(config.num_items + 1, config.hidden_size, padding_idx=PAD_ID)
            self.outputs = nn.Embedding(config.num_items + 1, config.hidden_size)

        def forward(self, batch):
            hidden = self.inputs(batch.input_ids)
            loss = dot_product_loss(self.config, hidden, batch.labels, batch, self.outputs.weight)
            return ModelOutput(loss=loss, hidden=hidden)

        def score(self, input_ids, users=None):
            return self.inputs(input_ids[:, -1]) @ self.outputs.weight.T
    """
)


def seqrec(*args: str, cwd: Path, extra_env: dict[str, str] | None = None) -> str:
    done = run_seqrec(*args, cwd=cwd, extra_env=extra_env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_model_of_ones_own_trains_evaluates_and_recommends(tmp_path: Path) -> None:
    (tmp_path / "my_models.py").write_text(PLUGIN)
    raw = tiny_raw(model={"name": "test-plugin-last-item"}, train={"max_epochs": 1})
    config = write_yaml(tmp_path / "c.yaml", raw)
    out = seqrec(
        "--import",
        "my_models",
        "-q",
        "train",
        "--config",
        str(config),
        "--out",
        "run",
        cwd=tmp_path,
    )
    assert "trained test-plugin-last-item: 1 epoch" in out
    by_file = {"SEQREC_IMPORT": str(tmp_path / "my_models.py")}  # a file, from elsewhere
    result = json.loads(
        seqrec("evaluate", str(tmp_path / "run"), "--json", cwd=Path("/"), extra_env=by_file)
    )
    assert 0.0 <= result["NDCG@10"] <= 1.0
    items = json.loads((tmp_path / "run" / "id_map.json").read_text())["items"][:3]
    rec = json.loads(
        seqrec(
            "recommend",
            "run",
            "--history",
            *items,
            "-k",
            "4",
            "--json",
            cwd=tmp_path,
            extra_env={"SEQREC_IMPORT": "my_models"},
        )
    )
    assert len(rec["items"]) == 4


def test_without_the_import_the_error_says_how(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "c.yaml", tiny_raw(model={"name": "test-plugin-last-item"}))
    done = run_seqrec("train", "--config", config, "--out", tmp_path / "run")
    assert done.returncode == 2
    assert "unknown model 'test-plugin-last-item'" in done.stderr
    assert "seqrec --import MODULE_OR_FILE or SEQREC_IMPORT" in done.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    done = run_seqrec("--import", broken, "data", "list")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: --import {broken}: RuntimeError: no GPU here"
    done = run_seqrec("data", "list", extra_env={"SEQREC_IMPORT": str(broken)})
    assert done.returncode == 2  # named where it came from (it said --import)
    assert done.stderr.strip() == f"error: SEQREC_IMPORT {broken}: RuntimeError: no GPU here"
    assert not os.path.exists(tmp_path / "run")


def test_the_same_definition_registers_again_another_does_not() -> None:
    registry: Registry[type] = Registry("thing", unknown_hint="register it first")

    def define() -> type:
        class Thing:  # the same module and qualified name each time: a module imported anew
            pass

        return Thing

    registry.register("a")(define())
    registry.register("a")(define())  # a notebook cell run twice
    with pytest.raises(KeyError, match="thing 'a' is already registered"):
        registry.register("a")(int)
    with pytest.raises(KeyError, match=r"unknown thing 'b'; available: a \(register it first\)"):
        registry.get("b")


def test_register_model_refuses_what_is_no_model_or_has_no_name() -> None:
    class NotAModel:
        pass

    with pytest.raises(TypeError, match="is not a SequentialRecommender subclass"):
        register_model(NotAModel)  # type: ignore[type-var]

    class Nameless(ScoringRecommender):
        config_class = ModelConfig  # the base config: its name is empty

    with pytest.raises(TypeError, match=r"Nameless.config_class has no name; give it name"):
        register_model(Nameless)


@pytest.mark.parametrize(
    ("returns", "message"),
    [
        ("tensor", r"last-item-test\.forward returned a Tensor; it must return a seqrec\.batch"),
        ("vector", r"returned a loss of shape \(2, 3\); it must be a scalar tensor"),
    ],
)
def test_a_forward_that_breaks_the_contract_is_named(returns: str, message: str) -> None:
    @dataclass(frozen=True, kw_only=True)
    class Config(ModelConfig):
        name: ClassVar[str] = "last-item-test"  # never registered

    class Broken(ScoringRecommender):
        config_class = Config

        def __init__(self) -> None:
            super().__init__(Config(num_items=5, max_seq_len=3))
            self.weight = nn.Parameter(torch.ones(2, 3))

        def forward(self, batch: SeqBatch) -> Any:
            return self.weight.sum() if returns == "tensor" else ModelOutput(loss=self.weight)

        def score(self, input_ids: Tensor, users: Tensor | None = None) -> Tensor:
            raise NotImplementedError

    model = Broken()
    batch = SeqBatch(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[2, 3, 4]]))
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises((TypeError, ValueError), match=message):
        train_one_epoch(model, [batch], optimizer, device=torch.device("cpu"))


def test_a_plugin_file_may_not_replace_a_module_already_imported(tmp_path: Path) -> None:
    shadow = tmp_path / "json.py"  # the CLI has imported the standard json module
    shadow.write_text("raise SystemExit('imported')\n")
    done = run_seqrec("--import", shadow, "data", "list")
    assert done.returncode == 2
    assert "a module named 'json' is imported already (json); rename json.py" in done.stderr
