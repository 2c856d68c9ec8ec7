"""``fractune train`` and ``fractune cost`` as a user runs them: a real subprocess for each command's JSON line
and exit code, the rest through the same entry point in this process (``main``: no interpreter start-up)."""

from __future__ import annotations

import json

from tests.conftest import run_main, write_yaml

TINY = """
name: cli_tiny
model: {name: tiny}
data: {dataset: digits, batch_size: 64}
optim: {epochs: 2}
schedule: {kind: static, fw: 6, bw: 8}
"""

KEYS = {"accuracy", "val_accuracy", "epochs", "train_bitops", "fp32_bitops", "fw8bw8_bitops", "savings_vs_fp32",
        "savings_vs_fw8bw8", "cp", "wall_seconds"}


def test_train_json_and_checkpoint_resume(run_cli, tmp_path):
    cfg = write_yaml(tmp_path / "tiny.yaml", TINY)
    r = run_cli("train", str(cfg), "--json", "--checkpoint-dir", str(tmp_path / "ck"), "--history", str(tmp_path / "h.jsonl"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert KEYS <= out.keys()
    assert 0 <= out["accuracy"] <= 1 and out["epochs"] == 2
    assert 0.0 < out["savings_vs_fw8bw8"] < 1.0  # FW6/BW8 is cheaper than FW8/BW8
    assert out["cp"] == 100 * out["train_bitops"] / out["fp32_bitops"]
    lines = (tmp_path / "h.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in lines] == [1, 2]
    code, _, again = run_main("train", str(cfg), "--json", "--resume", str(tmp_path / "ck"))
    assert code == 0 and again["accuracy"] == out["accuracy"]


def test_train_set_override(tmp_path):
    cfg = write_yaml(tmp_path / "tiny.yaml", TINY)
    code, _, out = run_main("train", str(cfg), "--set", "optim.epochs=1", "--set", "schedule.fw=8", "--json")
    assert code == 0 and out["epochs"] == 1 and out["savings_vs_fw8bw8"] == 0.0


def test_bad_input_exits_2_with_one_line(run_cli, tmp_path, capsys):
    cfg = write_yaml(tmp_path / "tiny.yaml", TINY)

    def one_line_error(args, *needles):
        try:
            code = run_main(*args)[0]
        except SystemExit as exc:  # argparse's own errors (a missing argument) exit from the parser
            code = exc.code
        err = capsys.readouterr().err
        lines = [x for x in err.strip().splitlines() if x]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
        for n in needles:
            assert n in lines[0], lines[0]

    one_line_error(("train", str(cfg), "--set", "schedule.fw=40"), "schedule.fw", "40", "1..32")
    one_line_error(("train", str(cfg), "--set", "model.name=vgg"), "model.name", "'vgg'", "resnet38")
    one_line_error(("train", str(cfg), "--set", "data.dataset=mnist"), "data.dataset", "fashion-mnist")
    one_line_error(("train", str(cfg), "--set", "optim.bogus=1"), "optim.bogus", "unknown key")
    one_line_error(("train", str(cfg), "--set", "optim.epochs=many"), "optim.epochs", "'many'")
    one_line_error(("train", str(tmp_path / "none.yaml")), "none.yaml")
    one_line_error(("train", str(cfg), "--set", "data.dataset=fashion-mnist", "--data-dir", str(tmp_path)),
                   "data.data_dir", "dataset-fashion-mnist")
    one_line_error(("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/0"), "--precision")
    one_line_error(("cost", "--model", "resnet38", "--dataset", "svhn", "--precision", "8/8"), "--dataset")
    one_line_error(("train",), "config")
    # and as a real process: exit status 2, one line on stderr
    r = run_cli("train", str(cfg), "--set", "schedule.fw=40")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "schedule.fw" in r.stderr


def test_cost_resnet38(run_cli):
    r = run_cli("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert abs(out["forward_macs_per_sample"] - 83.28e6) / 83.28e6 < 0.005
    assert out["ratio_vs_fp32"] == 0.0625
    assert out["bitops_per_sample"] == out["forward_macs_per_sample"] * 192
    code, text, _ = run_main("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "4/8", "--fc", "fp32")
    assert code == 0 and "layers.17.conv2" not in text and "blocks.17.conv2" in text
