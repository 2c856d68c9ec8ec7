"""``fractune train`` and ``fractune cost`` as a user runs them: a real subprocess for each command's JSON line
and exit code, the rest through the same entry point in this process (``main``: no interpreter start-up)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, run_main, write_yaml
from tests.orchestrator.procs import Pace, kill_session, start_cli, wait_for

TINY = """
name: cli_tiny
model: {name: tiny}
data: {dataset: digits, batch_size: 64}
optim: {epochs: 2}
schedule: {kind: static, fw: 6, bw: 8}
"""

KEYS = {"accuracy", "val_accuracy", "epochs", "train_bitops", "fp32_bitops", "fw8bw8_bitops", "savings_vs_fp32",
        "savings_vs_fw8bw8", "cp", "wall_seconds"}


@pytest.mark.slow
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
    # every cost model: the run's total with its references, as the tracker logs it per epoch
    assert set(out["costs"]) == {"bitops", "macs", "int_units", "energy", "memory"}
    assert out["costs"]["bitops"]["total"] == out["train_bitops"]
    assert out["costs"]["int_units"]["savings_vs_fw8bw8"] == 0.0  # FW6 runs on 8-bit units
    assert out["costs"]["macs"]["savings_vs_fp32"] == 0.0
    assert 0.0 < out["costs"]["energy"]["savings_vs_fw8bw8"] < out["savings_vs_fw8bw8"]
    epochs = [json.loads(x) for x in lines]
    for model in ("macs", "int_units", "energy", "memory"):
        assert out[f"train_cost_{model}"] == out["costs"][model]["total"] == epochs[-1][f"train_cost_{model}"]
        assert epochs[0][f"epoch_cost_{model}"] + epochs[1][f"epoch_cost_{model}"] == \
            pytest.approx(epochs[1][f"train_cost_{model}"])
    code, _, again = run_main("train", str(cfg), "--json", "--resume", str(tmp_path / "ck"))
    assert code == 0 and again["accuracy"] == out["accuracy"]


DATA_PARALLEL = """
name: cli_dp
model: {name: tiny}
data: {dataset: digits, batch_size: 32, train_subset: 1280}
optim: {epochs: 2}
device: cpu
schedule: {kind: static, fw: 8, bw: 8}
"""


@pytest.mark.slow
def test_train_on_two_workers_stops_on_ctrl_c_resumes_and_counts_what_one_worker_at_twice_the_batch_counts(
        ray_local, tmp_path, capsys, monkeypatch):
    """`fractune train --workers 2` (a real process, on the session's Ray): each epoch printed, written to the
    history and its checkpoint copied as it ends; Ctrl-C after the first ends it with code 130 and one line, and
    `--resume` (a relative path: Ray Train runs its workers in folders of their own) finishes the run. Two Ray
    Train workers at batch 32 take the steps and count the BitOPs of one worker at batch 64."""
    # three epochs: on a busy machine an epoch may reach this process seconds after its workers ended it, and
    # the interrupt must still find the run going
    pace = Pace(tmp_path, 0.1)
    cfg = write_yaml(tmp_path / "dp.yaml", DATA_PARALLEL.replace("epochs: 2", "epochs: 3")
                     + f"debug: {json.dumps(pace.debug)}\n")
    history = tmp_path / "h.jsonl"
    args = ("train", str(cfg), "--workers", "2", "--checkpoint-dir", "ck", "--history", str(history))
    proc = start_cli(*args, cwd=tmp_path, env={"RAY_ADDRESS": ray_local.get_runtime_context().gcs_address})
    try:
        wait_for(lambda: history.is_file() and history.read_text().count("\n") >= 1, timeout=240, interval=0.1,
                 what="the first epoch")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, (tmp_path / "stderr.log").read_text()[-3000:]
    finally:
        kill_session(proc.pid)
        pace.release()  # the resume runs at full speed
    err = (tmp_path / "stderr.log").read_text()
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "fractune train: interrupted", err[-3000:]
    done = [json.loads(x)["epoch"] for x in history.read_text().splitlines()]
    assert done in ([1], [1, 2]), done  # the epochs handed over before the interrupt, each with its checkpoint
    assert torch.load(tmp_path / "ck" / "state.pt", weights_only=True)["epoch"] == done[-1]
    monkeypatch.chdir(tmp_path)
    code, text, two = run_main(*args, "--resume", "ck", "--json")
    assert code == 0, text[-2000:] + capsys.readouterr().err[-2000:]
    assert [json.loads(x)["epoch"] for x in history.read_text().splitlines()] == [1, 2, 3]  # each epoch once
    assert torch.load(tmp_path / "ck" / "state.pt", weights_only=True)["epoch"] == 3
    code, _, one = run_main("train", str(cfg), "--set", "data.batch_size=64", "--set", "debug.sleep_per_iteration=0",
                            "--json")
    assert two["workers"] == 2 and one["workers"] == 1
    assert (two["iterations"], two["train_bitops"]) == (one["iterations"], one["train_bitops"])
    assert abs(two["accuracy"] - one["accuracy"]) < 0.1


@pytest.mark.slow
def test_an_input_only_the_workers_can_refuse_is_their_error_in_one_line(ray_local, tmp_path, capsys):
    """A sequence longer than the corpus's test split is found by the workers as they load the data: `fractune
    train --workers 2` exits with that error's own code and line (Ray Train raises it wrapped, with every
    rank's traceback), and no checkpoint folder is made."""
    cfg = write_yaml(tmp_path / "lm.yaml", "model: {name: transformer_tiny}\n"
                     "data: {dataset: fortunes, seq_len: 65536, vocab_size: 512}\noptim: {epochs: 1}\n")
    code, _, _ = run_main("train", str(cfg), "--workers", "2", "--checkpoint-dir", str(tmp_path / "ck"))
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert code == 2 and "Traceback" not in err and len(lines) == 2, err[-3000:]  # the line that says it starts
    assert lines[1].startswith("fractune train: error: data.seq_len: got 65536; allowed: <= "), lines
    assert not (tmp_path / "ck").exists()


def test_a_failed_data_parallel_run_raises_its_lowest_ranks_own_error():
    """What a run on Ray Train raises when it fails: a rank's fractune error itself (its exit code travels), the
    last line of any other rank's or the controller's error, never Ray Train's multi-line wrapper."""
    from ray.train import ControllerError, WorkerGroupError

    from engine.errors import DataError, TrainingDiverged
    from trainables.data_parallel import _run_error

    data = DataError("data.seq_len: too long")
    assert _run_error(WorkerGroupError("2 ranks", {1: ValueError("x"), 0: data})) is data
    diverged = TrainingDiverged("training loss is nan")
    assert _run_error(WorkerGroupError("1 rank", {3: diverged})) is diverged
    other = _run_error(WorkerGroupError("1 rank", {0: RuntimeError("Traceback:\n  at line 1\nActorDiedError: gone")}))
    assert type(other) is RuntimeError and str(other) == "rank 0: ActorDiedError: gone"
    ctl = _run_error(ControllerError(ValueError("first\nthe controller's last line")))
    assert type(ctl) is RuntimeError and str(ctl) == "the controller's last line"


@pytest.mark.parametrize("workers, line", [
    ("0", "--workers: got 0; allowed: 1 or more"),
    ("4096", "--workers: got 4096; allowed: >= 1 and <= 1024"),
    ("64", "--workers: got 64; allowed: <= "),
])
def test_train_refuses_workers_it_cannot_have_in_one_line(tmp_path, capsys, workers, line):
    cfg = write_yaml(tmp_path / "dp.yaml", DATA_PARALLEL)
    code, out, _ = run_main("train", str(cfg), "--workers", workers, "--checkpoint-dir", str(tmp_path / "ck"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"fractune train: error: {line}"), err
    assert not (tmp_path / "ck").exists()


_GPU_NODE = """
import json, ray
from engine.config.experiment import ExperimentConfig
from engine.errors import ConfigError
from orchestrator._data_parallel import check_workers
ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR")  # a node declaring one GPU
out = {}
for device, workers in (("auto", 1), ("cpu", 2), ("auto", 2), ("cuda", 2)):
    cfg = ExperimentConfig.model_validate({"device": device, "workers": workers, "model": {"name": "tiny"},
                                           "data": {"dataset": "digits"}})
    try:
        out[f"{device} {workers}"] = check_workers(cfg)
    except ConfigError as err:
        out[f"{device} {workers}"] = str(err)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_train_on_workers_gives_each_worker_a_gpu_where_its_device_asks_for_one_and_the_node_has_them():
    """On a node of one GPU (a Ray declaring it: no GPU is needed to check the decision), device auto gives a
    worker that GPU, two workers are refused naming the GPUs (each would take the same GPU otherwise), and device
    cpu keeps two workers on the CPUs."""
    r = subprocess.run([sys.executable, "-c", _GPU_NODE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "RAY_ADDRESS": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["auto 1"] == {"cpu": 1, "gpu": 1} and out["cpu 2"] == {"cpu": 1, "gpu": 0}, out
    for key in ("auto 2", "cuda 2"):
        assert out[key].startswith("workers: got 2; allowed: <= 1 (GPUs of this process's node of the running Ray"), out


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
    # a target only the built network refuses: refused before the line that says training starts
    far = write_yaml(tmp_path / "far.yaml", "model: {name: resnet8}\ndata: {dataset: digits}\n"
                     "schedule: {kind: dfq, cost_basis: model, target_cp: 0.0001}\n")
    one_line_error(("train", str(far)), "schedule.target_cp", "0.0001")
    one_line_error(("train", str(cfg), "--set", f"init.checkpoint={tmp_path / 'gone'}"), "init.checkpoint: ",
                   "does not exist")
    one_line_error(("train", str(cfg), "--set", "optim.epochs=many"), "optim.epochs", "'many'")
    one_line_error(("train", str(tmp_path / "none.yaml")), "none.yaml")
    one_line_error(("train", str(cfg), "--set", "data.dataset=fashion-mnist", "--data-dir", str(tmp_path)),
                   "data.data_dir", "dataset-fashion-mnist")
    one_line_error(("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/0"), "--precision")
    one_line_error(("cost", "--model", "resnet38", "--dataset", "svhn", "--precision", "8/8"), "--dataset")
    one_line_error(("train",), "config")
    one_line_error(("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/8", "--int-widths", "8,4"),
                   "--int-widths", "increasing")
    for typed in ("1_6", "\u0664,\u0668"):  # int() reads both: 16, and Arabic-Indic 4,8
        one_line_error(("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/8", "--int-widths",
                        typed), "--int-widths", "comma-separated integers")
    bad_table = write_yaml(tmp_path / "accel.yaml", "fp32: 4\ncosts: {'8x99': 0.3}\n")
    one_line_error(("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/8", "--table",
                    str(bad_table)), "--table", "costs.8x99", "1..31")
    one_line_error(("train", str(cfg), "--set", f"cost.table={bad_table}"), "cost.table", "costs.8x99")
    # and as a real process: exit status 2, one line on stderr
    r = run_cli("train", str(cfg), "--set", "schedule.fw=40")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "schedule.fw" in r.stderr


def test_cost_resnet38():
    code, text, out = run_main("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "8/8", "--fc",
                               "quantized", "--json")
    assert code == 0, text
    assert abs(out["forward_macs_per_sample"] - 83.28e6) / 83.28e6 < 0.005
    assert out["ratio_vs_fp32"] == 0.0625 and out["layer_map"] == {"stem": "quantized", "shortcut": "quantized",
                                                                   "fc": "quantized"}
    assert out["bitops_per_sample"] == out["forward_macs_per_sample"] * 192
    code, text, _ = run_main("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "4/8")
    assert code == 0 and "layers.17.conv2" not in text and "blocks.17.conv2" in text and "fc fp32" in text


def test_cost_prices_what_a_default_training_run_counts(tmp_path):
    """With no layer flag, `fractune cost` prices the layer map `fractune train` runs (the FC fp32): the run's
    BitOPs are its samples times cost's per-sample figure, and its ratios under each per-MAC model are cost's.
    With the FC quantized the per-sample figure is another, which no whole number of samples gives."""
    code, text, run = run_main("train", str(write_yaml(tmp_path / "tiny.yaml", TINY)), "--set", "optim.epochs=1",
                               "--json")
    assert code == 0, text
    code, text, cost = run_main("cost", "--model", "tiny", "--dataset", "digits", "--precision", "6/8", "--json")
    assert code == 0 and cost["layer_map"]["fc"] == "fp32", text
    samples = run["train_bitops"] / cost["bitops_per_sample"]
    assert samples == round(samples) and (run["iterations"] - 1) * 64 < samples <= run["iterations"] * 64
    for model in ("bitops", "int_units", "energy"):
        assert run["costs"][model]["total"] / run["costs"][model]["fp32"] == pytest.approx(
            cost["costs"][model]["ratio_vs_fp32"], rel=1e-12)
    _, _, fc_quantized = run_main("cost", "--model", "tiny", "--dataset", "digits", "--precision", "6/8", "--fc",
                                  "quantized", "--json")
    other = run["train_bitops"] / fc_quantized["bitops_per_sample"]
    assert other != round(other)


@pytest.mark.parametrize("model, dataset, flags, quant", [
    ("resnet18", "imagenet", (), {}),  # the family's map: stem and 1x1 projections fp32
    ("resnet18", "imagenet", ("--shortcut", "quantized"), {"quantize_shortcut": True}),
    ("mobilenetv2", "cifar10", (), {}),  # depthwise convs at their fixed bits
    ("resnet8", "cifar10", ("--layer-map", "gated"), {"layer_map": "gated"}),
    ("transformer_tiny", "fortunes", ("--fc", "quantized"), {"quantize_fc": True}),
    ("transformer_tiny", "fortunes", ("--vocab-size", "4096"), {}),  # the output layer of examples/lm_*.yaml
])
def test_cost_prices_the_layer_map_of_the_config_its_flags_stand_for(tmp_path, model, dataset, flags, quant):
    """Each flag is its config key: cost's ratio to FP32 is `fractune schedule`'s for the static run of that
    config, which prices the run on the network, layer map and cost models training uses."""
    cfg = {"name": "c", "model": {"name": model}, "data": {"dataset": dataset}, "quant": quant,
           "schedule": {"kind": "static", "fw": 4, "bw": 8}, "optim": {"iterations": 10}}
    if "--vocab-size" in flags:
        cfg["data"]["vocab_size"] = int(flags[1])
    code, text, sched = run_main("schedule", str(write_yaml(tmp_path / "c.yaml", json.dumps(cfg))), "--json")
    assert code == 0, text
    code, text, cost = run_main("cost", "--model", model, "--dataset", dataset, "--precision", "4/8", *flags, "--json")
    assert code == 0, text
    for name in ("bitops", "energy"):
        assert cost["costs"][name]["ratio_vs_fp32"] == pytest.approx(sched["costs"][name]["ratio_vs_fp32"], rel=1e-12)


@pytest.mark.parametrize("args, needles", [
    (("resnet8", "cifar10", "--layer-map", "gated", "--stem", "quantized"), ("--stem", "'quantized'", "gated")),
    (("resnet8", "cifar10", "--layer-map", "gated", "--fc", "quantized"), ("--fc", "'quantized'", "gated")),
    (("transformer_tiny", "fortunes", "--shortcut", "quantized"), ("--shortcut", "'quantized'", "language model")),
    (("transformer_tiny", "fortunes", "--stem", "quantized"), ("--stem", "'quantized'", "no stem")),
    (("tiny", "digits", "--seq-len", "64"), ("--seq-len", "64", "only with a text data set")),  # else ignored
    (("tiny", "digits", "--vocab-size", "100"), ("--vocab-size", "100", "only with a text data set")),
])
def test_cost_refuses_the_flags_a_config_refuses(capsys, args, needles):
    model, dataset, *flags = args
    code, _, _ = run_main("cost", "--model", model, "--dataset", dataset, "--precision", "4/8", *flags)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and all(n in lines[0] for n in needles), lines


def test_cost_every_model_with_a_user_table(tmp_path):
    table = write_yaml(tmp_path / "accel.yaml", "name: acc\nunit: pJ\nfp32: 4.0\ncosts: {'4x4': 0.1, '8x8': 0.3}\n")
    code, text, out = run_main("cost", "--model", "resnet38", "--dataset", "cifar10", "--precision", "6/8",
                               "--table", str(table), "--batch-size", "10", "--fc", "quantized", "--json")
    assert code == 0 and "table:acc" in text
    costs = out["costs"]
    assert list(costs) == ["bitops", "macs", "int_units", "energy", "memory", "table:acc"]
    macs = out["forward_macs_per_sample"]
    assert costs["bitops"]["per_sample"] == out["bitops_per_sample"] == macs * (36 + 48 + 48)
    assert costs["macs"]["per_iteration"] == 10 * 3 * macs
    assert costs["int_units"]["per_sample"] == macs * 192  # FW6/BW8 on 8-bit units = FW8/BW8
    assert costs["int_units"]["savings_vs_fw8bw8"] == 0.0 < costs["bitops"]["savings_vs_fw8bw8"]
    assert costs["table:acc"]["per_sample"] == pytest.approx(macs * 3 * 0.3)
    mem = costs["memory"]
    assert mem["per_iteration"] > 10 * mem["per_sample"]  # + the weights, once per iteration


def test_schedule_priced_under_every_model():
    code, _, out = run_main("schedule", str(ROOT / "examples" / "cpt_3to8.yaml"), "--json")
    assert code == 0
    c = out["costs"]
    assert c["bitops"]["savings_vs_fw8bw8"] == pytest.approx(0.367, abs=0.002)
    # CPT 3 -> 8 saves less on integer units (3/4 bits on 4-bit units, 5..8 on 8-bit ones) and in energy
    assert 0.1 < c["int_units"]["savings_vs_fw8bw8"] < c["energy"]["savings_vs_fw8bw8"] < 0.3
    assert c["macs"]["ratio_vs_fp32"] == 1.0


def test_the_history_file_is_strict_json_where_a_metric_is_not_a_number(tmp_path):
    """No validation split: val_accuracy is NaN, written as null (a bare NaN is no JSON for other parsers)."""
    cfg = write_yaml(tmp_path / "tiny.yaml", TINY)
    code, _, _ = run_main("train", str(cfg), "--set", "data.val_fraction=0", "--set", "optim.epochs=1",
                          "--history", str(tmp_path / "h.jsonl"))

    def refuse(token):
        raise AssertionError(f"{token} in the history file")

    [line] = (tmp_path / "h.jsonl").read_text().splitlines()
    epoch = json.loads(line, parse_constant=refuse)
    assert code == 0 and epoch["epoch"] == 1 and epoch["val_accuracy"] is None and epoch["accuracy"] > 0


def test_with_json_stdout_is_the_json_object_alone_and_the_tables_go_to_stderr(capsys):
    args = ("cost", "--model", "resnet8", "--dataset", "fashion-mnist", "--precision", "4/8")
    code, out, _ = run_main(*args)
    assert code == 0 and "under each cost model" in out and not out.lstrip().startswith("{")
    capsys.readouterr()
    code, out, result = run_main(*args, "--json")
    assert code == 0 and json.loads(out) == result and result["precision"]  # `| jq` reads stdout whole
    assert "under each cost model" in capsys.readouterr().err
